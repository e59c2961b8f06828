#!/usr/bin/env python3
"""Draws a serving timeline (requests x steps) with matplotlib (Debian's python3-matplotlib)
from engine step logs (JSON lines, one object per step, as kvlab::write_step_log writes them;
tutorial 07 writes them with --step-log): one panel per log, one row per request, one cell per
step, coloured by what the request did in that step (prefill, decode, padding) and marked where
it was preempted. Exact (steps, not timings). A cell's tooltip says what it was.
Deterministic: the same logs give the same SVG, byte for byte (no date, a fixed hash salt).

usage: timeline_plot.py OUT.svg TITLE=LOG.jsonl [TITLE=LOG.jsonl ...] [--names A,B,C,...]
"""
import argparse
import json

from plot_common import GAP_IN, GREY, PAD_IN, WIDTH_IN, fail, pyplot, save, wrapped

COLOURS = {"prefill": "#4c78a8", "decode": "#72b7b2", "padding": "#d9d9d9"}
PREEMPTED = "#cc0000"
TITLE_IN, TICKS_IN, PANEL_GAP_IN = 0.34, 0.3, 0.16  # above, below and between the panels


def read_log(path):
    """The steps of a step log, each checked for what the plot reads."""
    steps = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                s = json.loads(line)
            except json.JSONDecodeError as e:
                fail(f"{path}:{number}", "a JSON object (kvlab::write_step_log's line)",
                     f"malformed JSON: {e}")
            if not isinstance(s, dict) or any(k not in s for k in ("step", "batch", "preempted")):
                fail(f"{path}:{number}", "a step with 'step', 'batch' and 'preempted'",
                     f"keys {sorted(s) if isinstance(s, dict) else type(s).__name__}")
            for e in s["batch"]:
                if not isinstance(e, dict) or e.get("kind") not in COLOURS or \
                        not isinstance(e.get("request"), int) or "tokens" not in e:
                    fail(f"{path}:{number}", "batch entries {request, tokens, kind} with a kind "
                         f"of {', '.join(COLOURS)}", json.dumps(e))
            steps.append(s)
    if not steps:
        fail(path, "at least one step", "an empty log")
    return steps


def panel(ax, p, title, steps, names, width, tips):
    """One log's rows (requests) by columns (steps) in `ax`, `width` steps wide."""
    from matplotlib.patches import Rectangle
    requests = 1 + max((e["request"] for s in steps for e in s["batch"]), default=0)
    requests = max([requests] + [1 + r for s in steps for r in s["preempted"]])
    for s in steps:
        cells = {}  # request -> (kind, tokens): a padded prompt shows as prefill, not padding
        for e in s["batch"]:
            if e["request"] not in cells or cells[e["request"]][0] == "padding":
                cells[e["request"]] = (e["kind"], e["tokens"])
        for request, (kind, tokens) in sorted(cells.items()):
            gid = f"p{p}s{s['step']}r{request}"
            ax.add_patch(Rectangle((s["step"] + 0.05, requests - 1 - request + 0.07), 0.9, 0.86,
                                   facecolor=COLOURS[kind], edgecolor="none", gid=gid))
            tips[gid] = f"step {s['step']}: {kind} of {tokens} tokens"
        for request in s["preempted"]:
            gid = f"p{p}s{s['step']}x{request}"
            ax.text(s["step"] + 0.5, requests - 1 - request + 0.5, "×", ha="center", va="center",
                    fontsize=13, fontweight="bold", color=PREEMPTED, gid=gid)
            tips[gid] = f"step {s['step']}: preempted"
    ax.set_xlim(0, width)
    ax.set_ylim(0, requests)
    labels = [names[r] if r < len(names) else str(r) for r in range(requests)]
    ax.set_yticks([requests - 1 - r + 0.5 for r in range(requests)], labels, fontsize=10)
    shown = steps[::max(1, len(steps) // 10)]
    ax.set_xticks([s["step"] + 0.5 for s in shown], [str(s["step"]) for s in shown], fontsize=9)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(title, loc="left", fontsize=11, fontweight="bold")
    return requests


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("logs", nargs="+", metavar="TITLE=LOG.jsonl",
                        help="a panel's title and its step log")
    parser.add_argument("--names", default="", help="the requests' names, comma-separated")
    args = parser.parse_args()
    names = args.names.split(",") if args.names else []
    panels = []
    for arg in args.logs:
        title, sep, path = arg.partition("=")
        if not sep:
            parser.error(f"{arg}: expected TITLE=LOG.jsonl")
        panels.append((title, read_log(path)))
    width = max(1 + max(s["step"] for s in steps) for _, steps in panels)
    counts = [1 + max([e["request"] for s in steps for e in s["batch"]] +
                      [r for s in steps for r in s["preempted"]] + [0]) for _, steps in panels]

    plt = pyplot(**{"ytick.labelsize": 10})
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    fig = plt.figure(figsize=(WIDTH_IN, 4), dpi=100)
    # from the bottom up: the caption, the legend, then the panels, top to bottom
    text = fig.text(PAD_IN, PAD_IN, wrapped("one row per request, one cell per step (numbered "
                                            "from 0), from the engine's step logs "
                                            "(kvlab::write_step_log): exact"),
                    transform=fig.dpi_scale_trans, fontsize=9, color=GREY, ha="left",
                    va="bottom")
    y = PAD_IN + text.get_window_extent().height / fig.dpi + GAP_IN
    handles = [Patch(color=c) for c in COLOURS.values()]
    handles.append(Line2D([], [], ls="none", marker="x", ms=8, mew=2.5, color=PREEMPTED))
    box = fig.legend(handles, list(COLOURS) + ["preempted"], ncol=4, fontsize=10,
                     loc="lower center", bbox_to_anchor=(WIDTH_IN / 2, y),
                     bbox_transform=fig.dpi_scale_trans, frameon=False)
    y += box.get_window_extent().height / fig.dpi + GAP_IN
    longest = max([len(n) for n in names[:max(counts)]] + [len(str(max(counts) - 1))])
    left = 0.3 + 0.1 * longest  # the requests' names
    cell = min(0.4, (WIDTH_IN - left - 0.2) / width)
    row = min(0.32, max(cell, 0.24))
    heights = [TITLE_IN + n * row + TICKS_IN for n in counts]
    total = y + sum(heights) + PANEL_GAP_IN * (len(panels) - 1) + PAD_IN
    fig.set_size_inches(WIDTH_IN, total)
    tips = {}
    top = total - PAD_IN
    for p, ((title, steps), n, h) in enumerate(zip(panels, counts, heights)):
        bottom = top - h + TICKS_IN
        ax = fig.add_axes([left / WIDTH_IN, bottom / total, cell * width / WIDTH_IN,
                           n * row / total])
        panel(ax, p, title, steps, names, width, tips)
        top -= h + PANEL_GAP_IN
    save(fig, args.out, tips)


if __name__ == "__main__":
    main()
