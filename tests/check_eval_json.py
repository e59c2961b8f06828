#!/usr/bin/env python3
"""Checks the JSON that kvlab-eval writes (--json) against what its policies must give:

- a policy that keeps every token at fp32 in the contiguous cache ("cached") equals the
  reference exactly: KL 0 at every position, top-1 agreement 1, the same perplexity;
- a lower precision is not free: int8 and int4 have KL > 0, and int4 more than int8;
- every policy's KV bytes at the end of a window, held (reserved) and filled, equal their
  closed form from the model's shape: a token row is 2 · layers · kv_heads · (head_dim values
  as stored) bytes; the full contiguous cache holds and fills `context` rows; a windowed ring
  W − 1 + step rows (at most context), and S more with S sinks (a window and sinks that cover
  the context: the full cache); the paged store holds the whole blocks from the one holding the
  next token's first key (context − W + 1) to the last, and those holding the S sinks, and fills
  their rows up to the context; a policy per head (the selective store) holds, per head, every token
  or at most S + W − 1 + H rows (sinks, the next query's window, heavy hitters), each a key
  row and a value row of their own types;
- selective caching from a calibration: its policies keep the ranking's top heads whole;
- the per-position spans cover the window and count every position once;
- the pass-key probe has one result per policy and the reference.

    check_eval_json.py EVAL_JSON
"""
import json
import math
import sys

ROW_BYTES = {"fp32": lambda d: 4 * d, "fp16": lambda d: 2 * d, "bf16": lambda d: 2 * d,
             "int8": lambda d: d // 32 * 34, "int4": lambda d: d // 32 * 18}


def expected_bytes(policy, shape, context, step):
    """(held, filled) bytes at the end of a window of `context` tokens."""
    w = policy["window"]
    if policy["store"] == "selective":  # per head: every token, or S + W - 1 + H rows at most
        d, total = shape["head_dim"], 0
        row = ROW_BYTES[policy["key_storage"]](d) + ROW_BYTES[policy["value_storage"]](d)
        for layer in range(shape["n_layers"]):
            for head in range(shape["n_kv_heads"]):
                full = (w == 0 or layer in policy["full_layers"]
                        or [layer, head] in policy["full_heads"])
                rows = context if full else min(context, policy["sinks"] + w - 1 + policy["h2o"])
                total += rows * row
        return total, total
    row = 2 * shape["n_layers"] * shape["n_kv_heads"] * ROW_BYTES[policy["storage"]](shape["head_dim"])
    s = policy["sinks"]
    if policy["store"] == "paged":
        b = policy["block_size"]
        first = (max(0, context - w + 1) if w > 0 else 0) // b  # the first block of the window
        kept = [k for k in range(-(-context // b)) if k >= first or k * b < s]  # and the sinks'
        return len(kept) * b * row, sum(min(b, context - k * b) for k in kept) * row
    if w == 0 or w + s >= context:
        return context * row, context * row
    w = min(w, context)
    rows = min(context, s + w - 1 + min(step, context - s - w + 1))
    return rows * row, rows * row


def main():
    with open(sys.argv[1]) as f:
        run = json.load(f)
    problems = []
    shape, text = run["model_config"], run["text"]
    context, step = text["context"], run["step"]
    positions = text["tokens"]
    by_name = {p["policy"]: p for p in run["policies"]}
    full = by_name.get("cached")
    if full is None:
        problems.append("no 'cached' policy to compare with the reference")
    else:
        for key, want in (("kl_mean", 0), ("kl_p99", 0), ("kl_max", 0), ("top1", 1)):
            if full[key] != want:
                problems.append(f"cached: {key}: expected exactly {want}, got {full[key]}")
        if full["perplexity"] != run["reference"]["perplexity"]:
            problems.append(f"cached: perplexity {full['perplexity']} differs from the reference's "
                            f"{run['reference']['perplexity']}")
    kl = {p["storage"]: p["kl_mean"] for p in run["policies"]
          if p["store"] == "contiguous" and p["window"] == 0}
    for name in ("int8", "int4"):
        if name in kl and not kl[name] > 0:
            problems.append(f"kv={name}: expected a KL above 0, got {kl[name]}")
    if "int8" in kl and "int4" in kl and not kl["int4"] > kl["int8"]:
        problems.append(f"expected int4's KL ({kl['int4']}) above int8's ({kl['int8']})")
    for p in run["policies"]:
        held, filled = expected_bytes(p, shape, context, step)
        for key, want in (("kv_bytes_at_context", held), ("kv_bytes_used_at_context", filled)):
            if p[key] != want:
                problems.append(f"{p['policy']}: {key}: expected {want}, got {p[key]}")
        spans = p["per_position"]
        if spans[0]["begin"] != 0 or spans[-1]["end"] != context or any(
                a["end"] != b["begin"] for a, b in zip(spans, spans[1:])):
            problems.append(f"{p['policy']}: the spans do not cover [0, {context}) in order")
        if sum(s["positions"] for s in spans) != positions:
            problems.append(f"{p['policy']}: the spans count {sum(s['positions'] for s in spans)} "
                            f"positions, expected {positions}")
        if not (0 <= p["top1"] <= 1 and p["kl_mean"] >= 0 and math.isfinite(p["perplexity"])):
            problems.append(f"{p['policy']}: a figure out of range: {p}")
    if "calibration" in run:
        ranking = run["calibration"]["heads"]
        if len(ranking) != shape["n_layers"] * shape["n_kv_heads"] or any(
                a["outside"] < b["outside"] for a, b in zip(ranking, ranking[1:])):
            problems.append("calibration: expected every head once, the most attention outside first")
        for p in run["policies"]:
            k = len(p["full_heads"])
            if k > 3 and sorted(p["full_heads"]) != sorted(
                    [h["layer"], h["kv_head"]] for h in ranking[:k]):
                problems.append(f"{p['policy']}: expected the ranking's top {k} heads in full")
    for probe in run["passkey"]:
        names = [r["policy"] for r in probe["results"]]
        if names != ["reference"] + [p["policy"] for p in run["policies"]]:
            problems.append(f"pass key at {probe['length']}: results for {names}")
    for problem in problems:
        print(problem)
    print(f"{len(run['policies'])} policies checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
