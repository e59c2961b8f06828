/// \file
/// \brief The statistics kvlab's programs, benchmarks and tests share: the median of
/// repetitions, the mean time of a call run back to back, and the slope of a log-log fit (the
/// exponent k of y ~ n^k). Not part of the library.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <vector>

namespace kvlab_support {

/// The median of `values` (the mean of the middle two for an even count); `values` not empty.
inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t m = values.size() / 2;
  return values.size() % 2 == 1 ? values[m] : 0.5 * (values[m - 1] + values[m]);
}

/// Mean seconds per call of `call`, run back to back for at least `min_time` seconds (3 calls
/// at least).
template <typename F>
double time_per_call(F&& call, double min_time) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  int calls = 0;
  double elapsed = 0;
  do {
    call();
    ++calls;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < min_time || calls < 3);
  return elapsed / calls;
}

/// The least-squares slope of log y against log x: the exponent k of y ~ x^k (2 for Θ(n²), 1 for
/// Θ(n), 0 for a constant). `x` and `y` of the same size, every value positive.
inline double log_log_slope(const std::vector<double>& x, const std::vector<double>& y) {
  double mx = 0, my = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    mx += std::log(x[i]);
    my += std::log(y[i]);
  }
  mx /= static_cast<double>(x.size());
  my /= static_cast<double>(x.size());
  double sxy = 0, sxx = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    sxy += (std::log(x[i]) - mx) * (std::log(y[i]) - my);
    sxx += (std::log(x[i]) - mx) * (std::log(x[i]) - mx);
  }
  return sxx > 0 ? sxy / sxx : 0.0;
}

}  // namespace kvlab_support
