// cpu::linear, the weight products of a decoder layer: one row (a decode step) and several rows
// (a prefill), on one thread and split between two, equal the product computed in double within
// float's rounding bound; and a native build on a CPU with AVX2 and FMA takes its own one-row loop
// (detail::linear_one_row) rather than Eigen's product. Several matrices in one call (one
// parallel region for all) give each product as a call of its own would, and a bad call names
// the product at fault and resizes nothing.
//
// Built twice, as test_row_runs: test_layer_ops with the test suite's flags (Eigen's product,
// unless those flags target AVX2), and test_layer_ops_native with the flags of the benchmarks and
// apps (KVLAB_TEST_NATIVE), the form kvlab-generate and bench_generate run.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kvlab/kvlab.hpp"
#include "test_support.hpp"

using kvlab::RowMatrix;
using kvlab_test::names;

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
// §3.1).
void check_product(const RowMatrix<float>& x, const RowMatrix<float>& w,
                   const RowMatrix<float>& got) {
  constexpr double u = 0x1p-24;
  const auto gamma = [&](long k) { return double(k) * u / (1 - double(k) * u); };
  REQUIRE(got.rows() == x.rows());
  REQUIRE(got.cols() == w.rows());
  for (Eigen::Index r = 0; r < x.rows(); ++r)
    for (Eigen::Index o = 0; o < w.rows(); ++o) {
      double exact = 0, magnitude = 0;
      for (Eigen::Index i = 0; i < x.cols(); ++i) {
        const double product = double(x(r, i)) * double(w(o, i));
        exact += product;
        magnitude += std::fabs(product);
      }
      CHECK(std::fabs(got(r, o) - exact) <= gamma(x.cols() + 1) * magnitude);
    }
}

// Runs f() on 1 thread and, with OpenMP, on 2, and restores the thread count.
template <typename F>
void on_1_and_2_threads(F&& f) {
  std::vector<int> thread_counts = {1};
#if defined(_OPENMP)
  thread_counts.push_back(2);
  const int threads_before = omp_get_max_threads();
#endif
  for (int threads : thread_counts) {
#if defined(_OPENMP)
    omp_set_num_threads(threads);
#endif
    CAPTURE(threads);
    f();
  }
#if defined(_OPENMP)
  omp_set_num_threads(threads_before);
#endif
}

// Input widths cover the loop's blocks of 32 and 8 and the scalar rest; 288 and 768 are the 15M
// model's; 512 rows of 288 are enough work for two threads (kLinearParallelMinMacs).
TEST_CASE(
    "linear of one row and of several rows equals the product in double, on 1 and 2 threads") {
  kvlab::Rng rng(29);
  on_1_and_2_threads([&] {
    for (int rows : {1, 3})
      for (int in : {1, 7, 8, 31, 32, 33, 72, 288, 768})
        for (int out : {1, 5, 17, 512}) {
          CAPTURE(rows, in, out);
          const RowMatrix<float> x = kvlab::random_matrix<float>(rows, in, rng, -2, 2);
          const RowMatrix<float> w = kvlab::random_matrix<float>(out, in, rng);
          RowMatrix<float> got;
          kvlab::cpu::linear(x, w, got);
          check_product(x, w, got);
        }
  });
}

// The 15M model's K, V and Q projections (288 × 288 each) and gate and up (768 × 288), with a
// 5-row matrix that alone could not be split between two threads: one call runs them all in
// one region (their multiply-adds together pass kLinearParallelMinMacs); each product is
// checked as above.
TEST_CASE("linear of several matrices in one call computes each product, on 1 and 2 threads") {
  kvlab::Rng rng(31);
  on_1_and_2_threads([&] {
    for (int rows : {1, 3}) {
      CAPTURE(rows);
      const int in = 288;
      const RowMatrix<float> x = kvlab::random_matrix<float>(rows, in, rng, -2, 2);
      const RowMatrix<float> wk = kvlab::random_matrix<float>(288, in, rng);
      const RowMatrix<float> wv = kvlab::random_matrix<float>(288, in, rng);
      const RowMatrix<float> w1 = kvlab::random_matrix<float>(768, in, rng);
      const RowMatrix<float> small = kvlab::random_matrix<float>(5, in, rng);
      RowMatrix<float> k, v, h, s;
      kvlab::cpu::linear(x, {{wk, k}, {wv, v}, {w1, h}});
      check_product(x, wk, k);
      check_product(x, wv, v);
      check_product(x, w1, h);
      kvlab::cpu::linear(x, {{small, s}, {w1, h}});
      check_product(x, small, s);
      check_product(x, w1, h);
    }
  });
}

TEST_CASE("linear refuses a bad product by name and resizes nothing") {
  kvlab::Rng rng(37);
  const RowMatrix<float> x = kvlab::random_matrix<float>(2, 8, rng);
  const RowMatrix<float> w = kvlab::random_matrix<float>(4, 8, rng);
  const RowMatrix<float> narrow = kvlab::random_matrix<float>(4, 6, rng);
  RowMatrix<float> a(1, 1), b(1, 1);
  CHECK_THROWS_MATCHES(kvlab::cpu::linear(x, narrow, a), kvlab::InvalidArgument,
                       names("x.cols()", "6 (w.cols())", "8"));
  CHECK_THROWS_MATCHES(kvlab::cpu::linear(x, {{w, a}, {narrow, b}}), kvlab::InvalidArgument,
                       names("x.cols()", "6 (products[1].w.cols())", "8"));
  CHECK_THROWS_MATCHES(kvlab::cpu::linear(x, {{w, a}, {w, a}}), kvlab::InvalidArgument,
                       names("products[0].out", "a matrix of its own", "product 1's"));
  RowMatrix<float> w_copy = w;
  CHECK_THROWS_MATCHES(kvlab::cpu::linear(x, {{w, a}, {w_copy, w_copy}}), kvlab::InvalidArgument,
                       names("products[1].out", "a matrix other than x and w", "one of them"));
  CHECK_THROWS_MATCHES(kvlab::cpu::linear(x, {{w, a}, {w_copy, b}, {w, w_copy}}),
                       kvlab::InvalidArgument,
                       names("products[2].out", "a matrix of its own", "product 1's"));
  // Every product was checked before any out was resized.
  CHECK(a.rows() == 1);
  CHECK(a.cols() == 1);
  CHECK(b.rows() == 1);
  CHECK(b.cols() == 1);
}
