#!/usr/bin/env python3
"""Draws the storage-precision trade-off as SVG from bench_kv_dtype's JSON results (the file
committed in bench/results): for each precision, the bits it stores per value against (left)
the largest error of the attention output it gives, relative to fp32 storage, and (right) its
decode step time relative to fp32, with the time a purely memory-bound step would take (the
bytes ratio) as a dashed line. One context length and thread count; MHA and GQA as two marks.
Standard library only, so the docs build needs nothing more.

usage: tradeoff_svg.py OUT.svg RESULTS.json [--n N] [--threads T] [--machine TEXT]
"""
import json
import math
from xml.sax.saxutils import escape

from svg_common import caption, captions, write_svg, plot_arguments

BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8.5, "int4": 4.5}  # with the block scales
COLOUR = {"fp32": "#4c78a8", "fp16": "#f58518", "bf16": "#54a24b", "int8": "#b279a2",
          "int4": "#e45756"}
W, H, LEFT, TOP, GAP = 300, 220, 70, 60, 60  # one panel's plot area and the margins


def x_of(bits):  # bits per value on a log2 axis from 4 to 32
    return LEFT + (math.log2(bits) - 2) / 3 * W


def mark(shape, x, y, colour, tip):
    tip = f"<title>{escape(tip)}</title>"
    if shape == "mha":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{colour}">{tip}</circle>'
    return (f'<rect x="{x - 5:.1f}" y="{y - 5:.1f}" width="10" height="10" fill="none" '
            f'stroke="{colour}" stroke-width="2">{tip}</rect>')


def x_axis(x0):
    out = [f'<line x1="{x0}" y1="{TOP + H}" x2="{x0 + W}" y2="{TOP + H}" stroke="black"/>']
    for bits in (4, 8, 16, 32):
        x = x0 - LEFT + x_of(bits)
        out.append(f'<text x="{x:.1f}" y="{TOP + H + 16}" text-anchor="middle">{bits}</text>')
    out.append(f'<text x="{x0 + W / 2}" y="{TOP + H + 34}" text-anchor="middle">'
               f'bits stored per value (scales included)</text>')
    return out


def main():
    p = plot_arguments(__doc__, command=False)
    p.add_argument("--n", type=int, default=32768)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    with open(args.results, encoding="utf-8") as f:
        rows = [r for r in json.load(f)["results"]
                if r["n"] == args.n and r["threads"] == args.threads]
    if not rows:
        raise SystemExit(f"{args.results}: no results for n = {args.n}, {args.threads} thread(s)")

    out = []
    # Left: error against bits, log10 of the error from 1e-7 to 1e-2 (fp32 itself: 0, not drawn).
    lo, hi = -7, -2
    out.append(f'<text x="{LEFT}" y="{TOP - 14}" font-weight="bold">largest |error| of the output '
               f'vs fp32 storage</text>')
    out.append(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + H}" stroke="black"/>')
    for e in range(lo, hi + 1):
        y = TOP + H - (e - lo) / (hi - lo) * H
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">1e{e}</text>')
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + W}" y2="{y:.1f}" stroke="#eee"/>')
    out += x_axis(LEFT)
    for r in rows:
        if r["error_vs_fp32"] <= 0:
            continue
        e = min(max(math.log10(r["error_vs_fp32"]), lo), hi)
        y = TOP + H - (e - lo) / (hi - lo) * H
        out.append(mark(r["shape"], x_of(BITS[r["kv_dtype"]]), y, COLOUR[r["kv_dtype"]],
                        f'{r["shape"]} {r["kv_dtype"]}: {r["error_vs_fp32"]:.3g}'))

    # Right: step time / fp32 against bits, 0 to 2, and the memory-bound ideal (bytes / fp32).
    x0 = LEFT + W + GAP
    top = 2.0
    out.append(f'<text x="{x0}" y="{TOP - 14}" font-weight="bold">decode step time / fp32</text>')
    out.append(f'<line x1="{x0}" y1="{TOP}" x2="{x0}" y2="{TOP + H}" stroke="black"/>')
    for t in (0, 0.5, 1, 1.5, 2):
        y = TOP + H - t / top * H
        out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{t:g}</text>')
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + W}" y2="{y:.1f}" stroke="#eee"/>')
    out += x_axis(x0)
    ideal = " ".join(f"{x0 - LEFT + x_of(b):.1f},{TOP + H - (b / 32) / top * H:.1f}"
                     for b in (4.5, 8.5, 16, 32))
    out.append(f'<polyline points="{ideal}" fill="none" stroke="#888" stroke-dasharray="5,4">'
               f'<title>bytes read / fp32: a purely memory-bound step</title></polyline>')
    for r in rows:
        y = TOP + H - min(r["time_ratio_to_fp32"], top) / top * H
        out.append(mark(r["shape"], x0 - LEFT + x_of(BITS[r["kv_dtype"]]), y,
                        COLOUR[r["kv_dtype"]],
                        f'{r["shape"]} {r["kv_dtype"]}: {r["time_ratio_to_fp32"]:.2f}'))

    # Legend and what was measured.
    y = TOP + H + 60
    x = LEFT
    for dtype, colour in COLOUR.items():
        out.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{colour}"/>')
        out.append(f'<text x="{x + 16}" y="{y}">{dtype}</text>')
        x += 70
    out.append(mark("mha", x + 10, y - 4, "#333", "MHA") + f'<text x="{x + 20}" y="{y}">MHA 32/32</text>')
    out.append(mark("gqa", x + 110, y - 4, "#333", "GQA") + f'<text x="{x + 120}" y="{y}">GQA 32/8</text>')
    out.append(f'<text x="{x + 200}" y="{y}">- - memory-bound</text>')
    width = LEFT + 2 * W + GAP + 30
    parts, y = captions(LEFT, y + 24,
                        f"bench_kv_dtype, one layer, head_dim 128, {args.n} tokens, {args.threads} "
                        f"thread(s){'; ' + args.machine if args.machine else ''}", width - 10)
    out += parts
    write_svg(args.out, width, y + 16, out)


if __name__ == "__main__":
    main()
