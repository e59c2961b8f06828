#!/usr/bin/env bash
# Builds kvlab on a GPU machine and runs what cannot run elsewhere, writing everything worth
# keeping to $OUT (default: ./gpu-results). Two stages, each under 10 minutes on an H100/H200
# with 16 cores; run them back to back (the build of the first is reused by the second while
# the machine is still up, else rebuilt):
#
#   bench/cuda/run_on_gpu.sh tests   # build, ctest -L cuda, compute-sanitizer memcheck + racecheck
#   bench/cuda/run_on_gpu.sh bench   # the GPU benchmarks and PyTorch on the same shapes, as JSON
#
#   bench/cuda/run_on_gpu.sh kernels # a short check of the attention kernels: their CUDA tests but
#                                    # vLLM's grid, memcheck + racecheck on the sinks
#
# Needs .deps/ (Eigen, Catch2, Google Benchmark, CLI11, nlohmann/json and the tokenizer's
# Unicode data, made by scripts/prepare-gpu-deps.sh on a machine with the Debian packages and
# carried along), nvcc, CMake, Ninja; `bench` uses PyTorch if present.
# Files written (at most 8 per stage):
#   tests, kernels: build.log, ctest-cuda.log, sanitizer.log
#   bench: <gpu>-cuda-decode.{json,txt}, <gpu>-torch-decode.{json,txt},
#          <gpu>-attention-lab.{json,txt}, <gpu>-cuda-generation.{json,txt}
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${OUT:-$PWD/gpu-results}
mkdir -p "$out"
build=build-gpu
stage=${1:-}

configure_and_build() {  # all targets, or those named
  if [ ! -f "$build/build.ninja" ]; then
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps" \
      -DKVLAB_UNICODE_DATA_DIR="$PWD/.deps/unicode" \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DKVLAB_BUILD_DOCS=OFF -DKVLAB_WARNINGS_AS_ERRORS=ON || return 1
  fi
  cmake --build "$build" -j "$(nproc)" ${1:+--target "$@"}
}

case "$stage" in
  tests)
    nvidia-smi -L
    echo "== build"
    start=$(date +%s)
    configure_and_build > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
    echo "built in $(( $(date +%s) - start )) s"
    echo "== ctest -L cuda (CUDA tests, tutorial 11, benchmark smoke runs) and the CPU tests of the kernels' arithmetic"
    ctest --test-dir "$build" -L cuda --output-on-failure -j 4 --timeout 900 2>&1 | tee "$out/ctest-cuda.log" | tail -25
    ctest --test-dir "$build" -R '^test_(softmax_state|attention_plan):' 2>&1 | tail -3
    echo "== compute-sanitizer (memcheck, racecheck): every kernel, the caches and the decoders"
    : > "$out/sanitizer.log"
    runs=(
      "$build/tutorials/11_cuda_attention"
      "$build/tests/cuda/test_cuda_cache"
      "$build/tests/cuda/test_cuda_attention cuda::paged_prefill_attention*"
      "$build/bench/cuda/attention_lab --context 1000 --batch 2 --reps 1"
      "$build/bench/cuda/attention_lab --context 700 --heads 40 --kv-heads 40 --head-dim 80 --version 5 --reps 1"
      "$build/bench/cuda/attention_lab --context 3000 --heads 64 --kv-heads 8 --head-dim 256 --version 6 --reps 1"
    )
    for tool in memcheck racecheck; do
      for run in "${runs[@]}"; do
        read -r -a cmd <<< "$run"
        echo "---- $tool: $run" >> "$out/sanitizer.log"
        timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 99 "${cmd[@]}" >> "$out/sanitizer.log" 2>&1
        status=$?
        echo "$tool ${run#"$build/"}: exit $status ($( [ $status -eq 0 ] && echo clean || echo 'SEE sanitizer.log' ))"
      done
    done
    ;;
  kernels)
    nvidia-smi -L
    echo "== build (the CUDA tests of the kernels and caches)"
    start=$(date +%s)
    configure_and_build test_cuda_attention test_cuda_cache > "$out/build.log" 2>&1 ||
      { tail -40 "$out/build.log"; exit 1; }
    echo "built in $(( $(date +%s) - start )) s"
    echo "== ctest: test_cuda_attention (but vLLM's grid, whose CPU reference takes minutes) and test_cuda_cache"
    ctest --test-dir "$build" -R '^test_cuda_(attention|cache):' -E "vLLM's grid" --output-on-failure \
      -j 4 --timeout 300 2>&1 | tee "$out/ctest-cuda.log" | tail -12
    echo "== compute-sanitizer (memcheck, racecheck): the sinks cases"
    : > "$out/sanitizer.log"
    for tool in memcheck racecheck; do
      for filter in "with attention sinks*"; do
        echo "---- $tool: test_cuda_attention $filter" >> "$out/sanitizer.log"
        timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 99 \
          "$build/tests/cuda/test_cuda_attention" "$filter" >> "$out/sanitizer.log" 2>&1
        status=$?
        echo "$tool test_cuda_attention $filter: exit $status ($( [ $status -eq 0 ] && echo clean || echo 'SEE sanitizer.log' ))"
      done
    done
    echo "total $(( $(date +%s) - start )) s"
    ;;
  bench)
    nvidia-smi -L
    configure_and_build attention_lab bench_cuda_decode bench_cuda_generation > "$out/bench-build.log" 2>&1 ||
      { tail -40 "$out/bench-build.log"; exit 1; }
    rm -f "$out/bench-build.log"  # keep the 8 result files only
    name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    case "$name" in *H200*) gpu=h200 ;; *H100*) gpu=h100 ;; *) gpu=$(echo "$name" | tr -cs 'A-Za-z0-9' '-' | tr 'A-Z' 'a-z') ;; esac
    export PYTHONUNBUFFERED=1
    timeout 300 "$build/bench/cuda/bench_cuda_decode" --json "$out/$gpu-cuda-decode.json" 2>&1 | tee "$out/$gpu-cuda-decode.txt"
    timeout 240 python3 bench/cuda/torch_sdpa.py --cases "$out/$gpu-cuda-decode.json" \
      --out "$out/$gpu-torch-decode.json" 2>&1 | tee "$out/$gpu-torch-decode.txt"
    timeout 120 "$build/bench/cuda/attention_lab" --json "$out/$gpu-attention-lab.json" 2>&1 | tee "$out/$gpu-attention-lab.txt"
    timeout 180 "$build/bench/cuda/bench_cuda_generation" --json "$out/$gpu-cuda-generation.json" 2>&1 |
      tee "$out/$gpu-cuda-generation.txt"
    ;;
  *)
    echo "usage: bench/cuda/run_on_gpu.sh tests|bench|kernels" >&2
    exit 2
    ;;
esac
