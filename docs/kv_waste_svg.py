#!/usr/bin/env python3
"""Draws KV-cache memory waste and concurrency, contiguous preallocation vs paging, as SVG from
bench_memory_waste's JSON results (the file committed in bench/results): one row per layout;
left, the tokens a request reserves at its final length (mean over the workload) split into the
tokens it uses and the ones it leaves empty, with the waste at finish and over the lifetime;
right, how many requests fit in the memory budget (mean over the rounds, with the least and the
most as a whisker). Standard library only, so the docs build needs nothing more.

usage: kv_waste_svg.py OUT.svg RESULTS.json [--machine TEXT] [--command TEXT]
"""
import json
from xml.sax.saxutils import escape

from svg_common import caption, captions, write_svg, plot_arguments

USED, EMPTY = "#4c78a8", "#f2b8b5"  # used tokens; reserved and empty
ROW, LABEL, TOP = 24, 190, 64        # one layout's row height, the label column, the top margin
W1, GAP1, TEXT, GAP2, W2 = 200, 12, 110, 16, 150  # reserved-tokens panel, waste column, fit panel


def layouts(path):
    """The JSON's layouts, its request count, model and budget; a clear error if any is missing."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    for key in ("layouts", "workload", "model", "budget_bytes", "budget_tokens"):
        if key not in data:
            raise SystemExit(f"{path}: expected a bench_memory_waste result with '{key}', "
                             f"got keys {sorted(data)}")
    if not data["layouts"]:
        raise SystemExit(f"{path}: 'layouts' is empty")
    return data


def ticks(top, count):
    """count + 1 round tick values from 0 to at least top."""
    step = top / count
    for nice in (1, 2, 4, 5, 10, 20, 25, 50, 100, 128, 200, 256, 500, 512, 1000):
        if nice >= step:
            return [i * nice for i in range(count + 1)]
    return [i * step for i in range(count + 1)]


def main():
    p = plot_arguments(__doc__)
    args = p.parse_args()
    data = layouts(args.results)
    rows = data["layouts"]
    requests = data["workload"]["requests"]
    per_token = data["model"]["bytes_per_token"]
    budget_gib = data["budget_bytes"] / 2**30

    def tokens(bytes_total):  # mean tokens per request
        return bytes_total / per_token / requests

    top1 = max(tokens(r["reserved_bytes_at_finish"]) for r in rows)
    axis1 = ticks(top1, 4)
    top2 = max(r["sequences_max"] for r in rows)
    axis2 = ticks(top2, 3)
    x1 = LABEL                     # left panel
    xt = x1 + W1 + GAP1            # waste column
    x2 = xt + TEXT + GAP2          # right panel
    height = len(rows) * ROW
    baseline = rows[0]["sequences_mean"]  # the first layout: contiguous, max_len

    def bx(v):
        return x1 + v / axis1[-1] * W1

    def sx(v):
        return x2 + v / axis2[-1] * W2

    mean_used = tokens(rows[0]["used_bytes_at_finish"])
    out = [f'<text x="{x1}" y="{TOP - 40}" font-weight="bold">Tokens reserved per request</text>',
           f'<text x="{x1}" y="{TOP - 24}" fill="#555">final length, mean; used '
           f'{mean_used:.1f}</text>',
           f'<text x="{xt}" y="{TOP - 40}" font-weight="bold">Waste</text>',
           f'<text x="{xt}" y="{TOP - 24}" fill="#555">at finish / lifetime</text>',
           f'<text x="{x2}" y="{TOP - 40}" font-weight="bold">Requests that fit in '
           f'{budget_gib:g} GiB</text>',
           f'<text x="{x2}" y="{TOP - 24}" fill="#555">mean, whisker: least to most</text>']
    for axis, of, x0, w in ((axis1, bx, x1, W1), (axis2, sx, x2, W2)):
        for v in axis:
            x = of(v)
            out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + height}" '
                       f'stroke="#e4e4e4"/>')
            out.append(f'<text x="{x:.1f}" y="{TOP + height + 16}" text-anchor="middle">'
                       f'{v:g}</text>')
        out.append(f'<line x1="{x0}" y1="{TOP + height}" x2="{x0 + w}" y2="{TOP + height}" '
                   f'stroke="black"/>')
        out.append(f'<line x1="{x0}" y1="{TOP}" x2="{x0}" y2="{TOP + height}" stroke="black"/>')
    out.append(f'<text x="{x1 + W1 / 2}" y="{TOP + height + 34}" text-anchor="middle">tokens per '
               f'request ({per_token // 1024} KiB each in {escape(data["model"]["name"])}, '
               f'{escape(data["model"]["dtype"])})</text>')
    out.append(f'<text x="{x2 + W2 / 2}" y="{TOP + height + 34}" text-anchor="middle">'
               f'requests at once</text>')

    for i, r in enumerate(rows):
        y = TOP + i * ROW
        name = r["layout"]
        used = tokens(r["used_bytes_at_finish"])
        reserved = tokens(r["reserved_bytes_at_finish"])
        if i and rows[i - 1]["layout"].split(",")[0] != name.split(",")[0]:
            out.append(f'<line x1="10" y1="{y}" x2="{x2 + W2}" y2="{y}" stroke="#999" '
                       f'stroke-dasharray="2,3"/>')
        out.append(f'<text x="{LABEL - 8}" y="{y + 16}" text-anchor="end">{escape(name)}</text>')
        tip = (f"{name}: {reserved:.1f} tokens reserved per request at its final length, "
               f"{used:.1f} used; waste {100 * r['waste_at_finish']:.2f} % at finish, "
               f"{100 * r['waste_lifetime']:.2f} % over the lifetime")
        out.append(f'<rect x="{x1}" y="{y + 4}" width="{bx(used) - x1:.1f}" height="{ROW - 8}" '
                   f'fill="{USED}"><title>{escape(tip)}</title></rect>')
        if reserved > used:
            out.append(f'<rect x="{bx(used):.1f}" y="{y + 4}" width="{bx(reserved) - bx(used):.1f}"'
                       f' height="{ROW - 8}" fill="{EMPTY}"><title>{escape(tip)}</title></rect>')
        out.append(f'<text x="{xt}" y="{y + 16}">{100 * r["waste_at_finish"]:.1f} % / '
                   f'{100 * r["waste_lifetime"]:.1f} %</text>')
        mean, lo, hi = r["sequences_mean"], r["sequences_min"], r["sequences_max"]
        tip = (f"{name}: {mean:.1f} requests in {budget_gib:g} GiB on average over "
               f"{r['rounds'] or 'every'} rounds, {lo} to {hi}; {mean / baseline:.2f}x "
               f"{rows[0]['layout']}")
        out.append(f'<rect x="{x2}" y="{y + 4}" width="{sx(mean) - x2:.1f}" height="{ROW - 8}" '
                   f'fill="{USED}"><title>{escape(tip)}</title></rect>')
        if hi > lo:
            yc = y + ROW / 2
            out.append(f'<path d="M{sx(lo):.1f},{yc} H{sx(hi):.1f} M{sx(lo):.1f},{yc - 5} '
                       f'V{yc + 5} M{sx(hi):.1f},{yc - 5} V{yc + 5}" stroke="#333" '
                       f'stroke-width="1.5" fill="none"/>')
        out.append(f'<text x="{max(sx(mean), sx(hi)) + 6:.1f}" y="{y + 16}">{mean:.1f} '
                   f'({mean / baseline:.2f}×)</text>')

    y = TOP + height + 60
    out.append(f'<rect x="{x1}" y="{y - 11}" width="14" height="12" fill="{USED}"/>'
               f'<text x="{x1 + 20}" y="{y}">used</text>')
    out.append(f'<rect x="{x1 + 80}" y="{y - 11}" width="14" height="12" fill="{EMPTY}"/>'
               f'<text x="{x1 + 100}" y="{y}">reserved, empty</text>')
    w = data["workload"]
    width = x2 + W2 + 80
    parts, y = captions(10, y + 24, f"{requests} synthetic requests (seed {w['seed']}): total "
                                    f"length log-normal, median {w['median']}, sigma {w['sigma']}, "
                                    f"clamped to [2, {w['max_len']}] (mean {w['mean_total']:.1f}); "
                                    f"budget {data['budget_tokens']} tokens", width - 10)
    out += parts
    for text in (args.command, args.machine):
        if text:
            parts, y = captions(10, y + 18, text, width - 10)
            out += parts
    write_svg(args.out, width, y + 16, out, background="white")


if __name__ == "__main__":
    main()
