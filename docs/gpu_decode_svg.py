#!/usr/bin/env python3
"""Draws decode attention on a GPU against its memory's limit as SVG, from bench_cuda_decode's
JSON results (a file committed in bench/results): the K/V bytes per second of the paged kernel
against the context length, one line per batch size, split-K (solid, the default plan) and a
single pass (dashed), with the GPU's peak bandwidth and its measured device-to-device copy as
horizontal lines. Uniform batches (every sequence at the context) and ragged ones (lengths drawn
up to the context) in two panels. Standard library only, so the docs build needs nothing more.

usage: gpu_decode_svg.py OUT.svg RESULTS.json [--command TEXT]
"""
import json
import math
from xml.sax.saxutils import escape

from svg_common import caption, captions, write_svg, plot_arguments

COLOUR = {1: "#4c78a8", 4: "#54a24b", 16: "#f58518", 64: "#e45756"}
W, H, LEFT, TOP, GAP = 265, 240, 60, 60, 95  # one panel's plot area and the margins


def results(path):
    """{(ragged, batch): [(context, single TB/s, split-K TB/s, case)]} of the paged cases, and the
    file's header (GPU, peak, copy, shapes)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    for key in ("gpu", "peak_tbps", "copy_tbps", "cases"):
        if key not in data:
            raise SystemExit(f"{path}: expected bench_cuda_decode's JSON with '{key}', got keys "
                             f"{sorted(data)}")
    out = {}
    for c in data["cases"]:
        if c["kind"] == "paged":
            out.setdefault((c["ragged"], c["batch"]), []).append(
                (c["context"], c["single_pass_tbps"], c["split_k_tbps"], c))
    if not out:
        raise SystemExit(f"{path}: no paged case")
    return {k: sorted(v, key=lambda r: r[0]) for k, v in out.items()}, data


def main():
    p = plot_arguments(__doc__, machine=False)
    args = p.parse_args()
    series, data = results(args.results)
    peak, copy = data["peak_tbps"], data["copy_tbps"]
    contexts = sorted({n for rows in series.values() for n, *_ in rows})
    lo, hi = math.log2(contexts[0]), math.log2(contexts[-1])
    top = math.ceil(peak * 2) / 2  # TB/s at the top of the axis, a multiple of 0.5

    def x_of(x0, n):
        return x0 + (math.log2(n) - lo) / (hi - lo) * W

    def y_of(tbps):
        return TOP + H - tbps / top * H

    out = []
    for panel, ragged in enumerate((False, True)):
        x0 = LEFT + panel * (W + GAP)
        title = ("ragged batches: lengths drawn up to the context" if ragged
                 else "uniform batches: every sequence at the context")
        out.append(f'<text x="{x0 - 40}" y="{TOP - 30}" font-weight="bold">{title}</text>')
        for i in range(int(top * 2) + 1):
            g = i / 2
            y = y_of(g)
            out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + W}" y2="{y:.1f}" stroke="#e4e4e4"/>')
            out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{g:g}</text>')
        out.append(f'<line x1="{x0}" y1="{TOP}" x2="{x0}" y2="{TOP + H}" stroke="black"/>')
        out.append(f'<line x1="{x0}" y1="{TOP + H}" x2="{x0 + W}" y2="{TOP + H}" stroke="black"/>')
        for n in contexts:
            label = f"{n // 1024}k"
            out.append(f'<text x="{x_of(x0, n):.1f}" y="{TOP + H + 16}" '
                       f'text-anchor="middle">{label}</text>')
        out.append(f'<text x="{x0 + W / 2}" y="{TOP + H + 34}" text-anchor="middle">'
                   f'context length (tokens, log scale)</text>')
        out.append(f'<text x="{x0 - 38}" y="{TOP + H / 2}" text-anchor="middle" '
                   f'transform="rotate(-90 {x0 - 38} {TOP + H / 2})">K/V TB/s</text>')
        for value, dash, text in (
                (peak, "6,4", f"nominal peak {peak:.2f} TB/s"),
                (copy, "2,3", f"device-to-device copy (read + write): {copy:.2f} TB/s")):
            y = y_of(value)
            out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + W}" y2="{y:.1f}" stroke="#333" '
                       f'stroke-dasharray="{dash}"/>')
            out.append(f'<text x="{x0 + W - 4}" y="{y - 4:.1f}" text-anchor="end" fill="#333" '
                       f'font-size="11">{text}</text>')
        ends = []  # (y, batch, text) of the split-K line's last point, labelled at the right
        for (is_ragged, batch), rows in sorted(series.items()):
            if is_ragged != ragged:
                continue
            colour = COLOUR.get(batch, "#333")
            for index, dash, width in ((2, "", 2), (1, "5,3", 1.5)):  # split-K, single pass
                points = " ".join(f"{x_of(x0, row[0]):.1f},{y_of(row[index]):.1f}" for row in rows)
                out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" '
                           f'stroke-width="{width}"'
                           f'{f" stroke-dasharray={chr(34)}{dash}{chr(34)}" if dash else ""}/>')
            for n, single, split, case in rows:
                tip = (f"batch {batch}{' ragged' if ragged else ''}, context {n}: split-K "
                       f"{split:.2f} TB/s ({100 * split / peak:.1f} % of peak, "
                       f"{case['split_k_partitions']} partitions, {case['split_k_us']:.1f} us), "
                       f"single pass {single:.2f} TB/s ({case['single_pass_us']:.1f} us)")
                out.append(f'<circle cx="{x_of(x0, n):.1f}" cy="{y_of(split):.1f}" r="3.5" '
                           f'fill="{colour}"><title>{escape(tip)}</title></circle>')
            n, _, split, _ = rows[-1]
            at = "" if n == contexts[-1] else f" ({n // 1024}k)"
            ends.append([y_of(split) + 4, colour, f"{100 * split / peak:.0f} %{at}"])
        ends.sort()
        for i in range(1, len(ends)):  # at least 12 px apart, pushed down
            ends[i][0] = max(ends[i][0], ends[i - 1][0] + 12)
        for y, colour, text in ends:
            out.append(f'<text x="{x0 + W + 6:.1f}" y="{y:.1f}" font-size="11" '
                       f'fill="{colour}">{text}</text>')

    y = TOP + H + 60
    x = LEFT - 40
    for batch, colour in COLOUR.items():
        out.append(f'<line x1="{x}" y1="{y - 4}" x2="{x + 20}" y2="{y - 4}" stroke="{colour}" '
                   f'stroke-width="2"/><text x="{x + 26}" y="{y}">batch {batch}</text>')
        x += 90
    out.append(f'<line x1="{x}" y1="{y - 4}" x2="{x + 20}" y2="{y - 4}" stroke="#333" '
               f'stroke-width="2"/><text x="{x + 26}" y="{y}">split-K (default)</text>')
    x += 130
    out.append(f'<line x1="{x}" y1="{y - 4}" x2="{x + 20}" y2="{y - 4}" stroke="#333" '
               f'stroke-width="1.5" stroke-dasharray="5,3"/><text x="{x + 26}" y="{y}">single '
               f'pass</text>')
    width = LEFT + 2 * W + GAP + 70
    parts, y = captions(LEFT - 40, y + 24, f"paged decode, {data.get('heads')} query / "
                        f"{data.get('kv_heads')} K/V heads × {data.get('head_dim')}, "
                        f"{data.get('dtype')}, blocks of {data.get('block_size')} "
                        f"({data.get('layout')}); medians of {data.get('reps')} runs; "
                        f"at the right: split-K's share of the peak at the longest "
                        f"context run", width - 10)
    out += parts
    parts, y = captions(LEFT - 40, y + 18, f"{data['gpu']}, {data.get('sm_count', '?')} "
                        f"multiprocessors", width - 10)
    out += parts
    if args.command:
        parts, y = captions(LEFT - 40, y + 18, args.command, width - 10)
        out += parts
    write_svg(args.out, width, y + 16, out, background="white")


if __name__ == "__main__":
    main()
