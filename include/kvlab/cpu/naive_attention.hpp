/// \file
/// \brief Naive causal attention: the textbook form of `cpu::reference_attention`.
///
/// Every score of the `[q_len, kv_len]` matrix is computed and stored, then masked, softmaxed and
/// multiplied by V, with matrix products. Checked against `cpu::reference_attention` in the tests.
#pragma once

#include <cstdint>

#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/core/views.hpp"
#include "kvlab/cpu/checks.hpp"
#include "kvlab/cpu/softmax.hpp"
#include "kvlab/matrix.hpp"

namespace kvlab::cpu {

namespace detail {

/// `naive_attention` on checked-shape views (internal: the public form checks and binds them).
template <typename T>
void naive_attention(const AttentionShape& shape, const RowMatrixRef<T>& q,
                     const RowMatrixRef<T>& k, const RowMatrixRef<T>& v, RowMatrix<T>& out,
                     CostCounters* counters, int window) {
  constexpr const char* kWhere = "kvlab::cpu::naive_attention";
  check_queries(kWhere, shape, q);
  kvlab::detail::require_at_least(kWhere, "window", window, 0);
  kvlab::detail::require_equal(kWhere, "k.cols()", static_cast<long>(k.cols()),
                               static_cast<long>(shape.kv_width()), "num_kv_heads * head_dim");
  kvlab::detail::require_equal(kWhere, "v.rows()", static_cast<long>(v.rows()),
                               static_cast<long>(k.rows()), "k.rows()");
  kvlab::detail::require_equal(kWhere, "v.cols()", static_cast<long>(v.cols()),
                               static_cast<long>(shape.kv_width()), "num_kv_heads * head_dim");
  if (k.rows() < q.rows()) {
    kvlab::detail::fail(kWhere, "k.rows()", ">= q.rows() (" + std::to_string(q.rows()) + ")",
                        k.rows());
  }
  if (shares_memory(out, q) || shares_memory(out, k) || shares_memory(out, v)) {
    kvlab::detail::fail(kWhere, "out", "a matrix other than q, k and v", "one of them");
  }

  const Eigen::Index q_len = q.rows();
  const Eigen::Index kv_len = k.rows();
  const Eigen::Index first_position = kv_len - q_len;  // position of query row 0
  const int hd = shape.head_dim();
  const T scale = static_cast<T>(shape.scale());

  out.resize(q_len, shape.q_width());
  RowMatrix<T> scores(q_len, kv_len);  // [q_len, kv_len], one head at a time
  for (int h = 0; h < shape.num_heads(); ++h) {
    const int hk = shape.kv_head_of(h);
    const auto q_h = q.middleCols(h * hd, hd);   // [q_len, head_dim]
    const auto k_h = k.middleCols(hk * hd, hd);  // [kv_len, head_dim]
    const auto v_h = v.middleCols(hk * hd, hd);  // [kv_len, head_dim]

    // 1. Every score, masked or not.
    scores.noalias() = scale * (q_h * k_h.transpose());
    for (Eigen::Index i = 0; i < q_len; ++i) {
      // 2. Query i sees keys [start, first_position + i] — start 0, or its window's first key
      // — and the others get probability 0.
      const Eigen::Index visible = first_position + i + 1;
      const Eigen::Index start = first_visible_key(static_cast<int>(first_position + i), window);
      softmax_inplace(scores.row(i).data() + start, visible - start);
      scores.row(i).head(start).setZero();
      scores.row(i).tail(kv_len - visible).setZero();
    }
    // 3. Probability-weighted sum of the values.
    out.middleCols(h * hd, hd).noalias() = scores * v_h;
  }

  if (counters != nullptr) {  // every score; K/V rows read once per query head (a GEMM each)
    const auto kv = static_cast<std::uint64_t>(kv_len);
    add_attention_counts(shape, sizeof(T) * static_cast<std::size_t>(hd),
                         static_cast<std::uint64_t>(q_len) * kv,
                         kv * static_cast<std::uint64_t>(shape.group_size()), *counters);
  }
}

}  // namespace detail

/// Causal attention over a whole sequence, materialising the score matrix of every head: it
/// computes what `reference_attention` computes, with matrix products.
///
/// Queries are aligned to the end of the keys: query row `i` is the token at position
/// `kv_len - q_len + i` and sees keys `[0, kv_len - q_len + i]`. With `q_len == kv_len` this is
/// ordinary causal self-attention; with `q_len == 1` it is one decode step.
///
/// For every query head `h` (reading K/V head `h / group_size`):
///  1. `S = scale * Q_h K_h^T`, all `[q_len, kv_len]` entries, masked ones included;
///  2. each row's masked tail is dropped and the visible part softmaxed;
///  3. `O_h = P V_h`.
///
/// With a sliding window of `window` keys (>= 1; see `reference_attention`) each row keeps only
/// its band: the scores before it get probability 0 too.
///
/// Counts `q_len * kv_len` dot products per query head (all of them, since all are computed).
/// `q`, `k` and `v` may be any Eigen expressions of one scalar type: a `RowMatrix`, its rows
/// and row blocks are read in place, other layouts (column-major) are copied once.
///
/// \param shape     the head layout
/// \param q         queries, [q_len, num_heads * head_dim], q_len >= 1
/// \param k         keys,    [kv_len, num_kv_heads * head_dim], kv_len >= q_len
/// \param v         values,  [kv_len, num_kv_heads * head_dim]
/// \param out       output,  [q_len, num_heads * head_dim] (resized); must not share memory
///                  with q, k or v
/// \param counters  if not null, receives the work done
/// \param window    W >= 1: each query sees its last W keys; 0 (default): all up to itself
/// \throws InvalidArgument for any shape that does not fit the above, or a negative window
///         (out is then unchanged).
template <typename Q, typename K, typename V, typename T = typename Q::Scalar>
void naive_attention(const AttentionShape& shape, const Eigen::MatrixBase<Q>& q,
                     const Eigen::MatrixBase<K>& k, const Eigen::MatrixBase<V>& v,
                     RowMatrix<T>& out, CostCounters* counters = nullptr, int window = 0) {
  detail::require_scalar<Q, T>();
  detail::require_scalar<K, T>();
  detail::require_scalar<V, T>();
  detail::naive_attention<T>(shape, q, k, v, out, counters, window);
}

/// Returning form of `naive_attention`: `[q_len, num_heads * head_dim]`.
template <typename Q, typename K, typename V, typename T = typename Q::Scalar>
RowMatrix<T> naive_attention(const AttentionShape& shape, const Eigen::MatrixBase<Q>& q,
                             const Eigen::MatrixBase<K>& k, const Eigen::MatrixBase<V>& v,
                             CostCounters* counters = nullptr, int window = 0) {
  RowMatrix<T> out;
  naive_attention(shape, q, k, v, out, counters, window);
  return out;
}

}  // namespace kvlab::cpu
