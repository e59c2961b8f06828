/// \file
/// \brief `cuda::ContiguousKVCache`: the KV cache of one sequence in device memory.
///
/// It is the device counterpart of `ContiguousKVCache` (same layout, same calls). Checked bit for
/// bit against the CPU cache in tests/cuda.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/core/quant_blocks.hpp"
#include "kvlab/core/views.hpp"
#include "kvlab/cuda/cache_kernels.cuh"
#include "kvlab/cuda/device_memory.cuh"
#include "kvlab/cuda/error.cuh"
#include "kvlab/cuda/launch.cuh"
#include "kvlab/cuda/numeric.cuh"

namespace kvlab::cuda {

/// The KV cache of one sequence in device memory, preallocated for `capacity` tokens in every
/// layer: the device counterpart of `kvlab::ContiguousKVCache`, with the same layout (per layer
/// `[num_kv_heads, capacity, head_dim]` values for K and for V) and the same calls; `view(layer)`
/// is a `ContiguousKVView` of device pointers, what `cuda::decode_attention` reads.
///
/// `T` is the stored element: float, `__half`, `__nv_bfloat16` (rows of T are appended as they
/// are), or `BlockQ8_0` / `BlockQ4_0` (rows of floats are appended and quantized on the device,
/// block by block, exactly as `kvlab::ContiguousKVCache<float, BlockQ8_0>` quantizes them:
/// `detail::quantize_block`). Unlike the CPU cache it does not look at the values (they are in
/// device memory): a NaN or an out-of-range value is stored as the encoding makes it.
///
/// **Sliding window** (`window` = W >= 1), as in the CPU cache: the rows are kept in a ring of
/// `capacity` slots (row `pos` in slot `pos % capacity`, `ContiguousKVView::slot`), the sequence
/// may grow past `capacity`, a chunk may add at most `capacity − W + 1` tokens, and `truncate`
/// refuses a length whose window reaches overwritten rows — the same checks, in one place
/// (`detail::check_contiguous_append`, `detail::check_contiguous_truncate`). With attention
/// sinks (`sinks` = S, 1 <= S < W) the first S slots keep the sequence's first S tokens and
/// the ring is the other `capacity − S`, as in the CPU cache.
template <typename T>
class ContiguousKVCache {
 public:
  /// What `append` takes: rows of T, or of floats for an int8/int4 cache.
  using Input = StorageInput<T>;

  /// An empty cache for `capacity` tokens, or with a sliding window of `window` keys a ring of
  /// `capacity` slots (`capacity >= window`: W − 1 + C for steps of up to C tokens), the first
  /// `sinks` of them kept for the sequence's first tokens (`capacity >= sinks + window`); device
  /// memory, uninitialised.
  /// \throws InvalidArgument if any size is below 1, `window` is negative or above `capacity`
  ///         less the sinks, `sinks` is negative or not below a window (none without one),
  ///         `head_dim` is not a multiple of 32 for int8/int4, or the sizes overflow; CudaError
  ///         if the allocation fails.
  ContiguousKVCache(int num_layers, int num_kv_heads, int head_dim, int capacity, int window = 0,
                    int sinks = 0)
      : num_layers_(num_layers),
        num_kv_heads_(num_kv_heads),
        head_dim_(head_dim),
        capacity_(capacity),
        window_(window),
        sinks_(sinks),
        k_(elements(num_layers, num_kv_heads, head_dim, capacity, window, sinks)),
        v_(k_.size()),
        length_(at(num_layers), 0),
        valid_from_(at(num_layers), 0) {}

  /// Number of layers.
  int num_layers() const { return num_layers_; }
  /// K/V heads per layer.
  int num_kv_heads() const { return num_kv_heads_; }
  /// Values per head.
  int head_dim() const { return head_dim_; }
  /// Tokens reserved per layer (slots of the ring, with a window).
  int capacity() const { return capacity_; }
  /// The sliding window: each query sees its last `window()` keys; 0 for none.
  int window() const { return window_; }
  /// The attention sinks: each query also sees the first `sinks()` keys; 0 for none.
  int sinks() const { return sinks_; }
  /// The most tokens one `append` may add: `capacity() − sinks() − window() + 1` with a window,
  /// the free capacity without (as `kvlab::ContiguousKVCache::max_chunk`).
  /// \throws InvalidArgument if `layer` is out of range.
  int max_chunk(int layer) const {
    check_layer("kvlab::cuda::ContiguousKVCache::max_chunk", layer);
    return window_ > 0 ? capacity_ - sinks_ - window_ + 1 : capacity_ - length_[at(layer)];
  }
  /// Tokens of the sequence in `layer` (with a window, possibly more than the ring keeps).
  /// \throws InvalidArgument if `layer` is out of range.
  int length(int layer) const {
    check_layer("kvlab::cuda::ContiguousKVCache::length", layer);
    return length_[at(layer)];
  }

  /// Appends `n` tokens to `layer` (`append_rows_kernel`), as `ContiguousKVCache::append`.
  /// \param layer   in [0, num_layers)
  /// \param k       keys of the new tokens, [n, num_kv_heads * head_dim], n >= 1, device memory
  ///                (of `Input`: floats for an int8/int4 cache, quantized as they are written)
  /// \param v       values of the new tokens, [n, num_kv_heads * head_dim], device memory
  /// \param stream  the stream to run on
  /// \throws InvalidArgument for a wrong shape or layer; CapacityError if the layer would hold
  ///         more than `capacity()` tokens, or with a window if `n` exceeds `max_chunk` (either
  ///         way nothing is written); CudaError if the launch fails.
  void append(int layer, DeviceMatrix<const Input> k, DeviceMatrix<const Input> v,
              cudaStream_t stream = nullptr) {
    constexpr const char* kWhere = "kvlab::cuda::ContiguousKVCache::append";
    check_layer(kWhere, layer);
    detail::check_rows(kWhere, k, v, num_kv_heads_ * head_dim_, 1);
    const std::size_t l = at(layer);
    kvlab::detail::check_contiguous_append(kWhere, "k.rows", k.rows, capacity_, window_, length_[l],
                                           sinks_);
    const ContiguousKVView<T> layout = view(layer);  // with a window, slots in the ring
    detail::launch_kernel(
        "kvlab::cuda::detail::append_rows_kernel", detail::append_rows_kernel<T>,
        dim3(detail::write_blocks(static_cast<std::int64_t>(k.rows) * num_kv_heads_ *
                                  (head_dim_ / StorageUnit<T>::kValues))),
        dim3(detail::kWriteThreads), 0, stream, k.data, v.data, k.rows, layer_data(k_, layer),
        layer_data(v_, layer), layout, length_[l]);
    length_[l] += k.rows;
    // the rows overwritten in the ring are gone
    valid_from_[l] =
        kvlab::detail::ring_valid_from(valid_from_[l], length_[l], capacity_, window_, sinks_);
  }

  /// Forgets every token at position `length` and after, in every layer. With a window, the next
  /// token's window (the keys from `length − W + 1`) must still be in the ring.
  /// \throws InvalidArgument if `length` is negative, above a layer's current length, or with a
  ///         window below the oldest row kept plus W − 1.
  void truncate(int length) {
    constexpr const char* kWhere = "kvlab::cuda::ContiguousKVCache::truncate";
    for (int l = 0; l < num_layers_; ++l)
      kvlab::detail::check_contiguous_truncate(kWhere, length, l, length_[at(l)], window_,
                                               valid_from_[at(l)], sinks_);
    for (int& len : length_) len = length;
  }
  /// Empties every layer; the memory stays reserved.
  void clear() {
    for (int& len : length_) len = 0;
    for (int& from : valid_from_) from = 0;
  }

  /// A view of `layer` holding device pointers, valid until the cache is destroyed.
  /// \throws InvalidArgument if `layer` is out of range.
  ContiguousKVView<T> view(int layer) const {
    check_layer("kvlab::cuda::ContiguousKVCache::view", layer);
    return ContiguousKVView<T>{layer_data(k_, layer),
                               layer_data(v_, layer),
                               num_kv_heads_,
                               head_dim_,
                               capacity_,
                               length_[at(layer)],
                               window_,
                               sinks_};
  }

  /// Bytes reserved for K and V in all layers.
  std::size_t bytes_reserved() const { return k_.bytes() + v_.bytes(); }

 private:
  // A layer (or a size, >= 0) as an index (or a size) of the per-layer arrays.
  static std::size_t at(int i) { return static_cast<std::size_t>(i); }
  // Checks the arguments; the elements of K (or V) in all layers.
  static std::size_t elements(int num_layers, int num_kv_heads, int head_dim, int capacity,
                              int window, int sinks) {
    constexpr const char* kWhere = "kvlab::cuda::ContiguousKVCache";
    kvlab::detail::require_at_least(kWhere, "num_layers", num_layers, 1);
    kvlab::detail::require_at_least(kWhere, "num_kv_heads", num_kv_heads, 1);
    kvlab::detail::require_at_least(kWhere, "head_dim", head_dim, 1);
    kvlab::detail::require_at_least(kWhere, "capacity", capacity, 1);
    kvlab::detail::check_ring_window(kWhere, capacity, window, sinks);
    if (head_dim % StorageUnit<T>::kValues != 0) {
      kvlab::detail::fail(kWhere, "head_dim",
                          std::string("a multiple of 32 (whole ") + storage_name<T>() + " blocks)",
                          head_dim);
    }
    if (num_kv_heads > INT_MAX / head_dim) {
      kvlab::detail::fail(kWhere, "num_kv_heads * head_dim", "at most " + std::to_string(INT_MAX),
                          1LL * num_kv_heads * head_dim);
    }
    // stored elements per token
    const std::size_t row =
        kvlab::detail::elements(num_kv_heads, head_dim / StorageUnit<T>::kValues);
    const std::size_t limit = static_cast<std::size_t>(PTRDIFF_MAX) / sizeof(T) / at(num_layers);
    if (row > limit / at(capacity)) {
      kvlab::detail::fail(kWhere, "capacity", "at most " + std::to_string(limit / row), capacity);
    }
    return at(num_layers) * row * at(capacity);
  }
  void check_layer(const char* where, int layer) const {
    if (layer < 0 || layer >= num_layers_) {
      kvlab::detail::fail(where, "layer", "in [0, " + std::to_string(num_layers_) + ")", layer);
    }
  }
  T* layer_data(const DeviceBuffer<T>& buffer, int layer) const {
    const std::size_t per_layer = buffer.size() / at(num_layers_);
    return const_cast<T*>(buffer.data()) + at(layer) * per_layer;
  }

  int num_layers_;
  int num_kv_heads_;
  int head_dim_;
  int capacity_;
  int window_;                   // 0, or W: a ring of capacity_ slots
  int sinks_;                    // 0, or S < W: slots [0, S) keep the first S tokens
  DeviceBuffer<T> k_;            // [num_layers, num_kv_heads, capacity, row units]
  DeviceBuffer<T> v_;            // [num_layers, num_kv_heads, capacity, row units]
  std::vector<int> length_;      // [num_layers]: tokens of the sequence
  std::vector<int> valid_from_;  // [num_layers]: the oldest position the ring still holds
};

}  // namespace kvlab::cuda
