"""What the docs' plot scripts (bandwidth_svg.py, memory_svg.py, timeline_svg.py,
tradeoff_svg.py, kv_waste_svg.py, serving_svg.py, gpu_decode_svg.py) share: the caption line
under a plot and the SVG file around its parts.
Standard library only."""
from xml.sax.saxutils import escape


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
