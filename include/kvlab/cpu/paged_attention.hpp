/// \file
/// \brief Paged attention: the new queries of a ragged batch of sequences attend to a block pool.
///
/// Each sequence's keys and values are read from the block pool through the batch's block tables.
/// Same arithmetic as `decode_attention` on a contiguous cache; checked against it, against a
/// triple loop, with NaN in every unused slot and with block tables in random physical order.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#if defined(_OPENMP)
#include <omp.h>
#endif
#include <string>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/paged_view.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/core/softmax_state.hpp"
#include "kvlab/core/split_k.hpp"
#include "kvlab/cpu/attention_tile.hpp"
#include "kvlab/cpu/checks.hpp"
#include "kvlab/cpu/decode_attention.hpp"
#include "kvlab/cpu/parallel.hpp"
#include "kvlab/matrix.hpp"

namespace kvlab::cpu {

/// How the paged kernels divide a batch between threads, for given inputs and a thread count:
/// what `plan_paged_attention` returns and `paged_prefill_attention` and
/// `paged_decode_attention` follow.
struct PagedAttentionPlan {
  /// Enough K/V read to start threads: at least `kDecodeParallelMinElements` elements per
  /// tensor, each sequence's counted once per query row.
  bool parallel = false;
  /// Threads the kernel uses: the thread count asked for when `parallel`, else 1.
  int threads = 1;
  /// True for split-K: an NHD decode (at most one query per sequence) of fewer sequences than
  /// threads cuts each sequence's context into `parts` partitions of whole blocks, one work
  /// item each, and merges their partial results (`merge_softmax_states`).
  bool split_k = false;
  /// Partitions per sequence under split-K (1 otherwise).
  int parts = 1;
  /// Otherwise, work items per sequence, each a range of K/V heads: every head of an HND pool
  /// (`num_kv_heads`); one item per sequence for an NHD pool (whole token rows), or up to
  /// `ceil(threads / batch)` head ranges when there are fewer sequences than threads.
  int head_chunks = 1;
};

/// The split of one call of the paged kernels over `threads` threads (with OpenMP, the kernels
/// ask for `omp_get_max_threads()`): see `PagedAttentionPlan`. The split changes which thread
/// computes what, never a query's arithmetic — except split-K, whose merge changes the rounding.
/// \param shape      the head layout
/// \param cache      the pool and the batch's block tables
/// \param qo_indptr  [cache.batch + 1]: the query rows of each sequence (as the kernels take)
/// \param threads    the threads available, >= 1
/// \throws InvalidArgument if `threads < 1`.
template <typename T>
PagedAttentionPlan plan_paged_attention(const AttentionShape& shape, const PagedKVView<T>& cache,
                                        const std::int32_t* qo_indptr, int threads) {
  kvlab::detail::require_at_least("kvlab::cpu::plan_paged_attention", "threads", threads, 1);
  PagedAttentionPlan plan;
  const int kv_heads = shape.num_kv_heads();
  long long elements = 0;  // K/V elements per tensor read by the batch's query rows
  bool decode = true;      // at most one query per sequence
  for (int s = 0; s < cache.batch; ++s) {
    const long long rows = std::max(1, qo_indptr[s + 1] - qo_indptr[s]);
    elements += rows * cache.seq_len(s) * kv_heads * shape.head_dim();
    decode = decode && qo_indptr[s + 1] - qo_indptr[s] <= 1;
  }
  plan.parallel = elements >= kDecodeParallelMinElements;
  plan.threads = plan.parallel && threads > 1 ? threads : 1;
  const int per_sequence = (plan.threads + cache.batch - 1) / cache.batch;  // threads per sequence
  if (cache.layout == KVLayout::NHD && decode && plan.threads > cache.batch) {
    plan.split_k = true;
    plan.parts = per_sequence;
  } else if (cache.layout == KVLayout::HND) {
    plan.head_chunks = kv_heads;
  } else if (plan.threads > cache.batch) {
    plan.head_chunks = std::min(kv_heads, per_sequence);
  }
  return plan;
}

namespace detail {

/// What the calls of the paged kernels ran since the program started (`paged_attention`): how
/// they divided their work, as executed, not as planned. The tests read these counts to assert
/// that a case ran the split it is about.
struct PagedSplitCounts {
  std::atomic<std::uint64_t> split_k{0};     ///< calls that cut contexts into partitions (split-K)
  std::atomic<std::uint64_t> partitions{0};  ///< partitions attended by those calls
  std::atomic<std::uint64_t> merges{0};      ///< partitions merged into an earlier one
  std::atomic<std::uint64_t> by_heads{0};    ///< calls that ran (sequence, K/V head range) items
  std::atomic<std::uint64_t> head_items{0};  ///< (sequence, head range) items run by those calls
};
/// The counts of every call of the paged kernels of the program.
inline PagedSplitCounts& paged_split_counts() {
  static PagedSplitCounts counts;
  return counts;
}

/// Split-K decode: one query per sequence, each sequence's blocks cut into up to `parts`
/// partitions of whole blocks (`partition_size`), every (sequence, partition) a work item that
/// reads whole token rows of its blocks; the partial results of a sequence are then merged in
/// partition order with the log-sum-exp rule (`merge_softmax_states`). Used for NHD pools when
/// there are fewer sequences than threads: splitting the context keeps each thread on whole
/// token rows, where splitting the heads would give each thread a strided half of every row.
template <typename T, typename S>
void paged_decode_split_k(const AttentionShape& shape, const RowMatrixRef<T>& q,
                          const std::int32_t* qo_indptr, const PagedKVView<S>& cache, int parts,
                          RowMatrix<T>& out) {
  const int hd = shape.head_dim();
  // query heads of one row: query h of K/V head h / group is qi = h
  const int heads = shape.num_heads();
  struct Partition {
    int seq, begin, end;  // keys [begin, end) of sequence seq
    int window;           // the view's window; 0 for the sinks' partition (keys [0, end))
  };
  std::vector<Partition> partitions;  // in sequence order, then key order
  for (int s = 0; s < cache.batch; ++s) {
    if (qo_indptr[s + 1] == qo_indptr[s]) continue;  // no query
    const int len = cache.seq_len(s);
    // the keys the query sees, from the start of the block that holds the first (its window's)
    const int from = first_visible_key(len - 1, cache.window) / cache.block_size * cache.block_size;
    const int size = partition_size(len - from, parts, cache.block_size);
    // the sinks that have left the window, if any: one more partition, before the others
    const int sinks = sink_keys(len - 1, cache.window, cache.sinks);
    if (sinks > 0) partitions.push_back({s, 0, sinks, 0});
    for (int begin = from; begin < len; begin += size)
      partitions.push_back({s, begin, std::min(len, begin + size), cache.window});
  }
  const int items = static_cast<int>(partitions.size());
  // Partial result (item, query head h) lives at slot item * heads + h of `state` and `acc`.
  const auto slot = [heads](int item, int h) { return static_cast<std::size_t>(item * heads + h); };
  std::vector<SoftmaxState<T>> state(slot(items, 0));  // [items * heads]
  RowMatrix<T> acc(items * heads, hd);                 // [items * heads, head_dim]
  parallel_for(items, true, [&](int item) {
    const Partition& p = partitions[static_cast<std::size_t>(item)];
    TileScratch<T> scratch;
    AttentionTile tile;  // the sequence's one query, every K/V head, keys [begin, end)
    tile.row0 = qo_indptr[p.seq];
    tile.first_position = cache.seq_len(p.seq) - 1;
    tile.heads = shape.num_kv_heads();
    tile.key_begin = p.begin;
    tile.key_end = p.end;
    tile.window = p.window;
    attend_partial(shape, q, tile, PagedRows<S>{cache, p.seq, 0}, scratch);
    std::copy(scratch.state.begin(), scratch.state.end(),
              state.begin() + static_cast<std::ptrdiff_t>(slot(item, 0)));
    acc.middleRows(item * heads, heads) = scratch.acc;
  });
  PagedSplitCounts& counts = paged_split_counts();
  counts.split_k.fetch_add(1);
  counts.partitions.fetch_add(static_cast<std::uint64_t>(items));
  // Merge each sequence's partitions into its first, in order, and normalise.
  for (int first = 0; first < items;) {
    const int s = partitions[static_cast<std::size_t>(first)].seq;
    int next = first + 1;
    for (; next < items && partitions[static_cast<std::size_t>(next)].seq == s; ++next) {
      for (int h = 0; h < heads; ++h) {
        merge_softmax_states(state[slot(first, h)], &acc(first * heads + h, 0),
                             state[slot(next, h)], &acc(next * heads + h, 0), hd);
      }
      counts.merges.fetch_add(1);
    }
    for (int h = 0; h < heads; ++h) {
      out.block(qo_indptr[s], h * hd, 1, hd) =
          acc.row(first * heads + h) / state[slot(first, h)].sum;
    }
    first = next;
  }
}

/// The kernel of `paged_prefill_attention` and `paged_decode_attention`, arguments checked:
/// the work split by `plan_paged_attention`.
///  - HND: (sequence, K/V head) items; a head's rows of a block are adjacent — the contiguous
///    kernel's access pattern, block by block.
///  - NHD: a token's heads are adjacent, so one item reads whole token rows of a sequence; with
///    fewer sequences than threads, decode splits each sequence's context (split-K) and
///    prefill splits its heads.
template <typename T, typename S>
void paged_attention(const AttentionShape& shape, const RowMatrixRef<T>& q,
                     const std::int32_t* qo_indptr, const PagedKVView<S>& cache, RowMatrix<T>& out,
                     CostCounters* counters) {
  out.resize(q.rows(), shape.q_width());
  int threads = 1;
#if defined(_OPENMP)
  threads = omp_get_max_threads();
#endif
  const PagedAttentionPlan plan = plan_paged_attention(shape, cache, qo_indptr, threads);
  if (plan.split_k) {
    paged_decode_split_k(shape, q, qo_indptr, cache, plan.parts, out);
  } else {
    const int kv_heads = shape.num_kv_heads();
    const int chunks = plan.head_chunks;
    parallel_for(cache.batch * chunks, plan.parallel, [&](int item) {
      const int s = item / chunks;
      const int chunk = item % chunks;
      const int hk0 = chunk * kv_heads / chunks;  // this item's K/V heads: [hk0, hk1)
      const int hk1 = (chunk + 1) * kv_heads / chunks;
      const int row_begin = qo_indptr[s];  // the sequence's queries: rows [row_begin, row_end)
      const int q_len = qo_indptr[s + 1] - row_begin;
      const int first_position = cache.seq_len(s) - q_len;  // position of its first query
      // row pos of head hk0 + j at cache.key(s, pos, hk0) + j * head_stride
      const PagedRows<S> rows_from{cache, s, hk0};
      TileScratch<T> scratch;
      for (int r0 = 0; r0 < q_len; r0 += kDecodeQueryTile) {
        AttentionTile tile;
        tile.row0 = row_begin + r0;
        tile.rows = std::min(kDecodeQueryTile, q_len - r0);
        tile.first_position = first_position + r0;
        tile.hk0 = hk0;
        tile.heads = hk1 - hk0;
        tile.window = cache.window;
        tile.sinks = cache.sinks;
        attend_tile(shape, q, tile, rows_from, scratch, out);
      }
    });
    PagedSplitCounts& counts = paged_split_counts();
    counts.by_heads.fetch_add(1);
    counts.head_items.fetch_add(static_cast<std::uint64_t>(cache.batch * chunks));
  }

  if (counters != nullptr) {
    for (int s = 0; s < cache.batch; ++s) {
      const int q_len = qo_indptr[s + 1] - qo_indptr[s];
      if (q_len > 0) {
        count_tiled_attention(shape, storage_row_bytes<S>(shape.head_dim()), q_len,
                              cache.seq_len(s) - q_len, *counters, cache.window, cache.sinks);
      }
    }
  }
}

}  // namespace detail

/// Decode attention of a ragged batch: one new query per sequence attends to that sequence's
/// keys and values, read from a block pool through its block table.
///
/// Query row `s` belongs to sequence `s` of `cache`; its token is the sequence's last (append
/// its K/V to the pool first, then attend), so it sees every token of its own sequence and
/// nothing else. Sequences may have any lengths; one call serves them all. For each sequence
/// the queries of every GQA group are gathered and the K and V rows are streamed once, block
/// by block — in an HND pool one K/V head at a time (its rows of a block are adjacent), in an
/// NHD pool token by token with all K/V heads at once (a token's heads are adjacent) — the
/// same arithmetic per query as `decode_attention` on a contiguous cache holding the same
/// rows, so the two agree to rounding. With OpenMP, sequences run in parallel, and so do the
/// K/V heads of an HND pool. An NHD batch with fewer sequences than threads is split along the
/// context instead (split-K, as flash-decoding does): each thread takes whole blocks of a
/// sequence, and the partial results merge by the log-sum-exp rule (`merge_softmax_states`),
/// which changes the rounding, not the result (`plan_paged_attention` says which split a call
/// takes). It computes what `reference_attention` computes for each sequence.
///
/// \param shape     the head layout; `cache` must have its num_kv_heads and head_dim
/// \param q         queries, [batch, num_heads * head_dim]: row s for sequence s (any Eigen
///                  expression of scalar T; row-major rows and blocks are read in place)
/// \param cache     one layer's pool, [num_blocks, block_size, num_kv_heads, head_dim] (NHD) or
///                  [num_blocks, num_kv_heads, block_size, head_dim] (HND), K and V, stored as
///                  `S` (decoded row by row as read: `KVStorage`), and the batch's block tables
///                  (see `PagedKVView`)
/// \param out       output, [batch, num_heads * head_dim] (resized); must not share memory with q
/// \param counters  if not null, receives the work done (the same counts as `decode_attention`
///                  would give for each sequence on its own)
/// \par Example
/// One query per sequence of the batch of `PagedKVCache`'s example, through the view of its
/// block tables (tutorial 04, which checks it against a loop over the same rows):
/// \snippet 04_paged_attention.cpp decode
/// Used in \ref tutorial_04; `PagedDecoder` and the engine call it for every decode step.
///
/// \throws InvalidArgument for any shape or view that does not fit the above, or block tables
///         that break their invariants (out and counters are then unchanged).
template <typename Q, typename T, typename S>
void paged_decode_attention(const AttentionShape& shape, const Eigen::MatrixBase<Q>& q,
                            const PagedKVView<S>& cache, RowMatrix<T>& out,
                            CostCounters* counters = nullptr) {
  constexpr const char* kWhere = "kvlab::cpu::paged_decode_attention";
  detail::require_scalar<Q, T>();
  const detail::RowMatrixRef<T> queries(q);
  detail::check_queries(kWhere, shape, queries);
  kvlab::detail::check_paged_view(kWhere, shape, cache);
  kvlab::detail::require_storage_head_dim<S>(kWhere, cache.head_dim);
  kvlab::detail::require_equal(kWhere, "q.rows()", static_cast<long>(q.rows()),
                               static_cast<long>(cache.batch),
                               "cache.batch (one query per sequence)");
  if (detail::shares_memory(out, queries)) {
    kvlab::detail::fail(kWhere, "out", "a matrix other than q", "q");
  }
  // [batch + 1]: 0, 1, ..., batch
  std::vector<std::int32_t> qo_indptr(static_cast<std::size_t>(cache.batch) + 1);
  for (int s = 0; s <= cache.batch; ++s) qo_indptr[static_cast<std::size_t>(s)] = s;
  kvlab::detail::check_window_pages(kWhere, qo_indptr.data(), cache);
  detail::paged_attention(shape, queries, qo_indptr.data(), cache, out, counters);
}

/// Returning form of `paged_decode_attention`: `[batch, num_heads * head_dim]`, in q's scalar
/// type.
template <typename Q, typename S>
RowMatrix<typename Q::Scalar> paged_decode_attention(const AttentionShape& shape,
                                                     const Eigen::MatrixBase<Q>& q,
                                                     const PagedKVView<S>& cache,
                                                     CostCounters* counters = nullptr) {
  RowMatrix<typename Q::Scalar> out;
  paged_decode_attention(shape, q, cache, out, counters);
  return out;
}

/// Prefill (or chunked prefill, or decode) attention of a ragged batch: each sequence brings
/// any number of new queries, which attend causally to that sequence's keys and values in the
/// pool.
///
/// Sequence `s` owns query rows `[qo_indptr[s], qo_indptr[s + 1])` of `q` (CSR, as FlashInfer's
/// batch prefill). Its `q_len` new tokens must already be in the pool, as its last `q_len`
/// tokens (write the prompt into its blocks first, then attend): query row `i` of the sequence
/// is the token at position `seq_len - q_len + i` and sees that sequence's tokens
/// `[0, seq_len - q_len + i]`. A sequence may bring no query (`q_len == 0`): it is skipped. With
/// one query per sequence this is `paged_decode_attention`; with one sequence it equals
/// `decode_attention` on a contiguous cache holding the same rows. With a sliding window
/// (`cache.window` = W >= 1) each query sees its last W keys, and the blocks wholly before a
/// sequence's first query's window may be `kReleasedBlock` in the tables (checked: no query
/// reaches one); with attention sinks (`cache.sinks` = S) also the first S keys, whose blocks
/// stay.
///
/// \param shape      the head layout; `cache` must have its num_kv_heads and head_dim
/// \param q          queries, [qo_indptr[batch], num_heads * head_dim], sequence by sequence
///                   (any Eigen expression of scalar T)
/// \param qo_indptr  [batch + 1]: 0 = qo_indptr[0] <= qo_indptr[1] <= ... = q.rows(), and
///                   qo_indptr[s + 1] - qo_indptr[s] <= the length of sequence s
/// \param cache      one layer's pool and the batch's block tables (see `PagedKVView`)
/// \param out        output, [q.rows(), num_heads * head_dim] (resized); must not share memory
///                   with q
/// \param counters   if not null, receives the work done
/// \throws InvalidArgument for any argument that does not fit the above (out and counters are
///         then unchanged).
template <typename Q, typename T, typename S>
void paged_prefill_attention(const AttentionShape& shape, const Eigen::MatrixBase<Q>& q,
                             const std::vector<std::int32_t>& qo_indptr,
                             const PagedKVView<S>& cache, RowMatrix<T>& out,
                             CostCounters* counters = nullptr) {
  constexpr const char* kWhere = "kvlab::cpu::paged_prefill_attention";
  detail::require_scalar<Q, T>();
  const detail::RowMatrixRef<T> queries(q);
  detail::check_queries(kWhere, shape, queries);
  kvlab::detail::check_paged_view(kWhere, shape, cache);
  kvlab::detail::require_storage_head_dim<S>(kWhere, cache.head_dim);
  kvlab::detail::check_qo_indptr(kWhere, qo_indptr, cache);
  kvlab::detail::require_equal(kWhere, "qo_indptr[batch]", static_cast<long>(qo_indptr.back()),
                               static_cast<long>(q.rows()), "q.rows()");
  if (detail::shares_memory(out, queries)) {
    kvlab::detail::fail(kWhere, "out", "a matrix other than q", "q");
  }
  kvlab::detail::check_window_pages(kWhere, qo_indptr.data(), cache);
  detail::paged_attention(shape, queries, qo_indptr.data(), cache, out, counters);
}

/// Returning form of `paged_prefill_attention`: `[q.rows(), num_heads * head_dim]`, in q's
/// scalar type.
template <typename Q, typename S>
RowMatrix<typename Q::Scalar> paged_prefill_attention(const AttentionShape& shape,
                                                      const Eigen::MatrixBase<Q>& q,
                                                      const std::vector<std::int32_t>& qo_indptr,
                                                      const PagedKVView<S>& cache,
                                                      CostCounters* counters = nullptr) {
  RowMatrix<typename Q::Scalar> out;
  paged_prefill_attention(shape, q, qo_indptr, cache, out, counters);
  return out;
}

}  // namespace kvlab::cpu
