#!/usr/bin/env python3
"""Draws decode attention on a GPU against its memory's limit with matplotlib (Debian's
python3-matplotlib) from bench_cuda_decode's JSON results (bench/results/*-cuda-decode*.json):
the K/V bytes per second of the paged kernel against the context length, one line per batch
size, split-K (solid, the default plan) and a single pass (dashed), with the GPU's nominal peak
bandwidth and its measured device-to-device copy as horizontal lines, and split-K's share of the
peak at each line's end. Uniform batches (every sequence at the context) and ragged ones
(lengths drawn up to the context) in two panels. Each figure is the median of the file's
repetitions; the file records no spread. A point's tooltip gives its times and partitions.
Deterministic: the same file gives the same SVG, byte for byte (no date, a fixed hash salt).

usage: gpu_decode_plot.py OUT.svg RESULTS.json [--command TEXT]
"""
import math

from plot_common import WIDTH_IN, arguments, fail, load_json, pyplot, save, stack

COLOUR = {1: "#4c78a8", 4: "#54a24b", 16: "#f58518", 64: "#e45756"}
CASE_KEYS = ("kind", "batch", "context", "ragged", "single_pass_tbps", "split_k_tbps",
             "single_pass_us", "split_k_us", "split_k_partitions")


def results(path):
    """{(ragged, batch): [(context, single TB/s, split-K TB/s, case)]} of the paged cases in
    context order, and the file's header (GPU, peak, copy, shapes)."""
    data = load_json(path, "bench_cuda_decode's JSON")
    for key in ("gpu", "peak_tbps", "copy_tbps", "cases"):
        if key not in data:
            fail(path, f"bench_cuda_decode's JSON with '{key}'", f"keys {sorted(data)}")
    out = {}
    for i, c in enumerate(data["cases"]):
        missing = [k for k in CASE_KEYS if k not in c]
        if missing:
            fail(path, f"cases with {', '.join(CASE_KEYS)}", f"case {i} without {missing}")
        if c["kind"] == "paged":
            out.setdefault((c["ragged"], c["batch"]), []).append(
                (c["context"], c["single_pass_tbps"], c["split_k_tbps"], c))
    if not out:
        fail(path, "a case of kind 'paged'", f"kinds {sorted({c['kind'] for c in data['cases']})}")
    return {k: sorted(v, key=lambda r: r[0]) for k, v in out.items()}, data


def spread(ys, gap):
    """`ys` (ascending) moved as little as keeps them `gap` apart: each run of values closer
    than that is spaced by `gap` about the run's mean, runs merged until none overlap."""
    runs = [[y] for y in ys]  # each run: its members' wanted positions
    def start(run):
        return sum(run) / len(run) - gap * (len(run) - 1) / 2
    merged = True
    while merged:
        merged = False
        for i in range(1, len(runs)):
            if start(runs[i]) < start(runs[i - 1]) + gap * len(runs[i - 1]):
                runs[i - 1:i + 1] = [runs[i - 1] + runs[i]]
                merged = True
                break
    return [start(run) + gap * j for run in runs for j in range(len(run))]


def k(n):
    return f"{n // 1024}k" if n >= 1024 else str(n)


def main():
    parser = arguments(__doc__, "results", "bench_cuda_decode's JSON", command=True)
    args = parser.parse_args()
    series, data = results(args.results)
    peak, copy = data["peak_tbps"], data["copy_tbps"]
    contexts = sorted({row[0] for rows in series.values() for row in rows})
    # TB/s at the top of the axis, a multiple of 0.5 with room above the peak for its label
    top = math.ceil(peak * 2) / 2 + 0.5

    plt = pyplot()
    from matplotlib.lines import Line2D
    fig, axes = plt.subplots(2, 1, figsize=(WIDTH_IN, 6), dpi=100, sharex=True)
    tips = {}
    ends = {}  # ax -> [[TB/s, colour, text]]: split-K's last point, labelled at the right
    for ax, ragged in zip(axes, (False, True)):
        ax.set_title("ragged batches: lengths drawn up to the context" if ragged
                     else "uniform batches: every sequence at the context",
                     fontsize=10, fontweight="bold", loc="left")
        ax.axhline(peak, color="#333333", lw=1.2, ls=(0, (6, 4)))
        ax.annotate(f"nominal peak {peak:.2f} TB/s", (0.01, peak), xytext=(0, 2),
                    xycoords=ax.get_yaxis_transform(), textcoords="offset points", ha="left",
                    va="bottom", fontsize=9, color="#333333")
        ax.axhline(copy, color="#333333", lw=1.2, ls=(0, (2, 3)))
        ax.annotate(f"device-to-device copy (read + write): {copy:.2f} TB/s", (0.01, copy),
                    xytext=(0, -3), xycoords=ax.get_yaxis_transform(), textcoords="offset points",
                    ha="left", va="top", fontsize=9, color="#333333")
        ends[ax] = []
        for (is_ragged, batch), rows in sorted(series.items()):
            if is_ragged != ragged:
                continue
            colour = COLOUR.get(batch, "#333333")
            xs = [r[0] for r in rows]
            ax.plot(xs, [r[2] for r in rows], "-", color=colour, lw=2)
            ax.plot(xs, [r[1] for r in rows], color=colour, lw=1.5, ls=(0, (5, 3)))
            for n, single, split, case in rows:
                gid = f"b{batch}{'r' if ragged else 'u'}n{n}"
                ax.plot([n], [split], "o", ms=5, color=colour, gid=gid)
                tips[gid] = (f"batch {batch}{' ragged' if ragged else ''}, context {n}: split-K "
                             f"{split:.2f} TB/s ({100 * split / peak:.1f} % of peak, "
                             f"{case['split_k_partitions']} partitions, {case['split_k_us']:.1f} "
                             f"us), single pass {single:.2f} TB/s "
                             f"({case['single_pass_us']:.1f} us)")
            n, _, split, _ = rows[-1]
            at = "" if n == contexts[-1] else f" ({k(n)})"
            ends[ax].append([split, colour, f"{100 * split / peak:.0f} %{at}"])
        ax.set_xscale("log", base=2)
        ax.set_xticks(contexts, [k(n) for n in contexts])
        ax.minorticks_off()
        ax.set_xlim(contexts[0] / 1.25, contexts[-1] * 1.25)
        ax.set_ylim(0, top)
        ax.set_yticks([i / 2 for i in range(int(top * 2) + 1)])
        ax.grid(True, axis="y", color="#e4e4e4", lw=0.8)
        ax.set_axisbelow(True)
        ax.set_ylabel("K/V TB/s")
        # placed once the layout is known (below): where the axes' scale is final
        for end in ends[ax]:
            end.append(ax.text(1.015, end[0], end[2], transform=ax.get_yaxis_transform(),
                               ha="left", va="center", fontsize=9, color=end[1]))
    axes[1].set_xlabel("context length (tokens, log scale)")

    handles = [Line2D([], [], color=c, lw=2, marker="o", ms=5) for c in COLOUR.values()]
    labels = [f"batch {b}" for b in COLOUR]
    handles += [Line2D([], [], color="#333333", lw=2),
                Line2D([], [], color="#333333", lw=1.5, ls=(0, (5, 3)))]
    labels += ["split-K (default)", "single pass"]
    caption = (f"paged decode, {data.get('heads')} query / {data.get('kv_heads')} K/V heads × "
               f"{data.get('head_dim')}, {data.get('dtype')}, blocks of {data.get('block_size')} "
               f"({data.get('layout')}); medians of {data.get('reps')} runs; at the right: "
               f"split-K's share of the peak at the longest context run\n"
               f"{data['gpu']}, {data.get('sm_count', '?')} multiprocessors")
    if args.command:
        caption += "\n" + args.command
    stack(fig, 5.4, caption, [{"handles": handles, "labels": labels, "ncol": 6, "fontsize": 9,
                               "handlelength": 2.5, "columnspacing": 1.2}])
    # the end labels at least 12 px apart (their font is 9 pt), each run of labels too close
    # together spread evenly about its lines' mean
    for ax in axes:
        row = sorted(ends[ax], key=lambda e: e[0])
        for y, text in zip(spread([e[0] for e in row], 12 * top / ax.bbox.height),
                           [e[3] for e in row]):
            text.set_y(y)
    save(fig, args.out, tips)


if __name__ == "__main__":
    main()
