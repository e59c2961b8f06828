"""What the docs' plot scripts (bandwidth_svg.py, memory_svg.py, timeline_svg.py,
tradeoff_svg.py, kv_waste_svg.py, serving_svg.py, gpu_decode_svg.py) share: the caption line
under a plot, the SVG file around its parts, and the command line they all start from.
Standard library only."""
import argparse
from xml.sax.saxutils import escape


def plot_arguments(doc, data="results", machine=True, command=True):
    """The parser every plot script starts from: OUT.svg, the data file it draws (named `data`),
    and, where the script prints them in its footer, --machine and --command. `doc` is the
    script's docstring; its first paragraph is the description."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument(data)
    if machine:
        p.add_argument("--machine", default="")
    if command:
        p.add_argument("--command", default="")
    return p


# The widest a picture of the docs is drawn, in px: the text column beside the table of contents
# at 1400 px (docs/check_site.py fails on a picture shown narrower than drawn).
MAX_WIDTH = 760
# An average sans-serif character's width, in font sizes: on the wide side, so that a wrapped
# line ends before the picture's edge (the site check measures every label as drawn).
CHAR_WIDTH = 0.6
LINE_HEIGHT = 16


def caption(x, y, text):
    """A grey line of text at (x, y): what was measured, by which program, on which machine."""
    return f'<text x="{x}" y="{y}" fill="#555">{escape(text)}</text>'


def wrap(text, width, font_size=12):
    """`text` broken at spaces into lines of at most `width` px (estimated, CHAR_WIDTH)."""
    limit = max(10, int(width / (CHAR_WIDTH * font_size)))
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > limit:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return lines + [line] if line else lines


def captions(x, y, text, right, font_size=12):
    """`caption` lines at (x, y), (x, y + LINE_HEIGHT), ...: `text` wrapped to end before `right`.
    Returns the parts and the y of the last line."""
    lines = wrap(text, right - x, font_size)
    parts = [caption(x, y + i * LINE_HEIGHT, line) for i, line in enumerate(lines)]
    return parts, y + (len(lines) - 1) * LINE_HEIGHT


def write_svg(path, width, height, parts, font_size=12, background=None):
    """Writes `parts` (SVG elements, one per string) as an SVG file of width × height pixels, at
    most MAX_WIDTH wide.

    The viewBox lets a page scale the picture down to a narrower column (docs/kvlab.css) instead
    of cutting it off."""
    if width > MAX_WIDTH:
        raise SystemExit(f"{path}: drawn {width} px wide, more than the docs' column "
                         f"({MAX_WIDTH} px)")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="{font_size}">\n')
        if background:
            f.write(f'<rect width="{width}" height="{height}" fill="{background}"/>\n')
        f.write("\n".join(parts) + "\n</svg>\n")
