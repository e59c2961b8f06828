#!/usr/bin/env python3
"""Draws a long-running engine's resident memory against its steps as SVG, from kvlab_stress's
samples (the CSV committed in bench/results: run,policy,step,requests,records,rss_kib): one line
per run and policy. With every finished request's output taken (Engine::take_output) the line
is flat; with every record kept it grows with the requests served. Standard library only, so the
docs build needs nothing more.

usage: memory_svg.py OUT.svg SAMPLES.csv [--machine TEXT] [--command TEXT]
"""
import csv
import math

from svg_common import caption, captions, write_svg, plot_arguments

STYLE = {  # (run, policy) -> colour, dash
    ("outputs taken", "continuous"): ("#4c78a8", ""),
    ("outputs taken", "static"): ("#72b7b2", ""),
    ("outputs taken", "contiguous"): ("#54a24b", ""),
    ("records kept", "continuous"): ("#e45756", "6,4"),
}
W, H, LEFT, TOP = 560, 260, 70, 40


def samples(path):
    """{(run, policy): [(step, requests, records, MiB)]} in step order."""
    out = {}
    with open(path, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            key = (row["run"], row["policy"])
            out.setdefault(key, []).append((int(row["step"]), int(row["requests"]),
                                            int(row["records"]), int(row["rss_kib"]) / 1024))
    if not out:
        raise SystemExit(f"{path}: no samples")
    return {k: sorted(v) for k, v in out.items()}


def main():
    p = plot_arguments(__doc__, data="samples")
    args = p.parse_args()
    series = samples(args.samples)
    last_step = max(s for rows in series.values() for s, *_ in rows)
    top = math.ceil(max(m for rows in series.values() for *_, m in rows) / 10) * 10

    def x_of(step):
        return LEFT + step / last_step * W

    def y_of(mib):
        return TOP + H - mib / top * H

    out = [f'<text x="{LEFT}" y="{TOP - 16}" font-weight="bold">Resident memory of a '
           f'long-running engine (MiB) against its steps</text>']
    for g in range(0, top + 1, 10):
        y = y_of(g)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + W}" y2="{y:.1f}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{g}</text>')
    ticks = 5
    for i in range(ticks + 1):
        step = last_step * i / ticks
        out.append(f'<text x="{x_of(step):.1f}" y="{TOP + H + 16}" text-anchor="middle">'
                   f'{int(round(step, -3))}</text>')
    out.append(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + H}" stroke="black"/>')
    out.append(f'<line x1="{LEFT}" y1="{TOP + H}" x2="{LEFT + W}" y2="{TOP + H}" stroke="black"/>')
    out.append(f'<text x="{LEFT + W / 2}" y="{TOP + H + 34}" text-anchor="middle">engine steps</text>')
    out.append(f'<text x="{LEFT - 44}" y="{TOP + H / 2}" text-anchor="middle" '
               f'transform="rotate(-90 {LEFT - 44} {TOP + H / 2})">MiB</text>')
    legend = []
    for key, rows in sorted(series.items()):
        colour, dash = STYLE.get(key, ("#333", "2,2"))
        points = " ".join(f"{x_of(s):.1f},{y_of(m):.1f}" for s, _, _, m in rows)
        first, last = rows[0], rows[-1]
        per_request = (last[3] - first[3]) * 1024 * 1024 / max(1, last[1] - first[1])
        title = (f"{key[1]} policy, {key[0]}: {first[3]:.1f} MiB at step {first[0]} "
                 f"({first[1]} requests), {last[3]:.1f} MiB at step {last[0]} ({last[1]} requests, "
                 f"{last[2]} records kept): {per_request:+.0f} bytes per request")
        out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"'
                   f'{f" stroke-dasharray={chr(34)}{dash}{chr(34)}" if dash else ""}>'
                   f'<title>{title}</title></polyline>')
        legend.append((colour, dash, f"{key[1]}, {key[0]}: {per_request:+.0f} B per request"))
    y = TOP + H + 60
    for i, (colour, dash, text) in enumerate(legend):  # one a line: they are long
        x = LEFT
        yy = y + i * 18
        out.append(f'<line x1="{x}" y1="{yy - 4}" x2="{x + 24}" y2="{yy - 4}" stroke="{colour}" '
                   f'stroke-width="2"{f" stroke-dasharray={chr(34)}{dash}{chr(34)}" if dash else ""}/>')
        out.append(f'<text x="{x + 30}" y="{yy}">{text}</text>')
    y += 18 * len(legend) + 8
    text = "kvlab_stress, the built-in tiny model, a sample every 1000 steps"
    if args.command:
        text = args.command
    width = LEFT + W + 30
    parts, y = captions(LEFT, y, text, width - 10)
    out += parts
    if args.machine:
        parts, y = captions(LEFT, y + 18, args.machine, width - 10)
        out += parts
    write_svg(args.out, width, y + 16, out)


if __name__ == "__main__":
    main()
