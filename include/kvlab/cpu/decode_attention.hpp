/// \file
/// \brief Decode attention: one or more new queries attend to a contiguous KV cache. Keys and
/// values are streamed once per K/V head for the whole GQA group. Checked against
/// `naive_attention` and a triple loop in the tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>

#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/core/views.hpp"
#include "kvlab/cpu/checks.hpp"
#include "kvlab/cpu/softmax.hpp"
#include "kvlab/cpu/types.hpp"

namespace kvlab::cpu {

/// Query rows processed together by `decode_attention` (a decode step has one).
constexpr int kDecodeQueryTile = 16;

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
/// are gathered; then
///  1. the key rows are streamed once, and each one is scored against every gathered query;
///  2. each query's visible scores are softmaxed;
///  3. the value rows are streamed once, and each one is added to every query's output with
///     its probability as weight.
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
  const int group = shape.group_size();
  const int hd = shape.head_dim();
  const T scale = static_cast<T>(shape.scale());
  out.resize(q_len, shape.q_width());

  std::exception_ptr error;  // the first exception of any K/V head; none may leave the loop
  const bool parallel = 1LL * cache.length * hd * shape.num_kv_heads() >= kDecodeParallelMinElements;
  (void)parallel;  // unused without OpenMP
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (int hk = 0; hk < shape.num_kv_heads(); ++hk) try {
    RowMatrix<T> queries;  // [rows * group, head_dim]: query (row i, head hk*group + j) at i*group + j
    RowMatrix<T> probs;    // [rows * group, span]: scores, then probabilities
    RowMatrix<T> acc;      // [rows * group, head_dim]: outputs
    for (int r0 = 0; r0 < q_len; r0 += kDecodeQueryTile) {
      const int rows = std::min(kDecodeQueryTile, q_len - r0);
      const int m = rows * group;
      const int span = first_position + r0 + rows;  // keys seen by the tile's last row
      queries.resize(m, hd);
      for (int i = 0; i < rows; ++i)
        for (int j = 0; j < group; ++j)
          queries.row(i * group + j) = q.block(r0 + i, (hk * group + j) * hd, 1, hd);
      // Query qi of the tile sees keys [0, shared + qi / group]: all of them see [0, shared),
      // and the tile's later rows see up to `rows - 1` more (the causal corner).
      const int shared = first_position + r0 + 1;
      const auto visible = [&](int qi) { return shared + qi / group; };
      // The first query of the tile that sees key `pos` (0 outside the corner).
      const auto first_seeing = [&](int pos) { return pos < shared ? 0 : (pos - shared + 1) * group; };

      // 1. Scores: each key row is read once and met by every query of the tile.
      probs.resize(m, span);
      for (int pos = 0; pos < span; ++pos) {
        const Eigen::Map<const RowVector<T>> key(cache.key(hk, pos), hd);  // [head_dim]
        for (int qi = first_seeing(pos); qi < m; ++qi)
          probs(qi, pos) = scale * queries.row(qi).dot(key);
      }
      // 2. Softmax of each query's visible scores.
      for (int qi = 0; qi < m; ++qi) softmax_inplace(&probs(qi, 0), visible(qi));
      // 3. Values: each value row is read once and added to every query's sum.
      acc.setZero(m, hd);
      for (int pos = 0; pos < span; ++pos) {
        const Eigen::Map<const RowVector<T>> value(cache.value(hk, pos), hd);  // [head_dim]
        for (int qi = first_seeing(pos); qi < m; ++qi) acc.row(qi) += probs(qi, pos) * value;
      }
      for (int qi = 0; qi < m; ++qi)
        out.block(r0 + qi / group, (hk * group + qi % group) * hd, 1, hd) = acc.row(qi);
    }
  } catch (...) {
#if defined(_OPENMP)
#pragma omp critical(kvlab_decode_attention_error)
#endif
    if (!error) error = std::current_exception();
  }
  if (error) std::rethrow_exception(error);

  if (counters != nullptr) {
    // Query row i sees first_position + i + 1 keys; every tile streams the rows its last row sees.
    const auto n = static_cast<std::uint64_t>(q_len);
    const std::uint64_t dots = static_cast<std::uint64_t>(shape.num_heads()) *
                               (n * static_cast<std::uint64_t>(first_position) + n * (n + 1) / 2);
    std::uint64_t rows_streamed = 0;
    for (int r0 = 0; r0 < q_len; r0 += kDecodeQueryTile)
      rows_streamed += static_cast<std::uint64_t>(first_position + r0 + std::min(kDecodeQueryTile, q_len - r0));
    counters->qk_dots += dots;
    counters->macs += 2 * dots * static_cast<std::uint64_t>(hd);
    counters->kv_bytes_read += 2 * sizeof(T) * rows_streamed *
                               static_cast<std::uint64_t>(shape.num_kv_heads()) *
                               static_cast<std::uint64_t>(hd);
  }
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
