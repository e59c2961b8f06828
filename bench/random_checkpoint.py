#!/usr/bin/env python3
"""Writes a llama2.c checkpoint (legacy version-0 .bin) of a given shape with random weights, so
that kvlab and another implementation of the same format (llama2.c's run.c) can be timed on the
same file: `bench_generate --model FILE` and `kvlab-generate --model FILE` read it. The default
shape is stories15M's (dim 288, hidden 768, 6 layers, 6 heads, vocab 32000, seq_len 256) with a
separate classifier (a negative vocab size in the header), as bench_generate's stories15M shape.

Layout (the order run.c's memory_map_weights reads): a header of seven int32 (dim, hidden_dim,
n_layers, n_heads, n_kv_heads, vocab_size, seq_len), then float32 arrays: token embedding
[vocab, dim], attention RMSNorm [layers, dim], wq [layers, dim, dim], wk and wv [layers,
kv_dim, dim], wo [layers, dim, dim], ffn RMSNorm [layers, dim], w1 [layers, hidden, dim], w2
[layers, dim, hidden], w3 [layers, hidden, dim], final RMSNorm [dim], the two RoPE tables of the
legacy format [seq_len, head_dim / 2] each (unused), classifier [vocab, dim]. Norm weights are 1;
every matrix is uniform in ±1/sqrt(its input width), the embedding in ±0.5.

usage: random_checkpoint.py OUT.bin [--dim D] [--hidden H] [--layers L] [--heads N]
                            [--kv-heads K] [--vocab V] [--seq-len S] [--seed SEED]
"""
import argparse
import array
import random
import struct


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--dim", type=int, default=288)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--kv-heads", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--seed", type=int, default=1)
    a = parser.parse_args()
    if a.dim % a.heads or a.heads % a.kv_heads:
        parser.error(f"--dim ({a.dim}) must be a multiple of --heads ({a.heads}), "
                     f"and --heads of --kv-heads ({a.kv_heads})")
    rng = random.Random(a.seed)
    head_dim = a.dim // a.heads
    kv_dim = a.kv_heads * head_dim
    L = a.layers

    def uniform(count, bound):
        return array.array("f", (rng.uniform(-bound, bound) for _ in range(count)))

    def ones(count):
        return array.array("f", [1.0]) * count

    arrays = [
        uniform(a.vocab * a.dim, 0.5),                              # token embedding
        ones(L * a.dim),                                            # attention RMSNorm
        uniform(L * a.dim * a.dim, a.dim ** -0.5),                  # wq
        uniform(L * kv_dim * a.dim, a.dim ** -0.5),                 # wk
        uniform(L * kv_dim * a.dim, a.dim ** -0.5),                 # wv
        uniform(L * a.dim * a.dim, a.dim ** -0.5),                  # wo
        ones(L * a.dim),                                            # ffn RMSNorm
        uniform(L * a.hidden * a.dim, a.dim ** -0.5),               # w1
        uniform(L * a.dim * a.hidden, a.hidden ** -0.5),            # w2
        uniform(L * a.hidden * a.dim, a.dim ** -0.5),               # w3
        ones(a.dim),                                                # final RMSNorm
        ones(a.seq_len * head_dim // 2),                            # RoPE table (unused)
        ones(a.seq_len * head_dim // 2),                            # RoPE table (unused)
        uniform(a.vocab * a.dim, a.dim ** -0.5),                    # classifier
    ]
    with open(a.out, "wb") as f:
        # a negative vocab size: the classifier is stored after the other weights
        f.write(struct.pack("<7i", a.dim, a.hidden, L, a.heads, a.kv_heads, -a.vocab, a.seq_len))
        for values in arrays:
            values.tofile(f)


if __name__ == "__main__":
    main()
