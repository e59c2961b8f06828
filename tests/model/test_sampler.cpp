// Sampler: temperature 0 and top-p near 0 are greedy; seeded sampling draws tokens with the
// frequencies the probabilities say (all tokens, at a temperature, and within the top-p
// nucleus); the same seed gives the same sequence; bad parameters are rejected.
//
// Statistical tolerance: with N draws, the frequency of a token of probability p has standard
// deviation sqrt(p (1 - p) / N); every frequency must lie within 5 of those of p (a correct
// sampler fails that by chance with probability below 1e-6 per token). The generator is seeded,
// so each run draws the same numbers: the test cannot flake.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kvlab/kvlab.hpp"
#include "test_support.hpp"

using kvlab::InvalidArgument;
using kvlab::RowVector;
using kvlab::Sampler;
using kvlab_test::names;

namespace {

RowVector<float> row(const std::vector<float>& v) {
  return Eigen::Map<const RowVector<float>>(v.data(), static_cast<Eigen::Index>(v.size()));
}

// softmax(logits / temperature), in double.
std::vector<double> probabilities(const std::vector<float>& logits, double temperature) {
  double max = logits[0];
  for (float l : logits) max = std::max(max, static_cast<double>(l));
  std::vector<double> p;
  double sum = 0;
  for (float l : logits) sum += p.emplace_back(std::exp((l - max) / temperature));
  for (double& x : p) x /= sum;
  return p;
}

// Draws `n` tokens and checks each frequency against `expected` (5 standard deviations).
void check_frequencies(Sampler& sampler, const std::vector<float>& logits,
                       const std::vector<double>& expected, int n) {
  std::vector<int> counts(logits.size(), 0);
  const RowVector<float> l = row(logits);
  for (int i = 0; i < n; ++i) ++counts[static_cast<std::size_t>(sampler.sample(l))];
  for (std::size_t t = 0; t < logits.size(); ++t) {
    CAPTURE(t, counts[t], expected[t]);
    const double f = static_cast<double>(counts[t]) / n;
    if (expected[t] == 0.0) {
      CHECK(counts[t] == 0);
    } else {
      CHECK(std::abs(f - expected[t]) <= 5 * std::sqrt(expected[t] * (1 - expected[t]) / n));
    }
  }
}

}  // namespace

TEST_CASE("temperature 0 is greedy: the argmax, first on a tie, with no random number drawn") {
  kvlab::Rng rng(1);
  Sampler greedy(100, 0.0f, 0.9f, 7);
  for (int trial = 0; trial < 200; ++trial) {
    const RowVector<float> logits = kvlab::random_matrix<float>(1, 100, rng, -5, 5);
    Eigen::Index best = 0;
    logits.maxCoeff(&best);
    REQUIRE(greedy.sample(logits) == best);
  }
  Sampler greedy4(4, 0.0f, 1.0f, 7);
  CHECK(greedy4.sample(row({1, 3, 3, 2})) == 1);
  // The generator was not used: its next coin is the first one of a fresh sampler.
  Sampler fresh(100, 0.0f, 0.9f, 7);
  CHECK(greedy.next_coin() == fresh.next_coin());
}

TEST_CASE("top-p tending to 0 is greedy, whatever the coin") {
  kvlab::Rng rng(2);
  Sampler nucleus(64, 1.0f, 1e-6f, 3);
  for (int trial = 0; trial < 500; ++trial) {
    const RowVector<float> logits = kvlab::random_matrix<float>(1, 64, rng, -3, 3);
    Eigen::Index best = 0;
    logits.maxCoeff(&best);
    REQUIRE(nucleus.sample(logits) == best);
  }
}

TEST_CASE(
    "seeded sampling follows the probabilities: plain, at a temperature, and in the top-p "
    "nucleus") {
  const std::vector<float> logits{1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f};
  const int n = 100000;
  SECTION("temperature 1, all tokens") {
    Sampler s(6, 1.0f, 1.0f, 42);
    check_frequencies(s, logits, probabilities(logits, 1.0), n);
  }
  SECTION("temperature 0.5 sharpens, 2 flattens") {
    Sampler sharp(6, 0.5f, 1.0f, 43);
    check_frequencies(sharp, logits, probabilities(logits, 0.5), n);
    Sampler flat(6, 2.0f, 1.0f, 44);
    check_frequencies(flat, logits, probabilities(logits, 2.0), n);
  }
  SECTION("top-p 0.7: the smallest set of most probable tokens above 0.7, renormalised") {
    // Probabilities, sorted: 0.420 (token 1), 0.255 (4), 0.154 (0), 0.094 (2), 0.057 (5), 0.021
    // (3). Cumulative: 0.420, 0.674, 0.829 > 0.7: the nucleus is {1, 4, 0}.
    const std::vector<double> p = probabilities(logits, 1.0);
    const double nucleus = p[1] + p[4] + p[0];
    REQUIRE(p[1] + p[4] < 0.7);
    REQUIRE(nucleus > 0.7);
    const std::vector<double> expected{p[0] / nucleus, p[1] / nucleus, 0, 0, p[4] / nucleus, 0};
    Sampler s(6, 1.0f, 0.7f, 45);
    check_frequencies(s, logits, expected, n);
  }
}

TEST_CASE("the same seed gives the same sequence, another seed another") {
  kvlab::Rng rng(3);
  const RowVector<float> logits = kvlab::random_matrix<float>(1, 50, rng, -1, 1);
  Sampler a(50, 0.8f, 0.9f, 2024), b(50, 0.8f, 0.9f, 2024), c(50, 0.8f, 0.9f, 2025);
  std::vector<int> sa, sb, sc;
  for (int i = 0; i < 200; ++i) {
    sa.push_back(a.sample(logits));
    sb.push_back(b.sample(logits));
    sc.push_back(c.sample(logits));
  }
  CHECK(sa == sb);
  CHECK(sa != sc);
}

TEST_CASE("sample_mult, sample_topp and the coin at their edges") {
  const std::vector<float> p{0.25f, 0.5f, 0.25f};
  CHECK(kvlab::sample_mult(p.data(), 3, 0.0f) == 0);
  CHECK(kvlab::sample_mult(p.data(), 3, 0.2499f) == 0);
  CHECK(kvlab::sample_mult(p.data(), 3, 0.25f) == 1);
  CHECK(kvlab::sample_mult(p.data(), 3, 0.9999f) == 2);
  // rounding left the sum below the coin: the last index
  const std::vector<float> short_sum{0.3f, 0.3f};
  CHECK(kvlab::sample_mult(short_sum.data(), 2, 0.9f) == 1);
  std::vector<kvlab::ProbIndex> scratch;
  // A uniform distribution: every probability is below run.c's cut-off (1 - p) / (n - 1), so
  // all tokens stay candidates (run.c would read before its array); ties go to the lower id.
  const std::vector<float> uniform(10, 0.1f);
  CHECK(kvlab::sample_topp(uniform.data(), 10, 0.05f, 0.99f, scratch) == 0);
  CHECK(kvlab::sample_topp(uniform.data(), 10, 0.25f, 0.0f, scratch) == 0);
  CHECK(kvlab::sample_topp(uniform.data(), 10, 0.25f, 0.99f, scratch) == 2);  // nucleus {0, 1, 2}
  Sampler s(4, 1.0f, 1.0f, 0);
  for (int i = 0; i < 1000; ++i) {
    const float coin = s.next_coin();
    REQUIRE(coin >= 0.0f);
    REQUIRE(coin < 1.0f);
  }
}

TEST_CASE("bad parameters are rejected") {
  CHECK_THROWS_MATCHES(Sampler(0, 1.0f, 0.9f, 0), InvalidArgument,
                       names("vocab_size", ">= 1", "0"));
  CHECK_THROWS_MATCHES(Sampler(10, -0.1f, 0.9f, 0), InvalidArgument,
                       names("temperature", "a finite value >= 0", "-0.1"));
  CHECK_THROWS_AS(Sampler(10, INFINITY, 0.9f, 0), InvalidArgument);
  CHECK_THROWS_MATCHES(Sampler(10, 1.0f, 0.0f, 0), InvalidArgument,
                       names("top_p", "a value in (0, 1]", "0"));
  CHECK_THROWS_MATCHES(Sampler(10, 1.0f, 1.5f, 0), InvalidArgument,
                       names("top_p", "a value in (0, 1]", "1.5"));
  Sampler s(10, 1.0f, 0.9f, 0);
  CHECK_THROWS_MATCHES(s.sample(RowVector<float>::Zero(9)), InvalidArgument,
                       names("logits.size()", "10 (vocab_size)", "9"));
}
