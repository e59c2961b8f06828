#!/usr/bin/env python3
"""Draws the headline plot (the landing page's and tutorial 02's) from a committed run of kvlab-gap.

kvlab-gap prints two tables: whole generations of n tokens (K/V projections, exact; times, medians)
and single decode steps at context n, each followed by the spread of its times (the fastest and the
slowest run), which the time panels draw as bars (a run saved before kvlab-gap printed it has
none, and the caption says so). This reads them from its saved output (bench/results/
cpu-kvlab-gap-*.txt) and draws four log-log panels with matplotlib (Debian's python3-matplotlib):
projections and time of whole generations, then of one step, for the naive and the cached decoder,
each line with its least-squares slope of log y on log n (kvlab-gap's own fit). The times are a
committed run's, never one made while the docs build shares the cores; the counts are exact.
Deterministic: the same table gives the same file (no date, a fixed hash salt).

usage: gap_plot.py OUT.svg RUN.txt [--machine TEXT] [--opaque]
"""
import argparse
import math
import re
import sys

WIDTH_IN = 7.6  # inches at 100 dpi: 760 px, the docs' column beside the table of contents
NAIVE, CACHED = "#d62728", "#1f77b4"


def tables(text):
    """The two tables of kvlab-gap's output: [(n, naive proj, cached proj, naive ms, cached ms)]
    for whole generations and [(n, naive proj, cached proj, naive µs, cached µs)] for steps."""
    whole, steps, current = [], [], None
    for line in text.splitlines():
        if line.startswith("     n |") and current is None:
            current = whole
            continue
        if line.startswith("     n |") and current is whole:
            current = steps
            continue
        cells = [c.split() for c in line.split("|")]
        if current is None or len(cells) < 4 or not cells[0] or not cells[0][0].isdigit():
            continue
        n = int(cells[0][0])
        proj = [int(v) for v in cells[1][:2]]
        times = [float(v) for v in cells[3][:2]]
        current.append((n, proj[0], proj[1], times[0], times[1]))
    return whole, steps


def spreads(text):
    """The spread lines of kvlab-gap's output: ({n: (naive least, most, cached least, most)} of
    whole generations, the same of single steps); empty where the run did not print them."""
    number = r"([0-9.]+) to ([0-9.]+)"
    pattern = rf"^  (step at )?n = (\d+): naive {number}, cached {number}$"
    whole, steps = {}, {}
    for m in re.finditer(pattern, text, re.M):
        (steps if m.group(1) else whole)[int(m.group(2))] = tuple(float(v) for v in m.groups()[2:])
    return whole, steps


def slope(xs, ys):
    """The least-squares slope of log y on log x (0 for a constant)."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    den = sum((x - mx) ** 2 for x in lx)
    return sum((x - mx) * (y - my) for x, y in zip(lx, ly)) / den if den else 0.0


def panel(ax, rows, naive, cached, title, exact, spread=None):
    """One log-log panel; `spread`: {n: (naive least, most, cached least, most)}, drawn as bars."""
    ns = [r[0] for r in rows]
    for i, (column, name, colour) in enumerate(((naive, "naive (no cache)", NAIVE),
                                                 (cached, "cached", CACHED))):
        ys = [r[column] for r in rows]
        ax.plot(ns, ys, "o-", color=colour, lw=2, ms=4,
                label=f"{name}: slope {slope(ns, ys):.2f}")
        if spread and all(n in spread for n in ns):
            low = [max(0.0, y - spread[n][2 * i]) for n, y in zip(ns, ys)]
            high = [max(0.0, spread[n][2 * i + 1] - y) for n, y in zip(ns, ys)]
            ax.errorbar(ns, ys, yerr=[low, high], fmt="none", ecolor=colour, elinewidth=1.2,
                        capsize=3)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.minorticks_off()
    ax.set_title(title + (" (exact)" if exact else ""), fontsize=11)
    ax.grid(True, color="#dddddd", lw=0.6)
    ax.legend(loc="best", fontsize=10, frameon=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("run", help="kvlab-gap's saved output")
    parser.add_argument("--machine", default="", help="the processor, for the caption")
    parser.add_argument("--opaque", action="store_true",
                        help="a white background (the README's copy; the docs' is transparent)")
    args = parser.parse_args()
    with open(args.run, encoding="utf-8") as f:
        text = f.read()
    whole, steps = tables(text)
    if len(whole) < 2 or len(steps) < 2:
        sys.exit(f"gap_plot.py: {args.run}: expected kvlab-gap's two tables of at least 2 rows, "
                 f"got {len(whole)} and {len(steps)}")
    config = re.search(r"^config: (.*)$", text, re.M)
    import matplotlib
    matplotlib.use("svg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"svg.hashsalt": "kvlab", "font.size": 10, "svg.fonttype": "none"})
    fig, axes = plt.subplots(2, 2, figsize=(WIDTH_IN, 6.6), dpi=100)
    panel(axes[0][0], whole, 1, 2, "K/V projections, whole generation", True)
    whole_spread, step_spread = spreads(text)
    panel(axes[0][1], whole, 3, 4, "time of the generation, ms (median)", False, whole_spread)
    panel(axes[1][0], steps, 1, 2, "K/V projections, one step", True)
    panel(axes[1][1], steps, 3, 4, "time of one step, µs (median)", False, step_spread)
    for ax in axes[0]:
        ax.set_xlabel("n (generated tokens)")
    for ax in axes[1]:
        ax.set_xlabel("n (context of the step)")
    caption = "kvlab-gap"
    if config:
        caption += ": " + config.group(1).split(";")[0]
    if whole_spread and step_spread:
        caption += "; bars: the fastest and the slowest run"
    else:
        caption += "; this run recorded no spread of its times"
    if args.machine:
        caption += "; " + args.machine
    fig.text(0.01, 0.01, caption, fontsize=9, color="#555555", wrap=True)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(args.out, format="svg", metadata={"Date": None, "Creator": None},
                transparent=not args.opaque, facecolor="white")


if __name__ == "__main__":
    main()
