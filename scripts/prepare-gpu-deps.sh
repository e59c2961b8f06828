#!/usr/bin/env bash
# Copies what kvlab builds with from this machine's Debian packages into .deps/ at the
# repository root, for a GPU machine that has nvcc, CMake and Ninja but no package registry:
# Eigen, Catch2, Google Benchmark, CLI11 and nlohmann/json (their /usr layout kept; their CMake
# package files are relocatable, so `cmake -DCMAKE_PREFIX_PATH=$PWD/.deps` finds them), and in
# .deps/unicode the three files of unicode-data that the BPE tokenizer's table is made from
# (`-DKVLAB_UNICODE_DATA_DIR=$PWD/.deps/unicode`). About 20 MB; .deps/ is ignored by git.
# bench/cuda/run_on_gpu.sh configures with both. Installs the packages first if any is missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
packages=(libeigen3-dev catch2 libbenchmark-dev libcli11-dev nlohmann-json3-dev unicode-data)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] || scripts/install-deps.sh
lib=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
rm -rf .deps && mkdir -p .deps
copy() {  # each /usr/PATH to .deps/PATH
  for f in "$@"; do
    [ -e "$f" ] || { echo "prepare-gpu-deps.sh: $f: expected from the Debian packages, missing" >&2; exit 1; }
    mkdir -p ".deps/$(dirname "${f#/usr/}")"
    cp -a "$f" ".deps/${f#/usr/}"
  done
}
copy /usr/include/eigen3 /usr/share/eigen3
copy /usr/include/catch2 /usr/lib/cmake/Catch2 /usr/lib/libCatch2WithMain.a
copy /usr/include/benchmark "$lib/cmake/benchmark" "$lib"/libbenchmark.so* "$lib/libbenchmark_main.a"
copy /usr/include/CLI /usr/share/cmake/CLI11 /usr/include/nlohmann /usr/share/cmake/nlohmann_json
mkdir -p .deps/unicode/extracted
cp /usr/share/unicode/extracted/DerivedGeneralCategory.txt .deps/unicode/extracted/
cp /usr/share/unicode/PropList.txt /usr/share/unicode/DerivedAge.txt .deps/unicode/
du -sh .deps
