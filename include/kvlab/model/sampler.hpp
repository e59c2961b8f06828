/// \file
/// \brief `Sampler`: picks the next token from a row of logits as llama2.c's `run.c` does.
///
/// It takes the greedy argmax (temperature 0), or softmax at a temperature followed by plain or
/// top-p (nucleus) sampling, with a seeded `kvlab::Rng`, so that a run is reproducible. Checked in
/// the tests: temperature 0 and top-p near 0 are greedy, frequencies follow the probabilities, the
/// same seed gives the same sequence.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/core/fault_points.hpp"
#include "kvlab/core/random.hpp"
#include "kvlab/cpu/softmax.hpp"
#include "kvlab/matrix.hpp"

namespace kvlab {

/// A token and its probability, as top-p sampling sorts them.
struct ProbIndex {
  float prob;  ///< probability of the token
  int index;   ///< token id
};

/// The index of the largest of `values[0, n)`, the first one on a tie (greedy decoding).
/// \throws InvalidArgument if `n < 1`.
inline int sample_argmax(const float* values, int n) {
  detail::require_at_least("kvlab::sample_argmax", "n", n, 1);
  int best = 0;
  for (int i = 1; i < n; ++i) {
    if (values[i] > values[best]) best = i;
  }
  return best;
}

/// Samples an index from probabilities `probs[0, n)` (summing to 1) with a uniform `coin` in
/// [0, 1): the first index whose cumulative probability exceeds `coin` (the last index if
/// rounding leaves the sum below `coin`).
/// \throws InvalidArgument if `n < 1`.
inline int sample_mult(const float* probs, int n, float coin) {
  detail::require_at_least("kvlab::sample_mult", "n", n, 1);
  float cdf = 0.0f;
  for (int i = 0; i < n; ++i) {
    cdf += probs[i];
    if (coin < cdf) return i;
  }
  return n - 1;  // rounding
}

/// Top-p (nucleus) sampling: samples from the smallest set of most probable tokens whose
/// probabilities add up to more than `top_p`, renormalised, with a uniform `coin` in [0, 1).
///
/// As run.c: tokens below `(1 - top_p) / (n - 1)` cannot be in the set and are dropped before
/// sorting (a speed-up); the rest are sorted by descending probability (ties: lower id first,
/// so the result does not depend on the sort); the set ends at the first token where the
/// cumulative probability exceeds `top_p`; then `coin * cumulative` picks a token in it. One
/// difference: when every probability is below that cut-off (a nearly uniform distribution,
/// where run.c would read before its array), all tokens stay candidates.
/// \param probs    [n] probabilities summing to 1
/// \param n        number of probabilities, >= 1
/// \param top_p    in (0, 1)
/// \param coin     a uniform number in [0, 1)
/// \param scratch  reused buffer (resized to n)
/// \throws InvalidArgument if `n < 1`.
inline int sample_topp(const float* probs, int n, float top_p, float coin,
                       std::vector<ProbIndex>& scratch) {
  detail::require_at_least("kvlab::sample_topp", "n", n, 1);
  scratch.resize(static_cast<std::size_t>(n));
  const float cutoff = n > 1 ? (1.0f - top_p) / static_cast<float>(n - 1) : 0.0f;
  int n0 = 0;  // candidates kept in scratch[0, n0)
  for (int i = 0; i < n; ++i) {
    if (probs[i] >= cutoff) scratch[static_cast<std::size_t>(n0++)] = {probs[i], i};
  }
  if (n0 == 0) {  // nearly uniform: nothing passes the cut-off, so keep everything
    for (int i = 0; i < n; ++i) scratch[static_cast<std::size_t>(i)] = {probs[i], i};
    n0 = n;
  }
  std::sort(scratch.begin(), scratch.begin() + n0, [](const ProbIndex& a, const ProbIndex& b) {
    return a.prob > b.prob || (a.prob == b.prob && a.index < b.index);
  });
  // Truncate where the cumulative probability first exceeds top_p.
  float cumulative = 0.0f;
  int last = n0 - 1;  // all candidates, if rounding keeps the sum at or below top_p
  for (int i = 0; i < n0; ++i) {
    cumulative += scratch[static_cast<std::size_t>(i)].prob;
    if (cumulative > top_p) {
      last = i;
      break;
    }
  }
  // Sample from the truncated list.
  const float r = coin * cumulative;
  float cdf = 0.0f;
  for (int i = 0; i <= last; ++i) {
    cdf += scratch[static_cast<std::size_t>(i)].prob;
    if (r < cdf) return scratch[static_cast<std::size_t>(i)].index;
  }
  return scratch[static_cast<std::size_t>(last)].index;  // rounding
}

/// Picks the next token from logits, as llama2.c's `sample()`:
///  - `temperature == 0`: greedy, the argmax (no random number is drawn);
///  - otherwise the logits are divided by `temperature` and softmaxed, a coin is drawn from the
///    seeded generator, and the token is sampled from all probabilities (`top_p == 1`) or from
///    the nucleus of the most probable tokens (`top_p < 1`, see `sample_topp`).
///
/// Lower temperatures sharpen the distribution towards the argmax, higher ones flatten it;
/// top-p cuts off the unlikely tail. The generator is kvlab::Rng, so the same seed and the same
/// logits give the same tokens on every platform. (run.c also treats `top_p <= 0` as "off";
/// kvlab rejects it, since top-p tending to 0 is greedy.)
class Sampler {
 public:
  /// A sampler for `vocab_size` logits.
  /// \param vocab_size   logits per call, >= 1
  /// \param temperature  >= 0 and finite; 0 is greedy
  /// \param top_p        in (0, 1]; 1 samples from every token
  /// \param seed         the generator's seed
  /// \throws InvalidArgument for `vocab_size < 1` or a parameter out of range.
  Sampler(int vocab_size, float temperature, float top_p, std::uint64_t seed)
      : vocab_size_(vocab_size), temperature_(temperature), top_p_(top_p), rng_(seed) {
    constexpr const char* kWhere = "kvlab::Sampler";
    detail::require_at_least(kWhere, "vocab_size", vocab_size, 1);
    if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
      detail::fail(kWhere, "temperature", "a finite value >= 0", temperature);
    }
    if (!(top_p > 0.0f && top_p <= 1.0f)) detail::fail(kWhere, "top_p", "a value in (0, 1]", top_p);
  }

  /// Number of logits per call.
  int vocab_size() const { return vocab_size_; }
  /// The temperature (0: greedy).
  float temperature() const { return temperature_; }
  /// The top-p threshold (1: off).
  float top_p() const { return top_p_; }

  /// The next token for `logits` ([vocab_size]).
  /// \throws InvalidArgument if `logits` does not have `vocab_size()` values.
  int sample(const RowVector<float>& logits) {
    detail::require_equal("kvlab::Sampler::sample", "logits.size()",
                          static_cast<long>(logits.size()), static_cast<long>(vocab_size_),
                          "vocab_size");
    KVLAB_FAULT_POINT("Sampler::sample");
    if (temperature_ == 0.0f) return sample_argmax(logits.data(), vocab_size_);
    probs_.assign(logits.data(), logits.data() + vocab_size_);  // [vocab_size]
    for (float& p : probs_) p /= temperature_;                  // logits / temperature
    cpu::softmax_inplace(probs_.data(), vocab_size_);           // probabilities
    const float coin = next_coin();
    if (top_p_ >= 1.0f) return sample_mult(probs_.data(), vocab_size_, coin);
    return sample_topp(probs_.data(), vocab_size_, top_p_, coin, scratch_);
  }

  /// A uniform float in [0, 1) from the top 24 bits of the generator (as run.c's `random_f32`:
  /// every value is exactly representable, and 1 is never returned).
  float next_coin() { return static_cast<float>(rng_.next_u64() >> 40) * (1.0f / 16777216.0f); }

  /// The generator's state: `set_generator_state` with it makes the sampler draw the same
  /// tokens again (an engine undoing a failed step does).
  std::uint64_t generator_state() const { return rng_.state(); }
  /// Puts the generator back to `state` (from `generator_state`).
  void set_generator_state(std::uint64_t state) { rng_ = Rng(state); }

 private:
  int vocab_size_;
  float temperature_;
  float top_p_;
  Rng rng_;
  std::vector<float> probs_;        // [vocab_size]: probabilities of the current call
  std::vector<ProbIndex> scratch_;  // [vocab_size]: top-p candidates
};

}  // namespace kvlab
