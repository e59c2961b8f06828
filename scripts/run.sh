#!/usr/bin/env bash
# kvlab's main job: installs what is missing, builds (Release) and runs the headline demo,
# the O(n^2)-vs-O(n) table of naive and cached decoding. Extra arguments go to the demo
# (try --help).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target kvlab-gap -j "$jobs"
exec build/bench/kvlab-gap "$@"
