#!/usr/bin/env bash
# llama.cpp's own measure of what a quantized KV cache costs SmolLM2-135M-Instruct, on the text
# kvlab-eval reads by default, for the cross-check of kvlab-eval's figures
# (bench/results/cpu-eval-llama-cpp.txt). llama.cpp is a peer built locally, never part of kvlab:
# from the pip package llama-cpp-python's source (its vendor/llama.cpp), target llama-perplexity.
#
#   bench/llama_cpp_kv_kl.sh LLAMA_BIN_DIR MODEL.gguf OUT_DIR [THREADS] [K:V ...]
#
# It writes the text as kvlab-eval joins it (the GNU GPL version 3, a blank line, version 2),
# runs llama-perplexity once with an fp32 cache (-ctk f32 -ctv f32) saving its logits
# (--kl-divergence-base), then once per K:V pair of cache types (default f16:f16 q8_0:q8_0
# q4_0:q4_0) with --kl-divergence against them: 4096-token chunks (-c 4096, two of them), every
# run with flash attention (-fa on: a quantized V needs it, and the base uses it too, so that the
# pairs differ from the base by the cache only). llama-perplexity scores the second half of each
# chunk (positions 2048 to 4094). Each run's statistics go to OUT_DIR/<K>_<V>.log, or with
# LLAMA_ATTN_ROT_DISABLE=1 (no Hadamard rotation before a quantized cache: the formats alone, as
# kvlab stores them) to OUT_DIR/<K>_<V>_norot.log.
set -euo pipefail
bin=$1 model=$2 out=$3 threads=${4:-2}
shift $(( $# < 4 ? $# : 4 ))
pairs=("$@")
[ ${#pairs[@]} -gt 0 ] || pairs=(f16:f16 q8_0:q8_0 q4_0:q4_0)
mkdir -p "$out"
text=$out/text.txt
{ cat /usr/share/common-licenses/GPL-3; printf '\n\n'; cat /usr/share/common-licenses/GPL-2; } > "$text"
common=(-m "$model" -c 4096 -b 4096 -ub 512 -t "$threads" -fa on)
# The base, once per OUT_DIR (a second run there, e.g. with LLAMA_ATTN_ROT_DISABLE=1, reuses it).
[ -s "$out/base.kld" ] || "$bin/llama-perplexity" "${common[@]}" -f "$text" -ctk f32 -ctv f32 \
  --kl-divergence-base "$out/base.kld" > "$out/f32_f32.log" 2>&1
tag=""  # llama.cpp rotates Q, K and V by a Hadamard matrix before a quantized cache unless
[ "${LLAMA_ATTN_ROT_DISABLE:-0}" = 0 ] || tag=_norot  # LLAMA_ATTN_ROT_DISABLE=1
for pair in "${pairs[@]}"; do
  k=${pair%%:*} v=${pair##*:}
  "$bin/llama-perplexity" "${common[@]}" -ctk "$k" -ctv "$v" --kl-divergence-base "$out/base.kld" \
    --kl-divergence > "$out/${k}_${v}$tag.log" 2>&1
  echo "$pair$tag: $(grep -E '^Mean +KLD' "$out/${k}_${v}$tag.log")"
done
