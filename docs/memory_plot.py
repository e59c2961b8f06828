#!/usr/bin/env python3
"""Draws a long-running engine's resident memory against its steps with matplotlib (Debian's
python3-matplotlib) from kvlab_stress's samples (the CSV committed in bench/results,
cpu-stress-engine-rss.csv: run,policy,step,requests,records,rss_kib): one line per run and
policy, each sample one reading of /proc/self/statm (the file holds one a point, no spread).
With every finished request's output taken (Engine::take_output) the line is flat; with every
record kept it grows with the requests served; the legend gives each line's bytes per request
served, first sample to last. A line's tooltip gives its ends. Deterministic: the same file
gives the same SVG, byte for byte (no date, a fixed hash salt).

usage: memory_plot.py OUT.svg SAMPLES.csv [--machine TEXT] [--command TEXT]
"""
import csv
import math

from plot_common import WIDTH_IN, arguments, fail, pyplot, save, stack

STYLE = {  # (run, policy) -> colour, dash
    ("outputs taken", "continuous"): ("#4c78a8", "-"),
    ("outputs taken", "static"): ("#72b7b2", "-"),
    ("outputs taken", "contiguous"): ("#54a24b", "-"),
    ("records kept", "continuous"): ("#e45756", (0, (6, 4))),
}
COLUMNS = ("run", "policy", "step", "requests", "records", "rss_kib")


def samples(path):
    """{(run, policy): [(step, requests, records, MiB)]} in step order."""
    out = {}
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or any(c not in reader.fieldnames for c in COLUMNS):
            fail(path, f"kvlab_stress's CSV with the columns {','.join(COLUMNS)}",
                 f"the header {','.join(reader.fieldnames or []) or '(none)'}")
        for row in reader:
            try:
                values = [int(row[c]) for c in ("step", "requests", "records", "rss_kib")]
            except (TypeError, ValueError):
                fail(path, "whole numbers in step, requests, records and rss_kib",
                     f"line {reader.line_num}: {row}")
            out.setdefault((row["run"], row["policy"]), []).append(
                (values[0], values[1], values[2], values[3] / 1024))
    if not out:
        fail(path, "at least one sample", "none")
    return {k: sorted(v) for k, v in out.items()}


def main():
    parser = arguments(__doc__, "samples", "kvlab_stress's --rss-csv samples", machine=True,
                       command=True)
    args = parser.parse_args()
    series = samples(args.samples)
    last_step = max(s for rows in series.values() for s, *_ in rows)
    top = math.ceil(max(m for rows in series.values() for *_, m in rows) / 10) * 10

    plt = pyplot()
    from matplotlib.ticker import FuncFormatter
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 4), dpi=100)
    tips = {}
    for i, (key, rows) in enumerate(sorted(series.items())):
        colour, dash = STYLE.get(key, ("#333333", (0, (2, 2))))
        first, last = rows[0], rows[-1]
        per_request = (last[3] - first[3]) * 1024 * 1024 / max(1, last[1] - first[1])
        ax.plot([r[0] for r in rows], [r[3] for r in rows], color=colour, ls=dash, lw=2,
                label=f"{key[1]}, {key[0]}: {per_request:+.0f} B per request", gid=f"line{i}")
        tips[f"line{i}"] = (f"{key[1]} policy, {key[0]}: {first[3]:.1f} MiB at step {first[0]} "
                            f"({first[1]} requests), {last[3]:.1f} MiB at step {last[0]} "
                            f"({last[1]} requests, {last[2]} records kept): {per_request:+.0f} "
                            f"bytes per request")
    ax.set_xlim(0, last_step * 1.01)
    ax.set_ylim(0, top)
    ax.set_yticks(range(0, top + 1, 10))
    ax.set_xticks([round(last_step * i / 5, -3) for i in range(6)])
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
    ax.grid(True, color="#e4e4e4", lw=0.8)
    ax.set_axisbelow(True)
    ax.set_xlabel("engine steps")
    ax.set_ylabel("resident memory, MiB")
    ax.set_title("Resident memory of a long-running engine (MiB) against its steps",
                 fontsize=10, fontweight="bold")
    caption = args.command or "kvlab_stress, the built-in tiny model, a sample every 1000 steps"
    caption += "; each point one reading of the process's resident memory"
    if args.machine:
        caption += "\n" + args.machine
    handles, labels = ax.get_legend_handles_labels()
    stack(fig, 3.4, caption, [{"handles": handles, "labels": labels, "ncol": 2, "fontsize": 9,
                               "handlelength": 2.6}])
    save(fig, args.out, tips)


if __name__ == "__main__":
    main()
