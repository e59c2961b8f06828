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


def caption(x, y, text):
    """A grey line of text at (x, y): what was measured, by which program, on which machine."""
    return f'<text x="{x}" y="{y}" fill="#555">{escape(text)}</text>'


def write_svg(path, width, height, parts, font_size=12, background=None):
    """Writes `parts` (SVG elements, one per string) as an SVG file of width × height pixels.

    The viewBox lets a page scale the picture down to a narrower column (docs/kvlab.css) instead
    of cutting it off."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="{font_size}">\n')
        if background:
            f.write(f'<rect width="{width}" height="{height}" fill="{background}"/>\n')
        f.write("\n".join(parts) + "\n</svg>\n")
