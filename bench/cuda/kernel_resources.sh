#!/usr/bin/env bash
# What the compiler gives each of kvlab's CUDA kernels, from ptxas itself (no GPU needed):
# registers per thread, spill bytes, static shared memory, and the resident blocks per
# multiprocessor that the registers allow. Every library kernel (namespace kvlab) that tests/cuda
# instantiates is listed, once per template instance; the tests' own helper kernels are not.
#
#   bench/cuda/kernel_resources.sh [arch]   # arch: 90 (default), 80, ...
#
# Prints a Markdown table (bench/results/sm90-kernel-resources.md is its output for sm_90).
# The occupancy column assumes 65536 registers per multiprocessor, allocated per warp in units
# of 256, and at most 32 resident blocks (true of sm_80 and sm_90); shared memory may lower it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
arch=${1:-90}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for source in tests/cuda/test_cuda_*.cu; do
  nvcc -std=c++17 -arch="sm_$arch" -Iinclude -Itests -isystem /usr/include/eigen3 \
    --expt-relaxed-constexpr -diag-suppress=20011,20012,20014 -DEIGEN_NO_CUDA \
    -Xptxas -v -c "$source" -o "$work/$(basename "$source").o" 2>> "$work/ptxas.txt"
done

echo "| kernel (template instance) | threads | registers | spill stores / loads (bytes) | static smem (bytes) | blocks/SM by registers |"
echo "|---|---|---|---|---|---|"
# ptxas prints, per entry function: "Compiling entry function '<mangled>'", then "Function
# properties ... N bytes spill stores, M bytes spill loads", then "Used R registers, ... S bytes smem".
awk -v q="'" '
  /Compiling entry function/ { split($0, parts, q); name = parts[2] }
  /spill stores/ { match($0, /[0-9]+ bytes spill stores/); stores = substr($0, RSTART, RLENGTH) + 0
                   match($0, /[0-9]+ bytes spill loads/); loads = substr($0, RSTART, RLENGTH) + 0 }
  /Used [0-9]+ registers/ { match($0, /Used [0-9]+/); regs = substr($0, RSTART + 5, RLENGTH - 5) + 0
                            smem = 0; if (match($0, /[0-9]+ bytes smem/)) smem = substr($0, RSTART, RLENGTH) + 0
                            if (name ~ /^_ZN5kvlab/) print name "\t" regs "\t" stores "\t" loads "\t" smem }
' "$work/ptxas.txt" | sort -u > "$work/rows.txt"

while IFS=$'\t' read -r mangled regs stores loads smem; do
  pretty=$(echo "$mangled" | c++filt | sed -e 's/kvlab::cuda::detail:://g' -e 's/kvlab::cuda:://g' -e 's/kvlab:://g' \
    -e 's/^void //' -e 's/(.*$//')
  # Threads per block: fixed for the attention kernel (kAttentionThreads); the others are
  # launched with sizes that depend on the shape, so no occupancy is given for them.
  case "$pretty" in
    attention_kernel*) threads=128 ;;
    *) threads="-" ;;
  esac
  if [ "$threads" = "-" ]; then
    blocks="-"
  else
    per_warp=$(( (regs * 32 + 255) / 256 * 256 ))
    warps=$(( threads / 32 ))
    blocks=$(( 65536 / (per_warp * warps) ))
    [ "$blocks" -gt 32 ] && blocks=32
  fi
  echo "| \`$pretty\` | $threads | $regs | $stores / $loads | $smem | $blocks |"
done < "$work/rows.txt" | sort -u
