/// \file
/// \brief Decode attention on the GPU, over a contiguous KV cache or a paged pool.
///
/// New queries attend to a contiguous KV cache (`decode_attention`) or, for a ragged batch in one
/// launch, to a paged pool through block tables (`paged_decode_attention`,
/// `paged_prefill_attention`), with split-K ("flash-decoding") for long contexts. The kernels read
/// fp32, fp16 and bf16 storage, and int8/int4 caches (q8_0/q4_0 blocks, decoded in registers as
/// they are read, with fp32 queries); the arithmetic is fp32; GQA runs without copying K/V. Checked
/// per element against the `cpu::` functions of the same names in tests/cuda.
///
/// One kernel serves all three: `detail::attention_kernel`, thin by design — the index and merge
/// arithmetic it calls is in `attention_plan.hpp` and `core/softmax_state.hpp`, checked on the
/// CPU by tests/core/test_softmax_state.cpp and tests/cuda/test_attention_plan.cpp.
///
/// \par Measured
/// `bench/results/h100-cuda.md` and `bench/results/h200-cuda.md` (indexed in
/// `bench/results/README.md`): bench_cuda_decode's bandwidth per batch and context against
/// PyTorch's `scaled_dot_product_attention`, `kRowsInFlight` 8 against 4, and the kernels'
/// registers (`sm90-kernel-resources.md`).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/paged_view.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/core/softmax_state.hpp"
#include "kvlab/core/views.hpp"
#include "kvlab/cuda/attention_plan.hpp"
#include "kvlab/cuda/device_memory.cuh"
#include "kvlab/cuda/error.cuh"
#include "kvlab/cuda/launch.cuh"
#include "kvlab/cuda/numeric.cuh"

namespace kvlab::cuda {
namespace detail {

/// K/V rows each group of threads loads before it uses any of them (memory-level parallelism):
/// more rows in flight hide more of the memory's latency, for a few more registers per thread.
constexpr int kRowsInFlight = 8;

/// The element type `S` of a cache view (`ContiguousKVView<S>`, `PagedKVView<S>`).
template <typename Cache>
struct CacheElement;
/// A contiguous cache of `S`.
template <typename S>
struct CacheElement<ContiguousKVView<S>> {
  using type = S;  ///< the stored element
};
/// A paged pool of `S`.
template <typename S>
struct CacheElement<PagedKVView<S>> {
  using type = S;  ///< the stored element
};

/// Everything one launch of `attention_kernel` needs, passed by value.
template <typename T, typename Cache>
struct AttentionArgs {
  const T* q;  ///< [rows, num_heads * head_dim]
  T* out;      ///< [rows, num_heads * head_dim]
  /// `ContiguousKVView<S>` or `PagedKVView<S>`, device pointers; S is T, or any storage with
  /// float queries (`is_cache_pairing`)
  Cache cache;
  const std::int32_t* qo_indptr;       ///< [batch + 1]: ragged prefill rows (paged only), else null
  int rows;                            ///< query rows
  int num_heads;                       ///< query heads
  int head_dim;                        ///< values per head, a multiple of 8 up to 256
  int group_size;                      ///< query heads per K/V head
  int group_tiles;                     ///< blocks per K/V head and row
  int lanes;                           ///< threads per K/V row
  int partitions;                      ///< split-K partitions per row at most
  int unit;                            ///< partition sizes are multiples of this
  int block_size;                      ///< tokens per block of a paged pool, 1 if contiguous
  float scale;                         ///< score scale
  float* partial_acc;                  ///< [rows, num_heads, partitions, head_dim] (split-K only)
  SoftmaxState<float>* partial_state;  ///< [rows, num_heads, partitions] (split-K only)
};

/// Sum of `x` over the aligned group of `lanes` threads (a power of two dividing 32) that
/// holds this thread; every thread of the warp must call it.
__device__ inline float lane_group_sum(float x, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset /= 2)
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
/// Maximum of `x` over the warp.
__device__ inline float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
/// Sum of `x` over the warp.
__device__ inline float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

/// The attention kernel: one block per (query row, K/V head and tile of up to `kGroupTile` of
/// its query heads, split-K partition); `kAttentionThreads` (128) threads.
///
/// Thread mapping: `lanes` consecutive threads (a power of two, `lanes_per_row(head_dim)`)
/// share one K/V row, thread `i` of them holding values [8 i, 8 i + 8) in registers, so a warp
/// reads 32 / lanes rows at once and the block 128 / lanes ("key slots"). Each thread keeps its
/// 8 values of every served query head (registers `q`) and of every head's running output
/// (registers `acc`). A block serves one query row, so the keys it sees are one range: [first
/// visible key, own position] (`locate_row`; the band of a sliding window), with attention sinks
/// preceded by the sinks as virtual keys (`QueryRow::key_position`), cut into split-K partitions
/// from the block that holds its first key (`row_partition_keys`). The block walks its
/// partition's keys in tiles of `kKeyTile`:
///  0. translate: each key's position to the offset of its row (`row_offset`: through the
///     block table for a paged cache), into shared memory — one table read per key and block;
///  1. scores: each key slot loads key rows (`kRowsInFlight` at a time), each thread multiplies
///     its 8 values with each query head's, and the `lanes` threads sum their parts with
///     shuffles; scale · q·k goes to shared memory;
///  2. softmax of the tile: one warp per query head finds the tile's max and Σ exp(s − max)
///     (replacing the scores by exp(s − max)), and merges that state into the head's running
///     state with `merge_softmax_scales`, whose two factors are kept in shared memory;
///  3. values: every thread rescales its accumulators by the first factor, and adds each value
///     row of its key slot with weight exp(s − max) times the second.
/// At the end the accumulators of the key slots are summed (shuffles within a warp, shared
/// memory across warps) and either divided by the running sum and written to `out` (the row
/// has one partition) or written with the running state to the split-K workspace, for
/// `merge_partitions_kernel`.
///
/// Shared memory (`attention_smem_layout`): running states and factors, the tile's row offsets
/// and scores; at the end, the per-warp sums in place of the last two.
template <typename T, typename Cache, int kGroupTile>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_kernel(const AttentionArgs<T, Cache> a) {
  using S = typename CacheElement<Cache>::type;  // how K/V are stored
  const int row = static_cast<int>(blockIdx.x);
  const int kv_head = static_cast<int>(blockIdx.y) / a.group_tiles;
  const int tile = static_cast<int>(blockIdx.y) % a.group_tiles;
  const int part = static_cast<int>(blockIdx.z);
  // sequence, keys [first, keys)
  const QueryRow where = locate_row(a.cache, a.qo_indptr, a.rows, row);
  const int parts = row_partition_count(where, a.partitions, a.unit, a.block_size);
  if (part >= parts) return;  // the whole block: this row has fewer partitions
  const KeyRange range = row_partition_keys(where, a.partitions, a.unit, a.block_size, part);
  const int head0 = kv_head * a.group_size + tile * kGroupTile;  // first query head served
  const int heads = min(kGroupTile, a.group_size - tile * kGroupTile);

  unsigned char* smem = dynamic_shared_memory();  // layout.bytes, 16-byte aligned
  const AttentionSmemLayout layout = attention_smem_layout(kGroupTile, a.head_dim);
  auto* running = reinterpret_cast<SoftmaxState<float>*>(smem + layout.running);  // [kGroupTile]
  auto* scale_a = reinterpret_cast<float*>(smem + layout.scale_a);                // [kGroupTile]
  auto* scale_b = reinterpret_cast<float*>(smem + layout.scale_b);                // [kGroupTile]
  auto* offsets = reinterpret_cast<std::ptrdiff_t*>(smem + layout.offsets);       // [kKeyTile]
  // [kGroupTile, kKeyTile]
  auto* scores = reinterpret_cast<float*>(smem + layout.scores);
  // [warps, kGroupTile, head_dim]
  auto* reduce = reinterpret_cast<float*>(smem + layout.reduce);

  const int thread = static_cast<int>(threadIdx.x);
  const int lane = thread % 32;
  const int warp = thread / 32;
  const int chunk = thread % a.lanes;     // this thread's values: [8 chunk, 8 chunk + 8)
  const int key_slot = thread / a.lanes;  // which of the block's rows in flight it reads
  const int key_slots = kAttentionThreads / a.lanes;
  const bool holds = chunk * kValuesPerThread < a.head_dim;
  const int q_width = a.num_heads * a.head_dim;

  float q[kGroupTile][kValuesPerThread];  // this thread's values of each served query head
#pragma unroll
  for (int g = 0; g < kGroupTile; ++g) {
    if (holds && g < heads) {
      unpack8(
          load8(a.q + static_cast<std::ptrdiff_t>(row) * q_width + (head0 + g) * a.head_dim, chunk),
          q[g]);
    } else {
#pragma unroll
      for (int i = 0; i < kValuesPerThread; ++i) q[g][i] = 0.f;
    }
  }
  float acc[kGroupTile][kValuesPerThread] = {};  // this thread's part of each head's output sum
  if (thread < kGroupTile) running[thread] = empty_softmax_state<float>();

  for (int t0 = range.begin; t0 < range.end; t0 += kKeyTile) {
    const int n = min(kKeyTile, range.end - t0);  // keys in this tile
    // 0. Where each key's row is (the block table is read here, once per key).
    for (int j = thread; j < n; j += kAttentionThreads)
      offsets[j] = row_offset(a.cache, where.seq, where.key_position(t0 + j), kv_head);
    __syncthreads();

    // 1. Scores: scale · q · k for each served head and each key of the tile.
    // the same trip count for every thread
    for (int j0 = 0; j0 < n; j0 += key_slots * kRowsInFlight) {
      Pack8<S> rows_in_flight[kRowsInFlight];
#pragma unroll
      for (int r = 0; r < kRowsInFlight; ++r) {
        const int j = j0 + r * key_slots + key_slot;
        rows_in_flight[r] = holds && j < n ? load8(a.cache.k + offsets[j], chunk) : zero8<S>();
      }
#pragma unroll
      for (int r = 0; r < kRowsInFlight; ++r) {
        const int j = j0 + r * key_slots + key_slot;
        float k[kValuesPerThread];
        unpack8(rows_in_flight[r], k);
#pragma unroll
        for (int g = 0; g < kGroupTile; ++g) {
          if (g < heads) {  // the same for the whole block
            float dot = 0.f;
#pragma unroll
            for (int i = 0; i < kValuesPerThread; ++i) dot += q[g][i] * k[i];
            dot = lane_group_sum(dot, a.lanes);
            if (chunk == 0 && j < n) scores[g * kKeyTile + j] = a.scale * dot;
          }
        }
      }
    }
    __syncthreads();

    // 2. The tile's softmax state per head, merged into the head's running state.
    for (int g = warp; g < heads; g += kAttentionWarps) {
      float* s = scores + g * kKeyTile;
      float max = -INFINITY;
      for (int j = lane; j < n; j += 32) max = fmaxf(max, s[j]);
      max = warp_max(max);
      float sum = 0.f;
      for (int j = lane; j < n; j += 32) {
        s[j] = expf(s[j] - max);  // weight relative to the tile's max
        sum += s[j];
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const SoftmaxScales<float> f =
            merge_softmax_scales(running[g], SoftmaxState<float>{max, sum});
        scale_a[g] = f.a;
        scale_b[g] = f.b;
      }
    }
    __syncthreads();

    // 3. Values: acc = acc · scale_a + Σ_j (exp(s_j − tile max) · scale_b) · v_j.
    float weight_scale[kGroupTile];
#pragma unroll
    for (int g = 0; g < kGroupTile; ++g) {
      weight_scale[g] = g < heads ? scale_b[g] : 0.f;
      const float f = g < heads ? scale_a[g] : 0.f;
#pragma unroll
      for (int i = 0; i < kValuesPerThread; ++i) acc[g][i] *= f;
    }
    for (int j0 = 0; j0 < n; j0 += key_slots * kRowsInFlight) {
      Pack8<S> rows_in_flight[kRowsInFlight];
#pragma unroll
      for (int r = 0; r < kRowsInFlight; ++r) {
        const int j = j0 + r * key_slots + key_slot;
        rows_in_flight[r] = holds && j < n ? load8(a.cache.v + offsets[j], chunk) : zero8<S>();
      }
#pragma unroll
      for (int r = 0; r < kRowsInFlight; ++r) {
        const int j = j0 + r * key_slots + key_slot;
        if (j < n) {
          float v[kValuesPerThread];
          unpack8(rows_in_flight[r], v);
#pragma unroll
          for (int g = 0; g < kGroupTile; ++g) {
            if (g < heads) {
              const float w = scores[g * kKeyTile + j] * weight_scale[g];
#pragma unroll
              for (int i = 0; i < kValuesPerThread; ++i) acc[g][i] += w * v[i];
            }
          }
        }
      }
    }
    __syncthreads();  // offsets and scores are overwritten by the next tile
  }

  // Sum the key slots' accumulators: first within the warp (threads holding the same values are
  // `lanes`, 2 lanes, ... apart), then across warps through shared memory.
#pragma unroll
  for (int g = 0; g < kGroupTile; ++g) {
    if (g < heads) {
#pragma unroll
      for (int i = 0; i < kValuesPerThread; ++i) {
        for (int offset = a.lanes; offset < 32; offset *= 2)
          acc[g][i] += __shfl_xor_sync(0xffffffffu, acc[g][i], offset);
      }
    }
  }
  if (lane < a.lanes && holds) {
#pragma unroll
    for (int g = 0; g < kGroupTile; ++g) {
      if (g < heads) {
#pragma unroll
        for (int i = 0; i < kValuesPerThread; ++i)
          reduce[(warp * kGroupTile + g) * a.head_dim + chunk * kValuesPerThread + i] = acc[g][i];
      }
    }
  }
  __syncthreads();
  for (int idx = thread; idx < heads * a.head_dim; idx += kAttentionThreads) {
    const int g = idx / a.head_dim;
    const int c = idx % a.head_dim;
    float total = 0.f;
    for (int w = 0; w < kAttentionWarps; ++w)
      total += reduce[(w * kGroupTile + g) * a.head_dim + c];
    const int head = head0 + g;
    if (parts == 1) {  // the whole row in this block: the output itself
      a.out[static_cast<std::ptrdiff_t>(row) * q_width + head * a.head_dim + c] =
          from_float<T>(total / running[g].sum);
    } else {  // one partition of several: its state, for merge_partitions_kernel
      const std::ptrdiff_t slot =
          (static_cast<std::ptrdiff_t>(row) * a.num_heads + head) * a.partitions + part;
      a.partial_acc[slot * a.head_dim + c] = total;
      if (c == 0) a.partial_state[slot] = running[g];
    }
  }
}

/// Split-K's second step: one block per (query row, query head), one thread per value of the
/// head. Each thread merges the row's partitions in order with `merge_softmax_states` (the
/// log-sum-exp rule) and writes accumulator / sum. Rows with one partition were written by
/// `attention_kernel` and are skipped.
template <typename T, typename Cache>
__global__ void __launch_bounds__(kMaxHeadDim)
    merge_partitions_kernel(const AttentionArgs<T, Cache> a) {
  const int row = static_cast<int>(blockIdx.x);
  const int head = static_cast<int>(blockIdx.y);
  const QueryRow where = locate_row(a.cache, a.qo_indptr, a.rows, row);
  const int parts = row_partition_count(where, a.partitions, a.unit, a.block_size);
  if (parts == 1) return;
  const std::ptrdiff_t first =
      (static_cast<std::ptrdiff_t>(row) * a.num_heads + head) * a.partitions;
  for (int c = static_cast<int>(threadIdx.x); c < a.head_dim; c += static_cast<int>(blockDim.x)) {
    SoftmaxState<float> state = empty_softmax_state<float>();
    float acc = 0.f;
    for (int p = 0; p < parts; ++p) {
      const float part_acc = a.partial_acc[(first + p) * a.head_dim + c];
      merge_softmax_states(state, &acc, a.partial_state[first + p], &part_acc, 1);
    }
    a.out[static_cast<std::ptrdiff_t>(row) * a.num_heads * a.head_dim + head * a.head_dim + c] =
        from_float<T>(acc / state.sum);
  }
}

/// True if the byte ranges [a, a + a_bytes) and [b, b + b_bytes) overlap.
inline bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a);
  const auto y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

/// Throws InvalidArgument unless `pointer` is 16-byte aligned (the kernel loads 16 bytes at a
/// time; cudaMalloc gives 256).
inline void require_aligned(const char* where, const char* name, const void* pointer) {
  if (reinterpret_cast<std::uintptr_t>(pointer) % 16 != 0) {
    kvlab::detail::fail(where, name, "a 16-byte aligned device pointer", pointer);
  }
}

/// The checks shared by the three public functions: head_dim (for a cache of `S`), queries,
/// output.
template <typename T, typename S>
void check_attention_args(const char* where, const AttentionShape& shape, DeviceMatrix<const T> q,
                          DeviceMatrix<T> out, int cache_kv_heads, int cache_head_dim) {
  static_assert(is_cache_pairing<T, S>,
                "kvlab's CUDA attention reads a cache of float, __half or __nv_bfloat16 with "
                "queries of the same type, or a cache of any of them or of BlockQ8_0 or "
                "BlockQ4_0 with float queries");
  using kvlab::detail::require_equal;
  if (!head_dim_supported(shape.head_dim())) {
    kvlab::detail::fail(where, "shape.head_dim()", "a multiple of 8 in [8, 256]", shape.head_dim());
  }
  if (shape.head_dim() % StorageUnit<S>::kValues != 0) {
    kvlab::detail::fail(where, "shape.head_dim()",
                        std::string("a multiple of 32 (whole ") + storage_name<S>() + " blocks)",
                        shape.head_dim());
  }
  require_equal(where, "cache.num_kv_heads", cache_kv_heads, shape.num_kv_heads(),
                "shape.num_kv_heads()");
  require_equal(where, "cache.head_dim", cache_head_dim, shape.head_dim(), "shape.head_dim()");
  kvlab::detail::require_at_least(where, "q.rows", q.rows, 1);
  require_equal(where, "q.cols", q.cols, shape.q_width(), "num_heads * head_dim");
  require_equal(where, "out.rows", out.rows, q.rows, "q.rows");
  require_equal(where, "out.cols", out.cols, shape.q_width(), "num_heads * head_dim");
  if (q.data == nullptr || out.data == nullptr)
    kvlab::detail::fail(where, "q.data / out.data", "device pointers", "a null pointer");
  require_aligned(where, "q.data", q.data);
  if (overlaps(q.data, q.size() * sizeof(T), out.data, out.size() * sizeof(T))) {
    kvlab::detail::fail(where, "out", "memory that does not overlap q", "an overlap");
  }
  if (shape.num_kv_heads() > 65535 / group_tiles(shape.group_size())) {
    kvlab::detail::fail(where, "shape.num_kv_heads()", "at most 65535 blocks per row",
                        shape.num_kv_heads());
  }
}

/// Plans and launches `attention_kernel` (and `merge_partitions_kernel` when split) for
/// `q.rows` query rows over `cache`.
template <typename T, typename Cache>
void launch_attention(const AttentionShape& shape, DeviceMatrix<const T> q, const Cache& cache,
                      const std::int32_t* qo_indptr, DeviceMatrix<T> out, int block_size,
                      const LaunchOptions& options) {
  const int sm_count = options.partitions >= 1 ? 1 : multiprocessor_count();
  const AttentionPlan plan =
      plan_attention(shape, q.rows, block_size, sm_count, options.partitions);
  const std::size_t acc_bytes = partial_bytes(shape, q.rows, plan) == 0
                                    ? 0
                                    : static_cast<std::size_t>(q.rows) * shape.num_heads() *
                                          plan.partitions * shape.head_dim() * sizeof(float);
  Scratch scratch(partial_bytes(shape, q.rows, plan), options.workspace, options.stream);

  AttentionArgs<T, Cache> args{};
  args.q = q.data;
  args.out = out.data;
  args.cache = cache;
  args.qo_indptr = qo_indptr;
  args.rows = q.rows;
  args.num_heads = shape.num_heads();
  args.head_dim = shape.head_dim();
  args.group_size = shape.group_size();
  args.group_tiles = plan.group_tiles;
  args.lanes = plan.lanes;
  args.partitions = plan.partitions;
  args.unit = plan.unit;
  args.block_size = block_size;
  args.scale = static_cast<float>(shape.scale());
  args.partial_acc = plan.partitions > 1 ? scratch.as<float>() : nullptr;
  args.partial_state = plan.partitions > 1 ? scratch.as<SoftmaxState<float>>(acc_bytes) : nullptr;

  const dim3 grid(static_cast<unsigned>(q.rows),
                  static_cast<unsigned>(shape.num_kv_heads() * plan.group_tiles),
                  static_cast<unsigned>(plan.partitions));
  const auto smem = static_cast<unsigned>(plan.smem_bytes);
  // One compiled variant per group tile: the heads a block serves are registers (`q`, `acc`).
  void (*kernel)(AttentionArgs<T, Cache>) = attention_kernel<T, Cache, kMaxGroupTile>;
  switch (plan.group_tile) {
    case 1:
      kernel = attention_kernel<T, Cache, 1>;
      break;
    case 2:
      kernel = attention_kernel<T, Cache, 2>;
      break;
    case 4:
      kernel = attention_kernel<T, Cache, 4>;
      break;
    default:
      break;
  }
  launch_kernel("kvlab::cuda::detail::attention_kernel", kernel, grid, dim3(kAttentionThreads),
                smem, options.stream, args);
  if (plan.partitions > 1) {
    launch_kernel("kvlab::cuda::detail::merge_partitions_kernel", merge_partitions_kernel<T, Cache>,
                  dim3(static_cast<unsigned>(q.rows), static_cast<unsigned>(shape.num_heads())),
                  dim3(static_cast<unsigned>(shape.head_dim())), 0, options.stream, args);
  }
}

/// Checks the fields of a paged view that the host can see (the block tables themselves are in
/// device memory and are trusted).
template <typename S>
void check_paged_fields(const char* where, const PagedKVView<S>& cache) {
  kvlab::detail::require_at_least(where, "cache.batch", cache.batch, 1);
  kvlab::detail::require_at_least(where, "cache.block_size", cache.block_size, 1);
  kvlab::detail::require_at_least(where, "cache.num_blocks", cache.num_blocks, 1);
  if (cache.k == nullptr || cache.v == nullptr || cache.indptr == nullptr ||
      cache.indices == nullptr || cache.last_page_len == nullptr) {
    kvlab::detail::fail(where, "cache.k / v / indptr / indices / last_page_len", "device pointers",
                        "a null pointer");
  }
  kvlab::detail::require_at_least(where, "cache.window", cache.window, 0);
  kvlab::detail::require_at_least(where, "cache.sinks", cache.sinks, 0);
  if (cache.sinks > 0 && cache.window == 0) {
    kvlab::detail::fail(where, "cache.sinks", "0 without a window (every key is seen)",
                        cache.sinks);
  }
  require_aligned(where, "cache.k", cache.k);
  require_aligned(where, "cache.v", cache.v);
}

/// Keys seen by all query rows of a paged launch (for the counters): copies the batch's
/// `indptr`, `last_page_len` and `qo_indptr` (if not null) to the host, waiting for `stream`.
template <typename S>
std::uint64_t paged_keys_seen(const PagedKVView<S>& cache, const std::int32_t* qo_indptr,
                              cudaStream_t stream) {
  const auto batch = static_cast<std::size_t>(cache.batch);
  std::vector<std::int32_t> indptr(batch + 1), last(batch),
      qo(qo_indptr != nullptr ? batch + 1 : 0);
  KVLAB_CUDA_CHECK(cudaMemcpyAsync(indptr.data(), cache.indptr,
                                   indptr.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost,
                                   stream));
  KVLAB_CUDA_CHECK(cudaMemcpyAsync(last.data(), cache.last_page_len,
                                   last.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost,
                                   stream));
  if (qo_indptr != nullptr) {
    KVLAB_CUDA_CHECK(cudaMemcpyAsync(qo.data(), qo_indptr, qo.size() * sizeof(std::int32_t),
                                     cudaMemcpyDeviceToHost, stream));
  }
  KVLAB_CUDA_CHECK(cudaStreamSynchronize(stream));
  PagedKVView<S> host = cache;  // the host copies of the arrays that seq_len reads
  host.indptr = indptr.data();
  host.last_page_len = last.data();
  std::uint64_t keys = 0;
  for (int s = 0; s < cache.batch; ++s) {  // the last q_len tokens of each sequence attend
    const int q_len = qo_indptr == nullptr
                          ? 1
                          : qo[static_cast<std::size_t>(s) + 1] - qo[static_cast<std::size_t>(s)];
    keys += visible_keys(host.seq_len(s) - q_len, q_len, cache.window, cache.sinks);
  }
  return keys;
}

}  // namespace detail

/// Attention of `q_len` new queries over a contiguous KV cache in device memory: the device
/// counterpart of `cpu::decode_attention`, same arguments in the same order.
///
/// The new tokens' keys and values must already be in the cache (append first, then attend):
/// query row `i` is the token at position `cache.length - q_len + i` and sees cache rows `[0,
/// cache.length - q_len + i]`. With q_len = 1 (decode) it sees the whole cache. With a sliding
/// window (`cache.window` = W >= 1) each query sees only its last W keys, read from the cache's
/// ring of slots (`ContiguousKVView`), and its blocks read only those. Meant for decode: each
/// query row is its own set of blocks, so a long prefill reads K/V once per row.
///
/// Launch: one block of 128 threads per (query row, K/V head, split-K partition) — the query
/// heads of a GQA group (up to 8 per block) share every K/V row the block reads, so K/V are read
/// once per K/V head, not once per query head. Long contexts are cut into partitions computed in
/// parallel and merged by the log-sum-exp rule (`LaunchOptions::partitions`). See
/// `detail::attention_kernel` for the thread mapping and the shared memory.
///
/// \param shape     the head layout; head_dim a multiple of 8 in [8, 256]
/// \param q         queries, [q_len, num_heads * head_dim], 1 <= q_len <= cache.length, device
///                  memory, 16-byte aligned
/// \param cache     one layer of a contiguous cache in device memory, K and V each
///                  [num_kv_heads, capacity, head_dim], 16-byte aligned; a window >= 0, checked
///                  as `cpu::decode_attention` checks it
/// \param out       output, [q_len, num_heads * head_dim]; must not overlap q
/// \param counters  if not null, receives the work done (`count_attention`): for q_len = 1 and
///                  groups of at most 8 query heads, the counts of `cpu::decode_attention`
/// \param options   stream, split-K partitions, scratch memory
/// \throws InvalidArgument for any shape, pointer or view that does not fit the above;
///         CudaError if a CUDA call fails.
template <typename T, typename S>
void decode_attention(const AttentionShape& shape, DeviceInput<T> q,
                      const ContiguousKVView<S>& cache, DeviceMatrix<T> out,
                      CostCounters* counters = nullptr, const LaunchOptions& options = {}) {
  constexpr const char* kWhere = "kvlab::cuda::decode_attention";
  detail::check_attention_args<T, S>(kWhere, shape, q, out, cache.num_kv_heads, cache.head_dim);
  kvlab::detail::check_contiguous_length(kWhere, "q.rows", q.rows, cache);
  if (cache.k == nullptr || cache.v == nullptr)
    kvlab::detail::fail(kWhere, "cache.k / cache.v", "device pointers", "a null pointer");
  detail::require_aligned(kWhere, "cache.k", cache.k);
  detail::require_aligned(kWhere, "cache.v", cache.v);
  detail::launch_attention(shape, q, cache, nullptr, out, /*block_size=*/1, options);
  if (counters != nullptr) {
    count_attention(shape, storage_row_bytes<S>(shape.head_dim()),
                    visible_keys(cache.length - q.rows, q.rows, cache.window, cache.sinks),
                    *counters);
  }
}

/// Decode attention of a ragged batch in one launch: one new query per sequence attends to that
/// sequence's keys and values in a paged pool in device memory, read through its block table —
/// the device counterpart of `cpu::paged_decode_attention`, same arguments in the same order.
///
/// Query row `s` belongs to sequence `s` of `cache` and sees all its tokens (append first), or
/// with a window (`cache.window` = W >= 1) its last W; the blocks before them are never read and
/// may be `kReleasedBlock` in the tables (trusted: `cpu::paged_decode_attention` checks that no
/// query's window reaches one).
/// Both pool layouts (NHD, HND) and any block size >= 1. The kernel is the one of
/// `decode_attention`; each block first translates its keys' positions through the block table
/// into row offsets (one table read per key), then reads the rows wherever they are. Slots that
/// no sequence owns are never read. The block tables are trusted: the host cannot check device
/// memory without copying it (`cpu::paged_decode_attention` checks them on the CPU).
///
/// \param shape     the head layout; head_dim a multiple of 8 in [8, 256]
/// \param q         queries, [batch, num_heads * head_dim]: row s for sequence s; device memory
/// \param cache     one layer's pool in device memory, [num_blocks, block_size, num_kv_heads,
///                  head_dim] (NHD) or [num_blocks, num_kv_heads, block_size, head_dim] (HND),
///                  K and V 16-byte aligned, and the batch's block tables (indptr, indices,
///                  last_page_len) in device memory; batch, block_size, num_blocks on the host
/// \param out       output, [batch, num_heads * head_dim]; must not overlap q
/// \param counters  if not null, receives the work done (`count_attention`); counting copies the
///                  tables' indptr and last_page_len to the host and waits for the stream
/// \param options   stream, split-K partitions, scratch memory
/// \throws InvalidArgument for any shape, pointer or view that does not fit the above;
///         CudaError if a CUDA call fails.
template <typename T, typename S>
void paged_decode_attention(const AttentionShape& shape, DeviceInput<T> q,
                            const PagedKVView<S>& cache, DeviceMatrix<T> out,
                            CostCounters* counters = nullptr, const LaunchOptions& options = {}) {
  constexpr const char* kWhere = "kvlab::cuda::paged_decode_attention";
  detail::check_attention_args<T, S>(kWhere, shape, q, out, cache.num_kv_heads, cache.head_dim);
  detail::check_paged_fields(kWhere, cache);
  kvlab::detail::require_equal(kWhere, "q.rows", q.rows, cache.batch,
                               "cache.batch (one query per sequence)");
  detail::launch_attention(shape, q, cache, nullptr, out, cache.block_size, options);
  if (counters != nullptr)
    count_attention(shape, storage_row_bytes<S>(shape.head_dim()),
                    detail::paged_keys_seen(cache, nullptr, options.stream), *counters);
}

/// Prefill (or chunked prefill, or decode) attention of a ragged batch over a paged pool in
/// device memory: sequence `s` owns query rows `[qo_indptr[s], qo_indptr[s + 1])` of `q`, its
/// last q_len tokens, which attend causally to the sequence's keys — the device counterpart of
/// `cpu::paged_prefill_attention`, same arguments in the same order (`qo_indptr` in device
/// memory). With a window each query sees its last `cache.window` keys. Each query row is one
/// set of blocks of the decode kernel, so a long prompt reads its K/V once per row: correct,
/// not fast.
///
/// \param shape      the head layout; head_dim a multiple of 8 in [8, 256]
/// \param q          queries, [qo_indptr[batch], num_heads * head_dim], sequence by sequence
/// \param qo_indptr  [batch + 1] in device memory: 0 = qo_indptr[0] <= qo_indptr[1] <= ... =
///                   q.rows, each sequence's count at most its length (trusted, not checked)
/// \param cache      one layer's pool and the batch's block tables, as `paged_decode_attention`
/// \param out        output, [q.rows, num_heads * head_dim]; must not overlap q
/// \param counters   if not null, receives the work done (copies the tables to the host)
/// \param options    stream, split-K partitions, scratch memory
/// \throws InvalidArgument for any shape, pointer or view that does not fit the above;
///         CudaError if a CUDA call fails.
template <typename T, typename S>
void paged_prefill_attention(const AttentionShape& shape, DeviceInput<T> q,
                             const std::int32_t* qo_indptr, const PagedKVView<S>& cache,
                             DeviceMatrix<T> out, CostCounters* counters = nullptr,
                             const LaunchOptions& options = {}) {
  constexpr const char* kWhere = "kvlab::cuda::paged_prefill_attention";
  detail::check_attention_args<T, S>(kWhere, shape, q, out, cache.num_kv_heads, cache.head_dim);
  detail::check_paged_fields(kWhere, cache);
  if (qo_indptr == nullptr)
    kvlab::detail::fail(kWhere, "qo_indptr", "a device pointer", "a null pointer");
  detail::launch_attention(shape, q, cache, qo_indptr, out, cache.block_size, options);
  if (counters != nullptr)
    count_attention(shape, storage_row_bytes<S>(shape.head_dim()),
                    detail::paged_keys_seen(cache, qo_indptr, options.stream), *counters);
}

}  // namespace kvlab::cuda
