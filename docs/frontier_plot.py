#!/usr/bin/env python3
"""The cache-policy frontier: KV bytes per token held at 4,096 tokens against the mean KL
divergence from the full fp32 cache, a point per policy, drawn with matplotlib from kvlab-eval's
JSON files (bench/results/cpu-eval-smollm2*.json); with --steps, a second panel below against
the same axis of bytes: the decode step's attention time / the full cache's at 4,096 and 8,192
tokens (bench_policy_step's JSON). Deterministic: the same files give the same SVG, byte for
byte (no date, a fixed hash salt).

    frontier_plot.py OUT.svg EVAL.json [EVAL.json ...] --machine TEXT
                     [--steps STEPS.json --steps-machine TEXT]
"""
import argparse
import json

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the back end)

# A policy's family: what it changes of the full cache, by the items of its name.
FAMILIES = [  # (name, colour, marker), in the legend's order
    ("K and V in one type", "#1f77b4", "o"),
    ("K and V in two types", "#17becf", "D"),
    ("a window", "#d62728", "v"),
    ("a window + 4 sinks", "#ff7f0e", "^"),
    ("a window + sinks + heavy hitters (H2O)", "#2ca02c", "s"),
    ("window + sinks, some layers whole", "#9467bd", "P"),
    ("window + sinks, the calibration's top heads whole", "#8c564b", "X"),
]
FLOOR = 1e-6  # KL below this (fp32 in another order: 3e-11; the full cache itself: 0) sits here


def family(policy):
    if policy["full_heads"]:
        return 6
    if policy["full_layers"]:
        return 5
    if policy["h2o"]:
        return 4
    if policy["sinks"]:
        return 3
    if policy["window"]:
        return 2
    if policy["key_storage"] != policy["value_storage"]:
        return 1
    return 0


def label(policy):
    """A short label: what differs from the full cache."""
    items = [i for i in policy["policy"].split(",") if i not in ("cached", "paged")]
    if policy["full_heads"]:
        items = [i for i in items if not i.startswith("full_heads")]
        items.append(f"{len(policy['full_heads'])} heads whole")
    if policy["full_layers"]:
        items = [i for i in items if not i.startswith("full_layers")]
        layers = policy["full_layers"]
        items.append(f"layers {layers[0]}-{layers[-1]} whole")
    items = [i.replace("window=", "W=").replace("sinks=", "S=").replace("h2o=", "H=") for i in items]
    return ",".join(items) if items else "fp32"


def steps_panel(ax, points, path):
    """Time / the full cache's at each context of bench_policy_step's JSON (filled: the largest,
    hollow: the others), at the bytes per token of the same policy in the panel above."""
    with open(path) as f:
        steps = json.load(f)["results"]
    contexts = sorted({r["n"] for r in steps})
    for r in sorted(steps, key=lambda r: (r["n"], r["policy"])):
        p = points.get(r["policy"])
        if p is None:  # a paged policy, or one the evaluation did not run
            continue
        _, colour, marker = FAMILIES[family(p)]
        filled = r["n"] == contexts[-1]
        ax.scatter([p["kv_bytes_per_token_at_context"]], [r["time_ratio_to_full"]],
                   marker=marker, s=45, zorder=3, color=colour if filled else "none",
                   edgecolors=colour, linewidths=1.2)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(2000, 80000)
    ax.axhline(1.0, color="#999999", linewidth=0.8, linestyle=":")
    ax.set_xlabel("KV bytes held per token at 4,096 tokens (log)")
    ax.set_ylabel("decode step's attention time\n/ the full fp32 cache's (log)")
    names = " and ".join(f"{n:,}" for n in contexts)
    ax.set_title(f"Time of a decode step's attention at {names} tokens (filled: {contexts[-1]:,}; "
                 "hollow: fewer)\nK and V in two types, heavy hitters, heads or layers whole: the "
                 "reference store, not tuned", fontsize=10)
    ax.grid(True, which="major", color="#dddddd", linewidth=0.6)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--machine", required=True)
    parser.add_argument("--steps")
    parser.add_argument("--steps-machine")
    args = parser.parse_args()
    if args.steps and not args.steps_machine:
        parser.error("--steps needs --steps-machine")

    points = {}  # policy name -> its figures (the first file that has it)
    reference = None
    for path in args.runs:
        with open(path) as f:
            run = json.load(f)
        if reference is None:
            reference = run["reference"]["perplexity"]
        for p in run["policies"]:
            if p["store"] == "paged":  # the paged store gives the contiguous figures (part 1)
                continue
            p.setdefault("key_storage", p["storage"])
            p.setdefault("value_storage", p["storage"])
            for key in ("sinks", "h2o"):
                p.setdefault(key, 0)
            for key in ("full_layers", "full_heads"):
                p.setdefault(key, [])
            points.setdefault(p["policy"], p)

    plt.rcParams.update({"svg.hashsalt": "kvlab", "font.size": 11, "svg.fonttype": "none"})
    if args.steps:
        fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9.5, 10.4), dpi=100,
                                      gridspec_kw={"height_ratios": [3, 2]})
    else:
        fig, ax = plt.subplots(figsize=(9.5, 6.2), dpi=100)
        ax2 = None
    seen = set()
    placed = []  # (x, y, text) of every point, labelled once the axes are final
    for p in sorted(points.values(), key=lambda p: (p["kv_bytes_per_token_at_context"],
                                                     p["kl_mean"], p["policy"])):
        f = family(p)
        name, colour, marker = FAMILIES[f]
        x = p["kv_bytes_per_token_at_context"]
        y = max(p["kl_mean"], FLOOR)
        ax.scatter([x], [y], color=colour, marker=marker, s=55, zorder=3,
                   label=None if f in seen else name)
        seen.add(f)
        placed.append((x, y, label(p)))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(2000, 80000)
    ax.set_ylim(5e-7, 3)
    # Each label beside its point where it overlaps no label placed before (boxes estimated
    # from the text's length, in points of the figure): the first of these offsets that fits.
    fig.canvas.draw()
    boxes = []
    char_w, line_h = 5.4, 10.5  # an 8-point label, in display pixels at 100 dpi
    offsets = [(6, 2), (6, -11), (-6, 2), (-6, -11), (6, 13), (6, -22), (-6, 13), (-6, -22),
               (6, 24), (6, -33), (-6, 24), (-6, -33)]
    for x, y, text in placed:
        px, py = ax.transData.transform((x, y))
        width = char_w * len(text)
        for dx, dy in offsets:
            left = px + dx if dx > 0 else px + dx - width
            box = (left, py + dy, left + width, py + dy + line_h)
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3]
                       for b in boxes):
                break
        boxes.append(box)
        ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset pixels", fontsize=8,
                    color="#333333", ha="left" if dx > 0 else "right", va="bottom")
    ax.set_xlabel("KV bytes held per token at 4,096 tokens (log)")
    ax.set_ylabel("mean KL(full cache || policy), nats (log)")
    ax.axhline(FLOOR, color="#999999", linewidth=0.8, linestyle=":")
    ax.text(2100, FLOOR * 1.15, "exact (KL < 1e-6 drawn here)", fontsize=8, color="#666666")
    ax.grid(True, which="major", color="#dddddd", linewidth=0.6)
    ax.set_title("SmolLM2-135M-Instruct: what each cache policy costs (down and left is better)",
                 fontsize=12)
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: [n for n, _, _ in FAMILIES].index(labels[i]))
    credit = (f"kvlab-eval, 8,192 tokens of the GNU GPL in windows of 4,096, steps of 16 "
              f"(full-cache perplexity {reference:.2f}); {args.machine}")
    if ax2 is not None:
        steps_panel(ax2, points, args.steps)
        credit += f"\nbench_policy_step (the step's attention, every layer; medians); {args.steps_machine}"
    (ax2 if ax2 is not None else ax).legend(
        [handles[i] for i in order], [labels[i] for i in order], loc="upper center",
        bbox_to_anchor=(0.5, -0.13 if ax2 is None else -0.2), ncol=2, fontsize=9, frameon=False)
    fig.text(0.01, 0.005, credit, fontsize=8, color="#555555")
    fig.tight_layout(rect=(0, 0.02 if ax2 is None else 0.035, 1, 1))
    fig.savefig(args.out, format="svg", metadata={"Date": None, "Creator": None}, transparent=True)


if __name__ == "__main__":
    main()
