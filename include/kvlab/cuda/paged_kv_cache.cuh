/// \file
/// \brief `cuda::PagedKVCache`: the KV caches of many sequences in one block pool in device memory.
///
/// It is the device counterpart of `PagedKVCache` (same pool layouts, same calls, same slot
/// semantics; the bookkeeping runs on the host). `DeviceBlockTables` holds CSR block tables copied
/// to the device. Checked bit for bit against the CPU pool in tests/cuda.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kvlab/cache/block_allocator.hpp"
#include "kvlab/cache/block_tables.hpp"
#include "kvlab/cache/paged_sequences.hpp"
#include "kvlab/config.hpp"
#include "kvlab/core/paged_view.hpp"
#include "kvlab/core/quant_blocks.hpp"
#include "kvlab/cuda/cache_kernels.cuh"
#include "kvlab/cuda/device_memory.cuh"
#include "kvlab/cuda/error.cuh"
#include "kvlab/cuda/launch.cuh"
#include "kvlab/cuda/numeric.cuh"

namespace kvlab::cuda {

/// `BlockTables` copied to device memory, for the paged kernels. The host copy is kept too
/// (`host()`), for sizes and counts.
class DeviceBlockTables {
 public:
  /// Copies `tables` (indptr, indices, last_page_len) to the device.
  /// \throws CudaError if an allocation or copy fails.
  explicit DeviceBlockTables(BlockTables tables)
      : host_(std::move(tables)),
        indptr_(host_.indptr()),
        indices_(host_.indices()),
        last_page_len_(host_.last_page_len()) {}

  /// The tables on the host.
  const BlockTables& host() const { return host_; }
  /// Sequences in the batch.
  int batch() const { return host_.batch(); }

  /// The view of a device pool through these tables, with every array in device memory; valid
  /// while both live.
  /// \param k             the pool's keys, device memory, in `layout`
  /// \param v             the pool's values, device memory, in `layout`
  /// \param num_kv_heads  K/V heads
  /// \param head_dim      values per head
  /// \param layout        `KVLayout::NHD`: `[num_blocks, block_size, num_kv_heads, head_dim]`;
  ///                      `KVLayout::HND`: `[num_blocks, num_kv_heads, block_size, head_dim]`
  template <typename T>
  PagedKVView<T> view(const T* k, const T* v, int num_kv_heads, int head_dim,
                      KVLayout layout = KVLayout::NHD) const {
    PagedKVView<T> out = host_.view(k, v, num_kv_heads, head_dim, layout);
    out.indptr = indptr_.data();
    out.indices = indices_.data();
    out.last_page_len = last_page_len_.data();
    return out;
  }

 private:
  BlockTables host_;
  DeviceBuffer<std::int32_t> indptr_;         // [batch + 1]
  DeviceBuffer<std::int32_t> indices_;        // [indptr[batch]]
  DeviceBuffer<std::int32_t> last_page_len_;  // [batch]
};

/// The KV caches of many sequences in one pool of fixed-size blocks in device memory: the
/// device counterpart of `kvlab::PagedKVCache`, with the same pool layouts, the same calls and
/// the same slot semantics. The bookkeeping (a `BlockAllocator`, one block list per sequence,
/// fork with copy on write) runs on the host; only K and V live on the device. Unlike the host
/// cache it does not track which reserved slots have been written (that would take a device
/// copy per step): `view` does not refuse unwritten tokens, and there is no one-call `append`.
///
/// A step is `reserve(seq, n)` (room for n tokens; returns their slots, `block * block_size +
/// offset`), then per layer `write(layer, slots, k, v)` (`write_slots_kernel`); attention reads
/// the pool through `view(layer, tables)` with tables from `tables(seqs)` copied to the device
/// (`DeviceBlockTables`). A copy on write copies the whole shared block (all layers, K and V)
/// on the default stream.
///
/// `T` is the stored element: float, `__half`, `__nv_bfloat16`, or `BlockQ8_0` / `BlockQ4_0`,
/// whose rows are written as floats and quantized on the device exactly as the CPU cache
/// quantizes them (`detail::quantize_block`), without looking at the values.
template <typename T>
class PagedKVCache {
 public:
  /// What `write` takes: rows of T, or of floats for an int8/int4 pool.
  using Input = StorageInput<T>;

  /// An empty cache (device memory, uninitialised).
  /// \param num_layers    layers, >= 1
  /// \param num_kv_heads  K/V heads per layer, >= 1
  /// \param head_dim      values per head, >= 1
  /// \param block_size    tokens per block, >= 1
  /// \param num_blocks    blocks in the pool, >= 1
  /// \param layout        the order of a block's values (NHD: token-major, HND: head-major)
  /// \param window        a sliding window of that many keys (0: none): the views carry it and
  ///                      `release_out_of_window` gives the blocks before it back, as in
  ///                      `PagedKVCache`
  /// \param sinks         attention sinks (0: none; below `window`): each query also sees the
  ///                      first `sinks` tokens of its sequence, whose blocks are kept
  /// \throws InvalidArgument if any size is below 1, `window` is negative, `sinks` is negative or
  ///         not below a window (none without one), `head_dim` is not a multiple of 32 for
  ///         int8/int4, or the pool overflows; CudaError if the allocation fails.
  PagedKVCache(int num_layers, int num_kv_heads, int head_dim, int block_size, int num_blocks,
               KVLayout layout = KVLayout::NHD, int window = 0, int sinks = 0)
      : num_layers_(num_layers),
        num_kv_heads_(num_kv_heads),
        head_dim_(head_dim),
        layout_(layout),
        window_(window),
        sinks_(sinks),
        book_(block_size, num_blocks, "kvlab::cuda::PagedKVCache"),
        k_(elements(num_layers, num_kv_heads, head_dim, block_size, num_blocks, window, sinks)),
        v_(k_.size()) {}

  /// Layers.
  int num_layers() const { return num_layers_; }
  /// K/V heads per layer.
  int num_kv_heads() const { return num_kv_heads_; }
  /// Values per head.
  int head_dim() const { return head_dim_; }
  /// Tokens per block.
  int block_size() const { return book_.block_size(); }
  /// The order of a block's values.
  KVLayout layout() const { return layout_; }
  /// The pool's allocator (read-only).
  const BlockAllocator& allocator() const { return book_.allocator(); }

  /// Starts an empty sequence and returns its id; ids are never reused.
  int add_sequence() { return book_.add_sequence(); }
  /// Ids of the live sequences, ascending.
  std::vector<int> sequences() const { return book_.sequences(); }
  /// Tokens in sequence `seq`.
  /// \throws InvalidArgument if `seq` is not live.
  int length(int seq) const { return book_.length(seq); }
  /// The block table of `seq`: physical block ids, logical order.
  /// \throws InvalidArgument if `seq` is not live.
  const std::vector<std::int32_t>& blocks(int seq) const { return book_.blocks(seq); }

  /// Blocks that `reserve(seq, n)` would take from the pool (as `PagedKVCache::blocks_needed`).
  /// \throws InvalidArgument if `seq` is not live or `n < 1`.
  int blocks_needed(int seq, int n) const { return book_.blocks_needed(seq, n); }

  /// True when `seq` is a live sequence.
  bool contains(int seq) const { return book_.contains(seq); }

  /// Makes room for `n` more tokens of `seq` and returns their slots, [n], as
  /// `PagedKVCache::reserve` (the same `PagedSequences` bookkeeping): a block is allocated when
  /// the last one is full; a shared, partly filled last block is first copied (all layers, on
  /// the device).
  /// \throws InvalidArgument if `seq` is not live or `n < 1`; OutOfBlocks if the pool lacks the
  ///         blocks; CudaError if the copy fails (nothing changes in any of these cases).
  std::vector<std::int64_t> reserve(int seq, int n) {
    return book_.reserve(seq, n,
                         [this](std::int32_t from, std::int32_t to, int) { copy_block(from, to); });
  }

  /// Stores the keys and values of tokens at `slots` (device memory) in `layer`
  /// (`write_slots_kernel`). The slots are trusted (device memory); a negative one is skipped.
  /// \param layer   in [0, num_layers)
  /// \param slots   [k.rows] slots in device memory, each in [0, num_blocks * block_size) or < 0
  /// \param k       [n, num_kv_heads * head_dim], device memory
  /// \param v       [n, num_kv_heads * head_dim], device memory
  /// \param stream  the stream to run on
  /// \throws InvalidArgument for a wrong layer or shape; CudaError if the launch fails.
  void write(int layer, const std::int64_t* slots, DeviceMatrix<const Input> k,
             DeviceMatrix<const Input> v, cudaStream_t stream = nullptr) {
    constexpr const char* kWhere = "kvlab::cuda::PagedKVCache::write";
    check_layer(kWhere, layer);
    detail::check_rows(kWhere, k, v, num_kv_heads_ * head_dim_, 0);
    if (k.rows == 0) return;
    if (slots == nullptr)
      kvlab::detail::fail(kWhere, "slots", "a device pointer", "a null pointer");
    detail::launch_kernel(
        "kvlab::cuda::detail::write_slots_kernel", detail::write_slots_kernel<T>,
        dim3(detail::write_blocks(static_cast<std::int64_t>(k.rows) * num_kv_heads_ *
                                  (head_dim_ / StorageUnit<T>::kValues))),
        dim3(detail::kWriteThreads), 0, stream, k.data, v.data, slots, k.rows,
        layer_data(k_, layer), layer_data(v_, layer), layout_view(layer));
  }

  /// Stores the keys and values of tokens at `slots` (host memory, from `reserve`) in `layer`,
  /// as `PagedKVCache::write`: the slots are checked, then copied to the device on `stream`.
  /// \param layer   in [0, num_layers)
  /// \param slots   [n] slots, each in [0, num_blocks * block_size)
  /// \param k       [n, num_kv_heads * head_dim], device memory
  /// \param v       [n, num_kv_heads * head_dim], device memory
  /// \param stream  the stream to run on
  /// \throws InvalidArgument for a wrong layer, shape or slot (nothing is written); CudaError if
  ///         a copy or the launch fails.
  void write(int layer, const std::vector<std::int64_t>& slots, DeviceMatrix<const Input> k,
             DeviceMatrix<const Input> v, cudaStream_t stream = nullptr) {
    constexpr const char* kWhere = "kvlab::cuda::PagedKVCache::write";
    check_layer(kWhere, layer);
    detail::check_rows(kWhere, k, v, num_kv_heads_ * head_dim_, 0);
    kvlab::detail::require_equal(kWhere, "k.rows", static_cast<long>(k.rows),
                                 static_cast<long>(slots.size()), "slots.size()");
    const std::int64_t num_slots =
        static_cast<std::int64_t>(allocator().num_blocks()) * block_size();
    for (std::size_t i = 0; i < slots.size(); ++i) {
      if (slots[i] < 0 || slots[i] >= num_slots) {
        kvlab::detail::fail(kWhere, "slots[" + std::to_string(i) + "]",
                            "in [0, " + std::to_string(num_slots) + ")", slots[i]);
      }
    }
    if (slots.empty()) return;
    if (slots_.size() < slots.size()) slots_ = DeviceBuffer<std::int64_t>(slots.size());
    KVLAB_CUDA_CHECK(cudaMemcpyAsync(slots_.data(), slots.data(),
                                     slots.size() * sizeof(std::int64_t), cudaMemcpyHostToDevice,
                                     stream));
    write(layer, slots_.data(), k, v, stream);
  }

  /// Starts a sequence that shares every block of `seq` and returns its id (no K/V is copied).
  /// \throws InvalidArgument if `seq` is not live.
  int fork(int seq) { return book_.fork(seq); }

  /// Shortens `seq` to its first `length` tokens, as `PagedKVCache::truncate` (with a window,
  /// the next token's window must not reach a block already given back).
  /// \throws InvalidArgument if `seq` is not live, `length` is not in [0, length(seq)], or its
  ///         window reaches a released block.
  void truncate(int seq, int length) {
    book_.check_window_truncate(seq, length, window_);
    book_.truncate(seq, length);
  }

  /// The sliding window of the pool's attention (0: none), as `PagedKVCache::window`.
  int window() const { return window_; }
  /// The attention sinks (`PagedKVCache::sinks`); 0 for none.
  int sinks() const { return sinks_; }
  /// As `PagedKVCache::release_out_of_window` (`PagedSequences::release_out_of_window`): with a
  /// window, the blocks of `seq` before the next token's window go back; returns how many.
  /// \throws InvalidArgument if `seq` is not live.
  int release_out_of_window(int seq) { return book_.release_out_of_window(seq, window_, sinks_); }
  /// Blocks that `seq` holds, less those given back out of the window.
  /// \throws InvalidArgument if `seq` is not live.
  int held_blocks(int seq) const { return book_.held_blocks(seq); }

  /// Ends `seq`: its blocks lose a holder, and those with none left return to the pool.
  /// \throws InvalidArgument if `seq` is not live.
  void free_sequence(int seq) { book_.free_sequence(seq); }

  /// The block tables (host) of a batch of live, non-empty sequences, in the order given;
  /// `DeviceBlockTables(tables(seqs))` copies them to the device for `view`.
  /// \throws InvalidArgument if `seqs` is empty or names a sequence that is not live or empty.
  BlockTables tables(const std::vector<int>& seqs) const { return book_.tables(seqs, window_); }

  /// The view of `layer` through `tables`, every pointer in device memory: what
  /// `cuda::paged_decode_attention` reads. Valid while both live and until the next reserve, fork
  /// or free.
  /// \throws InvalidArgument if `layer` is out of range or `tables` is for another pool.
  PagedKVView<T> view(int layer, const DeviceBlockTables& tables) const {
    constexpr const char* kWhere = "kvlab::cuda::PagedKVCache::view";
    check_layer(kWhere, layer);
    kvlab::detail::require_equal(kWhere, "tables.num_blocks()", tables.host().num_blocks(),
                                 allocator().num_blocks(), "num_blocks");
    kvlab::detail::require_equal(kWhere, "tables.block_size()", tables.host().block_size(),
                                 block_size(), "block_size");
    PagedKVView<T> view = tables.view<T>(layer_data(k_, layer), layer_data(v_, layer),
                                         num_kv_heads_, head_dim_, layout_);
    view.window = window_;
    view.sinks = sinks_;
    return view;
  }

  /// A view of temporary device tables would point into device memory freed at the end of the
  /// statement, before a kernel reads it: keep the tables in a variable.
  PagedKVView<T> view(int layer, const DeviceBlockTables&& tables) const = delete;

 private:
  // Checks the arguments; the elements of K (or V) in all layers.
  static std::size_t elements(int num_layers, int num_kv_heads, int head_dim, int block_size,
                              int num_blocks, int window, int sinks) {
    constexpr const char* kWhere = "kvlab::cuda::PagedKVCache";
    kvlab::detail::check_window_sinks(kWhere, window, sinks);
    kvlab::detail::require_at_least(kWhere, "num_layers", num_layers, 1);
    kvlab::detail::require_at_least(kWhere, "num_kv_heads", num_kv_heads, 1);
    kvlab::detail::require_at_least(kWhere, "head_dim", head_dim, 1);
    kvlab::detail::require_at_least(kWhere, "block_size", block_size, 1);
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
    const std::size_t token =
        kvlab::detail::elements(num_kv_heads, head_dim / StorageUnit<T>::kValues);
    const std::size_t limit = static_cast<std::size_t>(PTRDIFF_MAX) / sizeof(T) /
                              static_cast<std::size_t>(num_layers) / token;
    const std::size_t tokens = kvlab::detail::elements(block_size, num_blocks);
    if (tokens > limit) {
      kvlab::detail::fail(kWhere, "num_blocks * block_size",
                          "at most " + std::to_string(limit) + " tokens", tokens);
    }
    return static_cast<std::size_t>(num_layers) * tokens * token;
  }
  void check_layer(const char* where, int layer) const {
    if (layer < 0 || layer >= num_layers_) {
      kvlab::detail::fail(where, "layer", "in [0, " + std::to_string(num_layers_) + ")", layer);
    }
  }
  std::size_t block_elements() const {
    return kvlab::detail::elements(block_size(), num_kv_heads_,
                                   head_dim_ / StorageUnit<T>::kValues);
  }
  T* layer_data(const DeviceBuffer<T>& buffer, int layer) const {
    const std::size_t per_layer =
        block_elements() * static_cast<std::size_t>(allocator().num_blocks());
    return const_cast<T*>(buffer.data()) + static_cast<std::size_t>(layer) * per_layer;
  }
  // A view of `layer` without block tables: for its slot_offset() only.
  PagedKVView<T> layout_view(int layer) const {
    PagedKVView<T> pool;
    pool.k = layer_data(k_, layer);
    pool.v = layer_data(v_, layer);
    pool.num_blocks = allocator().num_blocks();
    pool.block_size = block_size();
    pool.num_kv_heads = num_kv_heads_;
    pool.head_dim = head_dim_;
    pool.layout = layout_;
    return pool;
  }
  // Copies block `from` into block `to` in every layer, K and V: a block is contiguous in both
  // layouts, so one copy each (the slots past the filled ones are copied too, and never read).
  void copy_block(std::int32_t from, std::int32_t to) {
    const std::size_t block = block_elements();
    for (int l = 0; l < num_layers_; ++l) {
      for (const DeviceBuffer<T>* values : {&k_, &v_}) {
        T* base = layer_data(*values, l);
        KVLAB_CUDA_CHECK(cudaMemcpyAsync(base + static_cast<std::size_t>(to) * block,
                                         base + static_cast<std::size_t>(from) * block,
                                         block * sizeof(T), cudaMemcpyDeviceToDevice, nullptr));
      }
    }
  }

  int num_layers_;
  int num_kv_heads_;
  int head_dim_;
  KVLayout layout_;
  int window_;           // 0, or the window of the pool's attention
  int sinks_;            // 0, or S < window: the first S tokens of each sequence are kept
  PagedSequences book_;  // which blocks each sequence holds; the allocator (host)
  // [num_layers, num_blocks * block_size * num_kv_heads * row units], in layout_
  DeviceBuffer<T> k_;
  DeviceBuffer<T> v_;                 // the same for V
  DeviceBuffer<std::int64_t> slots_;  // scratch for the host-slots write: [at least n]
};

}  // namespace kvlab::cuda
