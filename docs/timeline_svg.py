#!/usr/bin/env python3
"""Draws a serving timeline (requests x steps) as SVG from engine step logs (JSON lines, one
object per step, as kvlab::write_step_log writes them): one panel per log, one row per request,
one cell per step, coloured by what the request did in that step (prefill, decode, padding) and
marked where it was preempted. Standard library only, so the docs build needs nothing more.

usage: timeline_svg.py OUT.svg TITLE=LOG.jsonl [TITLE=LOG.jsonl ...] [--names A,B,C,...]
"""
import json
import sys
from xml.sax.saxutils import escape

from svg_common import write_svg

COLOURS = {"prefill": "#4c78a8", "decode": "#72b7b2", "padding": "#d9d9d9"}
CELL, ROW, LEFT, TOP, GAP = 22, 22, 60, 34, 40


def read_log(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def panel(title, steps, names, y0):
    requests = 1 + max((e["request"] for s in steps for e in s["batch"]), default=0)
    out = [f'<text x="{LEFT}" y="{y0 - 10}" font-weight="bold">{escape(title)}</text>']
    for r in range(requests):
        label = escape(names[r] if r < len(names) else str(r))
        out.append(f'<text x="{LEFT - 8}" y="{y0 + r * ROW + 15}" text-anchor="end">{label}</text>')
    for s in steps:
        x = LEFT + s["step"] * CELL
        cells = {}  # request -> (kind, tokens): a padded prompt shows as prefill, not padding
        for e in s["batch"]:
            if e["request"] not in cells or cells[e["request"]][0] == "padding":
                cells[e["request"]] = (e["kind"], e["tokens"])
        for request, (kind, tokens) in sorted(cells.items()):
            y = y0 + request * ROW
            out.append(f'<rect x="{x + 1}" y="{y + 1}" width="{CELL - 2}" height="{ROW - 2}" '
                       f'fill="{COLOURS[kind]}"><title>step {s["step"]}: {kind} of {tokens} '
                       f'tokens</title></rect>')
        for r in s["preempted"]:
            y = y0 + r * ROW
            out.append(f'<text x="{x + CELL / 2}" y="{y + 16}" text-anchor="middle" '
                       f'fill="#c00">x</text>')
    for s in steps[:: max(1, len(steps) // 10 or 1)]:
        x = LEFT + s["step"] * CELL + CELL / 2
        out.append(f'<text x="{x}" y="{y0 + requests * ROW + 14}" text-anchor="middle" '
                   f'font-size="11">{s["step"]}</text>')
    return out, requests * ROW + 24


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    out_path, names, panels = argv[1], [], []
    args = argv[2:]
    if "--names" in args:
        i = args.index("--names")
        if i + 1 >= len(args):
            sys.exit("timeline_svg.py: --names: expected a comma-separated list, got nothing")
        names = args[i + 1].split(",")
        del args[i:i + 2]
    if not args:
        sys.exit("timeline_svg.py: expected at least one TITLE=LOG.jsonl, got none")
    for arg in args:
        title, sep, path = arg.partition("=")
        if not sep:
            sys.exit(f"timeline_svg.py: {arg}: expected TITLE=LOG.jsonl")
        panels.append((title, read_log(path)))
    width = LEFT + CELL * max(len(steps) for _, steps in panels) + 20
    body, y = [], TOP
    for title, steps in panels:
        lines, height = panel(title, steps, names, y)
        body += lines
        y += height + GAP
    per_row = max(1, (width - LEFT) // 110)  # legend entries of 110 px, as many a line as fit
    entries = list(COLOURS.items()) + [(None, None)]
    for i, (kind, colour) in enumerate(entries):
        x, yy = LEFT + (i % per_row) * 110, y + (i // per_row) * 20
        if kind is None:
            body.append(f'<text x="{x}" y="{yy + 2}" fill="#c00">x preempted</text>')
            continue
        body.append(f'<rect x="{x}" y="{yy - 10}" width="14" height="14" fill="{colour}"/>')
        body.append(f'<text x="{x + 20}" y="{yy + 2}">{kind}</text>')
    height = y + 20 * ((len(entries) - 1) // per_row) + 20
    write_svg(out_path, width, height, body, font_size=13, background="white")


if __name__ == "__main__":
    main(sys.argv)
