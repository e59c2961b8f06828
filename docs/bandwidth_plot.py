#!/usr/bin/env python3
"""Draws a decode step's speed against the memory's limit with matplotlib (Debian's
python3-matplotlib) from bench_decode_bandwidth's JSON results (Google Benchmark's file, with
repetitions: bench/results/cpu-decode-bandwidth*.json). Two panels, 1 and 2 threads: the K and
V bytes a step reads per second against the context length, MHA and GQA, each point the median
of the repetitions with a bar of ± one standard deviation of them (the file's stddev
aggregate), and the read bandwidth measured in the same run as a dashed line.

Hollow points are steps whose own K and V came partly from the caches: the program also reads
those same bytes with a plain vectorised sum just before timing the step (its counter
fraction_same_bytes), and where that read ran at least CACHED_RATIO times as fast as the read of
the large buffer (read_bandwidth_GBps_threads_T), the bytes did not all come from main memory,
and the dashed line is not the step's limit. The rule uses what the run measured, not the L3
size the machine reports (a virtual machine may report an L3 of hundreds of MiB that the step
does not see). A point's tooltip gives its figures. Deterministic: the same file gives the same
SVG, byte for byte (no date, a fixed hash salt).

usage: bandwidth_plot.py OUT.svg RESULTS.json [--machine TEXT]
"""
import math
import re

from plot_common import WIDTH_IN, arguments, fail, load_json, pyplot, save, stack

COLOUR = {"mha": "#4c78a8", "gqa": "#e45756"}
NAME = {"mha": "MHA 32/32 heads", "gqa": "GQA 32/8 heads"}
# A same-bytes read this much faster than the large buffer's read means the caches served part of
# it. Two reads of main memory minutes apart differ by up to about 1.2x on the machines of
# bench/results (a 512 MiB cache beside a 32 MiB L3 read at 0.79-1.19x the 1 GiB buffer's speed in
# cpu-decode-bandwidth.json), so the threshold sits above that drift.
CACHED_RATIO = 1.25
NAME_RE = re.compile(r"decode_bandwidth/(\w+)/n:(\d+)/threads:(\d+)/")


def results(path):
    """{(shape, threads): [(n, GB/s median, GB/s stddev or None, fraction, K+V MiB, same-bytes
    read GB/s or None)]} in n order, the run's context and the repetitions."""
    data = load_json(path, "bench_decode_bandwidth's JSON (--benchmark_out)", ("benchmarks", "context"))
    medians, spreads, reps = {}, {}, set()
    for b in data["benchmarks"]:
        m = NAME_RE.match(b.get("name", ""))
        kind = b.get("aggregate_name")
        if not m or kind not in ("median", "stddev"):
            continue
        missing = [k for k in ("GB_per_s", "fraction", "kv_MiB") if k not in b]
        if missing:
            fail(path, f"the counters GB_per_s, fraction and kv_MiB in {b['name']}",
                 f"none of {missing}")
        key = (m.group(1), int(m.group(3)), int(m.group(2)))
        if kind == "stddev":
            spreads[key] = b["GB_per_s"]
            continue
        reps.add(b.get("repetitions"))
        same = b.get("fraction_same_bytes")  # absent in runs before the counter existed
        medians[key] = (b["GB_per_s"], b["fraction"], b["kv_MiB"],
                        b["GB_per_s"] / same if same else None)
    if not medians:
        fail(path, "a median of a decode_bandwidth benchmark (run it with "
             "--benchmark_repetitions of 2 or more)", "none")
    for t in (1, 2):
        if f"read_bandwidth_GBps_threads_{t}" not in data["context"]:
            fail(path, f"'read_bandwidth_GBps_threads_{t}' in its context",
                 f"keys {sorted(data['context'])}")
    out = {}
    for (shape, threads, n), (gbps, fraction, mib, same) in sorted(medians.items()):
        out.setdefault((shape, threads), []).append(
            (n, gbps, spreads.get((shape, threads, n)), fraction, mib, same))
    return out, data["context"], sorted(r for r in reps if r)


def main():
    parser = arguments(__doc__, "results", "bench_decode_bandwidth's JSON", machine=True)
    args = parser.parse_args()
    series, context, reps = results(args.results)
    has_same_bytes = all(row[5] is not None for rows in series.values() for row in rows)
    has_spread = all(row[2] is not None for rows in series.values() for row in rows)
    ns = sorted({row[0] for rows in series.values() for row in rows})
    limits = {t: float(context[f"read_bandwidth_GBps_threads_{t}"]) for t in (1, 2)}
    top = max(max(g + (s or 0) for rows in series.values() for _, g, s, *_ in rows),
              max(limits.values()))
    top = math.ceil(top * 1.08 / 10) * 10  # GB/s at the top of the axis, room for the labels

    plt = pyplot()
    from matplotlib.lines import Line2D
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH_IN, 4), dpi=100, sharey=True)
    tips = {}
    for ax, threads in zip(axes, (1, 2)):
        limit = limits[threads]
        ax.set_title(f"{threads} thread{'s' if threads > 1 else ''}: K+V bytes read per second\n"
                     f"dashed: memory read, {limit:.1f} GB/s", fontsize=10)
        ax.axhline(limit, color="#333333", lw=1.2, ls=(0, (6, 4)), zorder=1,
                   gid=f"limit{threads}")
        tips[f"limit{threads}"] = f"read bandwidth, {threads} thread(s): {limit:.1f} GB/s"
        for shape in ("mha", "gqa"):
            rows = series.get((shape, threads), [])
            if not rows:
                continue
            colour = COLOUR[shape]
            xs, ys = [r[0] for r in rows], [r[1] for r in rows]
            ax.plot(xs, ys, "-", color=colour, lw=2, zorder=2)
            if has_spread:
                ax.errorbar(xs, ys, yerr=[r[2] for r in rows], fmt="none", ecolor=colour,
                            elinewidth=1.2, capsize=3, zorder=2)
            for n, g, sd, fraction, mib, same in rows:
                cached = has_same_bytes and same >= CACHED_RATIO * limit
                gid = f"{shape}{threads}n{n}"
                ax.plot([n], [g], "o", ms=7, mew=2, color=colour,
                        markerfacecolor="none" if cached else colour, zorder=3, gid=gid)
                read = (f"; a plain read of the same bytes {same:.1f} GB/s, {same / limit:.2f}x "
                        f"the large buffer's" if same else "")
                spread = f" ± {sd:.2f} (one standard deviation)" if sd is not None else ""
                tips[gid] = (f"{NAME[shape]}, n = {n} ({mib:g} MiB of K+V): {g:.1f} GB/s{spread}, "
                             f"{fraction:.2f} of the read bandwidth{read}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [f"{n // 1024}k" if n >= 1024 else str(n) for n in ns])
        ax.minorticks_off()
        ax.set_xlim(ns[0] / 1.3, ns[-1] * 1.3)
        ax.set_ylim(0, top)
        ax.set_yticks(range(0, top + 1, 10))
        ax.grid(True, axis="y", color="#e4e4e4", lw=0.8)
        ax.set_axisbelow(True)
        ax.set_xlabel("context length (tokens, log scale)")
    axes[0].set_ylabel("GB/s")
    axes[1].tick_params(labelleft=True)

    handles = [Line2D([], [], color=COLOUR[s], lw=2, marker="o", ms=7) for s in COLOUR]
    labels = [f"{NAME[s]}, fp32, head_dim 128" for s in COLOUR]
    if has_same_bytes:
        buffer = context.get("read_bandwidth_buffer_MiB", "?")
        handles.append(Line2D([], [], ls="none", marker="o", ms=7, mew=2, color="#333333",
                              markerfacecolor="none"))
        labels.append(f"hollow: partly from the caches (a plain read\n"
                      f"of the same K+V ran ≥ {CACHED_RATIO:g}× as fast as one of {buffer} MiB)")
    handles.append(Line2D([], [], color="#333333", lw=1.2, ls=(0, (6, 4))))
    labels.append("the read bandwidth measured in the same run")
    max_sd = max((row[2] or 0) for rows in series.values() for row in rows)
    caption = "bench_decode_bandwidth, one layer's decode step: "
    caption += (f"points are medians of {'/'.join(map(str, reps)) or 'the'} repetitions, bars "
                f"± one standard deviation of them (at most {max_sd:.2g} GB/s)"
                if has_spread else
                "medians (this file records no spread of the repetitions)")
    if not has_same_bytes:
        caption += ("; every point filled: this run did not record a read of each step's own "
                    "bytes (fraction_same_bytes)")
    if args.machine:
        caption += "\n" + args.machine
    stack(fig, 3.5, caption, [{"handles": handles, "labels": labels, "ncol": 2, "fontsize": 9,
                               "columnspacing": 1.5}])
    save(fig, args.out, tips)


if __name__ == "__main__":
    main()
