/// \file
/// \brief The machine's read bandwidth, measured the way the decode benchmarks compare against
/// it: a vectorised sum (Eigen) over arrays, split between threads, median of several runs.
/// Shared by bench_decode_bandwidth and bench_paged_decode.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include <Eigen/Dense>

#include "support/stats.hpp"

namespace kvlab_bench {

/// Sums `data[0, count)` with `threads` threads, each summing one contiguous chunk with Eigen
/// (vectorised: a plain float loop is not, without -ffast-math, and would understate the memory).
inline float parallel_sum(const float* data, std::size_t count, int threads) {
  const auto size = static_cast<std::ptrdiff_t>(count);
  std::vector<float> partial(static_cast<std::size_t>(std::max(threads, 1)), 0.0f);  // [threads]
#if defined(_OPENMP)
#pragma omp parallel num_threads(threads)
#endif
  {
#if defined(_OPENMP)
    const int id = omp_get_thread_num();
    const int num = omp_get_num_threads();
#else
    const int id = 0;
    const int num = 1;
#endif
    const std::ptrdiff_t begin = size * id / num;
    const std::ptrdiff_t end = size * (id + 1) / num;
    partial[static_cast<std::size_t>(id)] =
        Eigen::Map<const Eigen::ArrayXf>(data + begin, end - begin).sum();
  }
  float total = 0;
  for (float p : partial) total += p;
  return total;
}

/// Median read bandwidth (GB/s) of `runs` sums over the arrays `parts` (pointer, element count)
/// with `threads` threads, after one warm-up sum.
inline double read_bandwidth(const std::vector<std::pair<const float*, std::size_t>>& parts,
                             int threads, int runs) {
  std::size_t count = 0;
  for (const auto& p : parts) count += p.second;
  const double bytes = static_cast<double>(count * sizeof(float));
  volatile float sink = 0;  // keeps the sums from being optimised away
  const auto sum_all = [&] {
    float sum = 0;
    for (const auto& p : parts) sum += parallel_sum(p.first, p.second, threads);
    sink = sum;
  };
  sum_all();  // warm-up
  std::vector<double> gbps;
  for (int r = 0; r < runs; ++r) {
    const auto start = std::chrono::steady_clock::now();
    sum_all();
    const auto stop = std::chrono::steady_clock::now();
    gbps.push_back(bytes * 1e-9 / std::chrono::duration<double>(stop - start).count());
  }
  return kvlab_support::median(gbps);
}

/// The L3 size in bytes as Linux reports it for cpu0 (32 MiB if unknown).
inline std::size_t l3_bytes() {
  std::ifstream file("/sys/devices/system/cpu/cpu0/cache/index3/size");
  std::string text;
  if (file >> text && !text.empty()) {
    const char unit = text.back();
    const std::size_t value = std::strtoull(text.c_str(), nullptr, 10);
    if (value > 0 && unit == 'K') return value << 10;
    if (value > 0 && unit == 'M') return value << 20;
  }
  return std::size_t{32} << 20;
}

}  // namespace kvlab_bench
