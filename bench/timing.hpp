/// \file
/// \brief How the plain (non Google Benchmark) benchmarks time a call and compare outputs:
/// the mean time of a call run back to back for a minimum time, the median of repetitions, and
/// the row-relative difference of two outputs (the tolerance rule of tests/test_support.hpp).
/// Shared by bench_paged_decode and bench_kv_dtype.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

#include <kvlab/kvlab.hpp>

namespace kvlab_bench {

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

/// The median of `values` (the mean of the middle two for an even count); `values` not empty.
inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t m = values.size() / 2;
  return values.size() % 2 == 1 ? values[m] : 0.5 * (values[m - 1] + values[m]);
}

/// Max over rows of max |a - b| / max(1, max |b|): the rule of tests/test_support.hpp.
inline double row_relative_difference(const kvlab::RowMatrix<float>& a,
                                      const kvlab::RowMatrix<float>& b) {
  double worst = 0;
  for (Eigen::Index r = 0; r < b.rows(); ++r) {
    const double scale = std::max(1.0, static_cast<double>(b.row(r).cwiseAbs().maxCoeff()));
    worst =
        std::max(worst, static_cast<double>((a.row(r) - b.row(r)).cwiseAbs().maxCoeff()) / scale);
  }
  return worst;
}

}  // namespace kvlab_bench
