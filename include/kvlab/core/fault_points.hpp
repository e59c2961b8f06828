/// \file
/// \brief `KVLAB_FAULT_POINT`: places where a test can make kvlab throw, to prove that a failure
/// inside a step changes nothing; empty unless `KVLAB_FAULT_INJECTION` is defined.
///
/// A program that defines `KVLAB_FAULT_INJECTION` before including any kvlab header (the same
/// in every one of its files) gets `kvlab::detail::fault_hook()`, called with the point's name
/// at each point it passes; the hook throws to inject a fault there. Without the macro a point
/// compiles to nothing. The points: `"attention_step"` (after a layer's K and V are kept, before
/// they are attended), `"Sampler::sample"` (before a draw) and `"BlockAllocator::allocate"`
/// (before blocks are taken). Used by `tests/serving/test_engine_faults.cpp`.
#pragma once

#ifdef KVLAB_FAULT_INJECTION
#include <functional>

namespace kvlab {
namespace detail {

/// The function each fault point calls with its name (empty: none). Tests only.
inline std::function<void(const char*)>& fault_hook() {
  static std::function<void(const char*)> hook;
  return hook;
}

}  // namespace detail
}  // namespace kvlab

/// Calls `kvlab::detail::fault_hook()` with `name`, if a hook is set.
#define KVLAB_FAULT_POINT(name)                                             \
  do {                                                                      \
    if (::kvlab::detail::fault_hook()) ::kvlab::detail::fault_hook()(name); \
  } while (false)
#else
/// A place where a test built with `KVLAB_FAULT_INJECTION` can make kvlab throw; nothing here.
#define KVLAB_FAULT_POINT(name) \
  do {                          \
  } while (false)
#endif
