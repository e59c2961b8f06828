// AttentionShape validation, the error types, softmax numerics, the portable RNG and the
// counters' arithmetic.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "kvlab/kvlab.hpp"
#include "test_support.hpp"

using kvlab::AttentionShape;
using kvlab_test::names;

TEST_CASE("AttentionShape describes MHA, GQA and MQA") {
  const AttentionShape mha(8, 8, 64);
  CHECK(mha.group_size() == 1);
  CHECK(mha.q_width() == 512);
  CHECK(mha.kv_width() == 512);
  CHECK(mha.kv_head_of(5) == 5);
  CHECK(mha.scale() == Approx(1.0 / 8.0).epsilon(1e-15));

  const AttentionShape gqa(32, 8, 128);
  CHECK(gqa.group_size() == 4);
  CHECK(gqa.kv_width() == 1024);
  CHECK(gqa.kv_head_of(0) == 0);
  CHECK(gqa.kv_head_of(3) == 0);
  CHECK(gqa.kv_head_of(4) == 1);
  CHECK(gqa.kv_head_of(31) == 7);

  const AttentionShape mqa(4, 1, 80, 0.5);
  CHECK(mqa.group_size() == 4);
  CHECK(mqa.kv_head_of(3) == 0);
  CHECK(mqa.scale() == 0.5);
}

TEST_CASE("AttentionShape rejects bad sizes with the argument, expected and actual value") {
  using kvlab::InvalidArgument;
  CHECK_THROWS_MATCHES(AttentionShape(0, 1, 8), InvalidArgument, names("num_heads", ">= 1", "0"));
  CHECK_THROWS_MATCHES(AttentionShape(-4, 1, 8), InvalidArgument, names("num_heads", ">= 1", "-4"));
  CHECK_THROWS_MATCHES(AttentionShape(4, 0, 8), InvalidArgument,
                       names("num_kv_heads", ">= 1", "0"));
  CHECK_THROWS_MATCHES(AttentionShape(4, 2, 0), InvalidArgument, names("head_dim", ">= 1", "0"));
  CHECK_THROWS_MATCHES(AttentionShape(8, 3, 64), InvalidArgument,
                       names("num_heads", "a multiple of num_kv_heads (3)", "8"));
  CHECK_THROWS_MATCHES(AttentionShape(1 << 16, 1, 1 << 16), InvalidArgument,
                       names("num_heads * head_dim", "at most", "4294967296"));
  CHECK_THROWS_MATCHES(AttentionShape(4, 2, 8, 0.0), InvalidArgument,
                       names("scale", "a finite value > 0", "0"));
  CHECK_THROWS_MATCHES(AttentionShape(4, 2, 8, std::nan("")), InvalidArgument,
                       names("scale", "a finite value > 0", "nan"));
}

TEST_CASE("kvlab's exceptions derive from standard exceptions") {
  STATIC_REQUIRE(std::is_base_of<std::invalid_argument, kvlab::InvalidArgument>::value);
  STATIC_REQUIRE(std::is_base_of<std::length_error, kvlab::CapacityError>::value);
  CHECK_THROWS_AS(AttentionShape(0, 1, 1), std::logic_error);
}

TEST_CASE("softmax rows sum to 1 and follow the definition") {
  kvlab::Rng rng(7);
  for (int n : {1, 2, 3, 7, 16, 17, 100, 1000}) {
    SECTION("n = " + std::to_string(n)) {
      std::vector<double> x(static_cast<std::size_t>(n));
      for (double& xi : x) xi = rng.uniform(-20, 20);
      std::vector<double> p = x;
      kvlab::cpu::softmax_inplace(p.data(), n);
      double max = x[0];
      for (double xi : x) max = std::max(max, xi);
      double denominator = 0;
      for (double xi : x) denominator += std::exp(xi - max);
      double sum = 0;
      for (int i = 0; i < n; ++i) {
        const auto u = static_cast<std::size_t>(i);
        // double: a few ulps
        CHECK(p[u] == Approx(std::exp(x[u] - max) / denominator).epsilon(1e-13));
        CHECK(p[u] >= 0.0);
        sum += p[u];
      }
      CHECK(sum == Approx(1.0).epsilon(1e-13));
    }
  }
}

TEST_CASE("softmax of logits of +-1e4 gives no NaN or Inf") {
  SECTION("float") {
    std::vector<float> x = {1e4f, -1e4f, 1e4f - 1.0f, -1e4f, 0.0f};
    kvlab::cpu::softmax_inplace(x.data(), static_cast<Eigen::Index>(x.size()));
    for (float p : x) CHECK(std::isfinite(p));
    // exp(0) : exp(-1) between the two large logits; the rest underflow to 0.
    CHECK(x[0] == Approx(1.0 / (1.0 + std::exp(-1.0))).epsilon(1e-6));  // float: ~1e-7, with margin
    CHECK(x[2] == Approx(std::exp(-1.0) / (1.0 + std::exp(-1.0))).epsilon(1e-6));
    // exp(-2e4) underflows. Eigen's vectorised exp clamps its argument at about -88.7, so it
    // returns ~1e-38 or less instead of 0: an absolute error below float's smallest normal.
    CHECK(x[1] <= std::numeric_limits<float>::min());
    CHECK(x[4] <= std::numeric_limits<float>::min());
  }
  SECTION("double, all equal and huge") {
    std::vector<double> x(9, -1e4);
    kvlab::cpu::softmax_inplace(x.data(), 9);
    for (double p : x) CHECK(p == Approx(1.0 / 9).epsilon(1e-15));
  }
  SECTION("n < 1 is an error") {
    double x = 0;
    CHECK_THROWS_MATCHES(kvlab::cpu::softmax_inplace(&x, 0), kvlab::InvalidArgument,
                         names("n", ">= 1", "0"));
  }
}

TEST_CASE("Rng is SplitMix64: portable, seeded, uniform in range") {
  // Golden value: the first output of the reference SplitMix64 (Vigna, splitmix64.c) for seed 0.
  kvlab::Rng zero(0);
  CHECK(zero.next_u64() == 0xE220A8397B1DCDAFULL);
  kvlab::Rng a(123), b(123), c(124);
  const std::uint64_t first = a.next_u64();
  CHECK(first == b.next_u64());
  CHECK(first != c.next_u64());
  kvlab::Rng r(5);
  double sum = 0;
  for (int i = 0; i < 10000; ++i) {
    const double u = r.uniform(-2.0, 3.0);
    REQUIRE(u >= -2.0);
    REQUIRE(u < 3.0);
    sum += u;
  }
  CHECK(sum / 10000 == Approx(0.5).margin(0.05));  // mean of U[-2, 3); 5 sigma is ~0.07
}

TEST_CASE("CostCounters add and compare field by field") {
  kvlab::CostCounters a;
  a.q_projections = 1;
  a.kv_projections = 2;
  a.qk_dots = 3;
  a.kv_bytes_read = 4;
  a.macs = 5;
  kvlab::CostCounters b = a;
  CHECK(a == b);
  b += a;
  CHECK(b.q_projections == 2);
  CHECK(b.kv_projections == 4);
  CHECK(b.qk_dots == 6);
  CHECK(b.kv_bytes_read == 8);
  CHECK(b.macs == 10);
  CHECK_FALSE(a == b);
}
