/// \file
/// \brief Decode attention: one or more new queries attend to a contiguous KV cache. Keys and
/// values are streamed once per K/V head for the whole GQA group. Checked against
/// `naive_attention` and a triple loop in the tests.
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
#include "kvlab/cpu/types.hpp"

namespace kvlab::cpu {

/// K/V elements (per tensor, all heads) below which `decode_attention` runs on one thread:
/// starting threads costs microseconds, more than streaming a cache this small.
constexpr long long kDecodeParallelMinElements = 1 << 16;

/// Attention of `q_len` new queries over the `cache.length` tokens of a contiguous cache.
///
/// The new tokens' keys and values must already be in the cache (append first, then attend):
/// query row `i` is the token at position `cache.length - q_len + i` and sees cache rows
/// `[0, cache.length - q_len + i]`. With `q_len == 1` (decode) it sees the whole cache and no
/// mask is needed; with the whole prompt as `q` (prefill) the mask is causal. The results equal
/// `naive_attention` on the cache's rows.
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
/// \param q         queries, [q_len, num_heads * head_dim], 1 <= q_len <= cache.length
/// \param cache     one layer of a contiguous cache, [num_kv_heads, capacity, head_dim] each
/// \param out       output, [q_len, num_heads * head_dim] (resized); must not be q
/// \param counters  if not null, receives the work done
/// \throws InvalidArgument for any shape or view that does not fit the above.
template <typename T>
void decode_attention(const AttentionShape& shape, const RowMatrix<T>& q,
                      const ContiguousKVView<T>& cache, RowMatrix<T>& out,
                      CostCounters* counters = nullptr) {
  constexpr const char* kWhere = "kvlab::cpu::decode_attention";
  detail::check_queries(kWhere, shape, q);
  detail::require_equal(kWhere, "cache.num_kv_heads", cache.num_kv_heads, shape.num_kv_heads(),
                        "shape.num_kv_heads()");
  detail::require_equal(kWhere, "cache.head_dim", cache.head_dim, shape.head_dim(),
                        "shape.head_dim()");
  if (cache.length < q.rows() || cache.length > cache.capacity) {
    detail::fail(kWhere, "cache.length",
                 "in [q.rows() (" + std::to_string(q.rows()) + "), cache.capacity (" +
                     std::to_string(cache.capacity) + ")]",
                 cache.length);
  }
  if (cache.k == nullptr || cache.v == nullptr) {
    detail::fail(kWhere, "cache.k / cache.v", "non-null pointers", "a null pointer");
  }
  if (&out == &q) detail::fail(kWhere, "out", "a matrix other than q", "q");

  const int q_len = static_cast<int>(q.rows());
  const int first_position = cache.length - q_len;  // position of query row 0
  out.resize(q_len, shape.q_width());

  const bool parallel =
      1LL * cache.length * shape.head_dim() * shape.num_kv_heads() >= kDecodeParallelMinElements;
  detail::parallel_for(shape.num_kv_heads(), parallel, [&](int hk) {
    detail::TileScratch<T> scratch;
    const detail::ContiguousRows<T> rows_of_head{cache, hk};  // rows pos at cache.key(hk, pos)
    for (int r0 = 0; r0 < q_len; r0 += kDecodeQueryTile) {
      const int rows = std::min(kDecodeQueryTile, q_len - r0);
      detail::attend_tile(shape, q, r0, rows, first_position + r0, hk, 1, rows_of_head, scratch,
                          out);
    }
  });

  if (counters != nullptr)
    detail::count_attention(shape, sizeof(T), q_len, first_position, *counters);
}

/// Returning form of `decode_attention`: `[q_len, num_heads * head_dim]`.
template <typename T>
RowMatrix<T> decode_attention(const AttentionShape& shape, const RowMatrix<T>& q,
                              const ContiguousKVView<T>& cache, CostCounters* counters = nullptr) {
  RowMatrix<T> out;
  decode_attention(shape, q, cache, out, counters);
  return out;
}

}  // namespace kvlab::cpu
