#!/usr/bin/env python3
"""Draws KV-cache memory waste and concurrency, contiguous preallocation vs paging, with
matplotlib (Debian's python3-matplotlib) from bench_memory_waste's JSON results
(bench/results/cpu-memory-waste.json): one row per layout; left, the tokens a request reserves
at its final length (mean over the workload) split into the tokens it uses and the ones it
leaves empty; in the middle the waste at finish and over the lifetime; right, how many requests
fit in the memory budget (mean over the rounds, with the least and the most as a whisker, and
the mean over the first layout's). Counts of a replayed workload, not timings. A bar's tooltip
gives its figures. Deterministic: the same file gives the same SVG, byte for byte (no date, a
fixed hash salt).

usage: kv_waste_plot.py OUT.svg RESULTS.json [--machine TEXT] [--command TEXT]
"""

from plot_common import WIDTH_IN, arguments, fail, lines, load_json, pyplot, save, stack

USED, EMPTY = "#4c78a8", "#f2b8b5"  # used tokens; reserved and empty
LAYOUT_KEYS = ("layout", "reserved_bytes_at_finish", "used_bytes_at_finish", "waste_at_finish",
               "waste_lifetime", "sequences_mean", "sequences_min", "sequences_max", "rounds")


def layouts(path):
    """The JSON's layouts, its request count, model and budget; a clear error if any is missing."""
    data = load_json(path, "bench_memory_waste's JSON")
    for key in ("layouts", "workload", "model", "budget_bytes", "budget_tokens"):
        if key not in data:
            fail(path, f"a bench_memory_waste result with '{key}'", f"keys {sorted(data)}")
    if not data["layouts"]:
        fail(path, "at least one layout in 'layouts'", "an empty list")
    for i, r in enumerate(data["layouts"]):
        missing = [k for k in LAYOUT_KEYS if k not in r]
        if missing:
            fail(path, f"layouts with {', '.join(LAYOUT_KEYS)}", f"layout {i} without {missing}")
    for key in ("requests", "seed", "median", "sigma", "max_len", "mean_total"):
        if key not in data["workload"]:
            fail(path, f"'{key}' in 'workload'", f"keys {sorted(data['workload'])}")
    for key in ("name", "dtype", "bytes_per_token"):
        if key not in data["model"]:
            fail(path, f"'{key}' in 'model'", f"keys {sorted(data['model'])}")
    return data


def main():
    parser = arguments(__doc__, "results", "bench_memory_waste's JSON", machine=True, command=True)
    args = parser.parse_args()
    data = layouts(args.results)
    rows = data["layouts"]
    requests = data["workload"]["requests"]
    per_token = data["model"]["bytes_per_token"]
    budget_gib = data["budget_bytes"] / 2**30
    baseline = rows[0]["sequences_mean"]  # the first layout: contiguous, max_len

    def tokens(bytes_total):  # mean tokens per request
        return bytes_total / per_token / requests

    plt = pyplot()
    from matplotlib.patches import Patch
    fig, (left, middle, right) = plt.subplots(
        1, 3, figsize=(WIDTH_IN, 4), dpi=100, sharey=True,
        gridspec_kw={"width_ratios": [1.5, 1.0, 1.6]})
    ys = list(range(len(rows)))
    tips = {}
    top2 = max(r["sequences_max"] for r in rows)
    for i, r in enumerate(rows):
        name = r["layout"]
        used = tokens(r["used_bytes_at_finish"])
        reserved = tokens(r["reserved_bytes_at_finish"])
        tip = (f"{name}: {reserved:.1f} tokens reserved per request at its final length, "
               f"{used:.1f} used; waste {100 * r['waste_at_finish']:.2f} % at finish, "
               f"{100 * r['waste_lifetime']:.2f} % over the lifetime")
        left.barh(i, used, height=0.66, color=USED, gid=f"used{i}")
        tips[f"used{i}"] = tip
        if reserved > used:
            left.barh(i, reserved - used, left=used, height=0.66, color=EMPTY, gid=f"empty{i}")
            tips[f"empty{i}"] = tip
        middle.text(0.5, i, f"{100 * r['waste_at_finish']:.1f} % / "
                    f"{100 * r['waste_lifetime']:.1f} %", ha="center", va="center", fontsize=9)
        mean, lo, hi = r["sequences_mean"], r["sequences_min"], r["sequences_max"]
        right.barh(i, mean, height=0.66, color=USED, gid=f"fit{i}")
        tips[f"fit{i}"] = (f"{name}: {mean:.1f} requests in {budget_gib:g} GiB on average over "
                           f"{r['rounds'] or 'every'} rounds, {lo} to {hi}; {mean / baseline:.2f}x "
                           f"{rows[0]['layout']}")
        if hi > lo:
            right.errorbar([mean], [i], xerr=[[mean - lo], [hi - mean]], fmt="none",
                           ecolor="#333333", elinewidth=1.5, capsize=4)
        right.text(max(mean, hi) + top2 * 0.05, i, f"{mean:.1f} ({mean / baseline:.2f}×)",
                   va="center", ha="left", fontsize=9)
        if i and rows[i - 1]["layout"].split(",")[0] != name.split(",")[0]:
            for ax in (left, middle, right):
                ax.axhline(i - 0.5, color="#999999", lw=1, ls=(0, (2, 3)))
    left.set_yticks(ys, [r["layout"] for r in rows], fontsize=9)
    left.set_ylim(len(rows) - 0.5, -0.5)  # the first layout on top
    mean_used = tokens(rows[0]["used_bytes_at_finish"])
    # right-aligned: over the layouts' names, not over the next panel
    left.set_title(f"Tokens reserved per request\nfinal length, mean; used {mean_used:.1f}",
                   fontsize=10, loc="right")
    left.set_xlabel(f"tokens per request\n({per_token // 1024} KiB each in "
                    f"{data['model']['name']}, {data['model']['dtype']})")
    middle.set_title("Waste\nat finish / lifetime", fontsize=10)
    middle.set_xlim(0, 1)
    middle.set_xticks([])
    middle.tick_params(left=False)
    for side in middle.spines.values():
        side.set_visible(False)
    right.set_title(f"Requests that fit in {budget_gib:g} GiB\nmean, whisker: least to most",
                    fontsize=10, loc="left")
    right.set_xlabel("requests at once\n(× the first layout's mean)")
    right.set_xlim(0, top2 * 1.6)
    right.tick_params(left=False)
    for ax in (left, right):
        ax.grid(True, axis="x", color="#e4e4e4", lw=0.8)
        ax.set_axisbelow(True)
        ax.spines["top"].set_visible(False)
        ax.spines["right"].set_visible(False)
    right.set_xticks([t for t in right.get_xticks() if t <= top2 * 1.1])

    w = data["workload"]
    caption = (f"{requests} synthetic requests (seed {w['seed']}): total length log-normal, "
               f"median {w['median']}, sigma {w['sigma']}, clamped to [2, {w['max_len']}] "
               f"(mean {w['mean_total']:.1f}); budget {data['budget_tokens']} tokens")
    caption = lines(caption, args.command, args.machine)
    stack(fig, 4.1, caption, [{"handles": [Patch(color=USED), Patch(color=EMPTY)],
                               "labels": ["used", "reserved, empty"], "ncol": 2, "fontsize": 9}],
          w_pad=0.4)
    save(fig, args.out, tips)


if __name__ == "__main__":
    main()
