#!/usr/bin/env bash
# Builds kvlab's fuzz targets (tests/fuzz: Clang's libFuzzer with AddressSanitizer +
# UndefinedBehaviorSanitizer) in build-fuzz, runs each one RUNS times on its seed corpus (the
# CTest label `fuzz`), and prints what each run did, from libFuzzer's own last lines: executions,
# seconds, edges covered (cov), features (ft) and inputs in the corpus. A crash, a sanitizer
# report, an allocation over 256 MiB, an input taking over 10 s or a broken round trip fails the
# run. scripts/test.sh runs it with the default, a short run of each target; the long runs of
# the reliability page are `scripts/fuzz.sh 1000000`.
#
#   scripts/fuzz.sh [RUNS] [--summary FILE]   # RUNS: executions per target (default 20000)
#   scripts/fuzz.sh --build-only              # configure and build build-fuzz, run nothing
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
runs=20000
summary=""
build_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --summary) summary=${2:?"--summary: expected a file name"}; shift 2 ;;
    --build-only) build_only=1; shift ;;
    -h|--help) sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *)
      [[ "$1" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: RUNS: expected a positive integer, got '$1'" >&2; exit 2; }
      runs=$1; shift ;;
  esac
done
build=build-fuzz
jobs=$(nproc 2>/dev/null || echo 2)

CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" -DKVLAB_BUILD_FUZZERS=ON -DKVLAB_WARNINGS_AS_ERRORS=ON \
  -DKVLAB_FUZZ_RUNS="$runs" -DKVLAB_BUILD_TESTS=OFF -DKVLAB_BUILD_TUTORIALS=OFF \
  -DKVLAB_BUILD_APPS=OFF -DKVLAB_BUILD_BENCH=OFF -DKVLAB_BUILD_DOCS=OFF \
  -DKVLAB_ENABLE_CUDA=OFF >/dev/null
cmake --build "$build" -j "$jobs"
[ "$build_only" -eq 0 ] || exit 0
status=0
ctest --test-dir "$build" --output-on-failure -j "$jobs" -L fuzz || status=$?

# libFuzzer ends a run with "#N DONE cov: C ft: F corp: K/S ..." and "Done N runs in S
# second(s)"; CTest keeps every test's output in LastTest.log.
python3 - "$build/Testing/Temporary/LastTest.log" "$runs" "$summary" <<'EOF'
import re, sys
log, runs, summary = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(log, encoding="utf-8", errors="replace").read()
rows = []
for m in re.finditer(r"^\d+/\d+ Testing: (fuzz_\S+)$(.*?)^Test time = +([\d.]+) sec", text,
                     re.M | re.S):
    name, out = m.group(1), m.group(2)
    if name == "fuzz_seeds":
        continue
    done = re.findall(r"^Done (\d+) runs in (\d+) second", out, re.M)
    last = re.findall(r"DONE +cov: (\d+) ft: (\d+) corp: (\d+)/", out)
    if done and last:
        rows.append((name, done[-1][0], done[-1][1], *last[-1]))
    else:
        rows.append((name, "-", "-", "-", "-", "-"))
lines = [f"{'target':28} {'executions':>10} {'seconds':>8} {'cov':>6} {'ft':>6} {'corpus':>7}"]
lines += [f"{r[0]:28} {r[1]:>10} {r[2]:>8} {r[3]:>6} {r[4]:>6} {r[5]:>7}" for r in rows]
print("\n".join(lines))
if summary:
    with open(summary, "w", encoding="utf-8") as f:
        f.write(f"scripts/fuzz.sh {runs}: each target {runs} times on its corpus (libFuzzer, "
                "ASan + UBSan, -malloc_limit_mb=256 -rss_limit_mb=2048 -timeout=10 -seed=1)\n")
        f.write("\n".join(lines) + "\n")
EOF
exit "$status"
