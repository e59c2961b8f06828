/// \file
/// \brief The write kernels of the device KV caches, and their argument check.
///
/// The kernels append token rows to a contiguous cache and scatter token rows to pool slots (vLLM's
/// reshape_and_cache). Internal (`cuda::detail`); writes are copies, or for an int8/int4 cache the
/// quantization of `detail::quantize_block` (the CPU caches' own), checked for exact equality
/// against the CPU caches in tests/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kvlab/config.hpp"
#include "kvlab/core/paged_view.hpp"
#include "kvlab/core/quant_blocks.hpp"
#include "kvlab/core/views.hpp"
#include "kvlab/cuda/device_memory.cuh"
#include "kvlab/cuda/launch.cuh"
#include "kvlab/cuda/numeric.cuh"

namespace kvlab::cuda {

/// What a device cache of `S` is given to store: rows of `S` itself for float, fp16 and bf16;
/// rows of floats for int8 and int4 (quantized as they are written).
template <typename S>
using StorageInput = std::conditional_t<is_quantized_storage<S>, float, S>;

namespace detail {

/// Stores the `StorageUnit<S>::kValues` values at `x` as one element of `S`: a copy, or the
/// quantization of 32 floats into a block (`quantize_block`, as the CPU caches do).
template <typename S>
__device__ inline void store_unit(const StorageInput<S>* x, S& out) {
  if constexpr (is_quantized_storage<S>) {
    kvlab::detail::quantize_block(x, out);
  } else {
    out = *x;
  }
}

/// Threads per block of the write kernels.
constexpr int kWriteThreads = 256;

/// Blocks for a grid-stride loop over `count` elements.
inline unsigned write_blocks(std::int64_t count) {
  const std::int64_t blocks = (count + kWriteThreads - 1) / kWriteThreads;
  return static_cast<unsigned>(blocks < (1 << 20) ? (blocks > 0 ? blocks : 1) : (1 << 20));
}

/// Appends `n` token rows to one layer of a contiguous cache: row t of `k` and `v` ([n,
/// num_kv_heads * head_dim], token-major) goes, head by head, to position `first + t` of the
/// head-major cache (`layout.offset`; the ring's slot with a window). One thread per stored
/// element (`store_unit`: a value, or a block of 32 quantized; grid-stride loop).
/// \param k_cache  [num_kv_heads, capacity, row_units], this layer's keys
/// \param v_cache  [num_kv_heads, capacity, row_units], this layer's values
template <typename S>
__global__ void append_rows_kernel(const StorageInput<S>* k, const StorageInput<S>* v, int n,
                                   S* k_cache, S* v_cache, ContiguousKVView<S> layout, int first) {
  const int units = layout.row_units();  // stored elements per head's row
  const int width = layout.num_kv_heads * units;
  const std::int64_t count = static_cast<std::int64_t>(n) * width;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int t = static_cast<int>(i / width);
    const int h = static_cast<int>(i % width) / units;
    const int u = static_cast<int>(i % width) % units;
    const std::ptrdiff_t src =
        (static_cast<std::ptrdiff_t>(t) * layout.num_kv_heads + h) * layout.head_dim +
        u * StorageUnit<S>::kValues;
    const std::ptrdiff_t dst = layout.offset(h, first + t) + u;
    store_unit(k + src, k_cache[dst]);
    store_unit(v + src, v_cache[dst]);
  }
}

/// Scatters `n` token rows to pool slots (vLLM's reshape_and_cache): row t of `k` and `v` ([n,
/// num_kv_heads * head_dim]) goes, head by head, to `slots[t]` (`layout.slot_offset`, either
/// pool layout). A negative slot is skipped (vLLM's padding convention). One thread per stored
/// element (`store_unit`).
/// \param slots   [n] in device memory
/// \param k_pool  this layer's keys, [num_blocks, block_size, num_kv_heads, row_units] (NHD) or
///                [num_blocks, num_kv_heads, block_size, row_units] (HND)
/// \param v_pool  this layer's values, the same layout
template <typename S>
__global__ void write_slots_kernel(const StorageInput<S>* k, const StorageInput<S>* v,
                                   const std::int64_t* slots, int n, S* k_pool, S* v_pool,
                                   PagedKVView<S> layout) {
  const int units = layout.row_units();  // stored elements per head's row
  const int width = layout.num_kv_heads * units;
  const std::int64_t count = static_cast<std::int64_t>(n) * width;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t t = i / width;
    const std::int64_t slot = slots[t];
    if (slot < 0) continue;
    const int h = static_cast<int>(i % width) / units;
    const int u = static_cast<int>(i % width) % units;
    const std::ptrdiff_t src =
        (t * layout.num_kv_heads + h) * layout.head_dim + u * StorageUnit<S>::kValues;
    const std::ptrdiff_t dst = layout.slot_offset(slot, h) + u;
    store_unit(k + src, k_pool[dst]);
    store_unit(v + src, v_pool[dst]);
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
