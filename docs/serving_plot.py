#!/usr/bin/env python3
"""Draws serving throughput and concurrency, static vs continuous batching (and continuous
scheduling over contiguous preallocation), with matplotlib (Debian's python3-matplotlib) from
bench_serving's JSON results (bench/results/cpu-serving.json): one panel per model with the
generated tokens per second of each policy on 1 and 2 threads (medians of the file's
repetitions; it records no spread), continuous / static above each group; and a panel with the
requests each policy ran per step while others were waiting (exact, from the step logs). A
bar's tooltip gives its figure. Deterministic: the same file gives the same SVG, byte for byte
(no date, a fixed hash salt).

usage: serving_plot.py OUT.svg RESULTS.json [--machine TEXT] [--command TEXT]
"""
import math

from plot_common import WIDTH_IN, arguments, fail, lines, load_json, pyplot, save, stack

# policy -> (JSON key of its tokens/s, JSON key of its requests running while others wait,
#            legend text, colour)
POLICIES = [
    ("static", "static_tok_s", "loaded_running_static", "static batching", "#bab0ac"),
    ("continuous", "continuous_tok_s", "loaded_running_paged", "continuous batching, paged",
     "#4c78a8"),
    ("contiguous", "contiguous_tok_s", "loaded_running_contiguous",
     "continuous, contiguous preallocation", "#f58518"),
]
BAR = 0.26  # a bar's width, in groups


def results(path):
    """{model: {threads: row}} in the file's order, and the run's settings."""
    data = load_json(path, "bench_serving's JSON", ("results",))
    if not data["results"]:
        fail(path, "bench_serving's JSON with a non-empty 'results' list", "an empty list")
    for key in ("reps", "requests", "pool_tokens", "block_size", "max_running"):
        if key not in data:
            fail(path, f"bench_serving's JSON with '{key}'", f"keys {sorted(data)}")
    out = {}
    for r in data["results"]:
        missing = [k for _, tok, run, *_ in POLICIES for k in (tok, run) if k not in r]
        missing += [k for k in ("model", "threads", "continuous_over_static") if k not in r]
        if missing:
            fail(path, "results with each policy's tokens/s and requests running",
                 f"a result of {r.get('model')} without {missing}")
        out.setdefault(r["model"], {})[r["threads"]] = r
    return out, data


def nice_top(value):
    """A round top for an axis (1, 2, 2.5 or 5 times a power of ten, in about five steps) at or
    above value."""
    rough = value / 5
    p = 10 ** math.floor(math.log10(rough))
    step = next(m * p for m in (1, 2, 2.5, 5, 10) if m * p >= rough)
    return step * math.ceil(value / step)


def bars(ax, groups, tips, gid):
    """groups: [(label, [(value, colour, tip)], note above or "", numbers above the bars)] as
    bars side by side, one group a unit."""
    for g, (label, values, note, numbers) in enumerate(groups):
        offset = -BAR * (len(values) - 1) / 2
        for i, (v, colour, tip) in enumerate(values):
            x = g + offset + i * BAR
            ax.bar([x], [v], width=BAR * 0.9, color=colour, gid=f"{gid}{g}_{i}")
            tips[f"{gid}{g}_{i}"] = tip
            if numbers:
                ax.annotate(f"{v:.0f}", (x, v), xytext=(0, 2), textcoords="offset points",
                            ha="center", va="bottom", fontsize=9)
        if note:
            ax.annotate(note, (g, max(v for v, *_ in values)), xytext=(0, 3),
                        textcoords="offset points", ha="center", va="bottom", fontsize=10,
                        fontweight="bold")
    ax.set_xticks(range(len(groups)), [g[0] for g in groups])
    ax.set_xlim(-0.55, len(groups) - 0.45)
    ax.tick_params(axis="x", length=0)
    ax.grid(True, axis="y", color="#e4e4e4", lw=0.8)
    ax.set_axisbelow(True)
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)


def main():
    parser = arguments(__doc__, "results", "bench_serving's JSON", machine=True, command=True)
    args = parser.parse_args()
    series, data = results(args.results)

    plt = pyplot()
    from matplotlib.patches import Patch
    # a panel per model, two a row, then the concurrency panel and the legend beside it
    models = list(series)
    rows = (len(models) + 1 + 1) // 2
    fig, grid = plt.subplots(rows, 2, figsize=(WIDTH_IN, 3 * rows), dpi=100, squeeze=False)
    cells = [ax for row in grid for ax in row]
    tips = {}
    for m, (model, by_threads) in enumerate(series.items()):
        ax = cells[m]
        top = nice_top(1.15 * max(r[tok] for r in by_threads.values() for _, tok, *_ in POLICIES))
        groups = []
        for threads, r in sorted(by_threads.items()):
            values = [(r[tok], colour, f"{model}, {threads} thread(s), {text}: {r[tok]:.1f} tok/s")
                      for _, tok, _, text, colour in POLICIES]
            groups.append((f"{threads} thread{'s' if threads > 1 else ''}", values,
                           f"{r['continuous_over_static']:.2f}×", False))
        bars(ax, groups, tips, f"tok{m}_")
        ax.set_ylim(0, top)
        ax.set_ylabel("generated tokens/s")
        ax.set_title(f"{model}: throughput\nmedians of {data['reps']} runs", fontsize=10,
                     loc="left")
    # Concurrency: exact, the same for every thread count; one group per model.
    ax = cells[len(models)]
    top = nice_top(1.15 * max(r[run] for m in series.values() for r in m.values()
                              for _, _, run, *_ in POLICIES))
    groups = []
    for model, by_threads in series.items():
        r = next(iter(by_threads.values()))
        values = [(r[run], colour, f"{model}, {text}: {r[run]:.1f} requests per step while "
                                   f"others were waiting")
                  for _, _, run, text, colour in POLICIES]
        groups.append((model, values, "", True))
    bars(ax, groups, tips, "run")
    ax.set_ylim(0, top)
    ax.set_ylabel("requests per step (mean)")
    ax.set_title("Requests running while others wait\nexact, from the step logs", fontsize=10,
                 loc="left")
    # the legend in the cell beside it, and nothing in any cell left over
    key = cells[len(models) + 1]
    key.axis("off")
    handles = [Patch(color=colour) for *_, colour in POLICIES]
    labels = [text for _, _, _, text, _ in POLICIES]
    handles.append(Patch(color="none"))
    labels.append("n× above a group: continuous / static")
    key.legend(handles, labels, loc="center left", fontsize=9, frameon=False)
    for ax in cells[len(models) + 2:]:
        ax.axis("off")
    caption = (f"{data['requests']} requests arriving together, a pool of {data['pool_tokens']} "
               f"tokens in blocks of {data['block_size']}, at most {data['max_running']} running; "
               f"tokens/s: medians of {data['reps']} runs (the file records no spread)")
    caption = lines(caption, args.command, args.machine)
    stack(fig, 3.0 * rows, caption, h_pad=1.5, w_pad=1.5)
    save(fig, args.out, tips)


if __name__ == "__main__":
    main()
