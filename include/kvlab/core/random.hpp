/// \file
/// \brief `Rng`: a small seeded generator (SplitMix64) whose numbers are the same on every
/// platform, so tutorials, tests and benchmarks print the same values everywhere; `shuffle`.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <utility>
#include <vector>

#include "kvlab/config.hpp"

namespace kvlab {

namespace detail {

/// Checks the bounds of a uniform draw from `[lo, hi)`: both finite, `lo < hi`.
inline void require_interval(const char* where, double lo, double hi) {
  if (!std::isfinite(lo)) fail(where, "lo", "a finite number", lo);
  if (!std::isfinite(hi)) fail(where, "hi", "a finite number", hi);
  if (!(lo < hi)) {
    std::ostringstream expected;
    expected << "a number above lo (" << lo << ")";
    fail(where, "hi", expected.str(), hi);
  }
}

}  // namespace detail

/// A seeded pseudo-random generator (SplitMix64) with portable output.
///
/// `std::normal_distribution` and friends may give different numbers on different standard
/// libraries; kvlab's tutorials print values, so they use this instead. Not for cryptography.
class Rng {
 public:
  /// A generator whose sequence is fixed by `seed`.
  explicit Rng(std::uint64_t seed) : state_(seed) {}

  /// The state: `Rng(state())` goes on with this generator's sequence.
  std::uint64_t state() const { return state_; }

  /// The next 64 random bits.
  std::uint64_t next_u64() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }

  /// A uniform double in [0, 1), from the top 53 bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

  /// A uniform double in [lo, hi).
  /// \throws InvalidArgument (drawing nothing) unless `lo` and `hi` are finite and `lo < hi`.
  double uniform(double lo, double hi) {
    detail::require_interval("kvlab::Rng::uniform", lo, hi);
    return lo + (hi - lo) * uniform();
  }

 private:
  std::uint64_t state_;
};

/// Shuffles `values` in place (Fisher–Yates) with `rng`: the same permutation on every platform
/// for the same seed, which `std::shuffle` does not promise. Tests and benchmarks use it to take
/// the blocks of a pool in a random order, so that block tables are not monotonic.
template <typename T>
void shuffle(std::vector<T>& values, Rng& rng) {
  for (std::size_t i = values.size(); i > 1; --i)
    std::swap(values[i - 1], values[static_cast<std::size_t>(rng.next_u64() % i)]);
}

}  // namespace kvlab
