#!/usr/bin/env python3
"""Double-precision reference forward pass of a llama-architecture GGUF file (SmolLM2-135M-Instruct).

    python3 tests/golden/smollm2_golden.py MODEL.gguf OUT_DIR

Reads the file with gguf.GGUFReader, dequantizes every tensor with
gguf.quants.dequantize (which returns float32) and widens it to float64; all
the arithmetic after that is float64.  For each prompt (a user message put in
the file's ChatML chat template with its default system prompt, tokenized by
tokenizer_golden.build_tokenizer) it greedily decodes exactly 64 tokens with a
KV cache and writes, to OUT_DIR:

  smollm2_double.json          config, prompt ids, the 64 greedy ids, the
                               runner-up id and the top1-top2 logit gap of
                               each step, the decoded text;
  smollm2_prompt<N>_logits.f32 the 49152 logits of the first step (after the
                               whole prompt), little-endian float32.

The forward pass (llama.cpp's LLM_ARCH_LLAMA graph, F32 compute replaced by float64):
  x = token_embd[id]
  per layer:  h = rmsnorm(x) * attn_norm
              q = W_q h, k = W_k h, v = W_v h           (W stored [out, in])
              q, k rotated by RoPE, llama.cpp "normal" mode: within each head the
                 ADJACENT pairs (2i, 2i+1) are rotated by pos * base^(-2i/head_dim)
                 (the GGUF converter permuted W_q and W_k rows for this)
              k, v appended to the cache; query head h reads KV head h // (n_head/n_head_kv)
              a = softmax(q.k / sqrt(head_dim)) v,  x += W_o a
              h = rmsnorm(x) * ffn_norm
              x += W_down (silu(W_gate h) * (W_up h))
  logits = token_embd (rmsnorm(x) * output_norm)       (tied classifier)
  rmsnorm(x) = x / sqrt(mean(x^2) + eps)
"""
import argparse
import datetime
import json
import math
import os
import re
import sys
import time

import numpy as np
import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer_golden import (build_tokenizer, field, package_versions,  # noqa: E402
                              sha256_of, write_pretty_json)

N_DECODE = 64
USER_MESSAGES = [
    "What is the capital of France?",
    "Explain what a KV cache is in two sentences.",
    "Write a haiku about the sea.",
    "List three primary colors.",
    # Three whose greedy paths in llama.cpp run long before a near tie (smollm2_llamacpp.json):
    # the comparison with llama.cpp is made up to its first near tie.
    "Count from 1 to 20, separated by commas.",
    "Name the days of the week.",
    "What is the capital of Germany?",
]

# The file's tokenizer.chat_template must be exactly this ChatML template
# ({SYSTEM} stands for its default system prompt); render_chatml reproduces it.
# Its Jinja string literals hold real newline characters, not backslash-n.
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n{SYSTEM}<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def default_system_prompt(template):
    m = re.search(r"\{\{ '<\|im_start\|>system\n(.*?)<\|im_end\|>\n' \}\}", template)
    if m is None:
        raise ValueError("no default system prompt found in the chat template")
    system = m.group(1)
    if template != CHATML_TEMPLATE.replace("{SYSTEM}", system):
        raise ValueError("tokenizer.chat_template is not the expected ChatML template:\n" + template)
    return system


def render_chatml(system, user):
    """The template applied to [{"role": "user", "content": user}], add_generation_prompt=True."""
    return (f"<|im_start|>system\n{system}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n"
            f"<|im_start|>assistant\n")


def render_with_jinja2(template, user):
    """The template rendered by jinja2 when it is installed, else None."""
    try:
        import jinja2.sandbox
    except ImportError:
        return None
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(
        messages=[{"role": "user", "content": user}], add_generation_prompt=True)


def load_config(reader):
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"architecture {arch!r}, expected llama")
    g = lambda k: field(reader, "llama." + k)  # noqa: E731
    cfg = {
        "architecture": arch,
        "n_layers": int(g("block_count")),
        "d_model": int(g("embedding_length")),
        "n_heads": int(g("attention.head_count")),
        "n_kv_heads": int(g("attention.head_count_kv")),
        "ffn_dim": int(g("feed_forward_length")),
        "vocab_size": int(g("vocab_size")),
        "context_length": int(g("context_length")),
        "rope_dim": int(g("rope.dimension_count")),
        # float32 values in the file, widened exactly to double
        "rope_freq_base": float(g("rope.freq_base")),
        "rms_norm_eps": float(g("attention.layer_norm_rms_epsilon")),
    }
    cfg["head_dim"] = cfg["d_model"] // cfg["n_heads"]
    if cfg["head_dim"] * cfg["n_heads"] != cfg["d_model"] or cfg["rope_dim"] != cfg["head_dim"]:
        raise ValueError("unexpected head geometry")
    if cfg["n_heads"] % cfg["n_kv_heads"]:
        raise ValueError("n_heads is not a multiple of n_kv_heads")
    return cfg


def load_weights(reader, cfg):
    """name -> float64 array in numpy order (GGUF ne[0], the innermost dim, last)."""
    w, types = {}, {}
    for t in reader.tensors:
        x = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if x.shape != shape:
            raise ValueError(f"{t.name}: dequantized shape {x.shape}, expected {shape}")
        w[t.name] = x.astype(np.float64)
        types[t.name] = t.tensor_type.name
    d, dkv, f = cfg["d_model"], cfg["n_kv_heads"] * cfg["head_dim"], cfg["ffn_dim"]
    expect = {"token_embd.weight": (cfg["vocab_size"], d), "output_norm.weight": (d,)}
    for i in range(cfg["n_layers"]):
        p = f"blk.{i}."
        expect.update({p + "attn_norm.weight": (d,), p + "attn_q.weight": (d, d),
                       p + "attn_k.weight": (dkv, d), p + "attn_v.weight": (dkv, d),
                       p + "attn_output.weight": (d, d), p + "ffn_norm.weight": (d,),
                       p + "ffn_gate.weight": (f, d), p + "ffn_up.weight": (f, d),
                       p + "ffn_down.weight": (d, f)})
    for name, shape in expect.items():
        if w.get(name) is None or w[name].shape != shape:
            raise ValueError(f"tensor {name}: {None if name not in w else w[name].shape}, expected {shape}")
    extra = sorted(set(w) - set(expect))
    if extra:
        raise ValueError(f"unexpected tensors (an untied output.weight?): {extra}")
    return w, types


class Model:
    def __init__(self, cfg, w):
        self.cfg, self.w = cfg, w
        hd = cfg["head_dim"]
        i = np.arange(hd // 2, dtype=np.float64)
        self.inv_freq = cfg["rope_freq_base"] ** (-2.0 * i / hd)  # base^(-2i/head_dim)

    def rmsnorm(self, x, weight):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.cfg["rms_norm_eps"]) * weight

    def rope(self, x, positions):
        """x: [T, heads, head_dim]; rotates adjacent pairs (2i, 2i+1) ("normal" mode)."""
        ang = positions[:, None].astype(np.float64) * self.inv_freq[None, :]  # [T, hd/2]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def new_cache(self):
        c = self.cfg
        n = N_DECODE + 256
        return {"len": 0,
                "k": np.zeros((c["n_layers"], n, c["n_kv_heads"], c["head_dim"])),
                "v": np.zeros((c["n_layers"], n, c["n_kv_heads"], c["head_dim"]))}

    def forward(self, ids, cache):
        """Runs the tokens ids (at positions cache.len ...) and returns the last one's logits."""
        c, w = self.cfg, self.w
        T, start = len(ids), cache["len"]
        H, KV, hd = c["n_heads"], c["n_kv_heads"], c["head_dim"]
        group = H // KV
        pos = np.arange(start, start + T)
        L = start + T
        if L > cache["k"].shape[1]:
            raise ValueError("KV cache too small")
        causal = np.where(np.arange(L)[None, :] <= pos[:, None], 0.0, -np.inf)  # [T, L]
        x = w["token_embd.weight"][np.asarray(ids)]  # [T, d]
        for li in range(c["n_layers"]):
            p = f"blk.{li}."
            h = self.rmsnorm(x, w[p + "attn_norm.weight"])
            q = (h @ w[p + "attn_q.weight"].T).reshape(T, H, hd)
            k = (h @ w[p + "attn_k.weight"].T).reshape(T, KV, hd)
            v = (h @ w[p + "attn_v.weight"].T).reshape(T, KV, hd)
            q, k = self.rope(q, pos), self.rope(k, pos)
            cache["k"][li, start:L], cache["v"][li, start:L] = k, v
            K, V = cache["k"][li, :L], cache["v"][li, :L]  # [L, KV, hd]
            att = np.empty((T, H, hd))
            for hh in range(H):
                kv = hh // group
                s = q[:, hh, :] @ K[:, kv, :].T / math.sqrt(hd) + causal  # [T, L]
                s = np.exp(s - s.max(axis=-1, keepdims=True))
                s /= s.sum(axis=-1, keepdims=True)
                att[:, hh, :] = s @ V[:, kv, :]
            x = x + att.reshape(T, H * hd) @ w[p + "attn_output.weight"].T
            h = self.rmsnorm(x, w[p + "ffn_norm.weight"])
            gate = h @ w[p + "ffn_gate.weight"].T
            up = h @ w[p + "ffn_up.weight"].T
            x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
        cache["len"] = L
        h = self.rmsnorm(x[-1], w["output_norm.weight"])
        return w["token_embd.weight"] @ h  # tied classifier


def top2(logits):
    """(top-1 id, top-2 id, gap); ties go to the lower id."""
    order = np.argsort(-logits, kind="stable")
    a, b = int(order[0]), int(order[1])
    return a, b, float(logits[a] - logits[b])


def greedy_decode(logits, feed):
    """N_DECODE greedy steps from the first step's logits; feed(id) runs one token and returns
    the next logits. Returns the ids, the runner-up ids and the top1-top2 gaps of every step."""
    greedy, runner_up, gaps = [], [], []
    for step in range(N_DECODE):
        a, b, gap = top2(logits)
        greedy.append(a)
        runner_up.append(b)
        gaps.append(gap)
        if step + 1 < N_DECODE:
            logits = feed(a)
    return greedy, runner_up, gaps


def sig9(x):
    return float(f"{x:.9g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="GGUF file (SmolLM2-135M-Instruct.Q4_1.gguf)")
    ap.add_argument("out_dir", help="folder for smollm2_double.json and the .f32 logits files")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    t0 = time.time()

    print(f"reading {args.model}", flush=True)
    model_sha = sha256_of(args.model)
    reader = gguf.GGUFReader(args.model)
    cfg = load_config(reader)
    print("config:", json.dumps(cfg), flush=True)
    tok, special_ids, special_strings = build_tokenizer(reader)
    if cfg["vocab_size"] != tok.get_vocab_size(with_added_tokens=True):
        raise ValueError("llama.vocab_size differs from the tokenizer's vocabulary")
    template = field(reader, "tokenizer.chat_template")
    system = default_system_prompt(template)

    w, types = load_weights(reader, cfg)
    type_counts = {}
    for name in sorted(types):
        type_counts[types[name]] = type_counts.get(types[name], 0) + 1
    print(f"dequantized {len(w)} tensors {type_counts} to float64 in {time.time() - t0:.1f} s",
          flush=True)
    model = Model(cfg, w)
    im_end = tok.token_to_id("<|im_end|>")

    jinja_used = False
    prompts = []
    for n, user in enumerate(USER_MESSAGES):
        text = render_chatml(system, user)
        jt = render_with_jinja2(template, user)
        if jt is not None:
            jinja_used = True
            if jt != text:
                raise AssertionError(f"jinja2 rendering differs:\n{jt!r}\n{text!r}")
        prompt_ids = tok.encode(text, add_special_tokens=False).ids
        if tok.decode(prompt_ids, skip_special_tokens=False) != text:
            raise AssertionError("prompt does not round-trip through the tokenizer")
        cache = model.new_cache()
        t1 = time.time()
        logits = model.forward(prompt_ids, cache)
        logits_file = f"smollm2_prompt{n}_logits.f32"
        logits_path = os.path.join(args.out_dir, logits_file)
        logits.astype("<f4").tofile(logits_path)
        first_top5 = [[int(i), sig9(logits[i])] for i in np.argsort(-logits, kind="stable")[:5]]
        greedy, runner_up, gaps = greedy_decode(logits, lambda a: model.forward([a], cache))
        first_im_end = greedy.index(im_end) if im_end in greedy else None
        decoded = tok.decode(greedy, skip_special_tokens=False)
        min_step = int(np.argmin(gaps))
        print(f"prompt {n}: {len(prompt_ids)} prompt tokens, {N_DECODE} decoded in "
              f"{time.time() - t1:.1f} s; first <|im_end|> at {first_im_end}; "
              f"smallest gap {gaps[min_step]:.3g} at step {min_step}\n  {decoded!r}", flush=True)
        prompts.append({
            "user": user,
            "text": text,
            "prompt_ids": prompt_ids,
            "greedy_ids": greedy,
            "top2_ids": runner_up,
            "gaps": [sig9(g) for g in gaps],
            "first_im_end": first_im_end,
            "decoded_text": decoded,
            "first_step_top5": first_top5,
            "logits_file": logits_file,
            "logits_sha256": sha256_of(logits_path),
        })

    out = {
        "provenance": {
            "model_file": os.path.basename(args.model),
            "model_sha256": model_sha,
            "model_license": field(reader, "general.license"),
            "script": "tests/golden/smollm2_golden.py",
            "packages": package_versions(),
            "date": datetime.date.today().isoformat(),
            "forward": (
                "llama forward pass in float64 (numpy): every tensor dequantized by "
                "gguf.quants.dequantize (float32) and widened to float64; RMSNorm x/sqrt(mean(x^2)+eps)*w; "
                "q,k,v = W x with W stored [out, in]; RoPE llama.cpp normal mode (adjacent pairs "
                "(2i,2i+1) of each head rotated by pos*base^(-2i/head_dim)); grouped-query attention "
                "(query head h uses KV head h//(n_heads/n_kv_heads)) with a KV cache, softmax scale "
                "1/sqrt(head_dim); x += W_o a; SwiGLU x += W_down(silu(W_gate h)*(W_up h)); final "
                "RMSNorm; logits = token_embd h (tied). The prompt runs as one batch with a causal "
                "mask, then one token a step."),
            "decoding": (f"greedy, exactly {N_DECODE} tokens, not stopped at <|im_end|>; step s's "
                         "logits are those after the prompt and greedy_ids[0..s-1]; top2_ids[s] is "
                         "the runner-up and gaps[s] = logit(top1) - logit(top2), computed in double, "
                         "written with 9 significant digits; ties go to the lower id"),
            "logits_files": ("the first step's logits (after the whole prompt), vocab_size values, "
                             "little-endian IEEE float32 rounded from the double values"),
            "prompt": ("tokenizer.chat_template applied to one user message with "
                       "add_generation_prompt=true (the template inserts its default system prompt); "
                       + ("rendered by hand and checked equal to jinja2's rendering" if jinja_used else
                          "rendered by hand (jinja2 not installed) after checking that the template "
                          "is exactly the ChatML template this script reproduces")),
            "chat_template": template,
            "tokenizer": "tests/golden/tokenizer_golden.py build_tokenizer (GGUF metadata only)",
            "special_tokens": {str(i): s for i, s in zip(special_ids, special_strings)},
            "tensor_types": type_counts,
        },
        "config": cfg,
        "prompts": prompts,
    }
    out_path = os.path.join(args.out_dir, "smollm2_double.json")
    write_pretty_json(out_path, out)
    print(f"wrote {out_path} in {time.time() - t0:.1f} s total")


if __name__ == "__main__":
    main()
