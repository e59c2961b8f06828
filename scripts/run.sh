#!/usr/bin/env bash
# kvlab's main job: installs what is missing, builds (Release) and runs the headline demo,
# the O(n^2)-vs-O(n) table of naive and cached decoding. Extra arguments go to the demo
# (try --help); --plot FILE.svg (first) also draws its tables as log-log plots with matplotlib
# (docs/gap_plot.py, Debian's python3-matplotlib), the processor under them.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
# A build of its own, with only what the demo needs (no Catch2, no Doxygen).
cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=Release -DKVLAB_BUILD_TESTS=OFF \
  -DKVLAB_BUILD_TUTORIALS=OFF -DKVLAB_BUILD_BENCH=OFF -DKVLAB_BUILD_DOCS=OFF -DKVLAB_ENABLE_CUDA=OFF \
  >/dev/null
cmake --build build-demo --target kvlab-gap -j "$jobs"
plot=""
if [ "${1:-}" = "--plot" ]; then
  plot=${2:?"--plot: expected a file name (.svg)"}
  shift 2
fi
if [ -z "$plot" ]; then
  exec build-demo/apps/kvlab-gap "$@"
fi
table=$(mktemp)
trap 'rm -f "$table"' EXIT
build-demo/apps/kvlab-gap "$@" | tee "$table"
machine=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)
python=python3
[ -x /usr/bin/python3 ] && python=/usr/bin/python3  # Debian's, with python3-matplotlib
"$python" docs/gap_plot.py "$plot" "$table" --machine "${machine:-unknown processor}"
echo "Plot written to $plot"
