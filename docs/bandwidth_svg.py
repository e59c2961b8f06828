#!/usr/bin/env python3
"""Draws a decode step's speed against the memory's limit as SVG from bench_decode_bandwidth's
JSON results (the file committed in bench/results): for 1 and for 2 threads, the K and V bytes a
step reads per second (medians) against the context length, MHA and GQA, with the read bandwidth
measured in the same run as a dashed line. Hollow points are steps whose own K and V came partly
from the caches: the program also reads those same bytes with a plain vectorised sum just before
timing the step (its counter fraction_same_bytes), and where that read ran at least
CACHED_RATIO times as fast as the read of the large buffer (read_bandwidth_GBps_threads_T), the
bytes did not all come from main memory, and the dashed line is not the step's limit. The rule
uses what the run measured, not the L3 size the machine reports (a virtual machine may report an
L3 of hundreds of MiB that the step does not see). Standard library only, so the docs build
needs nothing more.

usage: bandwidth_svg.py OUT.svg RESULTS.json [--machine TEXT]
"""
import json
import math
import re

from svg_common import caption, captions, write_svg, plot_arguments

COLOUR = {"mha": "#4c78a8", "gqa": "#e45756"}
NAME = {"mha": "MHA 32/32 heads", "gqa": "GQA 32/8 heads"}
W, H, LEFT, TOP, GAP = 300, 220, 60, 50, 70  # one panel's plot area and the margins
# A same-bytes read this much faster than the large buffer's read means the caches served part of
# it. Two reads of main memory minutes apart differ by up to about 1.2x on the machines of
# bench/results (a 512 MiB cache beside a 32 MiB L3 read at 0.79-1.19x the 1 GiB buffer's speed in
# cpu-decode-bandwidth.json), so the threshold sits above that drift.
CACHED_RATIO = 1.25


def results(path):
    """{(shape, threads): [(n, GB/s, fraction, K+V MiB, same-bytes read GB/s or None)]} from the
    medians, and the run's context."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    out = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        m = re.match(r"decode_bandwidth/(\w+)/n:(\d+)/threads:(\d+)/", b["name"])
        if m:
            key = (m.group(1), int(m.group(3)))
            same = b.get("fraction_same_bytes")  # absent in runs before the counter existed
            out.setdefault(key, []).append((int(m.group(2)), b["GB_per_s"], b["fraction"],
                                            b["kv_MiB"], b["GB_per_s"] / same if same else None))
    if not out:
        raise SystemExit(f"{path}: no median of a decode_bandwidth benchmark "
                         f"(run it with --benchmark_repetitions of 2 or more)")
    return out, data["context"]


def main():
    p = plot_arguments(__doc__, command=False)
    args = p.parse_args()
    series, context = results(args.results)
    has_same_bytes = all(row[4] is not None for rows in series.values() for row in rows)
    ns = sorted({n for rows in series.values() for n, *_ in rows})
    lo, hi = math.log2(ns[0]), math.log2(ns[-1])
    top = max(max(g for rows in series.values() for _, g, *_ in rows),
              max(float(context[f"read_bandwidth_GBps_threads_{t}"]) for t in (1, 2)))
    top = math.ceil(top / 10) * 10  # GB/s at the top of the axis

    def x_of(x0, n):
        return x0 + (math.log2(n) - lo) / (hi - lo) * W

    def y_of(gbps):
        return TOP + H - gbps / top * H

    out = []
    for panel, threads in enumerate((1, 2)):
        x0 = LEFT + panel * (W + GAP)
        limit = float(context[f"read_bandwidth_GBps_threads_{threads}"])
        out.append(f'<text x="{x0}" y="{TOP - 14}" font-weight="bold">{threads} thread'
                   f'{"s" if threads > 1 else ""}: K+V bytes read per second</text>')
        for g in range(0, int(top) + 1, 10):
            y = y_of(g)
            out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + W}" y2="{y:.1f}" stroke="#e4e4e4"/>')
            out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{g}</text>')
        out.append(f'<line x1="{x0}" y1="{TOP}" x2="{x0}" y2="{TOP + H}" stroke="black"/>')
        out.append(f'<line x1="{x0}" y1="{TOP + H}" x2="{x0 + W}" y2="{TOP + H}" stroke="black"/>')
        for n in ns:
            out.append(f'<text x="{x_of(x0, n):.1f}" y="{TOP + H + 16}" '
                       f'text-anchor="middle">{n}</text>')
        out.append(f'<text x="{x0 + W / 2}" y="{TOP + H + 34}" text-anchor="middle">'
                   f'context length (tokens)</text>')
        out.append(f'<text x="{x0 - 40}" y="{TOP + H / 2}" text-anchor="middle" '
                   f'transform="rotate(-90 {x0 - 40} {TOP + H / 2})">GB/s</text>')
        y = y_of(limit)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + W}" y2="{y:.1f}" stroke="#333" '
                   f'stroke-dasharray="6,4"><title>read bandwidth, {threads} thread(s): '
                   f'{limit:.1f} GB/s</title></line>')
        out.append(f'<text x="{x0 + W - 4}" y="{y - 5:.1f}" text-anchor="end" fill="#333">'
                   f'memory read, {limit:.1f} GB/s</text>')
        for shape in ("mha", "gqa"):
            rows = sorted(series.get((shape, threads), []))
            if not rows:
                continue
            points = " ".join(f"{x_of(x0, n):.1f},{y_of(g):.1f}" for n, g, *_ in rows)
            out.append(f'<polyline points="{points}" fill="none" stroke="{COLOUR[shape]}" '
                       f'stroke-width="2"/>')
            for n, g, fraction, mib, same in rows:
                cached = has_same_bytes and same >= CACHED_RATIO * limit
                fill = "white" if cached else COLOUR[shape]
                read = (f"; a plain read of the same bytes {same:.1f} GB/s, {same / limit:.2f}x "
                        f"the large buffer's" if same else "")
                out.append(f'<circle cx="{x_of(x0, n):.1f}" cy="{y_of(g):.1f}" r="4" '
                           f'fill="{fill}" stroke="{COLOUR[shape]}" stroke-width="2">'
                           f'<title>{NAME[shape]}, n = {n} ({mib:g} MiB of K+V): {g:.1f} GB/s, '
                           f'{fraction:.2f} of the read bandwidth{read}</title></circle>')

    # Legend and what was measured.
    y = TOP + H + 60
    x = LEFT
    for shape, colour in COLOUR.items():
        out.append(f'<line x1="{x}" y1="{y - 4}" x2="{x + 20}" y2="{y - 4}" stroke="{colour}" '
                   f'stroke-width="2"/><circle cx="{x + 10}" cy="{y - 4}" r="4" fill="{colour}"/>')
        out.append(f'<text x="{x + 26}" y="{y}">{NAME[shape]}, fp32, head_dim 128</text>')
        x += 260
    if has_same_bytes:
        buffer = context.get("read_bandwidth_buffer_MiB", "?")
        out.append(f'<circle cx="{LEFT + 7}" cy="{y + 14}" r="4" fill="white" stroke="#333" '
                   f'stroke-width="2"/><text x="{LEFT + 16}" y="{y + 18}">hollow: partly from '
                   f'the caches (a plain read of the same K+V ran ≥ {CACHED_RATIO:g} × as fast '
                   f'as one of {buffer} MiB)</text>')
    else:
        out.append(caption(LEFT, y + 18, "every point filled: this run did not record a read of "
                                         "each step's own bytes (fraction_same_bytes)"))
    y += 18
    width = LEFT + 2 * W + GAP + 30
    parts, y = captions(LEFT, y + 24, "bench_decode_bandwidth, one layer's decode step, medians"
                        f"{'; ' + args.machine if args.machine else ''}", width - 10)
    out += parts
    write_svg(args.out, width, y + 16, out)


if __name__ == "__main__":
    main()
