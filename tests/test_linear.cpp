// cpu::linear, the weight products of a decoder layer: one row (a decode step) and several rows
// (a prefill), on one thread and split between two, equal the product computed in double within
// float's rounding bound; and a native build on a CPU with AVX2 and FMA takes its own one-row loop
// (detail::linear_one_row) rather than Eigen's product.
//
// Built twice, as test_row_runs: test_linear with the test suite's flags (Eigen's product, unless
// those flags target AVX2), and test_linear_native with the flags of the benchmarks and apps
// (KVLAB_TEST_NATIVE), the form kvlab-generate and bench_generate run.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kvlab/kvlab.hpp"
#include "test_support.hpp"

using kvlab::RowMatrix;

TEST_CASE("this build computes one row of linear in the form its flags select") {
#if defined(KVLAB_TEST_NATIVE) && (defined(__x86_64__) || defined(__i386__))
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    CHECK(kvlab::cpu::kLinearOneRowAvx2);
  } else {
    WARN("this CPU has no AVX2 with FMA: Eigen's product is tested");
  }
#endif
  INFO("one row of linear computed with "
       << (kvlab::cpu::kLinearOneRowAvx2 ? "the AVX2 loop" : "Eigen's product"));
  CHECK(kvlab::cpu::kLinearOneRowAvx2 == (KVLAB_LINEAR_AVX2 != 0));
}

// Bound: each output is a float sum of `in` products, each product rounded once (or fused), in
// some order: |y − exact| <= γ_{in+1} · Σ_i |w_i x_i|, γ_k = k u / (1 − k u), u = 2^-24 (Higham,
// §3.1). Input widths cover the loop's blocks of 32 and 8 and the scalar rest; 288 and 768 are
// the 15M model's; 512 rows of 288 are enough work for two threads (kLinearParallelMinMacs).
TEST_CASE(
    "linear of one row and of several rows equals the product in double, on 1 and 2 threads") {
  constexpr double u = 0x1p-24;
  const auto gamma = [&](long k) { return double(k) * u / (1 - double(k) * u); };
  kvlab::Rng rng(29);
  std::vector<int> thread_counts = {1};
#if defined(_OPENMP)
  thread_counts.push_back(2);
  const int threads_before = omp_get_max_threads();
#endif
  for (int threads : thread_counts) {
#if defined(_OPENMP)
    omp_set_num_threads(threads);
#endif
    for (int rows : {1, 3})
      for (int in : {1, 7, 8, 31, 32, 33, 72, 288, 768})
        for (int out : {1, 5, 17, 512}) {
          CAPTURE(threads, rows, in, out);
          const RowMatrix<float> x = kvlab::random_matrix<float>(rows, in, rng, -2, 2);
          const RowMatrix<float> w = kvlab::random_matrix<float>(out, in, rng);
          RowMatrix<float> got;
          kvlab::cpu::linear(x, w, got);
          REQUIRE(got.rows() == rows);
          REQUIRE(got.cols() == out);
          for (int r = 0; r < rows; ++r)
            for (int o = 0; o < out; ++o) {
              double exact = 0, magnitude = 0;
              for (int i = 0; i < in; ++i) {
                const double product = double(x(r, i)) * double(w(o, i));
                exact += product;
                magnitude += std::fabs(product);
              }
              CHECK(std::fabs(got(r, o) - exact) <= gamma(in + 1) * magnitude);
            }
        }
  }
#if defined(_OPENMP)
  omp_set_num_threads(threads_before);
#endif
}
