#!/usr/bin/env bash
# Line coverage of the library's headers (include/kvlab) by the test suite, with gcov alone (GCC's
# own tool; no lcov needed): builds the tests, tutorials and programs with --coverage in
# build-coverage (no CUDA compiler, no benchmarks, no docs; the CUDA kernels count through the
# emulated tests), runs every test, then reads gcov's JSON for every object file and prints, per
# header, the lines executed of the lines that hold code, worst first, and the total. A line
# counts as covered when any test executed it in any template instance; a header that no test
# compiles is not listed. Built without the shared instances (KVLAB_SHARED_INSTANCES=OFF): gcov
# does not count the lines that a test runs through a class the instances compiled once.
#
#   scripts/coverage.sh [--keep]        # --keep: reuse build-coverage as it is (no rebuild)
#   writes build-coverage/coverage.txt (the table) and build-coverage/uncovered.txt (the lines)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build=build-coverage
jobs=$(nproc 2>/dev/null || echo 2)
if [ "${1:-}" != "--keep" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
    -DCMAKE_CXX_FLAGS="--coverage" -DCMAKE_EXE_LINKER_FLAGS="--coverage" \
    -DKVLAB_ENABLE_CUDA=OFF -DKVLAB_BUILD_BENCH=OFF -DKVLAB_BUILD_DOCS=OFF \
    -DKVLAB_BUILD_HEADER_CHECK=OFF -DKVLAB_SHARED_INSTANCES=OFF >/dev/null
  cmake --build "$build" -j "$jobs"
  find "$build" -name '*.gcda' -delete
  ctest --test-dir "$build" -j "$jobs" -LE consumer --output-on-failure >"$build/ctest.log" || {
    tail -20 "$build/ctest.log"
    exit 1
  }
fi
json="$build/gcov-json"
rm -rf "$json" && mkdir -p "$json"
# One output folder per object directory (one per target): gcov names its output after the
# source file, and two targets that compile the same source (a test and its native twin) would
# otherwise overwrite each other's counts.
n=0
while IFS= read -r -d '' dir; do
  n=$((n + 1))
  mkdir -p "$json/$n"
  find "$dir" -maxdepth 1 -name '*.gcda' -print0 |
    (cd "$json/$n" && xargs -0 -n 64 gcov --json-format --preserve-paths >/dev/null 2>&1 || true)
done < <(find "$root/$build" -name '*.gcda' -printf '%h\0' | sort -zu)
python3 - "$json" "$root/include/kvlab" "$build" <<'EOF'
import collections, glob, gzip, json, os, sys
folder, include, build = sys.argv[1], os.path.realpath(sys.argv[2]), sys.argv[3]
hits = collections.defaultdict(dict)  # file -> line -> executed in any instance
for path in glob.glob(os.path.join(folder, "*", "*.gcov.json.gz")):
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    for entry in data["files"]:
        name = os.path.realpath(os.path.join(data.get("current_working_directory", ""), entry["file"]))
        if not name.startswith(include + os.sep):
            continue
        lines = hits[name]
        for line in entry["lines"]:
            number = line["line_number"]
            lines[number] = lines.get(number, False) or line["count"] > 0
rows, uncovered = [], []
for name, lines in hits.items():
    covered = sum(lines.values())
    rows.append((covered / len(lines), covered, len(lines), os.path.relpath(name, os.path.dirname(include))))
    uncovered += [f"{os.path.relpath(name, os.path.dirname(include))}:{n}" for n in sorted(lines) if not lines[n]]
rows.sort()
total_covered = sum(r[1] for r in rows)
total = sum(r[2] for r in rows)
table = [f"{100 * r[0]:6.1f} %  {r[1]:5d} / {r[2]:5d}  {r[3]}" for r in rows]
table.append(f"{100 * total_covered / total:6.1f} %  {total_covered:5d} / {total:5d}  all {len(rows)} headers")
open(os.path.join(build, "coverage.txt"), "w").write("\n".join(table) + "\n")
open(os.path.join(build, "uncovered.txt"), "w").write("\n".join(uncovered) + "\n")
print("\n".join(table))
EOF
