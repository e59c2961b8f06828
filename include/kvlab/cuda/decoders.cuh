/// \file
/// \brief The decoders of `model/` with a CUDA backend: `cuda::NaiveDecoder`,
/// `cuda::CachedDecoder` and `cuda::PagedDecoder` run the same `AttentionStack<float>` with
/// weights, activations and caches in device memory (projections by `linear`, attention by the
/// kernels of this folder), behind the same `Decoder<float>` interface and with the same cost
/// counters, so the naive-vs-cached gap can be measured on a GPU. Checked step by step against
/// the CPU decoders in tests/cuda. Includes Eigen (host side only: the `Decoder` interface takes
/// and returns host matrices).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/paged_view.hpp"
#include "kvlab/cpu/types.hpp"
#include "kvlab/cuda/attention_plan.hpp"
#include "kvlab/cuda/decode_attention.cuh"
#include "kvlab/cuda/device_memory.cuh"
#include "kvlab/cuda/kv_cache.cuh"
#include "kvlab/cuda/matmul.cuh"
#include "kvlab/cuda/naive_attention.cuh"
#include "kvlab/model/attention_layer.hpp"
#include "kvlab/model/decoder.hpp"

namespace kvlab::cuda {

/// The weights of an `AttentionStack<float>` copied to device memory, layer by layer, in the
/// same `[out, in]` layout.
class DeviceAttentionStack {
 public:
  /// The device weights of one layer.
  struct Layer {
    DeviceBuffer<float> wq;  ///< [num_heads * head_dim, d_model]
    DeviceBuffer<float> wk;  ///< [num_kv_heads * head_dim, d_model]
    DeviceBuffer<float> wv;  ///< [num_kv_heads * head_dim, d_model]
    DeviceBuffer<float> wo;  ///< [d_model, num_heads * head_dim]
  };

  /// Copies every layer of `stack` to the device.
  /// \throws CudaError if an allocation or copy fails.
  explicit DeviceAttentionStack(const AttentionStack<float>& stack)
      : shape_(stack.shape()), d_model_(stack.d_model()) {
    for (int l = 0; l < stack.num_layers(); ++l) {
      const AttentionLayer<float>& layer = stack.layer(l);
      layers_.push_back(
          Layer{upload(layer.wq()), upload(layer.wk()), upload(layer.wv()), upload(layer.wo())});
    }
  }

  /// Number of layers.
  int num_layers() const { return static_cast<int>(layers_.size()); }
  /// The head layout of every layer.
  const AttentionShape& shape() const { return shape_; }
  /// Width of every layer's input and output.
  int d_model() const { return d_model_; }
  /// Layer `l` (unchecked: `l` in [0, num_layers())).
  const Layer& layer(int l) const { return layers_[static_cast<std::size_t>(l)]; }

  /// Query weights of layer `l`, [num_heads * head_dim, d_model].
  DeviceMatrix<const float> wq(int l) const {
    return layer(l).wq.matrix(shape_.q_width(), d_model_);
  }
  /// Key weights of layer `l`, [num_kv_heads * head_dim, d_model].
  DeviceMatrix<const float> wk(int l) const {
    return layer(l).wk.matrix(shape_.kv_width(), d_model_);
  }
  /// Value weights of layer `l`, [num_kv_heads * head_dim, d_model].
  DeviceMatrix<const float> wv(int l) const {
    return layer(l).wv.matrix(shape_.kv_width(), d_model_);
  }
  /// Output weights of layer `l`, [d_model, num_heads * head_dim].
  DeviceMatrix<const float> wo(int l) const {
    return layer(l).wo.matrix(d_model_, shape_.q_width());
  }

 private:
  static DeviceBuffer<float> upload(const RowMatrix<float>& w) {
    return DeviceBuffer<float>(w.data(), static_cast<std::size_t>(w.size()));
  }

  AttentionShape shape_;
  int d_model_;
  std::vector<Layer> layers_;
};

namespace detail {

/// Adds the counts of the projections, as `AttentionLayer` counts them: `q_rows` query rows,
/// `kv_rows` key/value rows and `out_rows` output rows of one layer.
inline void count_projections(const AttentionShape& shape, int d_model, std::uint64_t q_rows,
                              std::uint64_t kv_rows, std::uint64_t out_rows,
                              CostCounters& counters) {
  const auto d = static_cast<std::uint64_t>(d_model);
  counters.q_projections += q_rows * static_cast<std::uint64_t>(shape.num_heads());
  counters.kv_projections += kv_rows * static_cast<std::uint64_t>(shape.num_kv_heads());
  counters.macs += q_rows * d * static_cast<std::uint64_t>(shape.q_width()) +
                   2 * kv_rows * d * static_cast<std::uint64_t>(shape.kv_width()) +
                   out_rows * d * static_cast<std::uint64_t>(shape.q_width());
}

/// A device copy of the host tokens `x` ([p, d_model]).
inline DeviceBuffer<float> upload_rows(const RowMatrix<float>& x) {
  return DeviceBuffer<float>(x.data(), static_cast<std::size_t>(x.size()));
}

/// `rows` rows of `cols` floats at device pointer `data`, copied to the host.
inline RowMatrix<float> download_rows(const float* data, int rows, int cols) {
  RowMatrix<float> out(rows, cols);
  if (out.size() > 0) {
    KVLAB_CUDA_CHECK(cudaMemcpy(out.data(), data,
                                static_cast<std::size_t>(out.size()) * sizeof(float),
                                cudaMemcpyDeviceToHost));
  }
  return out;
}

/// One step of a decoder with a cache, on the device, for the p new tokens `x` ([p, d_model]):
/// per layer, q, k, v of the new tokens only (counted), then `attend(l, k, v, q, attn)` keeps k
/// and v in the cache and writes the new queries' attention to `attn` (each [p, width] device
/// matrices), then the output projection is added to the residual. Returns the top layer's
/// output rows, [p, d_model], on the host. Shared by `CachedDecoder` and `PagedDecoder`, which
/// differ only in `attend`.
template <typename Attend>
RowMatrix<float> cached_forward(const DeviceAttentionStack& w, const RowMatrix<float>& x,
                                CostCounters& counters, Attend&& attend) {
  const AttentionShape& shape = w.shape();
  const int d_model = w.d_model();
  const int p = static_cast<int>(x.rows());
  const auto n = static_cast<std::uint64_t>(p);
  DeviceBuffer<float> h = upload_rows(x);  // [p, d_model]
  // [p, num_kv_heads * head_dim]
  DeviceBuffer<float> k(static_cast<std::size_t>(p) * shape.kv_width());
  DeviceBuffer<float> v(k.size());
  // [p, num_heads * head_dim]
  DeviceBuffer<float> q(static_cast<std::size_t>(p) * shape.q_width());
  DeviceBuffer<float> attn(q.size());
  for (int l = 0; l < w.num_layers(); ++l) {
    const DeviceMatrix<const float> h_in = h.matrix(p, d_model);
    // 1. q, k, v of the new tokens only.
    linear(h_in, w.wk(l), k.matrix(p, shape.kv_width()));
    linear(h_in, w.wv(l), v.matrix(p, shape.kv_width()));
    linear(h_in, w.wq(l), q.matrix(p, shape.q_width()));
    count_projections(shape, d_model, n, n, n, counters);
    // 2. and 3. Keep k and v; the new queries attend to every token, themselves included.
    attend(l, k.matrix(p, shape.kv_width()), v.matrix(p, shape.kv_width()),
           q.matrix(p, shape.q_width()), attn.matrix(p, shape.q_width()));
    linear(attn.matrix(p, shape.q_width()), w.wo(l), h.matrix(p, d_model), /*accumulate=*/true);
  }
  return download_rows(h.data(), p, d_model);  // [p, d_model]
}

}  // namespace detail

/// `NaiveDecoder` on the GPU (`T` = float): keeps only its inputs (in device memory) and recomputes
/// K and V of the whole prefix at every step, with `cuda::naive_attention` (the score matrix
/// materialised). The same steps and the same counts as `kvlab::NaiveDecoder`.
template <typename T>
class NaiveDecoder : public Decoder<T> {
  static_assert(std::is_same<T, float>::value, "the GPU decoders run float models");

 public:
  /// A decoder running `stack`, its weights copied to the device.
  /// \throws InvalidArgument if `stack` is null; CudaError if a copy fails.
  explicit NaiveDecoder(std::shared_ptr<const AttentionStack<float>> stack)
      : Decoder<T>(std::move(stack)),
        weights_(std::make_shared<const DeviceAttentionStack>(this->stack())) {}

 protected:
  /// One step: see `kvlab::NaiveDecoder` (the same three steps per layer, on the device).
  RowMatrix<float> forward(const RowMatrix<float>& x, CostCounters& counters) override {
    const DeviceAttentionStack& w = *weights_;
    const AttentionShape& shape = w.shape();
    const int d_model = w.d_model();
    const int p = static_cast<int>(x.rows());
    const int t = this->position() + p;  // tokens after this step
    reserve(t);
    KVLAB_CUDA_CHECK(
        cudaMemcpy(inputs_.data() + static_cast<std::size_t>(this->position()) * d_model, x.data(),
                   static_cast<std::size_t>(x.size()) * sizeof(float), cudaMemcpyHostToDevice));
    // [rows, d_model]: the current layer's input
    DeviceBuffer<float> h(static_cast<std::size_t>(t) * d_model);
    KVLAB_CUDA_CHECK(cudaMemcpy(h.data(), inputs_.data(), h.bytes(), cudaMemcpyDeviceToDevice));
    // [t, num_kv_heads * head_dim]
    DeviceBuffer<float> k(static_cast<std::size_t>(t) * shape.kv_width());
    DeviceBuffer<float> v(k.size());
    // [rows, num_heads * head_dim]
    DeviceBuffer<float> q(static_cast<std::size_t>(t) * shape.q_width());
    DeviceBuffer<float> attn(q.size());
    int h_rows = t;
    LaunchOptions options;
    options.workspace = &workspace_;
    for (int l = 0; l < w.num_layers(); ++l) {
      const bool top = l + 1 == w.num_layers();
      const int rows = top ? p : t;  // positions whose output is needed
      const DeviceMatrix<const float> h_all(h.data(), h_rows, d_model);  // [t, d_model]
      const DeviceMatrix<const float> h_out(
          h.data() + static_cast<std::size_t>(h_rows - rows) * d_model, rows,
          d_model);  // [rows, d_model]: the last rows
      // 1. K and V of the whole prefix, again.
      linear(h_all, w.wk(l), k.matrix(t, shape.kv_width()));
      linear(h_all, w.wv(l), v.matrix(t, shape.kv_width()));
      // 2. Queries of the positions that need an output.
      linear(h_out, w.wq(l), q.matrix(rows, shape.q_width()));
      detail::count_projections(shape, d_model, static_cast<std::uint64_t>(rows),
                                static_cast<std::uint64_t>(t), static_cast<std::uint64_t>(rows),
                                counters);
      // 3. Attention over the whole prefix (scores materialised), then the output projection
      //    added to the residual.
      naive_attention<float>(shape, q.matrix(rows, shape.q_width()), k.matrix(t, shape.kv_width()),
                             v.matrix(t, shape.kv_width()), attn.matrix(rows, shape.q_width()),
                             &counters, options);
      DeviceBuffer<float> next(static_cast<std::size_t>(rows) * d_model);  // [rows, d_model]
      KVLAB_CUDA_CHECK(cudaMemcpy(next.data(), h_out.data, next.bytes(), cudaMemcpyDeviceToDevice));
      linear(attn.matrix(rows, shape.q_width()), w.wo(l), next.matrix(rows, d_model),
             /*accumulate=*/true);
      h = std::move(next);
      h_rows = rows;
    }
    return detail::download_rows(h.data(), p, d_model);  // [p, d_model]
  }

  /// Nothing to drop: the inputs past `position` are overwritten by the next step.
  void truncate(int /*position*/) override {}

 private:
  // Room for `rows` input rows, keeping the rows already fed.
  void reserve(int rows) {
    const std::size_t needed =
        static_cast<std::size_t>(rows) * static_cast<std::size_t>(weights_->d_model());
    if (needed <= inputs_.size()) return;
    DeviceBuffer<float> bigger(needed > 2 * inputs_.size() ? needed : 2 * inputs_.size());
    if (this->position() > 0) {
      KVLAB_CUDA_CHECK(cudaMemcpy(
          bigger.data(), inputs_.data(),
          static_cast<std::size_t>(this->position()) * weights_->d_model() * sizeof(float),
          cudaMemcpyDeviceToDevice));
    }
    inputs_ = std::move(bigger);
  }

  std::shared_ptr<const DeviceAttentionStack> weights_;
  DeviceBuffer<float> inputs_;  // [rows reserved, d_model]: every token fed so far, then room
  Workspace workspace_;         // the score matrices
};

/// `CachedDecoder` on the GPU (`T` = float): keeps K and V of every past token in a
/// `cuda::ContiguousKVCache`; each step projects q, k, v of the new tokens only, appends k and
/// v, and runs `cuda::decode_attention`. The same steps and counts as `kvlab::CachedDecoder`
/// (for a prefill of p > 1 tokens, `kv_bytes_read` counts what the GPU kernel reads: K/V once
/// per query row).
template <typename T>
class CachedDecoder : public Decoder<T> {
  static_assert(std::is_same<T, float>::value, "the GPU decoders run float models");

 public:
  /// A decoder running `stack` with device room for `capacity` tokens.
  /// \throws InvalidArgument if `capacity < 1`; CudaError if an allocation or copy fails.
  CachedDecoder(std::shared_ptr<const AttentionStack<float>> stack, int capacity)
      : Decoder<T>(std::move(stack)),
        weights_(std::make_shared<const DeviceAttentionStack>(this->stack())),
        cache_(this->stack().num_layers(), this->stack().shape().num_kv_heads(),
               this->stack().shape().head_dim(), capacity) {}

  /// The cache in device memory (read-only).
  const ContiguousKVCache<float>& cache() const { return cache_; }

 protected:
  /// One step: see `kvlab::CachedDecoder` (the same three steps per layer, on the device).
  RowMatrix<float> forward(const RowMatrix<float>& x, CostCounters& counters) override {
    const DeviceAttentionStack& w = *weights_;
    const AttentionShape& shape = w.shape();
    const int p = static_cast<int>(x.rows());
    if (p > cache_.capacity() - this->position()) {  // checked before any layer is touched
      kvlab::detail::fail<CapacityError>("kvlab::cuda::CachedDecoder::forward", "x.rows()",
                                         "at most " +
                                             std::to_string(cache_.capacity() - this->position()) +
                                             " (capacity " + std::to_string(cache_.capacity()) +
                                             ", position " + std::to_string(this->position()) + ")",
                                         p);
    }
    LaunchOptions options;
    options.workspace = &workspace_;
    try {
      return detail::cached_forward(w, x, counters,
                                    [&](int l, DeviceMatrix<float> k, DeviceMatrix<float> v,
                                        DeviceMatrix<float> q, DeviceMatrix<float> attn) {
                                      // 2. Keep k and v for every later step.
                                      cache_.append(l, k, v);
                                      // 3. The new queries attend to everything cached.
                                      decode_attention<float>(shape, q, cache_.view(l), attn,
                                                              &counters, options);
                                    });
    } catch (...) {
      cache_.truncate(this->position());  // undo the appends of this step
      throw;
    }
  }

  /// Drops the cached rows at `position` and after.
  void truncate(int position) override { cache_.truncate(position); }

 private:
  std::shared_ptr<const DeviceAttentionStack> weights_;
  ContiguousKVCache<float> cache_;
  Workspace workspace_;  // split-K partial results
};

/// `PagedDecoder` on the GPU (`T` = float): keeps K and V of its tokens in the blocks of a
/// `cuda::PagedKVCache` (possibly shared with other decoders); each step makes room
/// (`append`), then per layer writes k and v to the new slots and runs
/// `cuda::paged_prefill_attention` through the sequence's block table. The same steps and counts
/// as `kvlab::PagedDecoder` (for p > 1, `kv_bytes_read` as `cuda::CachedDecoder`).
template <typename T>
class PagedDecoder : public Decoder<T> {
  static_assert(std::is_same<T, float>::value, "the GPU decoders run float models");

 public:
  /// A decoder with a device pool of its own: `num_blocks` blocks of `block_size` tokens.
  /// \throws InvalidArgument if `block_size` or `num_blocks` is below 1; CudaError if an
  ///         allocation or copy fails.
  PagedDecoder(std::shared_ptr<const AttentionStack<float>> stack, int block_size, int num_blocks,
               KVLayout layout = KVLayout::NHD)
      : Decoder<T>(std::move(stack)),
        weights_(std::make_shared<const DeviceAttentionStack>(this->stack())),
        pool_(std::make_shared<PagedKVCache<float>>(
            this->stack().num_layers(), this->stack().shape().num_kv_heads(),
            this->stack().shape().head_dim(), block_size, num_blocks, layout)),
        seq_(pool_->add_sequence()) {}

  /// A decoder that adds its sequence to `pool`, shared with other decoders of the same stack.
  /// \throws InvalidArgument if `pool` is null or its layers, K/V heads or head_dim differ from
  ///         the stack's; CudaError if a copy fails.
  PagedDecoder(std::shared_ptr<const AttentionStack<float>> stack,
               std::shared_ptr<PagedKVCache<float>> pool)
      : Decoder<T>(std::move(stack)),
        weights_(std::make_shared<const DeviceAttentionStack>(this->stack())),
        pool_(checked(std::move(pool), this->stack())),
        seq_(pool_->add_sequence()) {}

  /// Frees this decoder's blocks (those no fork still holds).
  ~PagedDecoder() override { pool_->free_sequence(seq_); }

  /// A new decoder at the same position that shares every block (copy on write), as
  /// `kvlab::PagedDecoder::fork`. Counters start at zero.
  std::unique_ptr<PagedDecoder> fork() const {
    return std::unique_ptr<PagedDecoder>(new PagedDecoder(*this, pool_->fork(seq_)));
  }

  /// The device pool (read-only).
  const PagedKVCache<float>& cache() const { return *pool_; }
  /// This decoder's sequence id in `cache()`.
  int sequence() const { return seq_; }

 protected:
  /// One step: see `kvlab::PagedDecoder` (the same steps, on the device).
  RowMatrix<float> forward(const RowMatrix<float>& x, CostCounters& counters) override {
    const DeviceAttentionStack& w = *weights_;
    const AttentionShape& shape = w.shape();
    const int p = static_cast<int>(x.rows());
    // 0. Room for the p new tokens (throws OutOfBlocks, changing nothing, if the pool is dry).
    const std::vector<std::int64_t> slots = pool_->append(seq_, p);  // [p]
    try {
      const DeviceBlockTables tables(pool_->tables({seq_}));  // the same blocks in every layer
      // [2]: all p queries are ours
      const DeviceBuffer<std::int32_t> qo_indptr(std::vector<std::int32_t>{0, p});
      const auto len = static_cast<std::uint64_t>(pool_->length(seq_));
      const auto n = static_cast<std::uint64_t>(p);
      LaunchOptions options;
      options.workspace = &workspace_;
      return detail::cached_forward(
          w, x, counters,
          [&](int l, DeviceMatrix<float> k, DeviceMatrix<float> v, DeviceMatrix<float> q,
              DeviceMatrix<float> attn) {
            // 2. Keep k and v in the sequence's blocks.
            pool_->write(l, slots, k, v);
            // 3. The new queries attend through the block table to every token.
            paged_prefill_attention<float>(shape, q, qo_indptr.data(), pool_->view(l, tables), attn,
                                           nullptr, options);
            count_attention(shape, sizeof(float), n * (len - n) + n * (n + 1) / 2, counters);
          });
    } catch (...) {
      pool_->truncate(seq_, this->position());  // undo step 0
      throw;
    }
  }

  /// Drops the tokens at `position` and after from this decoder's sequence.
  void truncate(int position) override { pool_->truncate(seq_, position); }

 private:
  // The fork: same weights, same pool, sequence `seq` (already forked in the pool).
  PagedDecoder(const PagedDecoder& parent, int seq)
      : Decoder<T>(parent.stack_pointer()),
        weights_(parent.weights_),
        pool_(parent.pool_),
        seq_(seq) {
    this->continue_from(parent);
  }

  static std::shared_ptr<PagedKVCache<float>> checked(std::shared_ptr<PagedKVCache<float>> pool,
                                                      const AttentionStack<float>& stack) {
    constexpr const char* kWhere = "kvlab::cuda::PagedDecoder";
    if (!pool) kvlab::detail::fail(kWhere, "pool", "a non-null pool", "nullptr");
    kvlab::detail::require_equal(kWhere, "pool->num_layers()", pool->num_layers(),
                                 stack.num_layers(), "stack's num_layers");
    kvlab::detail::require_equal(kWhere, "pool->num_kv_heads()", pool->num_kv_heads(),
                                 stack.shape().num_kv_heads(), "stack's num_kv_heads");
    kvlab::detail::require_equal(kWhere, "pool->head_dim()", pool->head_dim(),
                                 stack.shape().head_dim(), "stack's head_dim");
    return pool;
  }

  std::shared_ptr<const DeviceAttentionStack> weights_;
  std::shared_ptr<PagedKVCache<float>> pool_;
  int seq_;              // this decoder's sequence in pool_
  Workspace workspace_;  // split-K partial results
};

}  // namespace kvlab::cuda
