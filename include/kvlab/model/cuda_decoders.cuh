/// \file
/// \brief The toy decoders of `model/` on the GPU.
///
/// `cuda::NaiveDecoder`, `cuda::CachedDecoder` and `cuda::PagedDecoder` run the same
/// `AttentionStack<float>` with weights, activations and caches in device memory (projections by
/// `cuda::linear`, attention by the kernels of `cuda/`), behind the same `Decoder<float>`
/// interface and with the same cost counters, so the naive-vs-cached gap can be measured on a GPU.
/// Checked step by step against the CPU decoders in tests/cuda. The three share one step
/// (`cuda::run_stack` and `cuda::attention_step`, the GPU twins of the CPU's `run_stack` and
/// `attention_step`) and differ only in their `cuda::KVStore`, the twin of the CPU stores: K and
/// V recomputed, or kept in a cache of any storage (fp32, fp16, bf16, int8, int4), with or
/// without a sliding window, as their CPU twins. A model-level header (it reads `model/`'s
/// `AttentionStack` and `Decoder`, and `cuda/`'s kernels); includes Eigen (host side only: the
/// `Decoder` interface takes and returns host matrices).
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
#include "kvlab/core/views.hpp"
#include "kvlab/cuda/attention_plan.hpp"
#include "kvlab/cuda/cache_kernels.cuh"
#include "kvlab/cuda/contiguous_kv_cache.cuh"
#include "kvlab/cuda/decode_attention.cuh"
#include "kvlab/cuda/device_memory.cuh"
#include "kvlab/cuda/launch.cuh"
#include "kvlab/cuda/matmul.cuh"
#include "kvlab/cuda/naive_attention.cuh"
#include "kvlab/cuda/numeric.cuh"
#include "kvlab/cuda/paged_kv_cache.cuh"
#include "kvlab/matrix.hpp"
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

/// Converts `n` floats at `x` to `S` (fp16 or bf16, `from_float`: round to nearest even) at
/// `out`, one thread per value (grid-stride loop).
template <typename S>
__global__ void convert_kernel(const float* x, std::int64_t n, S* out) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    out[i] = from_float<S>(x[i]);
}

/// The rows `x` ([rows, cols] floats) as a cache of `S` takes them (`StorageInput<S>`): `x`
/// itself for float, int8 and int4 (the cache quantizes floats), else converted into `buffer`.
template <typename S>
DeviceMatrix<StorageInput<S>> storage_rows(DeviceMatrix<float> x,
                                           DeviceBuffer<StorageInput<S>>& buffer) {
  if constexpr (std::is_same<StorageInput<S>, float>::value) {
    return x;
  } else {
    const std::int64_t n = static_cast<std::int64_t>(x.rows) * x.cols;
    buffer = DeviceBuffer<S>(static_cast<std::size_t>(n));
    launch_kernel("kvlab::cuda::detail::convert_kernel", convert_kernel<S>, dim3(write_blocks(n)),
                  dim3(kWriteThreads), 0, nullptr, x.data, n, buffer.data());
    return buffer.matrix(x.rows, x.cols);
  }
}

}  // namespace detail

/// How a GPU decoder keeps the keys and values of a step's rows and attends over them: the device
/// twin of `kvlab::KVStore`'s `append` and `attend`, for the one sequence of a decoder. It is the
/// part in which `NaiveDecoder`, `CachedDecoder` and `PagedDecoder` differ, as `RecomputeStore`,
/// `ContiguousStore` and `PagedStore` on the CPU.
class KVStore {
 public:
  virtual ~KVStore() = default;
  /// Keeps (or holds for this layer) the keys and values of every row of the step of `layer`.
  /// \param layer  the layer, in [0, num_layers)
  /// \param k      [step rows, num_kv_heads * head_dim], device memory
  /// \param v      the same shape
  virtual void append(int layer, DeviceMatrix<float> k, DeviceMatrix<float> v) = 0;
  /// Attention of `q` — the sequence's last `q.rows` tokens — over its keys, into `attn`.
  /// \param layer     the layer, in [0, num_layers)
  /// \param q         [q rows, num_heads * head_dim], device memory
  /// \param attn      the same shape
  /// \param counters  receives the attention's work
  virtual void attend(int layer, DeviceMatrix<float> q, DeviceMatrix<float> attn,
                      CostCounters& counters) = 0;
};

/// Device buffers reused from layer to layer by `cuda::attention_step` (the twin of
/// `kvlab::StepScratch`), sized for the step's rows.
struct StepScratch {
  DeviceBuffer<float> k;     ///< [rows, num_kv_heads * head_dim]
  DeviceBuffer<float> v;     ///< [rows, num_kv_heads * head_dim]
  DeviceBuffer<float> q;     ///< [rows, num_heads * head_dim]
  DeviceBuffer<float> attn;  ///< [rows, num_heads * head_dim]
};

/// One layer of a step on the device: the GPU twin of `kvlab::attention_step`, with the residual
/// added in place. `h` holds the layer's input of the step's `rows` rows ([rows, d_model]), the
/// last `new_rows` of them the new tokens.
///  1. k, v = h Wkᵀ, h Wvᵀ for every row, kept by `store` (`KVStore::append`);
///  2. q = h Wqᵀ for the rows whose outputs carry on (all of them below the top layer, the new
///     tokens at the top);
///  3. `store.attend`: those queries attend to the sequence's keys;
///  4. h = those rows + attention · Woᵀ (the residual); `rows` becomes their number.
/// Projections are counted here (`add_projection_counts`), attention by the store.
inline void attention_step(const DeviceAttentionStack& w, KVStore& store, int layer, bool top,
                           DeviceBuffer<float>& h, int& rows, int new_rows, StepScratch& scratch,
                           CostCounters& counters) {
  const AttentionShape& shape = w.shape();
  const int d_model = w.d_model();
  const int q_rows = top ? new_rows : rows;  // rows whose outputs carry on: the last q_rows
  const DeviceMatrix<const float> h_all(h.data(), rows, d_model);  // [rows, d_model]
  const DeviceMatrix<const float> h_out(h.data() + kvlab::detail::elements(rows - q_rows, d_model),
                                        q_rows, d_model);  // [q_rows, d_model]
  // 1. K and V of every row, kept.
  linear(h_all, w.wk(layer), scratch.k.matrix(rows, shape.kv_width()));
  linear(h_all, w.wv(layer), scratch.v.matrix(rows, shape.kv_width()));
  store.append(layer, scratch.k.matrix(rows, shape.kv_width()),
               scratch.v.matrix(rows, shape.kv_width()));
  // 2. and 3. Queries of the rows that carry on, attending.
  linear(h_out, w.wq(layer), scratch.q.matrix(q_rows, shape.q_width()));
  add_projection_counts(shape, d_model, static_cast<std::uint64_t>(q_rows),
                        static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(q_rows),
                        counters);
  store.attend(layer, scratch.q.matrix(q_rows, shape.q_width()),
               scratch.attn.matrix(q_rows, shape.q_width()), counters);
  // 4. The residual, on the rows that carry on.
  if (q_rows != rows) {
    DeviceBuffer<float> next(kvlab::detail::elements(q_rows, d_model));  // [q_rows, d_model]
    KVLAB_CUDA_CHECK(cudaMemcpy(next.data(), h_out.data, next.bytes(), cudaMemcpyDeviceToDevice));
    h = std::move(next);
    rows = q_rows;
  }
  linear(scratch.attn.matrix(rows, shape.q_width()), w.wo(layer), h.matrix(rows, d_model),
         /*accumulate=*/true);
}

/// One step of a decoder's stack on the device: the GPU twin of `kvlab::run_stack` for one
/// sequence, `cuda::attention_step` for each layer, written once for the three GPU decoders. `h`
/// holds the layer-0 input of every row the step computes ([rows, d_model]: the new tokens for a
/// decoder with a cache, the whole sequence for the naive one), the last `new_rows` of them new.
/// Returns the top layer's output rows, [new_rows, d_model], on the host.
inline RowMatrix<float> run_stack(const DeviceAttentionStack& w, KVStore& store,
                                  DeviceBuffer<float> h, int rows, int new_rows,
                                  CostCounters& counters) {
  const AttentionShape& shape = w.shape();
  StepScratch scratch{DeviceBuffer<float>(kvlab::detail::elements(rows, shape.kv_width())),
                      DeviceBuffer<float>(kvlab::detail::elements(rows, shape.kv_width())),
                      DeviceBuffer<float>(kvlab::detail::elements(rows, shape.q_width())),
                      DeviceBuffer<float>(kvlab::detail::elements(rows, shape.q_width()))};
  for (int l = 0; l < w.num_layers(); ++l)
    attention_step(w, store, l, l + 1 == w.num_layers(), h, rows, new_rows, scratch, counters);
  return detail::download_rows(h.data(), rows, w.d_model());  // [new_rows, d_model]
}

/// `NaiveDecoder` on the GPU (`T` = float): keeps only its inputs (in device memory) and
/// recomputes K and V of the whole prefix at every step, with `cuda::naive_attention` (the
/// score matrix materialised, masked to a `window` if it has one). The same steps and the same
/// counts as `kvlab::NaiveDecoder`.
template <typename T>
class NaiveDecoder : public Decoder<T> {
  static_assert(std::is_same<T, float>::value, "the GPU decoders run float models");

 public:
  /// A decoder running `stack`, its weights copied to the device, each query seeing its last
  /// `window` keys (0: all).
  /// \throws InvalidArgument if `stack` is null or `window` is negative; CudaError if a copy
  ///         fails.
  explicit NaiveDecoder(std::shared_ptr<const AttentionStack<float>> stack, int window = 0)
      : Decoder<T>(std::move(stack)),
        weights_(std::make_shared<const DeviceAttentionStack>(this->stack())),
        window_(window) {
    kvlab::detail::require_at_least("kvlab::cuda::NaiveDecoder", "window", window, 0);
  }

 protected:
  /// One step: `cuda::run_stack` over every token so far, K and V held for one layer.
  RowMatrix<float> forward(const RowMatrix<float>& x, CostCounters& counters) override {
    const int d_model = weights_->d_model();
    const int p = static_cast<int>(x.rows());
    const int t = this->position() + p;  // tokens after this step
    reserve(t);
    KVLAB_CUDA_CHECK(cudaMemcpy(inputs_.data() + kvlab::detail::elements(this->position(), d_model),
                                x.data(), static_cast<std::size_t>(x.size()) * sizeof(float),
                                cudaMemcpyHostToDevice));
    DeviceBuffer<float> h(kvlab::detail::elements(t, d_model));  // [t, d_model]: every input
    KVLAB_CUDA_CHECK(cudaMemcpy(h.data(), inputs_.data(), h.bytes(), cudaMemcpyDeviceToDevice));
    Recompute store(weights_->shape(), window_, workspace_);
    return run_stack(*weights_, store, std::move(h), t, p, counters);
  }

  /// Nothing to drop: the inputs past `position` are overwritten by the next step.
  void truncate(int /*position*/) override {}

 private:
  // Holds each layer's K and V of the whole sequence for its attention only.
  class Recompute : public KVStore {
   public:
    Recompute(const AttentionShape& shape, int window, Workspace& workspace)
        : shape_(shape), window_(window), workspace_(workspace) {}
    void append(int, DeviceMatrix<float> k, DeviceMatrix<float> v) override {
      k_ = k;
      v_ = v;
    }
    void attend(int, DeviceMatrix<float> q, DeviceMatrix<float> attn,
                CostCounters& counters) override {
      LaunchOptions options;
      options.workspace = &workspace_;
      naive_attention<float>(shape_, q, k_, v_, attn, &counters, window_, options);
    }

   private:
    const AttentionShape& shape_;
    int window_;  // W >= 1: each query sees its last W keys; 0: all
    Workspace& workspace_;
    DeviceMatrix<float> k_, v_;  // [t, kv_width]: this layer's keys and values
  };

  // Room for `rows` input rows, keeping the rows already fed.
  void reserve(int rows) {
    const std::size_t needed = kvlab::detail::elements(rows, weights_->d_model());
    if (needed <= inputs_.size()) return;
    DeviceBuffer<float> bigger(needed > 2 * inputs_.size() ? needed : 2 * inputs_.size());
    if (this->position() > 0) {
      KVLAB_CUDA_CHECK(
          cudaMemcpy(bigger.data(), inputs_.data(),
                     kvlab::detail::elements(this->position(), weights_->d_model()) * sizeof(float),
                     cudaMemcpyDeviceToDevice));
    }
    inputs_ = std::move(bigger);
  }

  std::shared_ptr<const DeviceAttentionStack> weights_;
  int window_;                  // W >= 1: each query sees its last W keys; 0: all
  DeviceBuffer<float> inputs_;  // [rows reserved, d_model]: every token fed so far, then room
  Workspace workspace_;         // the score matrices
};

/// `CachedDecoder` on the GPU (`T` = float): keeps K and V of every past token in a
/// `cuda::ContiguousKVCache`; each step projects q, k, v of the new tokens only, appends k and
/// v, and runs `cuda::decode_attention`. The same steps and counts as `kvlab::CachedDecoder`
/// (for a prefill of p > 1 tokens, `kv_bytes_read` counts what the GPU kernel reads: K/V once
/// per query row). `S` is the device storage (float, `__half`, `__nv_bfloat16`, `BlockQ8_0`,
/// `BlockQ4_0`: the twin of `kvlab::CachedDecoder<float, S>` with `Eigen::half`,
/// `Eigen::bfloat16` or the same blocks), and a `window` keeps the last W keys in a ring, as there.
template <typename T, typename S = float>
class CachedDecoder : public Decoder<T> {
  static_assert(std::is_same<T, float>::value, "the GPU decoders run float models");

 public:
  /// A decoder running `stack` with device room for `capacity` tokens, or with a sliding window
  /// of `window` keys a ring of `capacity` slots.
  /// \throws InvalidArgument if `capacity < 1` or the window or head_dim does not suit the cache
  ///         (`cuda::ContiguousKVCache`); CudaError if an allocation or copy fails.
  CachedDecoder(std::shared_ptr<const AttentionStack<float>> stack, int capacity, int window = 0)
      : Decoder<T>(std::move(stack)),
        weights_(std::make_shared<const DeviceAttentionStack>(this->stack())),
        cache_(this->stack().num_layers(), this->stack().shape().num_kv_heads(),
               this->stack().shape().head_dim(), capacity, window) {}

  /// The cache in device memory (read-only).
  const ContiguousKVCache<S>& cache() const { return cache_; }

 protected:
  /// One step: `cuda::run_stack` over the new tokens, K and V appended to the cache.
  RowMatrix<float> forward(const RowMatrix<float>& x, CostCounters& counters) override {
    const int p = static_cast<int>(x.rows());
    // the cache's own check, as the CPU decoder's store makes it, before any layer is touched
    kvlab::detail::check_contiguous_append("kvlab::Decoder::prefill", "new tokens of sequence 0", p,
                                           cache_.capacity(), cache_.window(), this->position());
    Contiguous store(weights_->shape(), cache_, workspace_);
    try {
      return run_stack(*weights_, store, detail::upload_rows(x), p, p, counters);
    } catch (...) {
      cache_.truncate(this->position());  // undo the appends of this step
      throw;
    }
  }

  /// Drops the cached rows at `position` and after.
  void truncate(int position) override { cache_.truncate(position); }

 private:
  // Appends each layer's k and v to the cache and attends with decode_attention.
  class Contiguous : public KVStore {
   public:
    Contiguous(const AttentionShape& shape, ContiguousKVCache<S>& cache, Workspace& workspace)
        : shape_(shape), cache_(cache), workspace_(workspace) {}
    void append(int layer, DeviceMatrix<float> k, DeviceMatrix<float> v) override {
      DeviceBuffer<StorageInput<S>> k_rows, v_rows;  // fp16 / bf16 copies (unused otherwise)
      cache_.append(layer, detail::storage_rows<S>(k, k_rows), detail::storage_rows<S>(v, v_rows));
    }
    void attend(int layer, DeviceMatrix<float> q, DeviceMatrix<float> attn,
                CostCounters& counters) override {
      LaunchOptions options;
      options.workspace = &workspace_;
      decode_attention<float>(shape_, q, cache_.view(layer), attn, &counters, options);
    }

   private:
    const AttentionShape& shape_;
    ContiguousKVCache<S>& cache_;
    Workspace& workspace_;
  };

  std::shared_ptr<const DeviceAttentionStack> weights_;
  ContiguousKVCache<S> cache_;
  Workspace workspace_;  // split-K partial results
};

/// `PagedDecoder` on the GPU (`T` = float): keeps K and V of its tokens in the blocks of a
/// `cuda::PagedKVCache` (possibly shared with other decoders); each step makes room
/// (`reserve`), then per layer writes k and v to the new slots and runs
/// `cuda::paged_prefill_attention` through the sequence's block table. The same steps and counts
/// as `kvlab::PagedDecoder` (for p > 1, `kv_bytes_read` as `cuda::CachedDecoder`). `S` as for
/// `cuda::CachedDecoder`; with a `window`, the blocks wholly before it go back to the pool after
/// each step, as `kvlab::PagedDecoder`'s do.
template <typename T, typename S = float>
class PagedDecoder : public Decoder<T> {
  static_assert(std::is_same<T, float>::value, "the GPU decoders run float models");

 public:
  /// A decoder with a device pool of its own: `num_blocks` blocks of `block_size` tokens, each
  /// query seeing its last `window` keys (0: all).
  /// \throws InvalidArgument if `block_size` or `num_blocks` is below 1, or the window or
  ///         head_dim does not suit the pool (`cuda::PagedKVCache`); CudaError if an allocation
  ///         or copy fails.
  PagedDecoder(std::shared_ptr<const AttentionStack<float>> stack, int block_size, int num_blocks,
               KVLayout layout = KVLayout::NHD, int window = 0)
      : Decoder<T>(std::move(stack)),
        weights_(std::make_shared<const DeviceAttentionStack>(this->stack())),
        pool_(std::make_shared<PagedKVCache<S>>(
            this->stack().num_layers(), this->stack().shape().num_kv_heads(),
            this->stack().shape().head_dim(), block_size, num_blocks, layout, window)),
        seq_(pool_->add_sequence()) {}

  /// A decoder that adds its sequence to `pool`, shared with other decoders of the same stack.
  /// \throws InvalidArgument if `pool` is null or its layers, K/V heads or head_dim differ from
  ///         the stack's; CudaError if a copy fails.
  PagedDecoder(std::shared_ptr<const AttentionStack<float>> stack,
               std::shared_ptr<PagedKVCache<S>> pool)
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
  const PagedKVCache<S>& cache() const { return *pool_; }
  /// This decoder's sequence id in `cache()`.
  int sequence() const { return seq_; }

 protected:
  /// One step: room for the new tokens, then `cuda::run_stack` over them, K and V written
  /// into their slots.
  RowMatrix<float> forward(const RowMatrix<float>& x, CostCounters& counters) override {
    const int p = static_cast<int>(x.rows());
    // Room for the p new tokens (throws OutOfBlocks, changing nothing, if the pool is dry).
    const std::vector<std::int64_t> slots = pool_->reserve(seq_, p);  // [p]
    try {
      Paged store(weights_->shape(), *pool_, slots, DeviceBlockTables(pool_->tables({seq_})), p,
                  workspace_);
      RowMatrix<float> out = run_stack(*weights_, store, detail::upload_rows(x), p, p, counters);
      pool_->release_out_of_window(seq_);  // with a window: the blocks before it go back
      return out;
    } catch (...) {
      pool_->truncate(seq_, this->position());  // give back the slots
      throw;
    }
  }

  /// Drops the tokens at `position` and after from this decoder's sequence.
  void truncate(int position) override { pool_->truncate(seq_, position); }

 private:
  // Writes each layer's k and v into the step's slots and attends through the block table.
  class Paged : public KVStore {
   public:
    Paged(const AttentionShape& shape, PagedKVCache<S>& pool,
          const std::vector<std::int64_t>& slots, DeviceBlockTables tables, int new_rows,
          Workspace& workspace)
        : shape_(shape),
          pool_(pool),
          slots_(slots),
          tables_(std::move(tables)),
          qo_indptr_(std::vector<std::int32_t>{0, new_rows}),
          workspace_(workspace) {}
    void append(int layer, DeviceMatrix<float> k, DeviceMatrix<float> v) override {
      DeviceBuffer<StorageInput<S>> k_rows, v_rows;  // fp16 / bf16 copies (unused otherwise)
      pool_.write(layer, slots_, detail::storage_rows<S>(k, k_rows),
                  detail::storage_rows<S>(v, v_rows));
    }
    void attend(int layer, DeviceMatrix<float> q, DeviceMatrix<float> attn,
                CostCounters& counters) override {
      LaunchOptions options;
      options.workspace = &workspace_;
      paged_prefill_attention<float>(shape_, q, qo_indptr_.data(), pool_.view(layer, tables_), attn,
                                     nullptr, options);
      // Counted on the host (the device tables would have to be copied back).
      const int len = tables_.host().seq_len(0);
      count_attention(shape_, storage_row_bytes<S>(shape_.head_dim()),
                      visible_keys(len - q.rows, q.rows, pool_.window()), counters);
    }

   private:
    const AttentionShape& shape_;
    PagedKVCache<S>& pool_;
    const std::vector<std::int64_t>& slots_;  // [new rows]: this step's slots
    DeviceBlockTables tables_;                // the sequence's block table, on the device
    DeviceBuffer<std::int32_t> qo_indptr_;    // [2]: all queries are this sequence's
    Workspace& workspace_;
  };

  // The fork: same weights, same pool, sequence `seq` (already forked in the pool).
  PagedDecoder(const PagedDecoder& parent, int seq)
      : Decoder<T>(parent.stack_pointer()),
        weights_(parent.weights_),
        pool_(parent.pool_),
        seq_(seq) {
    this->continue_from(parent);
  }

  static std::shared_ptr<PagedKVCache<S>> checked(std::shared_ptr<PagedKVCache<S>> pool,
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
  std::shared_ptr<PagedKVCache<S>> pool_;
  int seq_;              // this decoder's sequence in pool_
  Workspace workspace_;  // split-K partial results
};

}  // namespace kvlab::cuda
