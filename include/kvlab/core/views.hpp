/// \file
/// \brief `ContiguousKVView`: the documented layout of one layer of a contiguous KV cache,
/// as plain pointers and sizes that host and device code read the same way.
#pragma once

#include <cstddef>

#include "kvlab/config.hpp"
#include "kvlab/core/quant_blocks.hpp"

namespace kvlab {

/// Read-only view of one layer of a contiguous KV cache.
///
/// Layout (head-major, "HND"): `k` and `v` each point to `[num_kv_heads, capacity, head_dim]`
/// values; rows `[0, length)` of every head are valid. `T` is the stored element: a number
/// (`float`, fp16, bf16), one per value, or a quantized block (`BlockQ8_0`, `BlockQ4_0`) of 32
/// values, so a row is `row_units()` elements and offsets count elements. Each head's keys are one contiguous
/// `[capacity, head_dim]` block, so a decode step streams them front to back, and the query
/// heads of a GQA group read the same block once.
template <typename T>
struct ContiguousKVView {
  const T* k = nullptr;  ///< keys:   [num_kv_heads, capacity, head_dim]
  const T* v = nullptr;  ///< values: [num_kv_heads, capacity, head_dim]
  int num_kv_heads = 0;  ///< K/V heads
  int head_dim = 0;      ///< values per head
  int capacity = 0;      ///< rows reserved per head
  int length = 0;        ///< rows filled per head (0 <= length <= capacity)

  /// Stored elements of one head's row: `head_dim / StorageUnit<T>::kValues`.
  KVLAB_HOST_DEVICE int row_units() const { return head_dim / StorageUnit<T>::kValues; }
  /// Offset, in elements, of row `pos` of K/V head `kv_head` from `k` (or `v`).
  KVLAB_HOST_DEVICE std::ptrdiff_t offset(int kv_head, int pos) const {
    return (static_cast<std::ptrdiff_t>(kv_head) * capacity + pos) * row_units();
  }
  /// Key row `pos` of K/V head `kv_head`: `row_units()` elements.
  KVLAB_HOST_DEVICE const T* key(int kv_head, int pos) const { return k + offset(kv_head, pos); }
  /// Value row `pos` of K/V head `kv_head`: `row_units()` elements.
  KVLAB_HOST_DEVICE const T* value(int kv_head, int pos) const { return v + offset(kv_head, pos); }
};

}  // namespace kvlab
