"""What the docs' plot scripts (bandwidth_plot.py, gpu_decode_plot.py, kv_waste_plot.py,
memory_plot.py, serving_plot.py, timeline_plot.py, tradeoff_plot.py) share: matplotlib set up for
deterministic SVG, a clear error for a malformed data file, the figure's parts stacked from the
bottom up (caption, legends, axes) and the SVG saved with tooltips."""
import argparse
import json
import os
import sys
import textwrap
from xml.sax.saxutils import escape

WIDTH_IN = 7.6  # inches at 100 dpi: 760 px, the docs' column beside the table of contents
PAD_IN, GAP_IN = 0.08, 0.12  # the figure's margin, the space between the parts stacked below
GREY = "#555555"


def arguments(doc, data, data_help, machine=False, command=False):
    """The command line every plot script starts from: OUT.svg, the data file (named `data`),
    and where the script's caption shows them, --machine and --command. `doc`: the script's
    docstring, whose first paragraph describes it."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument(data, help=data_help)
    if machine:
        parser.add_argument("--machine", default="", help="where it ran, for the caption")
    if command:
        parser.add_argument("--command", default="", help="the command that made it, for the caption")
    return parser


def load_json(path, what, keys=()):
    """The JSON object in `path`, `what` (a program's results) with every key of `keys`; stops
    the script with what was wrong otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        fail(path, what, f"malformed JSON: {e}")
    if not isinstance(data, dict):
        fail(path, f"{what}: a JSON object", type(data).__name__)
    missing = [key for key in keys if key not in data]
    if missing:
        fail(path, f"{what} with " + ", ".join(f"'{key}'" for key in keys), f"keys {sorted(data)}")
    return data


def pyplot(**rc):
    """matplotlib.pyplot with the SVG backend and the settings every plot shares: a fixed hash
    salt and text kept as text (the same data gives the same file, byte for byte), 10 pt text
    and 9 pt ticks; `rc` overrides them."""
    import matplotlib
    matplotlib.use("svg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"svg.hashsalt": "kvlab", "svg.fonttype": "none", "font.size": 10,
                         "xtick.labelsize": 9, "ytick.labelsize": 9, **rc})
    return plt


def fail(path, expected, got):
    """Stops the script: `path` (a file, or file:line) held `got` where `expected` was due."""
    sys.exit(f"{os.path.basename(sys.argv[0])}: {path}: expected {expected}, got {got}")


def lines(*texts):
    """The non-empty `texts`, one per line (a caption and its --command and --machine)."""
    return "\n".join(t for t in texts if t)


def wrapped(text, size=9):
    """`text` broken at spaces into lines that end before the figure's right edge (at 0.6 em a
    character: wide for a sans-serif face, so a browser's own font fits too)."""
    limit = int((WIDTH_IN - 2 * PAD_IN) * 72 / (0.6 * size))
    return "\n".join(textwrap.fill(part, limit) for part in text.split("\n"))


def stack(fig, plot_in, caption, legends=(), **layout):
    """From the bottom up: the grey caption (wrapped), the legends (each a dict of fig.legend's
    arguments, the last on top) below the axes, and plot_in inches over them for the axes
    (tight_layout, with `layout`'s padding). Sets the figure's height."""
    text = fig.text(PAD_IN, PAD_IN, wrapped(caption), transform=fig.dpi_scale_trans, fontsize=9,
                    color=GREY, ha="left", va="bottom")
    y = PAD_IN + text.get_window_extent().height / fig.dpi + GAP_IN
    for legend in legends:
        box = fig.legend(**legend, loc="lower center", bbox_to_anchor=(WIDTH_IN / 2, y),
                         bbox_transform=fig.dpi_scale_trans, frameon=False)
        y += box.get_window_extent().height / fig.dpi
    if legends:
        y += GAP_IN
    fig.set_size_inches(WIDTH_IN, y + plot_in)
    fig.tight_layout(rect=(0, y / (y + plot_in), 1, 1), **layout)


def save(fig, path, tips):
    """The SVG (transparent: the page shows through, and the dark theme inverts it), then each
    tooltip (gid -> text) as the <title> of its artist's group."""
    fig.savefig(path, format="svg", metadata={"Date": None, "Creator": None}, transparent=True)
    with open(path, encoding="utf-8") as f:
        svg = f.read()
    for gid, tip in tips.items():
        svg = svg.replace(f'<g id="{gid}">', f'<g id="{gid}">\n   <title>{escape(tip)}</title>', 1)
    with open(path, "w", encoding="utf-8") as f:
        f.write(svg)
