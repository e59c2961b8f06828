/// \file
/// \brief `cpu::detail::parallel_for`: the work-item loop of the CPU kernels, on OpenMP
/// threads when enabled, with any exception carried out of the parallel region (internal).
#pragma once

#include <exception>

namespace kvlab::cpu::detail {

/// Runs `body(item)` for every item in [0, items), in parallel (dynamic schedule, one item at a
/// time) when `parallel` is true and OpenMP is enabled. No exception may leave an OpenMP loop,
/// so the first one thrown by any item is kept and rethrown after the loop.
template <typename F>
void parallel_for(int items, bool parallel, F&& body) {
  (void)parallel;  // unused without OpenMP
  std::exception_ptr error;
#if defined(_OPENMP)
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
#endif
  for (int item = 0; item < items; ++item) {
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
}

}  // namespace kvlab::cpu::detail
