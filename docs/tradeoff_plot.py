#!/usr/bin/env python3
"""Draws the storage-precision trade-off with matplotlib (Debian's python3-matplotlib) from
bench_kv_dtype's JSON results (bench/results/cpu-kv-dtype*.json): for each precision, the bits
it stores per value against (left) the largest error of the attention output it gives, relative
to fp32 storage, and (right) its decode step time relative to fp32 (medians of the file's
repetitions; it records no spread), with the time a purely memory-bound step would take (the
bytes ratio) as a dashed line. One context length and thread count; MHA and GQA as two marks;
fp16 and bf16, both 16 bits, drawn a little apart. A mark's tooltip gives its figure.
Deterministic: the same file gives the same SVG, byte for byte (no date, a fixed hash salt).

usage: tradeoff_plot.py OUT.svg RESULTS.json [--n N] [--threads T] [--machine TEXT]
"""
import math

from plot_common import WIDTH_IN, arguments, fail, load_json, pyplot, save, stack

BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8.5, "int4": 4.5}  # with the block scales
# Marks drawn a little apart, in octaves of the bits axis, so that none covers another: the two
# 16-bit types either side of 16, and MHA just left of GQA.
NUDGE = {"fp16": -0.15, "bf16": 0.15, "mha": -0.06, "gqa": 0.06}
COLOUR = {"fp32": "#4c78a8", "fp16": "#f58518", "bf16": "#54a24b", "int8": "#b279a2",
          "int4": "#e45756"}
SHAPE = {"mha": ("MHA 32/32", "o"), "gqa": ("GQA 32/8", "s")}
ROW_KEYS = ("shape", "n", "threads", "kv_dtype", "error_vs_fp32", "time_ratio_to_fp32",
            "bytes_ratio_to_fp32")
LO, HI = 1e-7, 1e-2  # the error axis; an error outside it is drawn at its end
TIME_TOP = 2.0       # the time axis, 0 to this


def results(path, n, threads):
    """The rows of bench_kv_dtype's JSON at context n and `threads` threads, and its
    repetitions."""
    data = load_json(path, "bench_kv_dtype's JSON", ("results",))
    for i, r in enumerate(data["results"]):
        missing = [k for k in ROW_KEYS if k not in r]
        if missing:
            fail(path, f"results with {', '.join(ROW_KEYS)}", f"result {i} without {missing}")
        if r["kv_dtype"] not in BITS or r["shape"] not in SHAPE:
            fail(path, f"a kv_dtype of {', '.join(BITS)} and a shape of {', '.join(SHAPE)}",
                 f"result {i}: {r['kv_dtype']}, {r['shape']}")
    rows = [r for r in data["results"] if r["n"] == n and r["threads"] == threads]
    if not rows:
        have = sorted({(r["n"], r["threads"]) for r in data["results"]})
        fail(path, f"results for n = {n}, {threads} thread(s)",
             f"only (n, threads) {have}" if have else "no results")
    return rows, data.get("reps")


def mark(ax, shape, dtype, y, gid):
    """MHA a filled circle, GQA a hollow square, in the precision's colour."""
    colour = COLOUR[dtype]
    x = BITS[dtype] * 2 ** (NUDGE.get(dtype, 0) + NUDGE[shape])
    ax.plot([x], [y], SHAPE[shape][1], ms=8, mew=2, color=colour,
            markerfacecolor=colour if shape == "mha" else "none", zorder=3, gid=gid)


def bits_axis(ax):
    ax.set_xscale("log", base=2)
    ax.set_xlim(3.6, 40)
    ax.set_xticks([4, 8, 16, 32], ["4", "8", "16", "32"])
    ax.minorticks_off()
    ax.set_xlabel("bits stored per value (scales included)")
    ax.grid(True, color="#eeeeee", lw=0.8)
    ax.set_axisbelow(True)


def main():
    parser = arguments(__doc__, "results", "bench_kv_dtype's JSON", machine=True)
    parser.add_argument("--n", type=int, default=32768, help="the context length drawn")
    parser.add_argument("--threads", type=int, default=1, help="the thread count drawn")
    args = parser.parse_args()
    rows, reps = results(args.results, args.n, args.threads)

    plt = pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    fig, (left, right) = plt.subplots(1, 2, figsize=(WIDTH_IN, 4), dpi=100)
    tips = {}
    # Left: the error against bits, log scale (fp32 itself: 0, not drawn).
    for i, r in enumerate(rows):
        if r["error_vs_fp32"] <= 0:
            continue
        mark(left, r["shape"], r["kv_dtype"], min(max(r["error_vs_fp32"], LO), HI), f"err{i}")
        tips[f"err{i}"] = f"{r['shape']} {r['kv_dtype']}: {r['error_vs_fp32']:.3g}"
    left.set_yscale("log")
    left.set_ylim(LO, HI)
    decades = range(round(math.log10(LO)), round(math.log10(HI)) + 1)
    left.set_yticks([10.0 ** e for e in decades], [f"1e{e}" for e in decades])
    left.minorticks_off()
    left.set_title("largest |error| of the output vs fp32 storage\n(fp32's own: 0, not drawn)",
                   fontsize=10)
    bits_axis(left)
    # Right: step time / fp32 against bits, and the memory-bound ideal (bytes / fp32).
    ideal = sorted({(BITS[r["kv_dtype"]], r["bytes_ratio_to_fp32"]) for r in rows})
    right.plot([b for b, _ in ideal], [q for _, q in ideal], color="#888888", lw=1.5,
               ls=(0, (5, 4)), zorder=2, gid="ideal")
    tips["ideal"] = "bytes read / fp32: a purely memory-bound step"
    for i, r in enumerate(rows):
        mark(right, r["shape"], r["kv_dtype"], min(r["time_ratio_to_fp32"], TIME_TOP), f"time{i}")
        tips[f"time{i}"] = f"{r['shape']} {r['kv_dtype']}: {r['time_ratio_to_fp32']:.2f}"
    right.set_ylim(0, TIME_TOP)
    right.set_yticks([0, 0.5, 1, 1.5, 2])
    right.set_title(f"decode step time / fp32\n(medians of {reps or 'the'} repetitions)",
                    fontsize=10)
    bits_axis(right)

    precisions = {"handles": [Patch(color=c) for c in COLOUR.values()], "labels": list(COLOUR)}
    marks = {"handles": [Line2D([], [], ls="none", marker=marker, ms=8, mew=2, color="#333333",
                                markerfacecolor="#333333" if shape == "mha" else "none")
                         for shape, (_, marker) in SHAPE.items()],
             "labels": [name for name, _ in SHAPE.values()]}
    marks["handles"].append(Line2D([], [], color="#888888", lw=1.5, ls=(0, (5, 4))))
    marks["labels"].append("memory-bound: bytes / fp32's")
    caption = (f"bench_kv_dtype, one layer, head_dim 128, {args.n} tokens, {args.threads} "
               f"thread(s); times are medians of {reps or 'the'} repetitions (the file records no "
               f"spread); marks drawn a little apart: fp16 and bf16 (16 bits each) either side of "
               f"16, MHA left of GQA")
    if args.machine:
        caption += "\n" + args.machine
    stack(fig, 3.6, caption, [dict(marks, ncol=3, fontsize=9, handlelength=2.4),
                              dict(precisions, ncol=len(COLOUR), fontsize=9)])
    save(fig, args.out, tips)


if __name__ == "__main__":
    main()
