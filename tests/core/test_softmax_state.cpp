// The split-K merge (core/softmax_state.hpp), the arithmetic by which kvlab's kernels (the CPU
// decode over a split context and the CUDA kernels' partitions) combine partial attention over
// disjoint key ranges: merge_softmax_states against one pass over all keys, in any order and
// partition sizes, with empty partitions and extreme scores; merge_softmax_scales against it.
//
// Tolerances: merges in double are compared with the long-double one pass at 1e-12 relative
// (rounding only: a few dozen operations per value). Exact where the arithmetic is exact (a
// max of maxes; an empty side of a merge).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kvlab/core/random.hpp"
#include "kvlab/core/softmax_state.hpp"

using kvlab::SoftmaxState;
namespace {

using Wide = long double;

// Scores and value rows of one query over n keys.
struct Keys {
  std::vector<double> scores;          // [n]
  std::vector<std::vector<double>> v;  // [n][d]
};

Keys random_keys(int n, int d, kvlab::Rng& rng, double lo = -3.0, double hi = 3.0) {
  Keys keys;
  for (int j = 0; j < n; ++j) {
    keys.scores.push_back(rng.uniform(lo, hi));
    keys.v.emplace_back();
    for (int c = 0; c < d; ++c) keys.v.back().push_back(rng.uniform(-1.0, 1.0));
  }
  return keys;
}

// The state and accumulator of keys [begin, end) in one pass (T), the definition in
// softmax_state.hpp: max, Σ exp(s - max), Σ exp(s - max) v.
template <typename T>
SoftmaxState<T> one_pass(const Keys& keys, int begin, int end, std::vector<T>& acc) {
  const int d = keys.v.empty() ? 0 : static_cast<int>(keys.v[0].size());
  acc.assign(static_cast<std::size_t>(d), T(0));
  SoftmaxState<T> state = kvlab::empty_softmax_state<T>();
  for (int j = begin; j < end; ++j)
    state.max = std::max(state.max, static_cast<T>(keys.scores[static_cast<std::size_t>(j)]));
  for (int j = begin; j < end; ++j) {
    const T w = std::exp(static_cast<T>(keys.scores[static_cast<std::size_t>(j)]) - state.max);
    state.sum += w;
    for (int c = 0; c < d; ++c)
      acc[static_cast<std::size_t>(c)] +=
          w * static_cast<T>(keys.v[static_cast<std::size_t>(j)][static_cast<std::size_t>(c)]);
  }
  return state;
}

// The softmax-weighted sum acc / sum.
template <typename T>
std::vector<double> output(const SoftmaxState<T>& state, const std::vector<T>& acc) {
  std::vector<double> out;
  for (T a : acc) out.push_back(static_cast<double>(a / state.sum));
  return out;
}

double max_relative_diff(const std::vector<double>& got, const std::vector<double>& want) {
  double worst = 0;
  for (std::size_t c = 0; c < want.size(); ++c)
    worst = std::max(worst, std::abs(got[c] - want[c]) / std::max(1.0, std::abs(want[c])));
  return worst;
}

// Merges the partitions [cuts[i], cuts[i + 1]) of `keys` in the order `order` (indices into the
// partitions), each computed in one pass, into an empty state; returns the output.
std::vector<double> merged_output(const Keys& keys, const std::vector<int>& cuts,
                                  const std::vector<int>& order, int d,
                                  SoftmaxState<double>* final_state = nullptr) {
  SoftmaxState<double> state = kvlab::empty_softmax_state<double>();
  std::vector<double> acc(static_cast<std::size_t>(d), 0.0);
  for (int i : order) {
    std::vector<double> part_acc;
    const SoftmaxState<double> part = one_pass(keys, cuts[static_cast<std::size_t>(i)],
                                               cuts[static_cast<std::size_t>(i) + 1], part_acc);
    kvlab::merge_softmax_states(state, acc.data(), part, part_acc.data(), d);
  }
  if (final_state != nullptr) *final_state = state;
  return output(state, acc);
}

}  // namespace

TEST_CASE("merge_softmax_states over partitions of every size, in any order, equals one pass") {
  const int n = 37, d = 5;
  kvlab::Rng rng(1);
  const Keys keys = random_keys(n, d, rng);
  std::vector<Wide> wide_acc;
  const SoftmaxState<Wide> whole = one_pass(keys, 0, n, wide_acc);
  const std::vector<double> want = output(whole, wide_acc);
  std::mt19937 shuffle(7);
  for (int size = 1; size <= n + 3; ++size) {  // sizes past n: one partition
    CAPTURE(size);
    std::vector<int> cuts;
    for (int begin = 0; begin < n; begin += size) cuts.push_back(begin);
    cuts.push_back(n);
    std::vector<int> order(cuts.size() - 1);
    std::iota(order.begin(), order.end(), 0);
    SoftmaxState<double> state{};
    CHECK(max_relative_diff(merged_output(keys, cuts, order, d, &state), want) <= 1e-12);
    CHECK(state.max == static_cast<double>(whole.max));  // a max of maxes: exact
    CHECK(std::abs(state.sum - static_cast<double>(whole.sum)) <=
          1e-12 * static_cast<double>(whole.sum));
    std::reverse(order.begin(), order.end());
    CHECK(max_relative_diff(merged_output(keys, cuts, order, d), want) <= 1e-12);
    std::shuffle(order.begin(), order.end(), shuffle);
    CHECK(max_relative_diff(merged_output(keys, cuts, order, d), want) <= 1e-12);
  }
  // Uneven cuts, including empty partitions anywhere.
  for (const std::vector<int>& cuts :
       {std::vector<int>{0, 0, 5, 5, 36, 37, 37}, std::vector<int>{0, 36, 37},
        std::vector<int>{0, 1, 37}, std::vector<int>{0, 0, 37, 37}}) {
    std::vector<int> order(cuts.size() - 1);
    std::iota(order.begin(), order.end(), 0);
    CHECK(max_relative_diff(merged_output(keys, cuts, order, d), want) <= 1e-12);
    std::shuffle(order.begin(), order.end(), shuffle);
    CHECK(max_relative_diff(merged_output(keys, cuts, order, d), want) <= 1e-12);
  }
}

TEST_CASE("an empty partition changes nothing, and a state merged into an empty one is copied") {
  kvlab::Rng rng(2);
  const Keys keys = random_keys(9, 4, rng);
  std::vector<double> acc;
  const SoftmaxState<double> full = one_pass(keys, 0, 9, acc);
  const std::vector<double> zeros(4, 0.0);
  const SoftmaxState<double> empty = kvlab::empty_softmax_state<double>();
  CHECK(std::isinf(empty.max));
  CHECK(empty.max < 0);
  CHECK(empty.sum == 0.0);

  SoftmaxState<double> a = full;  // full <- empty: unchanged, bit for bit
  std::vector<double> acc_a = acc;
  kvlab::merge_softmax_states(a, acc_a.data(), empty, zeros.data(), 4);
  CHECK(a.max == full.max);
  CHECK(a.sum == full.sum);
  CHECK(acc_a == acc);

  SoftmaxState<double> b = empty;  // empty <- full: a copy, bit for bit
  std::vector<double> acc_b = zeros;
  kvlab::merge_softmax_states(b, acc_b.data(), full, acc.data(), 4);
  CHECK(b.max == full.max);
  CHECK(b.sum == full.sum);
  CHECK(acc_b == acc);

  SoftmaxState<double> c = empty;  // empty <- empty: still empty, no NaN from -inf - -inf
  std::vector<double> acc_c = zeros;
  kvlab::merge_softmax_states(c, acc_c.data(), empty, zeros.data(), 4);
  CHECK(c.sum == 0.0);
  CHECK(std::isinf(c.max));
  CHECK(acc_c == zeros);
}

TEST_CASE("scores of +-1e4 merge without overflow and equal one pass") {
  const int d = 3;
  Keys keys;
  kvlab::Rng rng(3);
  for (double s : {1e4, -1e4, 1e4 - 1.0, -1e4 + 2.0, 0.0, 9999.5, -9999.0, 1e4}) {
    keys.scores.push_back(s);
    keys.v.push_back({rng.uniform(-1, 1), rng.uniform(-1, 1), rng.uniform(-1, 1)});
  }
  const int n = static_cast<int>(keys.scores.size());
  std::vector<Wide> wide_acc;
  const std::vector<double> want = output(one_pass(keys, 0, n, wide_acc), wide_acc);
  for (int size = 1; size <= n; ++size) {
    CAPTURE(size);
    std::vector<int> cuts;
    for (int begin = 0; begin < n; begin += size) cuts.push_back(begin);
    cuts.push_back(n);
    std::vector<int> order(cuts.size() - 1);
    std::iota(order.begin(), order.end(), 0);
    const std::vector<double> got = merged_output(keys, cuts, order, d);
    for (double x : got) CHECK(std::isfinite(x));
    CHECK(max_relative_diff(got, want) <= 1e-12);
    // In float, as the GPU computes: the scores are exact in float, the exponents stay <= 0.
    SoftmaxState<float> state = kvlab::empty_softmax_state<float>();
    std::vector<float> acc(static_cast<std::size_t>(d), 0.f);
    for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
      std::vector<float> part_acc;
      const SoftmaxState<float> part = one_pass<float>(keys, cuts[i], cuts[i + 1], part_acc);
      kvlab::merge_softmax_states(state, acc.data(), part, part_acc.data(), d);
    }
    const std::vector<double> got_float = output(state, acc);
    for (double x : got_float) CHECK(std::isfinite(x));
    CHECK(max_relative_diff(got_float, want) <= 1e-5);
  }
}

TEST_CASE("merge_softmax_scales gives the state and factors of merge_softmax_states") {
  kvlab::Rng rng(4);
  const int d = 6;
  for (int trial = 0; trial < 200; ++trial) {
    CAPTURE(trial);
    const Keys keys = random_keys(12, d, rng, -20.0, 20.0);
    const int cut = static_cast<int>(rng.next_u64() % 13);  // 0 and 12: one side empty
    const int start = trial % 3 == 0 ? cut : 0;             // sometimes both sides empty
    std::vector<double> acc_a, acc_b;
    SoftmaxState<double> a = one_pass(keys, start, cut, acc_a);
    const SoftmaxState<double> b = one_pass(keys, cut, 12, acc_b);
    SoftmaxState<double> a2 = a;
    std::vector<double> acc_merged = acc_a;
    kvlab::merge_softmax_states(a, acc_merged.data(), b, acc_b.data(), d);
    const kvlab::SoftmaxScales<double> f = kvlab::merge_softmax_scales(a2, b);
    CHECK((a2.max == a.max || (std::isinf(a2.max) && std::isinf(a.max))));
    CHECK(a2.sum == a.sum);
    for (int c = 0; c < d; ++c) {
      const double applied =
          acc_a[static_cast<std::size_t>(c)] * f.a + acc_b[static_cast<std::size_t>(c)] * f.b;
      CHECK(std::abs(applied - acc_merged[static_cast<std::size_t>(c)]) <=
            1e-15 * std::max(1.0, std::abs(applied)));
    }
    CHECK(f.a >= 0.0);
    CHECK(f.a <= 1.0);
    CHECK(f.b >= 0.0);
    CHECK(f.b <= 1.0);
  }
}
