#!/usr/bin/env bash
# kvlab's main job: installs what is missing, builds (Release) and runs the headline demo,
# the O(n^2)-vs-O(n) table of naive and cached decoding. Extra arguments go to the demo
# (try --help).
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
exec build-demo/apps/kvlab-gap "$@"
