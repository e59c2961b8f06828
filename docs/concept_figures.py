#!/usr/bin/env python3
"""Draws the concept pages' figures with matplotlib from the library's own state.

STATE.json is what docs/figures/concept_state.cpp wrote (decoders' counters, block tables, a
ring's slots, a split-K merge, quantized blocks); the batching figure reads tutorial 07's step
logs (kvlab::write_step_log). One SVG per concept page, each at most 760 px wide (the docs'
column) with text of at least 10 px. Deterministic: the same state gives the same files (no
date, a fixed hash salt).

usage: concept_figures.py OUT_DIR STATE.json STATIC.jsonl CONTINUOUS.jsonl
"""
import json
import sys
from pathlib import Path

DPI = 100
WIDTH_IN = 7.6  # 760 px
BLUE, ORANGE, GREEN, RED, GREY = "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#7f7f7f"
LIGHT = "#e8e8e8"
SEQ = ["#4c78a8", "#f58518", "#54a24b", "#b279a2"]  # one per sequence or request


def setup():
    import matplotlib
    matplotlib.use("svg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"svg.hashsalt": "kvlab", "font.size": 11, "svg.fonttype": "none",
                         "axes.titlesize": 12, "axes.titleweight": "bold"})
    return plt


def save(plt, fig, path):
    # transparent: the page shows through, and in the dark theme (kvlab.css inverts pictures)
    # the figure takes its background
    fig.savefig(path, format="svg", metadata={"Date": None, "Creator": None}, transparent=True)
    plt.close(fig)


def cells(ax, rows, cols, colour_of, text_of=None, fontsize=10):
    """A grid of rows x cols squares (row 0 on top), each coloured colour_of(r, c) (None: an
    outline only) and labelled text_of(r, c)."""
    from matplotlib.patches import Rectangle
    for r in range(rows):
        for c in range(cols):
            colour = colour_of(r, c)
            ax.add_patch(Rectangle((c, rows - 1 - r), 0.92, 0.92, facecolor=colour or "none",
                                   edgecolor="#bbbbbb" if colour is None else "none", lw=0.8))
            text = text_of(r, c) if text_of else None
            if text:
                ax.text(c + 0.46, rows - 1 - r + 0.46, text, ha="center", va="center",
                        fontsize=fontsize, color="white" if colour not in (None, LIGHT) else "black")
    ax.set_xlim(-0.1, cols)
    ax.set_ylim(-0.1, rows)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ax.spines.values():
        side.set_visible(False)


def naive_recompute(plt, state, out):
    p = state["projections"]
    n = p["steps"]
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH_IN, 3.6), dpi=DPI)
    for ax, key, title, colour in ((axes[0], "naive", "no cache", RED),
                                   (axes[1], "cached", "with a cache", BLUE)):
        counts = p[key]
        # step t projects its counts[t] newest tokens' K/V rows
        cells(ax, n, n, lambda r, c: colour if r - counts[r] < c <= r else
              (None if c > r else LIGHT))
        ax.set_title(f"{title}: {sum(counts)} K/V projections")
        for r in range(n):
            ax.text(-0.3, n - 1 - r + 0.46, f"step {r + 1}", ha="right", va="center", fontsize=10)
        ax.text(n / 2, -0.6, "tokens 1 … %d" % n, ha="center", va="top", fontsize=10)
    fig.text(0.5, 0.02, "coloured: K and V projected in that step (counted by the decoders); "
             "grey: already known", ha="center", fontsize=10, color="#444444")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    save(plt, fig, out)


def score_matrix(ax, n, colour_of, title):
    cells(ax, n, n, colour_of)
    ax.set_title(title)
    for r in range(n):
        ax.text(-0.2, n - 1 - r + 0.46, f"q{r + 1}", ha="right", va="center", fontsize=10)
    for c in range(n):
        ax.text(c + 0.46, -0.2, f"k{c + 1}", ha="center", va="top", fontsize=10)
    ax.set_ylim(-0.8, n)


def kv_cache(plt, state, out):
    n = state["projections"]["steps"]
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 4.2), dpi=DPI)
    score_matrix(ax, n, lambda r, c: None if c > r else (BLUE if r == n - 1 else LIGHT),
                 "")
    ax.set_xlim(-1.2, n + 7.5)
    ax.text(n + 0.4, 0.46, f"← this step: q{n} against all {n} keys,\n"
            f"   k1 … k{n - 1} from the cache, k{n} new", va="center", fontsize=11)
    ax.text(n + 0.4, n - 2, "grey: scores of earlier steps,\n  never needed again", fontsize=11,
            va="center")
    ax.text(n + 0.4, n / 2, "outlines: masked (a query sees\n  no later key)", fontsize=11,
            va="center")
    ax.set_title(f"The causal score matrix Q·Kᵀ of {n} tokens, one row a decode step")
    fig.tight_layout()
    save(plt, fig, out)


def prefill_decode(plt, state, out):
    n, prompt = state["projections"]["steps"], 5
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 4.2), dpi=DPI)
    score_matrix(ax, n, lambda r, c: None if c > r else (ORANGE if r < prompt else BLUE), "")
    ax.set_xlim(-1.2, n + 7.5)
    from matplotlib.patches import Rectangle
    ax.add_patch(Rectangle((-0.05, n - prompt - 0.05), prompt + 0.02, prompt + 0.02, fill=False,
                           edgecolor=ORANGE, lw=2))
    ax.text(n + 0.4, n - prompt / 2, f"prefill: the {prompt} prompt rows\n  in one matrix product "
            "(Q has\n  5 rows: much arithmetic per byte)", va="center", fontsize=11)
    ax.text(n + 0.4, (n - prompt) / 2, f"decode: one row a step\n  (Q has 1 row: every byte of\n"
            "  K and V read for one row)", va="center", fontsize=11)
    ax.set_title(f"Prefill and decode in the score matrix of {n} tokens")
    fig.tight_layout()
    save(plt, fig, out)


def paging(plt, state, out):
    p = state["paged"]
    bs, lengths, max_len = p["block_size"], p["lengths"], p["max_len"]
    indptr, indices, last = p["indptr"], p["indices"], p["last_page_len"]
    names = "ABCD"
    fig, axes = plt.subplots(2, 1, figsize=(WIDTH_IN, 5.8), dpi=DPI,
                             gridspec_kw={"height_ratios": [1, 1.9]})
    ax = axes[0]
    rows = len(lengths)
    cells(ax, rows, max_len, lambda r, c: SEQ[r] if c < lengths[r] else None,
          lambda r, c: str(c + 1) if c < lengths[r] else None, fontsize=9)
    for r in range(rows):
        ax.text(-0.3, rows - 1 - r + 0.46, f"{names[r]} ({lengths[r]})", ha="right", va="center")
    ax.set_xlim(-3, max_len + 0.2)
    ax.set_title(f"Contiguous: {max_len} slots reserved per sequence, "
                 f"{rows * max_len - sum(lengths)} of {rows * max_len} unused")
    ax = axes[1]
    owner = {}
    for s in range(rows):
        for k, b in enumerate(indices[indptr[s]:indptr[s + 1]]):
            used = last[s] if indptr[s] + k == indptr[s + 1] - 1 else bs
            owner[b] = (s, k, used)
    nb = p["num_blocks"]
    per_row = 4
    from matplotlib.patches import Rectangle
    for b in range(nb):
        x, y = (b % per_row) * (bs + 1), 5.2 - (b // per_row) * 2.2
        s = owner.get(b)
        for slot in range(bs):
            filled = s is not None and slot < s[2]
            ax.add_patch(Rectangle((x + slot, y), 0.92, 0.92,
                                   facecolor=SEQ[s[0]] if filled else "none",
                                   edgecolor="none" if filled else "#bbbbbb"))
            if filled:
                ax.text(x + slot + 0.46, y + 0.46, str(s[1] * bs + slot + 1), ha="center",
                        va="center", fontsize=10, color="white")
        label = f"block {b}" + (f": {names[s[0]]}, #{s[1] + 1}" if s else ": free")
        ax.text(x, y + 1.1, label, fontsize=10)
    ax.text(0, 1.6, f"indptr        = {indptr}", fontsize=11, family="monospace")
    ax.text(0, 0.8, f"indices       = {indices}", fontsize=11, family="monospace")
    ax.text(0, 0.0, f"last_page_len = {last}", fontsize=11, family="monospace")
    ax.text(per_row * (bs + 1) + 0.2, 0.8, "sequence s: blocks\nindices[indptr[s] :\n"
            "        indptr[s + 1]]", fontsize=10, va="center")
    ax.set_xlim(-0.2, per_row * (bs + 1) + 6)
    ax.set_ylim(-0.3, 6.6)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"Paged: blocks of {bs} tokens from one pool of {nb}, "
                 f"{sum(bs * (indptr[s + 1] - indptr[s]) - lengths[s] for s in range(rows))} "
                 "slots unused")
    fig.tight_layout()
    save(plt, fig, out)


def sliding_window(plt, state, out):
    w = state["window"]
    window, tokens, slots = w["window"], w["tokens"], w["slots"]
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH_IN, 4.4), dpi=DPI,
                             gridspec_kw={"width_ratios": [tokens, window + 2]})
    cells(axes[0], tokens, tokens,
          lambda r, c: None if c > r else (BLUE if r - c < window else LIGHT))
    axes[0].set_title(f"the band: each query sees {window} keys")
    axes[0].text(tokens / 2, -0.5, "keys →", ha="center", va="top")
    axes[0].text(-0.4, tokens / 2, "queries (one a step) ↓", ha="right", va="center", rotation=90)
    cells(axes[1], tokens, window, lambda r, c: BLUE if slots[r][c] == r else
          (LIGHT if slots[r][c] >= 0 else None),
          lambda r, c: str(slots[r][c] + 1) if slots[r][c] >= 0 else None)
    axes[1].set_title(f"the ring: {window} slots")
    for r in range(tokens):
        axes[1].text(-0.2, tokens - 1 - r + 0.46, f"step {r + 1}", ha="right", va="center",
                     fontsize=10)
    axes[1].set_xlim(-2.4, window)
    fig.text(0.5, 0.02, "band: blue read, grey before the window (never read again), outlined "
             "masked; ring: the token each slot of a ContiguousKVCache holds after each step, "
             "blue this step's, written over the oldest",
             ha="center", fontsize=10, color="#444444", wrap=True)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    save(plt, fig, out)


def split_k(plt, state, out):
    s = state["split_k"]
    scores, partials = s["scores"], s["partials"]
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 4.6), dpi=DPI)
    for i, part in enumerate(partials):
        xs = list(range(part["begin"], part["end"]))
        ax.bar(xs, [scores[j] for j in xs], color=SEQ[i], width=0.8,
               label=f"part {i + 1}: keys {part['begin'] + 1}–{part['end']}, max {part['max']:.2f}, "
                     f"sum {part['sum']:.2f}, output {part['output']:+.3f}")
        ax.hlines(part["max"], part["begin"] - 0.4, part["end"] - 0.6, colors=SEQ[i],
                  linestyles="dashed", lw=1.5)
    ax.axhline(0, color=GREY, lw=0.6)
    ax.set_xticks(range(0, s["length"], s["align"]), [str(j + 1) for j in
                                                      range(0, s["length"], s["align"])])
    ax.set_xlabel(f"key (blocks of {s['align']}; each part a whole number of blocks)")
    ax.set_ylabel("score q·k")
    ax.set_title(f"Split-K: one query's {s['length']} keys in {len(partials)} parts (dashed: "
                 "each part's max)\n"
                 f"merged: {s['merged']:+.6f}, one pass over all keys: {s['one_pass']:+.6f}")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), fontsize=10, frameon=False)
    fig.text(0.5, 0.02, "the merge, M the largest of the parts' maxes: sum = Σ sumᵢ·exp(maxᵢ − M),"
             "\noutput = Σ outputᵢ·sumᵢ·exp(maxᵢ − M) / sum", ha="center", fontsize=10,
             color="#444444")
    ax.set_ylim(min(scores) - 0.3, max(scores) + 0.8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save(plt, fig, out)


def slots_of(steps):
    """[(step, [(request, kind) or None per slot])]: each request keeps the slot it got first."""
    held, rows, width = {}, [], 0
    for s in steps:
        kinds = {}
        for e in s["batch"]:
            if e["request"] not in kinds or kinds[e["request"]] == "padding":
                kinds[e["request"]] = e["kind"]
        for r in list(held):
            if r not in kinds:
                del held[r]
        for r in sorted(kinds):
            if r not in held:
                free = min(set(range(len(kinds) + len(held) + 1)) - set(held.values()))
                held[r] = free
        width = max(width, 1 + max(held.values(), default=-1))
        rows.append((s["step"], {held[r]: (r, kinds[r]) for r in kinds}))
    return rows, width


def batching(plt, static_steps, continuous_steps, out):
    colours = {"prefill": ORANGE, "decode": BLUE, "padding": LIGHT}
    panels = [("static batching", slots_of(static_steps)),
              ("continuous batching", slots_of(continuous_steps))]
    width = max(p[1][1] for p in panels)
    steps = max(len(p[1][0]) for p in panels)
    fig, axes = plt.subplots(2, 1, figsize=(WIDTH_IN, 1.1 + 2 * (0.45 * width + 0.7)), dpi=DPI)
    for ax, (title, (rows, _)) in zip(axes, panels):
        table = {step: occupied for step, occupied in rows}
        cells(ax, width, steps,
              lambda r, c: colours[table[c][r][1]] if c in table and r in table[c] else None,
              lambda r, c: "ABCDEFGH"[table[c][r][0]] if c in table and r in table[c] else None)
        ax.set_xlim(-2.2, steps)
        for r in range(width):
            ax.text(-0.2, width - 1 - r + 0.46, f"slot {r}", ha="right", va="center",
                    fontsize=10)
        idle = sum(width - len(table.get(c, {})) + sum(1 for v in table.get(c, {}).values()
                                                        if v[1] == "padding")
                   for c in range(len(rows)))
        ax.set_title(f"{title}: {len(rows)} steps, {idle} slot-steps idle or padded")
    fig.text(0.5, 0.01, "a cell: the request a slot runs in a step (columns, from tutorial 07's "
             "step logs): orange prefill,\nblue decode, grey padding (a finished request keeps "
             "its slot until the batch ends), empty: idle", ha="center", fontsize=10,
             color="#444444")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    save(plt, fig, out)


def memory_bound(plt, state, out):
    s = state["intensity"]
    groups = [f"{s['num_heads']} over {g}" for g in s["kv_heads"]]
    xs = range(len(groups))
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 4.0), dpi=DPI)
    ax.bar([x - 0.2 for x in xs], s["fp32"], width=0.38, color=BLUE, label="K, V in fp32")
    ax.bar([x + 0.2 for x in xs], s["fp16"], width=0.38, color=ORANGE, label="K, V in fp16")
    for x, a, b in zip(xs, s["fp32"], s["fp16"]):
        ax.text(x - 0.2, a, f"{a:g}", ha="center", va="bottom", fontsize=10)
        ax.text(x + 0.2, b, f"{b:g}", ha="center", va="bottom", fontsize=10)
    ax.set_xticks(list(xs), groups)
    ax.set_xlabel("query heads over K/V heads (MHA on the left, GQA to the right)")
    ax.set_ylabel("multiply-adds per byte")
    ax.set_title("A decode step's arithmetic per byte it reads, at any context length")
    ax.legend(frameon=False, loc="upper left")
    ax.set_ylim(0, max(s["fp16"]) * 1.25)
    fig.text(0.5, 0.01, "from kvlab::cpu::decode_attention's counters (macs / kv_bytes_read), "
             "one step at 64 tokens;\na core does several multiply-adds in the time its memory "
             "delivers one byte", ha="center", fontsize=10,
             color="#444444")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    save(plt, fig, out)


def quantization(plt, state, out):
    q = state["quant"]
    xs = range(len(q["values"]))
    fig, axes = plt.subplots(2, 1, figsize=(WIDTH_IN, 4.6), dpi=DPI, sharex=True,
                             gridspec_kw={"height_ratios": [1.6, 1]})
    ax = axes[0]
    ax.plot(xs, q["values"], "o", color="black", ms=5, label="the values (fp32)")
    ax.plot(xs, q["q8_0"], "_", color=BLUE, ms=12, mew=2,
            label=f"q8_0: 255 levels of {q['q8_0_scale']:.4f}")
    ax.plot(xs, q["q4_0"], "_", color=RED, ms=12, mew=2,
            label=f"q4_0: 16 levels of {abs(q['q4_0_scale']):.4f}")
    ax.set_ylabel("value")
    fig.suptitle("One block of 32 values and one scale, the largest value setting it",
                 fontweight="bold", fontsize=12)
    ax.legend(frameon=False, fontsize=10, loc="lower left", ncol=3, bbox_to_anchor=(0, 1.0))
    ax = axes[1]
    ax.bar([x - 0.2 for x in xs], [a - b for a, b in zip(q["q8_0"], q["values"])], width=0.4,
           color=BLUE, label="q8_0")
    ax.bar([x + 0.2 for x in xs], [a - b for a, b in zip(q["q4_0"], q["values"])], width=0.4,
           color=RED, label="q4_0")
    ax.axhline(0, color=GREY, lw=0.6)
    ax.set_ylabel("error")
    ax.set_xlabel("position in the block")
    fig.tight_layout()
    save(plt, fig, out)


def main(argv):
    if len(argv) != 5:
        sys.exit(__doc__)
    out, state_path, static_log, continuous_log = Path(argv[1]), argv[2], argv[3], argv[4]
    with open(state_path, encoding="utf-8") as f:
        state = json.load(f)

    def log(path):
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    plt = setup()
    out.mkdir(parents=True, exist_ok=True)
    naive_recompute(plt, state, out / "concept_naive_recompute.svg")
    kv_cache(plt, state, out / "concept_kv_cache.svg")
    prefill_decode(plt, state, out / "concept_prefill_decode.svg")
    paging(plt, state, out / "concept_paging.svg")
    sliding_window(plt, state, out / "concept_sliding_window.svg")
    split_k(plt, state, out / "concept_gpu.svg")
    batching(plt, log(static_log), log(continuous_log), out / "concept_batching.svg")
    memory_bound(plt, state, out / "concept_memory_bound.svg")
    quantization(plt, state, out / "concept_quantization.svg")


if __name__ == "__main__":
    main(sys.argv)
