/// \file
/// \brief The arithmetic of kvlab's CUDA attention kernels, as plain host+device functions.
///
/// The functions give which threads hold which values of a K/V row, which sequence and which keys a
/// query row sees, how a context is cut into split-K partitions, how the shared memory of a block
/// is laid out, and what a launch counts. The kernels (`attention.cuh`) only call these; the CPU
/// tests (`tests/cuda/test_attention_plan.cpp`) check them, and that a launch counts what the CPU
/// paths count; the kernels themselves run against the CPU paths on a GPU or the emulator. No CUDA
/// header is needed: this compiles with any C++17 compiler.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/paged_view.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/core/softmax_state.hpp"
#include "kvlab/core/split_k.hpp"
#include "kvlab/core/views.hpp"

namespace kvlab::cuda {

/// Threads per block of the attention kernel (4 warps).
constexpr int kAttentionThreads = 128;
/// Warps per block of the attention kernel.
constexpr int kAttentionWarps = kAttentionThreads / 32;
/// Keys a block scores and stores in shared memory at a time (one tile).
constexpr int kKeyTile = 256;
/// Values of a K/V row that one thread loads at once: 16 bytes of fp16/bf16, 32 of fp32.
constexpr int kValuesPerThread = 8;
/// Most query heads that one block serves (a compiled variant serves 1, 2, 4 or 8).
constexpr int kMaxGroupTile = 8;
/// Largest head_dim the kernels accept: 32 threads × 8 values.
constexpr int kMaxHeadDim = 32 * kValuesPerThread;
/// Most split-K partitions per query row.
constexpr int kMaxPartitions = 1024;
/// Blocks per multiprocessor that the automatic split-K choice aims for.
constexpr int kTargetBlocksPerSm = 4;

/// True for the head sizes the CUDA kernels accept: multiples of 8 from 8 to 256.
KVLAB_HOST_DEVICE inline bool head_dim_supported(int head_dim) {
  return head_dim >= kValuesPerThread && head_dim <= kMaxHeadDim &&
         head_dim % kValuesPerThread == 0;
}

/// Threads that share one K/V row in the attention kernel: the smallest power of two that
/// covers `head_dim / 8` chunks of 8 values (1 … 32). Thread `i` of the group holds values
/// `[8 i, 8 i + 8)`; those with `8 i >= head_dim` hold nothing (head_dim 80: 10 chunks, 16
/// threads, 6 idle). A warp reads `32 / lanes` rows at once.
KVLAB_HOST_DEVICE inline int lanes_per_row(int head_dim) {
  const int chunks = (head_dim + kValuesPerThread - 1) / kValuesPerThread;
  int lanes = 1;
  while (lanes < chunks) lanes *= 2;
  return lanes;
}

/// Query heads per block for a GQA group of `group_size` query heads (the compiled variant):
/// 1, 2, 4 or 8, the smallest that holds the group, at most 8 (larger groups take several
/// blocks per K/V head, see `group_tiles`).
KVLAB_HOST_DEVICE inline int group_tile(int group_size) {
  int tile = 1;
  while (tile < group_size && tile < kMaxGroupTile) tile *= 2;
  return tile;
}

/// Blocks per K/V head: ceil(group_size / group_tile(group_size)). Each reads the K/V head's
/// rows once for its query heads; 1 unless the group has more than 8 query heads.
KVLAB_HOST_DEVICE inline int group_tiles(int group_size) {
  const int tile = group_tile(group_size);
  return (group_size + tile - 1) / tile;
}

/// The split-K unit for pools of `block_size`-token blocks (1 for a contiguous cache): the
/// smallest multiple of `block_size` that is at least `kKeyTile`. Partition sizes are multiples
/// of it (see `partition_size`), so a partition never splits a block and never has fewer keys
/// than one tile, unless it is a sequence's last.
KVLAB_HOST_DEVICE inline int split_k_unit(int block_size) {
  return (kKeyTile + block_size - 1) / block_size * block_size;
}

/// Keys [begin, end) of one partition.
struct KeyRange {
  int begin;  ///< first key position
  int end;    ///< one past the last key position
};

/// Partition `part` of a row that sees `length` keys, cut into at most `parts` partitions of
/// whole `unit`s (`partition_size`): keys [part · size, min(length, (part + 1) · size)), empty
/// ({length, length}) past the last partition.
KVLAB_HOST_DEVICE inline KeyRange partition_keys(int length, int parts, int unit, int part) {
  const int size = partition_size(length, parts, unit);
  const long long begin = static_cast<long long>(part) * size;
  if (begin >= length) return KeyRange{length, length};
  const long long end = begin + size < length ? begin + size : length;
  return KeyRange{static_cast<int>(begin), static_cast<int>(end)};
}

/// The sequence that query row `row` belongs to, for ragged queries in CSR form: the `s` with
/// `qo_indptr[s] <= row < qo_indptr[s + 1]` (sequences without queries are skipped), by binary
/// search.
/// \param qo_indptr  [batch + 1], non-decreasing, qo_indptr[0] = 0
/// \param batch      sequences
/// \param row        in [0, qo_indptr[batch])
KVLAB_HOST_DEVICE inline int sequence_of_row(const std::int32_t* qo_indptr, int batch, int row) {
  int lo = 0;      // qo_indptr[lo] <= row
  int hi = batch;  // row < qo_indptr[hi]
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (qo_indptr[mid] <= row) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

/// What one query row reads: its sequence and which of that sequence's keys it sees.
///
/// The keys it sees are [0, sinks) and [first, keys); the kernels walk them as one range of
/// *virtual* keys [first − sinks, keys), virtual key i being position `key_position(i)`: the
/// sinks just before the window, so that a row with sinks is cut into split-K partitions and
/// tiles as a row without them is.
struct QueryRow {
  int seq;    ///< sequence (0 for a contiguous cache)
  int first;  ///< it sees keys [first, keys): 0, or with a window W its last W
              ///< (`first_visible_key`)
  int keys;   ///< one past its last key: its own position + 1
  int sinks;  ///< and keys [0, sinks): the attention sinks that have left its window
              ///< (`sink_keys`; 0 without)

  /// The first virtual key: first − sinks.
  KVLAB_HOST_DEVICE int begin() const { return first - sinks; }
  /// The position of virtual key `i` (in [begin(), keys)): i itself in the window, i − begin()
  /// for a sink.
  KVLAB_HOST_DEVICE int key_position(int i) const { return i >= first ? i : i - begin(); }
};

/// The query row whose position is `keys − 1`, of sequence `seq`, with a window of `window` keys
/// (0: none) and `sinks` attention sinks (0: none).
KVLAB_HOST_DEVICE inline QueryRow query_row(int seq, int keys, int window, int sinks) {
  return QueryRow{seq, first_visible_key(keys - 1, window), keys,
                  sink_keys(keys - 1, window, sinks)};
}

/// Query row `row` of `rows` new tokens over a contiguous cache (the tokens are the cache's
/// last `rows`): it is the token at position cache.length − rows + row, and sees the keys up to
/// it (its last `cache.window` with a window), as in `cpu::decode_attention`.
template <typename T>
KVLAB_HOST_DEVICE QueryRow locate_row(const ContiguousKVView<T>& cache,
                                      const std::int32_t* /*qo_indptr*/, int rows, int row) {
  return query_row(0, cache.length - rows + row + 1, cache.window, cache.sinks);
}

/// Query row `row` over a paged cache. Without `qo_indptr` (decode) row s is sequence s and
/// sees all its keys; with it (prefill, CSR rows as in `cpu::paged_prefill_attention`) the row
/// is query i of sequence s and sees keys up to position seq_len(s) − q_len(s) + i. With a
/// window, only the last `cache.window` of them.
template <typename T>
KVLAB_HOST_DEVICE QueryRow locate_row(const PagedKVView<T>& cache, const std::int32_t* qo_indptr,
                                      int /*rows*/, int row) {
  if (qo_indptr == nullptr) return query_row(row, cache.seq_len(row), cache.window, cache.sinks);
  const int seq = sequence_of_row(qo_indptr, cache.batch, row);
  const int q_len = qo_indptr[seq + 1] - qo_indptr[seq];
  return query_row(seq, cache.seq_len(seq) - q_len + (row - qo_indptr[seq]) + 1, cache.window,
                   cache.sinks);
}

/// Where a query row's split-K partitions start: the first key of the block that holds its
/// first virtual key (`QueryRow::begin`; `block_size` 1 for a contiguous cache), so partitions
/// of whole units are still whole blocks of the pool where the row has no sinks. 0 without a
/// window.
KVLAB_HOST_DEVICE inline int partition_origin(const QueryRow& row, int block_size) {
  return row.begin() / block_size * block_size;
}

/// Number of non-empty split-K partitions of a query row: `partition_count` of its keys from
/// `partition_origin`.
KVLAB_HOST_DEVICE inline int row_partition_count(const QueryRow& row, int parts, int unit,
                                                 int block_size) {
  return partition_count(row.keys - partition_origin(row, block_size), parts, unit);
}

/// Virtual keys (`QueryRow::key_position`) of partition `part` of a query row: `partition_keys`
/// counted from `partition_origin`, the first partition starting at the row's first virtual key.
/// Empty ({keys, keys}) past the last partition.
KVLAB_HOST_DEVICE inline KeyRange row_partition_keys(const QueryRow& row, int parts, int unit,
                                                     int block_size, int part) {
  const int origin = partition_origin(row, block_size);
  const KeyRange range = partition_keys(row.keys - origin, parts, unit, part);
  const int begin = origin + range.begin;
  return KeyRange{begin > row.begin() ? begin : row.begin(), origin + range.end};
}

/// Offset, in elements from `cache.k` (or `cache.v`), of the row of K/V head `kv_head` at
/// position `pos` of a contiguous cache (`seq` is ignored).
template <typename T>
KVLAB_HOST_DEVICE std::ptrdiff_t row_offset(const ContiguousKVView<T>& cache, int /*seq*/, int pos,
                                            int kv_head) {
  return cache.offset(kv_head, pos);
}

/// Offset, in elements from `cache.k` (or `cache.v`), of the row of K/V head `kv_head` at
/// position `pos` of sequence `seq` of a paged cache: through its block table.
template <typename T>
KVLAB_HOST_DEVICE std::ptrdiff_t row_offset(const PagedKVView<T>& cache, int seq, int pos,
                                            int kv_head) {
  return cache.offset(seq, pos, kv_head);
}

/// `bytes` rounded up to a multiple of 16.
KVLAB_HOST_DEVICE inline std::size_t round_up_16(std::size_t bytes) {
  return (bytes + 15) / 16 * 16;
}

/// Byte offsets of the regions of an attention block's shared memory.
///
/// `running`, `scale_a`, `scale_b` live for the whole block; `offsets` and `scores` are reused
/// for every key tile; `reduce` is used once, after the last tile, and overlays `offsets` and
/// `scores`. Every region starts on a 16-byte boundary.
struct AttentionSmemLayout {
  std::size_t running;  ///< SoftmaxState<float> [group_tile]: each query head's state so far
  std::size_t scale_a;  ///< float [group_tile]: factor of the accumulators for the current tile
  std::size_t scale_b;  ///< float [group_tile]: factor of the current tile's weights
  std::size_t offsets;  ///< std::ptrdiff_t [kKeyTile]: element offset of each key of the tile
  std::size_t scores;   ///< float [group_tile, kKeyTile]: scores, then weights, of the tile
  std::size_t reduce;   ///< float [kAttentionWarps, group_tile, head_dim]: per-warp sums at the end
  std::size_t bytes;    ///< total bytes
};

/// The shared-memory layout of an attention block serving `group_tile` query heads of
/// `head_dim` values. At most 33 KiB (group tile 8, head_dim 256): within the 48 KiB that a
/// launch may use without opting in.
KVLAB_HOST_DEVICE inline AttentionSmemLayout attention_smem_layout(int group_tile, int head_dim) {
  AttentionSmemLayout layout{};
  const auto tile = static_cast<std::size_t>(group_tile);
  layout.running = 0;
  layout.scale_a = layout.running + round_up_16(tile * sizeof(SoftmaxState<float>));
  layout.scale_b = layout.scale_a + round_up_16(tile * sizeof(float));
  layout.offsets = layout.scale_b + round_up_16(tile * sizeof(float));
  layout.scores = layout.offsets + round_up_16(kKeyTile * sizeof(std::ptrdiff_t));
  const std::size_t tiles_end = layout.scores + round_up_16(tile * kKeyTile * sizeof(float));
  layout.reduce = layout.offsets;
  const std::size_t reduce_end =
      layout.reduce + round_up_16(static_cast<std::size_t>(kAttentionWarps) * tile *
                                  static_cast<std::size_t>(head_dim) * sizeof(float));
  layout.bytes = tiles_end > reduce_end ? tiles_end : reduce_end;
  return layout;
}

/// How one launch of the attention kernel is shaped (computed on the host by `plan_attention`).
///
/// Grid: x = query rows, y = num_kv_heads · group_tiles, z = partitions; `kAttentionThreads`
/// threads and `smem_bytes` of dynamic shared memory per block. Block (row, y, part) serves
/// query heads [kv_head · group_size + t · group_tile, … + group_tile) (kv_head = y /
/// group_tiles, t = y % group_tiles) of `row`, over partition `part` of the keys it sees.
struct AttentionPlan {
  int lanes;               ///< threads per K/V row (`lanes_per_row`)
  int group_tile;          ///< query heads per block: the compiled variant (1, 2, 4 or 8)
  int group_tiles;         ///< blocks per K/V head and row
  int partitions;          ///< split-K partitions per row at most (1: single pass, no merge)
  int unit;                ///< partition sizes are multiples of this (`split_k_unit`)
  std::size_t smem_bytes;  ///< dynamic shared memory per block
};

/// The launch shape for `rows` query rows of `shape` over a cache whose blocks hold
/// `block_size` tokens (1 for a contiguous cache), on a GPU with `sm_count` multiprocessors.
///
/// Split-K: `requested_partitions` = 1 gives a single pass (one block per row and head tile
/// walks all the row's keys); n > 1 allows up to n partitions; 0 chooses from the blocks one
/// partition makes, rows × num_kv_heads × group_tiles, against the target of
/// `kTargetBlocksPerSm` blocks per multiprocessor (one wave of blocks, all resident at once):
///  - the most partitions that keep the blocks within the target, if that is 2 or more
///    (many for a batch of 1): one more would start a second, mostly idle wave;
///  - else 2 while one partition leaves the target unfilled, so that the long rows of a ragged
///    batch are still cut in two;
///  - else 1 (a batch large enough to fill the GPU alone).
/// (Rounding up instead would start a second wave of blocks that stays mostly idle.)
/// Each row then uses `partition_count(keys, partitions, unit)` of them: a short row keeps one.
/// \pre `head_dim_supported(shape.head_dim())`, rows >= 1, block_size >= 1, sm_count >= 1
inline AttentionPlan plan_attention(const AttentionShape& shape, int rows, int block_size,
                                    int sm_count, int requested_partitions) {
  AttentionPlan plan{};
  plan.lanes = lanes_per_row(shape.head_dim());
  plan.group_tile = group_tile(shape.group_size());
  plan.group_tiles = group_tiles(shape.group_size());
  plan.unit = split_k_unit(block_size);
  if (requested_partitions >= 1) {
    plan.partitions = requested_partitions < kMaxPartitions ? requested_partitions : kMaxPartitions;
  } else {
    const long long blocks = static_cast<long long>(rows) * shape.num_kv_heads() * plan.group_tiles;
    const long long target = static_cast<long long>(kTargetBlocksPerSm) * sm_count;
    const long long within = target / blocks;  // partitions whose blocks fit the target
    const long long parts = within >= 2 ? within : blocks < target ? 2 : 1;
    plan.partitions = static_cast<int>(parts < kMaxPartitions ? parts : kMaxPartitions);
  }
  plan.smem_bytes = attention_smem_layout(plan.group_tile, shape.head_dim()).bytes;
  return plan;
}

/// Bytes of split-K workspace a launch needs: per row, query head and partition, an
/// accumulator of head_dim floats and a `SoftmaxState<float>`; 0 for a single pass.
inline std::size_t partial_bytes(const AttentionShape& shape, int rows, const AttentionPlan& plan) {
  if (plan.partitions <= 1) return 0;
  const std::size_t slots = kvlab::detail::elements(rows, shape.num_heads(), plan.partitions);
  return slots *
         (static_cast<std::size_t>(shape.head_dim()) * sizeof(float) + sizeof(SoftmaxState<float>));
}

/// Adds what the attention kernel does for query rows that see `keys` keys in total (summed
/// over the rows) to `counters`: `num_heads · keys` q·k dots, twice as many multiply-adds per
/// value, and K and V rows of `keys` per K/V head and group tile (each block reads its rows
/// once for up to 8 query heads). For one query per sequence and groups of at most 8 query
/// heads these are the counts of `cpu::decode_attention` and `cpu::paged_decode_attention`.
/// `row_bytes`: bytes of one head's K (or V) row as stored (`storage_row_bytes`).
inline void count_attention(const AttentionShape& shape, std::size_t row_bytes, std::uint64_t keys,
                            CostCounters& counters) {
  add_attention_counts(shape, row_bytes, keys,
                       keys * static_cast<std::uint64_t>(group_tiles(shape.group_size())),
                       counters);
}

}  // namespace kvlab::cuda
