/// \file
/// \brief Decode attention: one or more new queries attend to a contiguous KV cache.
///
/// Keys and values are streamed once per K/V head for the whole GQA group. Computes
/// `cpu::reference_attention`; checked against it and `naive_attention` in the tests.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/core/views.hpp"
#include "kvlab/cpu/attention_tile.hpp"
#include "kvlab/cpu/checks.hpp"
#include "kvlab/cpu/parallel.hpp"
#include "kvlab/matrix.hpp"

namespace kvlab::cpu {

/// K/V elements read (per tensor, all heads, counted once per query row: a decode step reads
/// its cache once, a prefill chunk of q rows q times) below which the CPU attention kernels run
/// on one thread: starting threads costs microseconds, more than such a small call. Counting
/// the rows matters for a prefill chunk over a short cache: on one thread there, the fp32 path's
/// matrix products went to Eigen's own threads, one short parallel product at a time, whose
/// waits made a prefill in chunks of 64 on two threads slower than on one
/// (`bench/results/README.md`, "a prefill chunk's threads").
constexpr long long kDecodeParallelMinElements = 1 << 16;

namespace detail {

/// `decode_attention` on a bound view of the queries (internal: see the public form).
template <typename T, typename S>
void decode_attention(const AttentionShape& shape, const RowMatrixRef<T>& q,
                      const ContiguousKVView<S>& cache, RowMatrix<T>& out, CostCounters* counters) {
  constexpr const char* kWhere = "kvlab::cpu::decode_attention";
  check_queries(kWhere, shape, q);
  kvlab::detail::require_equal(kWhere, "cache.num_kv_heads", cache.num_kv_heads,
                               shape.num_kv_heads(), "shape.num_kv_heads()");
  kvlab::detail::require_equal(kWhere, "cache.head_dim", cache.head_dim, shape.head_dim(),
                               "shape.head_dim()");
  kvlab::detail::require_storage_head_dim<S>(kWhere, cache.head_dim);
  kvlab::detail::check_contiguous_length(kWhere, "q.rows()", q.rows(), cache);
  if (cache.k == nullptr || cache.v == nullptr) {
    kvlab::detail::fail(kWhere, "cache.k / cache.v", "non-null pointers", "a null pointer");
  }
  if (shares_memory(out, q)) kvlab::detail::fail(kWhere, "out", "a matrix other than q", "q");

  const int q_len = static_cast<int>(q.rows());
  const int first_position = cache.length - q_len;  // position of query row 0
  out.resize(q_len, shape.q_width());

  const bool parallel = 1LL * q_len * cache.length * shape.head_dim() * shape.num_kv_heads() >=
                        kDecodeParallelMinElements;
  // In parallel each K/V head is an item, and its tiles read one head's rows. A cache too small
  // to be worth threads (under kDecodeParallelMinElements per tensor, once per query row: at
  // most 512 KiB of fp32 K and V) is one item whose tiles take every head at once:
  // each token's rows of all heads are read together, so the walk over the tokens is paid once,
  // not once per head (`attend_partial` computes the same whatever its `heads`).
  const int heads_per_item = parallel ? 1 : shape.num_kv_heads();
  parallel_for(shape.num_kv_heads() / heads_per_item, parallel, [&](int item) {
    TileScratch<T> scratch;
    const int hk0 = item * heads_per_item;
    const ContiguousRows<S> rows_of_heads{cache, hk0};  // rows pos at cache.key(hk0 + j, pos)
    for (int r0 = 0; r0 < q_len; r0 += kDecodeQueryTile) {
      AttentionTile tile;  // rows [r0, r0 + rows) of q, the query heads of the item's K/V heads
      tile.row0 = r0;
      tile.rows = std::min(kDecodeQueryTile, q_len - r0);
      tile.first_position = first_position + r0;
      tile.hk0 = hk0;
      tile.heads = heads_per_item;
      tile.window = cache.window;
      tile.sinks = cache.sinks;
      attend_tile(shape, q, tile, rows_of_heads, scratch, out);
    }
  });

  if (counters != nullptr)
    count_tiled_attention(shape, storage_row_bytes<S>(shape.head_dim()), q_len, first_position,
                          *counters, cache.window, cache.sinks);
}

}  // namespace detail

/// Attention of `q_len` new queries over the `cache.length` tokens of a contiguous cache.
///
/// The new tokens' keys and values must already be in the cache (append first, then attend):
/// query row `i` is the token at position `cache.length - q_len + i` and sees cache rows
/// `[0, cache.length - q_len + i]`. With `q_len == 1` (decode) it sees the whole cache and no
/// mask is needed; with the whole prompt as `q` (prefill) the mask is causal. It computes what
/// `reference_attention` computes over the cache's rows (and so equals `naive_attention` on them,
/// to rounding). With a window (`cache.window` = W >= 1) each query sees its last W keys, read
/// from the cache's ring of slots (`ContiguousKVView`), as `reference_attention` with that window
/// computes them; with attention sinks (`cache.sinks` = S) also the first S keys, attended as a
/// second key range and merged by the log-sum-exp rule (`detail::attend_sinks`). A cache that
/// stores its rows in another type than `T` (fp16, bf16, int8, int4: `KVStorage<S>`) has each row
/// decoded as the kernel reads it (int8 and int4 rows block by block, each block's scale taken out
/// of its sum; fp16 and bf16 rows eight values at a time in vector registers where the build has
/// that form: `cpu/row_runs.hpp`), and the result is that attention over the decoded rows.
///
/// For each K/V head, the queries of its group (and of up to `kDecodeQueryTile` query rows)
/// are gathered (`detail::attend_tile`, shared with the paged kernels); then
///  1. the key rows are streamed once, and each one is scored against every gathered query;
///  2. each query's visible scores s become exp(s - max) (max: the query's largest score), and
///     their sum is kept;
///  3. the value rows are streamed once, and each one is added to every query's output with
///     its weight exp(s - max); the output is finally divided by the sum — the softmax-weighted
///     sum of the values.
/// So K and V are read once per K/V head for the whole group (and once more per further tile
/// of query rows in a prefill), not once per query head. Only visible (unmasked) scores are
/// computed. K/V heads run in parallel when OpenMP is enabled; an exception in one of them
/// (out of memory) is passed on to the caller after the loop.
///
/// \param shape     the head layout; `cache` must have its num_kv_heads and head_dim
/// \param q         queries, [q_len, num_heads * head_dim], 1 <= q_len <= cache.length: any
///                  Eigen expression of scalar T (`q.row(t)`, `q.middleRows(a, n)` are read in
///                  place; a column-major matrix is copied once)
/// \param cache     one layer of a contiguous cache, [num_kv_heads, capacity, head_dim] each,
///                  stored as `S` (head_dim a multiple of `KVStorage<S>::kValues`)
/// \param out       output, [q_len, num_heads * head_dim] (resized); must not share memory with q
/// \param counters  if not null, receives the work done
/// \throws InvalidArgument for any shape or view that does not fit the above.
template <typename Q, typename T, typename S>
void decode_attention(const AttentionShape& shape, const Eigen::MatrixBase<Q>& q,
                      const ContiguousKVView<S>& cache, RowMatrix<T>& out,
                      CostCounters* counters = nullptr) {
  detail::require_scalar<Q, T>();
  detail::decode_attention<T, S>(shape, q, cache, out, counters);
}

/// Returning form of `decode_attention`: `[q_len, num_heads * head_dim]`, in q's scalar type.
template <typename Q, typename S>
RowMatrix<typename Q::Scalar> decode_attention(const AttentionShape& shape,
                                               const Eigen::MatrixBase<Q>& q,
                                               const ContiguousKVView<S>& cache,
                                               CostCounters* counters = nullptr) {
  RowMatrix<typename Q::Scalar> out;
  decode_attention(shape, q, cache, out, counters);
  return out;
}

}  // namespace kvlab::cpu
