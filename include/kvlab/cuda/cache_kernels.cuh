/// \file
/// \brief The write kernels of the device KV caches: append token rows to a contiguous cache,
/// scatter token rows to pool slots (vLLM's reshape_and_cache), and their argument check.
/// Internal (`cuda::detail`); writes are copies, checked for exact equality against the CPU
/// caches in tests/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kvlab/config.hpp"
#include "kvlab/core/paged_view.hpp"
#include "kvlab/core/views.hpp"
#include "kvlab/cuda/device_memory.cuh"
#include "kvlab/cuda/launch.cuh"

namespace kvlab::cuda {
namespace detail {

/// Threads per block of the write kernels.
constexpr int kWriteThreads = 256;

/// Blocks for a grid-stride loop over `count` elements.
inline unsigned write_blocks(std::int64_t count) {
  const std::int64_t blocks = (count + kWriteThreads - 1) / kWriteThreads;
  return static_cast<unsigned>(blocks < (1 << 20) ? (blocks > 0 ? blocks : 1) : (1 << 20));
}

/// Appends `n` token rows to one layer of a contiguous cache: row t of `k` and `v` ([n,
/// num_kv_heads * head_dim], token-major) goes, head by head, to position `first + t` of the
/// head-major cache (`layout.offset`). One thread per value (grid-stride loop).
/// \param k_cache  [num_kv_heads, capacity, head_dim], this layer's keys
/// \param v_cache  [num_kv_heads, capacity, head_dim], this layer's values
template <typename T>
__global__ void append_rows_kernel(const T* k, const T* v, int n, T* k_cache, T* v_cache,
                                   ContiguousKVView<T> layout, int first) {
  const int width = layout.num_kv_heads * layout.head_dim;
  const std::int64_t count = static_cast<std::int64_t>(n) * width;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int t = static_cast<int>(i / width);
    const int in_row = static_cast<int>(i % width);
    const std::ptrdiff_t dst =
        layout.offset(in_row / layout.head_dim, first + t) + in_row % layout.head_dim;
    k_cache[dst] = k[i];
    v_cache[dst] = v[i];
  }
}

/// Scatters `n` token rows to pool slots (vLLM's reshape_and_cache): row t of `k` and `v` ([n,
/// num_kv_heads * head_dim]) goes, head by head, to `slots[t]` (`layout.slot_offset`, either
/// pool layout). A negative slot is skipped (vLLM's padding convention). One thread per value.
/// \param slots   [n] in device memory
/// \param k_pool  this layer's keys, [num_blocks, block_size, num_kv_heads, head_dim] (NHD) or
///                [num_blocks, num_kv_heads, block_size, head_dim] (HND)
/// \param v_pool  this layer's values, the same layout
template <typename T>
__global__ void write_slots_kernel(const T* k, const T* v, const std::int64_t* slots, int n,
                                   T* k_pool, T* v_pool, PagedKVView<T> layout) {
  const int width = layout.num_kv_heads * layout.head_dim;
  const std::int64_t count = static_cast<std::int64_t>(n) * width;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t slot = slots[i / width];
    if (slot < 0) continue;
    const int in_row = static_cast<int>(i % width);
    const std::ptrdiff_t dst =
        layout.slot_offset(slot, in_row / layout.head_dim) + in_row % layout.head_dim;
    k_pool[dst] = k[i];
    v_pool[dst] = v[i];
  }
}

/// Checks that `k` and `v` are both [rows >= min_rows, width] device matrices.
template <typename T>
void check_rows(const char* where, DeviceMatrix<const T> k, DeviceMatrix<const T> v, int width,
                int min_rows) {
  kvlab::detail::require_at_least(where, "k.rows", k.rows, min_rows);
  kvlab::detail::require_equal(where, "k.cols", k.cols, width, "num_kv_heads * head_dim");
  kvlab::detail::require_equal(where, "v.rows", v.rows, k.rows, "k.rows");
  kvlab::detail::require_equal(where, "v.cols", v.cols, width, "num_kv_heads * head_dim");
  if (k.rows > 0 && (k.data == nullptr || v.data == nullptr)) {
    kvlab::detail::fail(where, "k.data / v.data", "device pointers", "a null pointer");
  }
}

}  // namespace detail
}  // namespace kvlab::cuda
