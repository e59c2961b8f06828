#!/usr/bin/env python3
"""Draws serving throughput and concurrency, static vs continuous batching (and continuous
scheduling over contiguous preallocation), as SVG from bench_serving's JSON results (the file
committed in bench/results): one panel per model with the generated tokens per second of each
policy on 1 and 2 threads (medians), continuous / static above each group; and a panel with the
requests each policy ran per step while others were waiting (exact, from the step logs).
Standard library only, so the docs build needs nothing more.

usage: serving_svg.py OUT.svg RESULTS.json [--machine TEXT] [--command TEXT]
"""
import json
import math
from xml.sax.saxutils import escape

from svg_common import caption, captions, write_svg, plot_arguments

# policy -> (JSON key of its tokens/s, JSON key of its requests running while others wait,
#            legend text, colour)
POLICIES = [
    ("static", "static_tok_s", "loaded_running_static", "static batching", "#bab0ac"),
    ("continuous", "continuous_tok_s", "loaded_running_paged", "continuous batching, paged",
     "#4c78a8"),
    ("contiguous", "contiguous_tok_s", "loaded_running_contiguous",
     "continuous, contiguous preallocation", "#f58518"),
]
W, H, LEFT, TOP, GAP = 180, 200, 64, 56, 60  # one panel's plot area and the margins
BAR = 18


def results(path):
    """{model: {threads: row}} in the file's order, and the run's settings."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not data.get("results"):
        raise SystemExit(f"{path}: expected bench_serving's JSON with a non-empty 'results' list")
    out = {}
    for r in data["results"]:
        missing = [k for _, tok, run, *_ in POLICIES for k in (tok, run) if k not in r]
        if missing:
            raise SystemExit(f"{path}: a result of {r.get('model')} lacks {missing}")
        out.setdefault(r["model"], {})[r["threads"]] = r
    return out, data


def nice_axis(value):
    """(top, step): about five round steps (1, 2, 2.5 or 5 times a power of ten) up to value."""
    rough = value / 5
    p = 10 ** math.floor(math.log10(rough))
    step = next(m * p for m in (1, 2, 2.5, 5, 10) if m * p >= rough)
    return step * math.ceil(value / step), step


def axis(x0, top, step, label):
    out = []
    for i in range(round(top / step) + 1):
        v = step * i
        y = TOP + H - v / top * H
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + W}" y2="{y:.1f}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{v:g}</text>')
    out.append(f'<line x1="{x0}" y1="{TOP}" x2="{x0}" y2="{TOP + H}" stroke="black"/>')
    out.append(f'<line x1="{x0}" y1="{TOP + H}" x2="{x0 + W}" y2="{TOP + H}" stroke="black"/>')
    out.append(f'<text x="{x0 - 46}" y="{TOP + H / 2}" text-anchor="middle" '
               f'transform="rotate(-90 {x0 - 46} {TOP + H / 2})">{label}</text>')
    return out


def bars(x0, top, groups):
    """groups: [(group label, [(value, colour, tip)], note above)] as bars side by side."""
    out = []
    width = W / len(groups)
    for g, (label, values, note) in enumerate(groups):
        xg = x0 + g * width + (width - BAR * len(values)) / 2
        for i, (v, colour, tip) in enumerate(values):
            h = v / top * H
            out.append(f'<rect x="{xg + i * BAR:.1f}" y="{TOP + H - h:.1f}" width="{BAR - 2}" '
                       f'height="{h:.1f}" fill="{colour}"><title>{escape(tip)}</title></rect>')
        xc = x0 + (g + 0.5) * width
        out.append(f'<text x="{xc:.1f}" y="{TOP + H + 16}" text-anchor="middle">{label}</text>')
        if note:
            ymax = TOP + H - max(v for v, *_ in values) / top * H
            out.append(f'<text x="{xc:.1f}" y="{ymax - 6:.1f}" text-anchor="middle" '
                       f'font-weight="bold">{note}</text>')
    return out


def panel_title(x0, title, subtitle):
    """A panel's bold title and its grey subtitle, above the plot area that starts at x0."""
    return [f'<text x="{x0 - 50}" y="{TOP - 34}" font-weight="bold">{escape(title)}</text>',
            f'<text x="{x0 - 50}" y="{TOP - 18}" fill="#555">{escape(subtitle)}</text>']


def main():
    p = plot_arguments(__doc__)
    args = p.parse_args()
    series, data = results(args.results)
    out = []
    x0 = LEFT
    for model, by_threads in series.items():
        top, step = nice_axis(1.12 * max(r[tok] for r in by_threads.values()
                                         for _, tok, *_ in POLICIES))
        out += panel_title(x0, f"{model}: throughput", f"medians of {data['reps']} runs")
        out += axis(x0, top, step, "generated tokens/s")
        groups = []
        for threads, r in sorted(by_threads.items()):
            values = [(r[tok], colour, f"{model}, {threads} thread(s), {text}: {r[tok]:.1f} tok/s")
                      for _, tok, _, text, colour in POLICIES]
            groups.append((f"{threads} thread{'s' if threads > 1 else ''}", values,
                           f"{r['continuous_over_static']:.2f}×"))
        out += bars(x0, top, groups)
        x0 += W + GAP
    # Concurrency: exact, the same for every thread count; one group per model.
    top, step = nice_axis(1.12 * max(r[run] for m in series.values() for r in m.values()
                                     for _, _, run, *_ in POLICIES))
    out += panel_title(x0, "Requests running while others wait",
                       "exact, from the step logs")
    out += axis(x0, top, step, "requests per step (mean)")
    groups = []
    for model, by_threads in series.items():
        r = next(iter(by_threads.values()))
        values = [(r[run], colour, f"{model}, {text}: {r[run]:.1f} requests per step while "
                                   f"others were waiting")
                  for _, _, run, text, colour in POLICIES]
        groups.append((escape(model), values, ""))
    out += bars(x0, top, groups)
    for g, (model, by_threads) in enumerate(series.items()):
        r = next(iter(by_threads.values()))
        width = W / len(series)
        xg = x0 + g * width + (width - BAR * len(POLICIES)) / 2
        for i, (_, _, run, _, _) in enumerate(POLICIES):
            y = TOP + H - r[run] / top * H
            out.append(f'<text x="{xg + i * BAR + BAR / 2 - 1:.1f}" y="{y - 4:.1f}" '
                       f'text-anchor="middle" font-size="10">{r[run]:.0f}</text>')
    right = x0 + W
    y = TOP + H + 44
    x = LEFT - 50
    for i, (_, _, _, text, colour) in enumerate(POLICIES):  # two entries a line
        xi, yi = x + (i % 2) * 300, y + (i // 2) * 18
        out.append(f'<rect x="{xi}" y="{yi - 11}" width="14" height="12" fill="{colour}"/>'
                   f'<text x="{xi + 20}" y="{yi}">{text}</text>')
    y += 18 * ((len(POLICIES) - 1) // 2)
    out.append(f'<text x="{x + 300 * (len(POLICIES) % 2)}" y="{y}"><tspan font-weight="bold">'
               f'n×</tspan>: continuous / static</text>')
    width = right + 20
    parts, y = captions(LEFT - 50, y + 24, f"{data['requests']} requests arriving together, a "
                        f"pool of {data['pool_tokens']} tokens in blocks of "
                        f"{data['block_size']}, at most {data['max_running']} "
                        f"running; medians of {data['reps']}", width - 10)
    out += parts
    for text in (args.command, args.machine):
        if text:
            parts, y = captions(LEFT - 50, y + 18, text, width - 10)
            out += parts
    write_svg(args.out, width, y + 16, out, background="white")


if __name__ == "__main__":
    main()
