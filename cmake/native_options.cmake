# The compile options of kvlab's benchmark programs and apps: `kvlab_bench_options`.
# The library never forces an instruction set: its users choose their own flags. A benchmark of
# decode attention, though, has to show the kernel at the speed the machine can give it. Decode
# is memory-bound only if the kernel's arithmetic keeps up with the memory: at the default x86-64
# target (SSE2) Eigen computes 4 floats per instruction, and for grouped-query attention (4 query
# heads per K/V row) the arithmetic, not the loads, then sets the pace (see bench/results/README.md),
# so the "bandwidth" measured would be the compiler's, not the memory's. -march=native gives AVX2
# / AVX-512 where present.
option(KVLAB_BENCH_NATIVE "Compile kvlab's benchmark programs and apps with -O3 -march=native -falign-loops=32" ON)

set(kvlab_bench_options "")
if(KVLAB_BENCH_NATIVE)
  include(CheckCXXCompilerFlag)
  check_cxx_compiler_flag(-march=native KVLAB_CXX_HAS_MARCH_NATIVE)
  if(KVLAB_CXX_HAS_MARCH_NATIVE)
    set(kvlab_bench_options -O3 -march=native)
    # GCC 12's AVX-512 intrinsics initialise a register from itself (_mm512_undefined_ps), and
    # Eigen's AVX-512 transpose inlines them: a false -Wmaybe-uninitialized (GCC bug 105593,
    # fixed in later releases) that -Werror would turn into a failed build.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
      list(APPEND kvlab_bench_options -Wno-maybe-uninitialized)
    endif()
    # Loops start on a 32-byte boundary. Otherwise an edit anywhere in a program can move the
    # inner loop of decode attention across a 64-byte fetch line: on a Zen 3, the same machine
    # code then took 0.76 instead of 0.72 ms a step (GQA, n = 1024), a difference an A/B of two
    # builds would blame on the edit (bench/results/cpu-restructure-ab.txt).
    check_cxx_compiler_flag(-falign-loops=32 KVLAB_CXX_HAS_ALIGN_LOOPS)
    if(KVLAB_CXX_HAS_ALIGN_LOOPS)
      list(APPEND kvlab_bench_options -falign-loops=32)
    endif()
  else()
    message(STATUS "kvlab: ${CMAKE_CXX_COMPILER_ID} does not accept -march=native; "
                   "benchmarks are built for the default target")
  endif()
endif()

