#!/usr/bin/env python3
"""Greedy ids and first-step logits of SmolLM2-135M-Instruct as llama.cpp computes them.

    LLAMA_CPP_LIB_PATH=LIBDIR PYTHONPATH=SRC python3 tests/golden/llamacpp_golden.py \
        MODEL.gguf OUT_DIR --llama-cpp-commit SHA

A second golden beside smollm2_double.json, from an implementation kvlab did not write:
llama.cpp, through the Python bindings of the pip package llama-cpp-python (its
`llama_cpp` module, SRC above) over the shared libraries built from the llama.cpp source
the package vendors (LIBDIR). Neither is part of kvlab; see tests/golden/README.md.

For each prompt of smollm2_double.json (the same prompt ids, which llama.cpp's own
tokenizer must reproduce from the prompt text) it evaluates the prompt as one batch,
then greedily decodes exactly 64 tokens, one token a batch, and writes to OUT_DIR:

  smollm2_llamacpp.json          provenance, and per prompt the 64 greedy ids, the
                                 runner-up id and the top1-top2 logit gap of each
                                 step (llama.cpp's float32 logits), and where its
                                 greedy ids first part from the double golden's;
  smollm2_llamacpp_prompt<N>_logits.f32
                                 the 49152 logits of the first step, little-endian
                                 float32, exactly as llama.cpp returned them.

llama.cpp's CPU backend multiplies Q4_1/Q8_0 weights by activations it first
quantizes to 8 bits (Q8_1/Q8_0 blocks), so its logits carry an error of their own;
where two logits are closer than that error its greedy path may part from an exact one.
"""
import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from smollm2_golden import N_DECODE, greedy_decode, sig9  # noqa: E402
from tokenizer_golden import sha256_of, write_pretty_json  # noqa: E402


def last_logits(llm, llama_cpp):
    """The logits of the last token evaluated (the only row the batch asked logits for), copied."""
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(llm.model))
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype(np.float32).copy()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="GGUF file (SmolLM2-135M-Instruct.Q4_1.gguf)")
    ap.add_argument("out_dir", help="tests/golden: reads smollm2_double.json, writes the llama.cpp golden")
    ap.add_argument("--llama-cpp-commit", required=True,
                    help="the llama.cpp commit the package vendors (recorded in the provenance)")
    ap.add_argument("--build", default="",
                    help="how the libraries were built (recorded in the provenance)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import llama_cpp  # the package's Python module, over LLAMA_CPP_LIB_PATH's libraries

    double_path = os.path.join(args.out_dir, "smollm2_double.json")
    with open(double_path, encoding="utf-8") as f:
        double = json.load(f)
    model_sha = sha256_of(args.model)
    if model_sha != double["provenance"]["model_sha256"]:
        raise ValueError(f"{args.model}: sha256 {model_sha}, the double golden's model is "
                         f"{double['provenance']['model_sha256']}")

    # One thread and one batch size for the prompt: the logits do not depend on how the work
    # is split between threads, but a batch of one and a batch of many run different kernels.
    llm = llama_cpp.Llama(model_path=args.model, n_ctx=512, n_batch=512, n_ubatch=512,
                          n_threads=args.threads, n_threads_batch=args.threads,
                          logits_all=False, verbose=False)
    system_info = llama_cpp.llama_print_system_info().decode().strip()
    prompts = []
    for n, p in enumerate(double["prompts"]):
        t0 = time.time()
        ids = llm.tokenize(p["text"].encode("utf-8"), add_bos=False, special=True)
        if ids != p["prompt_ids"]:
            raise AssertionError(f"prompt {n}: llama.cpp tokenizes the prompt as {ids}, "
                                 f"the double golden as {p['prompt_ids']}")
        llm.reset()
        llm.eval(ids)
        logits = last_logits(llm, llama_cpp)
        logits_file = f"smollm2_llamacpp_prompt{n}_logits.f32"
        logits_path = os.path.join(args.out_dir, logits_file)
        logits.astype("<f4").tofile(logits_path)
        exact = np.fromfile(os.path.join(args.out_dir, p["logits_file"]), dtype="<f4")
        first_error = float(np.max(np.abs(logits.astype(np.float64) - exact.astype(np.float64))))
        def feed(token):
            llm.eval([token])
            return last_logits(llm, llama_cpp)

        greedy, runner_up, gaps = greedy_decode(logits, feed)
        parts = next((s for s in range(N_DECODE) if greedy[s] != p["greedy_ids"][s]), None)
        text = llm.detokenize(greedy, special=True).decode("utf-8", errors="replace")
        print(f"prompt {n}: {N_DECODE} tokens in {time.time() - t0:.1f} s; first-step logits "
              f"max |llama.cpp - double| {first_error:.3g}; parts from the double golden at "
              f"{parts}; smallest gap before it "
              f"{min(gaps[:parts] if parts else gaps):.3g}\n  {text!r}", flush=True)
        prompts.append({
            "user": p["user"],
            "greedy_ids": greedy,
            "top2_ids": runner_up,
            "gaps": [sig9(g) for g in gaps],
            "parts_from_double_at": parts,
            "decoded_text": text,
            "first_step_max_abs_error_vs_double": sig9(first_error),
            "logits_file": logits_file,
            "logits_sha256": sha256_of(logits_path),
        })

    out = {
        "provenance": {
            "model_file": os.path.basename(args.model),
            "model_sha256": model_sha,
            "script": "tests/golden/llamacpp_golden.py",
            "implementation": "llama.cpp",
            "llama_cpp_commit": args.llama_cpp_commit,
            "llama_cpp_python": llama_cpp.__version__,
            "build": args.build,
            "system_info": system_info,
            "threads": args.threads,
            "python": sys.version.split()[0],
            "numpy": np.__version__,
            "date": datetime.date.today().isoformat(),
            "prompts": "the prompt texts and ids of smollm2_double.json; llama.cpp's tokenizer "
                       "(special tokens parsed, no BOS added) gives the same ids",
            "decoding": (f"the prompt evaluated as one batch (n_batch 512), then greedy, exactly "
                         f"{N_DECODE} tokens one a batch, not stopped at <|im_end|>; gaps[s] = "
                         "logit(top1) - logit(top2) of llama.cpp's float32 logits at step s, "
                         "computed in double, 9 significant digits; ties go to the lower id; "
                         "parts_from_double_at: the first step whose id differs from "
                         "smollm2_double.json's greedy_ids (null: none)"),
            "logits_files": "the first step's logits as llama.cpp returned them, vocab_size "
                            "little-endian IEEE float32 values",
        },
        "prompts": prompts,
    }
    path = os.path.join(args.out_dir, "smollm2_llamacpp.json")
    write_pretty_json(path, out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
