/// \file
/// \brief Paged attention: the new queries of a ragged batch of sequences attend to their keys
/// and values in a block pool, read through the batch's block tables. Same arithmetic as
/// `decode_attention` on a contiguous cache; checked against it, against a triple loop, with
/// NaN in every unused slot and with block tables in random physical order.
#pragma once

#include <algorithm>
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
#include "kvlab/cpu/attention_tile.hpp"
#include "kvlab/cpu/checks.hpp"
#include "kvlab/cpu/decode_attention.hpp"
#include "kvlab/cpu/parallel.hpp"
#include "kvlab/cpu/types.hpp"

namespace kvlab {
namespace detail {

/// Checks a paged view against `shape` and every invariant of its block tables (a raw view may
/// come from anywhere): non-null arrays, `indptr` increasing from 0, every index a block of the
/// pool, `1 <= last_page_len <= block_size`. O(number of pages).
template <typename T>
void check_paged_view(const char* where, const AttentionShape& shape, const PagedKVView<T>& cache) {
  detail::require_equal(where, "cache.num_kv_heads", cache.num_kv_heads, shape.num_kv_heads(),
                        "shape.num_kv_heads()");
  detail::require_equal(where, "cache.head_dim", cache.head_dim, shape.head_dim(),
                        "shape.head_dim()");
  detail::require_at_least(where, "cache.batch", cache.batch, 1);
  detail::require_at_least(where, "cache.block_size", cache.block_size, 1);
  detail::require_at_least(where, "cache.num_blocks", cache.num_blocks, 1);
  if (cache.k == nullptr || cache.v == nullptr || cache.indptr == nullptr ||
      cache.indices == nullptr || cache.last_page_len == nullptr) {
    detail::fail(where, "cache.k / v / indptr / indices / last_page_len", "non-null pointers",
                 "a null pointer");
  }
  detail::require_equal(where, "cache.indptr[0]", cache.indptr[0], 0);
  for (int s = 0; s < cache.batch; ++s) {
    const std::string seq = "[" + std::to_string(s) + "]";
    if (cache.indptr[s + 1] <= cache.indptr[s]) {
      detail::fail(where, "cache.indptr[" + std::to_string(s + 1) + "]",
                   "> cache.indptr" + seq + " (" + std::to_string(cache.indptr[s]) + ")",
                   cache.indptr[s + 1]);
    }
    if (static_cast<std::int64_t>(cache.indptr[s + 1] - cache.indptr[s]) * cache.block_size >
        INT32_MAX) {
      detail::fail(where, "cache.indptr[" + std::to_string(s + 1) + "]",
                   "a sequence of at most " + std::to_string(INT32_MAX) + " tokens",
                   std::to_string(cache.indptr[s + 1] - cache.indptr[s]) + " blocks");
    }
    if (cache.last_page_len[s] < 1 || cache.last_page_len[s] > cache.block_size) {
      detail::fail(where, "cache.last_page_len" + seq,
                   "in [1, block_size (" + std::to_string(cache.block_size) + ")]",
                   cache.last_page_len[s]);
    }
  }
  for (std::int32_t i = 0; i < cache.indptr[cache.batch]; ++i) {
    if (cache.indices[i] < 0 || cache.indices[i] >= cache.num_blocks) {
      detail::fail(where, "cache.indices[" + std::to_string(i) + "]",
                   "in [0, " + std::to_string(cache.num_blocks) + ")", cache.indices[i]);
    }
  }
}

/// Split-K decode: one query per sequence, each sequence's blocks cut into up to `parts`
/// partitions of whole blocks (`partition_size`), every (sequence, partition) a work item that
/// reads whole token rows of its blocks; the partial results of a sequence are then merged in
/// partition order with the log-sum-exp rule (`merge_softmax_states`). Used for NHD pools when
/// there are fewer sequences than threads: splitting the context keeps each thread on whole
/// token rows, where splitting the heads would give each thread a strided half of every row.
template <typename T>
void paged_decode_split_k(const AttentionShape& shape, const RowMatrix<T>& q,
                          const std::int32_t* qo_indptr, const PagedKVView<T>& cache, int parts,
                          RowMatrix<T>& out) {
  const int hd = shape.head_dim();
  // query heads of one row: query h of K/V head h / group is qi = h
  const int heads = shape.num_heads();
  struct Partition {
    int seq, begin, end;  // keys [begin, end) of sequence seq
  };
  std::vector<Partition> partitions;  // in sequence order, then key order
  for (int s = 0; s < cache.batch; ++s) {
    if (qo_indptr[s + 1] == qo_indptr[s]) continue;  // no query
    const int len = cache.seq_len(s);
    const int size = partition_size(len, parts, cache.block_size);
    for (int begin = 0; begin < len; begin += size)
      partitions.push_back({s, begin, std::min(len, begin + size)});
  }
  const int items = static_cast<int>(partitions.size());
  std::vector<SoftmaxState<T>> state(static_cast<std::size_t>(items) * heads);  // [items * heads]
  // [items * heads, head_dim]
  RowMatrix<T> acc(static_cast<Eigen::Index>(items) * heads, hd);
  parallel_for(items, true, [&](int item) {
    const Partition& p = partitions[static_cast<std::size_t>(item)];
    TileScratch<T> scratch;
    attend_partial(shape, q, qo_indptr[p.seq], 1, cache.seq_len(p.seq) - 1, 0, shape.num_kv_heads(),
                   PagedRows<T>{cache, p.seq, 0}, p.begin, p.end, scratch);
    std::copy(scratch.state.begin(), scratch.state.end(),
              state.begin() + static_cast<std::ptrdiff_t>(item) * heads);
    acc.middleRows(static_cast<Eigen::Index>(item) * heads, heads) = scratch.acc;
  });
  // Merge each sequence's partitions into its first, in order, and normalise.
  for (int first = 0; first < items;) {
    const int s = partitions[static_cast<std::size_t>(first)].seq;
    int next = first + 1;
    for (; next < items && partitions[static_cast<std::size_t>(next)].seq == s; ++next)
      for (int h = 0; h < heads; ++h) {
        const auto a = static_cast<std::size_t>(first) * heads + h;
        const auto b = static_cast<std::size_t>(next) * heads + h;
        merge_softmax_states(state[a], &acc(static_cast<Eigen::Index>(a), 0), state[b],
                             &acc(static_cast<Eigen::Index>(b), 0), hd);
      }
    for (int h = 0; h < heads; ++h) {
      const auto a = static_cast<std::size_t>(first) * heads + h;
      out.block(qo_indptr[s], h * hd, 1, hd) = acc.row(static_cast<Eigen::Index>(a)) / state[a].sum;
    }
    first = next;
  }
}

/// The kernel of `paged_prefill_attention` and `paged_decode_attention`, arguments checked.
template <typename T>
void paged_attention(const AttentionShape& shape, const RowMatrix<T>& q,
                     const std::int32_t* qo_indptr, const PagedKVView<T>& cache, RowMatrix<T>& out,
                     CostCounters* counters) {
  out.resize(q.rows(), shape.q_width());
  const int kv_heads = shape.num_kv_heads();
  long long elements = 0;  // K/V elements per tensor in the batch
  bool decode = true;      // at most one query per sequence
  for (int s = 0; s < cache.batch; ++s) {
    elements += 1LL * cache.seq_len(s) * kv_heads * shape.head_dim();
    decode = decode && qo_indptr[s + 1] - qo_indptr[s] <= 1;
  }
  const bool parallel = elements >= cpu::kDecodeParallelMinElements;
  int threads = 1;
#if defined(_OPENMP)
  if (parallel) threads = omp_get_max_threads();
#endif
  // Work items. The result does not depend on the split by heads: each query's arithmetic is
  // the same; the split-K path (NHD decode of fewer sequences than threads) merges partial
  // results, which changes the rounding only.
  //  - HND: (sequence, K/V head); a head's rows of a block are adjacent — the contiguous
  //    kernel's access pattern, block by block.
  //  - NHD: a token's heads are adjacent, so one item reads whole token rows of a sequence;
  //    with fewer sequences than threads, decode splits each sequence's context (split-K)
  //    and prefill splits its heads.
  if (cache.layout == KVLayout::NHD && decode && threads > cache.batch) {
    paged_decode_split_k(shape, q, qo_indptr, cache, (threads + cache.batch - 1) / cache.batch,
                         out);
  } else {
    int chunks = cache.layout == KVLayout::HND ? kv_heads : 1;
    if (cache.layout == KVLayout::NHD && threads > cache.batch)
      chunks = std::min(kv_heads, (threads + cache.batch - 1) / cache.batch);
    parallel_for(cache.batch * chunks, parallel, [&](int item) {
      const int s = item / chunks;
      const int chunk = item % chunks;
      const int hk0 = chunk * kv_heads / chunks;  // this item's K/V heads: [hk0, hk1)
      const int hk1 = (chunk + 1) * kv_heads / chunks;
      // the sequence's queries: rows [row_begin, row_end) of q
      const int row_begin = qo_indptr[s];
      const int q_len = qo_indptr[s + 1] - row_begin;
      const int first_position = cache.seq_len(s) - q_len;  // position of its first query
      // row pos of head hk0 + j at cache.key(s, pos, hk0) + j * head_stride
      const PagedRows<T> rows_from{cache, s, hk0};
      TileScratch<T> scratch;
      for (int r0 = 0; r0 < q_len; r0 += cpu::kDecodeQueryTile) {
        const int rows = std::min(cpu::kDecodeQueryTile, q_len - r0);
        attend_tile(shape, q, row_begin + r0, rows, first_position + r0, hk0, hk1 - hk0, rows_from,
                    scratch, out);
      }
    });
  }

  if (counters != nullptr) {
    for (int s = 0; s < cache.batch; ++s) {
      const int q_len = qo_indptr[s + 1] - qo_indptr[s];
      if (q_len > 0) count_attention(shape, sizeof(T), q_len, cache.seq_len(s) - q_len, *counters);
    }
  }
}

}  // namespace detail

namespace cpu {

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
/// which changes the rounding, not the result.
///
/// \param shape     the head layout; `cache` must have its num_kv_heads and head_dim
/// \param q         queries, [batch, num_heads * head_dim]: row s for sequence s
/// \param cache     one layer's pool, [num_blocks, block_size, num_kv_heads, head_dim] (NHD) or
///                  [num_blocks, num_kv_heads, block_size, head_dim] (HND), K and V, and the
///                  batch's block tables (see `PagedKVView`)
/// \param out       output, [batch, num_heads * head_dim] (resized); must not be q
/// \param counters  if not null, receives the work done (the same counts as `decode_attention`
///                  would give for each sequence on its own)
/// \throws InvalidArgument for any shape or view that does not fit the above, or block tables
///         that break their invariants (out and counters are then unchanged).
template <typename T>
void paged_decode_attention(const AttentionShape& shape, const RowMatrix<T>& q,
                            const PagedKVView<T>& cache, RowMatrix<T>& out,
                            CostCounters* counters = nullptr) {
  constexpr const char* kWhere = "kvlab::cpu::paged_decode_attention";
  detail::check_queries(kWhere, shape, q);
  detail::check_paged_view(kWhere, shape, cache);
  detail::require_equal(kWhere, "q.rows()", static_cast<long>(q.rows()),
                        static_cast<long>(cache.batch), "cache.batch (one query per sequence)");
  if (&out == &q) detail::fail(kWhere, "out", "a matrix other than q", "q");
  // [batch + 1]: 0, 1, ..., batch
  std::vector<std::int32_t> qo_indptr(static_cast<std::size_t>(cache.batch) + 1);
  for (int s = 0; s <= cache.batch; ++s) qo_indptr[static_cast<std::size_t>(s)] = s;
  detail::paged_attention(shape, q, qo_indptr.data(), cache, out, counters);
}

/// Returning form of `paged_decode_attention`: `[batch, num_heads * head_dim]`.
template <typename T>
RowMatrix<T> paged_decode_attention(const AttentionShape& shape, const RowMatrix<T>& q,
                                    const PagedKVView<T>& cache, CostCounters* counters = nullptr) {
  RowMatrix<T> out;
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
/// `decode_attention` on a contiguous cache holding the same rows.
///
/// \param shape      the head layout; `cache` must have its num_kv_heads and head_dim
/// \param q          queries, [qo_indptr[batch], num_heads * head_dim], sequence by sequence
/// \param qo_indptr  [batch + 1]: 0 = qo_indptr[0] <= qo_indptr[1] <= ... = q.rows(), and
///                   qo_indptr[s + 1] - qo_indptr[s] <= the length of sequence s
/// \param cache      one layer's pool and the batch's block tables (see `PagedKVView`)
/// \param out        output, [q.rows(), num_heads * head_dim] (resized); must not be q
/// \param counters   if not null, receives the work done
/// \throws InvalidArgument for any argument that does not fit the above (out and counters are
///         then unchanged).
template <typename T>
void paged_prefill_attention(const AttentionShape& shape, const RowMatrix<T>& q,
                             const std::vector<std::int32_t>& qo_indptr,
                             const PagedKVView<T>& cache, RowMatrix<T>& out,
                             CostCounters* counters = nullptr) {
  constexpr const char* kWhere = "kvlab::cpu::paged_prefill_attention";
  detail::check_queries(kWhere, shape, q);
  detail::check_paged_view(kWhere, shape, cache);
  detail::require_equal(kWhere, "qo_indptr.size()", qo_indptr.size(),
                        static_cast<std::size_t>(cache.batch) + 1, "cache.batch + 1");
  detail::require_equal(kWhere, "qo_indptr[0]", qo_indptr[0], 0);
  for (int s = 0; s < cache.batch; ++s) {
    const auto i = static_cast<std::size_t>(s);
    const std::int64_t q_len = static_cast<std::int64_t>(qo_indptr[i + 1]) - qo_indptr[i];
    if (q_len < 0 || q_len > cache.seq_len(s)) {
      detail::fail(kWhere, "qo_indptr[" + std::to_string(s + 1) + "]",
                   "in [qo_indptr[" + std::to_string(s) + "] (" + std::to_string(qo_indptr[i]) +
                       "), that + the sequence's length (" + std::to_string(cache.seq_len(s)) +
                       ")]",
                   qo_indptr[i + 1]);
    }
  }
  detail::require_equal(kWhere, "qo_indptr[batch]", static_cast<long>(qo_indptr.back()),
                        static_cast<long>(q.rows()), "q.rows()");
  if (&out == &q) detail::fail(kWhere, "out", "a matrix other than q", "q");
  detail::paged_attention(shape, q, qo_indptr.data(), cache, out, counters);
}

/// Returning form of `paged_prefill_attention`: `[q.rows(), num_heads * head_dim]`.
template <typename T>
RowMatrix<T> paged_prefill_attention(const AttentionShape& shape, const RowMatrix<T>& q,
                                     const std::vector<std::int32_t>& qo_indptr,
                                     const PagedKVView<T>& cache,
                                     CostCounters* counters = nullptr) {
  RowMatrix<T> out;
  paged_prefill_attention(shape, q, qo_indptr, cache, out, counters);
  return out;
}

}  // namespace cpu
}  // namespace kvlab
