#!/usr/bin/env python3
"""The decode shapes of bench_cuda_decode through PyTorch, on the same GPU in the same run.

Reads the JSON that bench_cuda_decode wrote (every case with its sequence lengths), runs each
case through torch.nn.functional.scaled_dot_product_attention on a padded batch, writes a JSON
of the times, and prints kvlab's times beside PyTorch's with the ratio (PyTorch time / kvlab
split-K time: above 1, kvlab is faster).

The PyTorch side of a case: K and V are [batch, kv_heads, max_len, head_dim] in fp16 (every
sequence padded to the longest), the queries [batch, kv_heads, group, head_dim]: the `group`
query heads of a K/V head are passed as `group` query rows of that head, which is exactly
decode attention with grouped-query heads and needs no copy of K/V. A ragged batch adds a
boolean attn_mask [batch, 1, 1, max_len] that hides the padding. Bandwidth is computed from the
bytes of the real tokens (the same figure as kvlab's), so padding counts against PyTorch, as
it costs a padded batch in practice. Times: CUDA events, median of --reps runs, each after
writing a buffer twice the size of the L2 cache, as bench_cuda_decode does.

Usage (a GPU machine, see bench/cuda/README.md):
  python3 bench/cuda/torch_sdpa.py --cases <bench_cuda_decode json> --out <json> [--reps R]
"""
import argparse
import json
import math
import statistics
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", required=True, help="JSON written by bench_cuda_decode --json")
    parser.add_argument("--out", required=True, help="JSON to write PyTorch's times to")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()

    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("SKIPPED: PyTorch is not installed")
        return 77
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device")
        return 77

    with open(args.cases) as f:
        ours = json.load(f)
    heads, kv_heads, head_dim = ours["heads"], ours["kv_heads"], ours["head_dim"]
    group = heads // kv_heads
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    l2_bytes = getattr(props, "L2_cache_size", 50 * 2**20)
    flush = torch.empty(2 * max(l2_bytes, 2**20), dtype=torch.uint8, device=device)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    peak = ours.get("peak_tbps", 0.0)

    def median_us(work):
        work()  # warm-up
        torch.cuda.synchronize()
        times = []
        for r in range(args.reps):
            flush.fill_(r & 0xFF)
            start.record()
            work()
            stop.record()
            stop.synchronize()
            times.append(1000.0 * start.elapsed_time(stop))
        return statistics.median(times)

    print(f"GPU: {props.name}; torch {torch.__version__}; fp16; {heads} query heads / {kv_heads} K/V heads, "
          f"head_dim {head_dim}")
    print(f"{'kind':<10} {'batch':>6} {'context':>7} {'lengths':<7} | {'kvlab (us)':>11} {'TB/s':>6} | "
          f"{'torch (us)':>11} {'TB/s':>6} | {'torch/kvlab':>11}")
    results = []
    for case in ours["cases"]:
        lengths = case["lengths"]
        batch, max_len = len(lengths), max(lengths)
        torch.manual_seed(0)
        q = torch.empty(batch, kv_heads, group, head_dim, dtype=torch.float16, device=device).uniform_(-1, 1)
        k = torch.empty(batch, kv_heads, max_len, head_dim, dtype=torch.float16, device=device).uniform_(-1, 1)
        v = torch.empty(batch, kv_heads, max_len, head_dim, dtype=torch.float16, device=device).uniform_(-1, 1)
        mask = None
        if min(lengths) != max_len:
            positions = torch.arange(max_len, device=device)
            mask = (positions[None, :] < torch.tensor(lengths, device=device)[:, None]).view(batch, 1, 1, max_len)

        def work():
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        us = median_us(work)
        kv_bytes = case["kv_bytes"]
        torch_tbps = kv_bytes / (us * 1e-6) / 1e12
        ours_us = case["split_k_us"]
        results.append({
            "kind": case["kind"], "batch": case["batch"], "context": case["context"], "ragged": case["ragged"],
            "kv_bytes": kv_bytes, "padded_kv_bytes": 2 * 2 * batch * max_len * kv_heads * head_dim,
            "torch_us": us, "torch_tbps": torch_tbps,
            "torch_fraction_of_peak": torch_tbps / peak if peak else 0.0,
            "kvlab_split_k_us": ours_us, "kvlab_single_pass_us": case["single_pass_us"],
            "torch_over_kvlab": us / ours_us,
        })
        print(f"{case['kind']:<10} {case['batch']:>6} {case['context']:>7} "
              f"{'ragged' if case['ragged'] else 'uniform':<7} | {ours_us:>11.1f} {case['split_k_tbps']:>6.2f} | "
              f"{us:>11.1f} {torch_tbps:>6.2f} | {us / ours_us:>10.2f}x", flush=True)
        del q, k, v, mask
        torch.cuda.empty_cache()

    ratios = [r["torch_over_kvlab"] for r in results if r["ragged"]]
    if ratios:
        print(f"ragged batches: torch/kvlab geometric mean {math.exp(statistics.mean(math.log(x) for x in ratios)):.2f}x, "
              f"minimum {min(ratios):.2f}x")
    with open(args.out, "w") as f:
        json.dump({"program": "torch_sdpa.py", "gpu": props.name, "torch": torch.__version__,
                   "peak_tbps": peak, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
                   "dtype": "fp16", "reps": args.reps, "cases": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
