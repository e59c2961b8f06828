/// \file
/// \brief `cpu::detail::parallel_for`: the work-item loop of the CPU kernels, on OpenMP
/// threads when enabled, with any exception carried out of the parallel region (internal).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace kvlab::cpu::detail {

/// What the calls of `parallel_for` ran since the program started: the tests read these counts
/// to assert that a divided path ran on several threads, not only that it was planned to.
struct ParallelCounts {
  std::atomic<std::uint64_t> loops{0};     ///< calls of `parallel_for` that ran their items
  std::atomic<std::uint64_t> threaded{0};  ///< of those, loops whose items ran on several threads
  std::atomic<std::uint64_t> items{0};     ///< items run by all of them
};
/// The counts of every `parallel_for` call of the program.
inline ParallelCounts& parallel_counts() {
  static ParallelCounts counts;
  return counts;
}

/// Runs `body(item)` for every item in [0, items), in parallel (dynamic schedule, one item at a
/// time) when `parallel` is true and OpenMP is enabled. No exception may leave an OpenMP loop,
/// so the first one thrown by any item is kept and rethrown after the loop (and the loop is not
/// counted in `parallel_counts`).
template <typename F>
void parallel_for(int items, bool parallel, F&& body) {
  (void)parallel;  // unused without OpenMP
  std::exception_ptr error;
  std::atomic<bool> several{false};  // an item ran in a team of more than one thread
#if defined(_OPENMP)
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
#endif
  for (int item = 0; item < items; ++item) {
#if defined(_OPENMP)
    if (omp_get_num_threads() > 1) several.store(true, std::memory_order_relaxed);
#endif
    try {
      body(item);
    } catch (...) {
#if defined(_OPENMP)
#pragma omp critical(kvlab_parallel_for_error)
#endif
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  ParallelCounts& counts = parallel_counts();
  counts.loops.fetch_add(1, std::memory_order_relaxed);
  if (several.load()) counts.threaded.fetch_add(1, std::memory_order_relaxed);
  counts.items.fetch_add(static_cast<std::uint64_t>(items < 0 ? 0 : items),
                         std::memory_order_relaxed);
}

}  // namespace kvlab::cpu::detail
