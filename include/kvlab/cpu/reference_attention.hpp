/// \file
/// \brief `cpu::reference_attention`: causal grouped-query attention written as plain loops.
///
/// It is written the way llama2.c's `run.c` writes it, with an optional sliding window: the oracle
/// that every other attention path in kvlab computes (naive, decode and paged, on the CPU and on
/// the GPU) and is tested against.
#pragma once

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/matrix.hpp"

namespace kvlab::cpu {

/// Causal attention of `q_len` queries over `kv_len` keys and values, one query head and one
/// query token at a time, with nothing cached, tiled or reordered: the definition that kvlab's
/// kernels are checked against.
///
/// Query row `i` is the token at position `first_position + i`; it sees the keys at positions
/// `0 .. first_position + i` (the causal mask) and nothing after them. For query head `h`, which
/// reads K/V head `hk = shape.kv_head_of(h)`:
///
///     score[j]   = scale · q[i, h] · k[j, hk]                for j = 0 .. first_position + i
///     p[j]       = exp(score[j] − max score) / Σ exp(score − max score)
///     out[i, h]  = Σ_j p[j] · v[j, hk]
///
/// - prefill: `first_position = 0`, `q_len = kv_len` (each prompt token sees itself and those
///   before it);
/// - decode: `q_len = 1`, `first_position = kv_len − 1` (the new token sees every key);
/// - chunked prefill: a chunk of `q_len` tokens after `first_position` cached ones.
///
/// **Sliding window** (`window` = W >= 1; 0, the default, is none): the query at position i sees
/// the W keys ending with its own, positions j with **i − W < j <= i** — the band mask. This is
/// the convention of Hugging Face transformers, vLLM and llama.cpp, and FlashInfer's
/// `window_left = W − 1`; the Mistral paper's text describes a token attending to the W tokens
/// before it (W + 1 keys with its own). kvlab follows the libraries: W keys, the current one
/// included, so W = 1 attends to the token itself only. With W at least the sequence's length the
/// band is the whole causal mask.
///
/// **Attention sinks** (`sinks` = S >= 1, with a window; StreamingLLM, Xiao et al. 2023): the
/// query also sees the sequence's first S keys, positions j < S, where they have left its band —
/// keys j with j < S or i − W < j <= i. The keys are those the cache holds, rotated by their own
/// positions (kvlab caches keys after RoPE), so a sink at 0 and a query at i are i apart;
/// StreamingLLM's code instead renumbers the S + W kept keys and rotates them again at every
/// step. For a model trained with full attention the two differ once i >= W; kvlab keeps the
/// positions the model was trained with, and re-rotating needs the keys before RoPE.
///
/// The sums are in double, so that the oracle's own rounding stays far below that of the float
/// kernels it checks. Cost: Θ(q_len · kv_len · num_heads · head_dim); for tests and lessons.
///
/// `q`, `k` and `v` may be any Eigen expressions of one scalar type (a `RowMatrix`, `m.row(t)`,
/// `m.middleRows(a, n)`, a column-major `Eigen::MatrixXf`): they are read element by element.
///
/// \param shape           the head layout (heads, K/V heads, head_dim, scale)
/// \param q               queries, [q_len, num_heads * head_dim], q_len >= 1
/// \param k               keys,    [kv_len, num_kv_heads * head_dim]
/// \param v               values,  [kv_len, num_kv_heads * head_dim]
/// \param first_position  position of query row 0, in [0, kv_len - q_len]
/// \param window          W >= 1: each query sees its last W keys (the band); 0: all of them
/// \param sinks           S >= 1 (with a window): each query also sees keys [0, S)
/// \return                [q_len, num_heads * head_dim]
/// \throws InvalidArgument for a shape, position, window or sinks that do not fit the above.
template <typename Q, typename K, typename V, typename T = typename Q::Scalar>
RowMatrix<T> reference_attention(const AttentionShape& shape, const Eigen::MatrixBase<Q>& q,
                                 const Eigen::MatrixBase<K>& k, const Eigen::MatrixBase<V>& v,
                                 int first_position, int window = 0, int sinks = 0) {
  static_assert(
      std::is_same<typename K::Scalar, T>::value && std::is_same<typename V::Scalar, T>::value,
      "reference_attention: q, k and v must have one scalar type");
  constexpr const char* kWhere = "kvlab::cpu::reference_attention";
  const long q_len = static_cast<long>(q.rows());
  const long kv_len = static_cast<long>(k.rows());
  kvlab::detail::require_at_least(kWhere, "q.rows()", q_len, 1L);
  kvlab::detail::require_equal(kWhere, "q.cols()", static_cast<long>(q.cols()),
                               static_cast<long>(shape.q_width()), "num_heads * head_dim");
  kvlab::detail::require_equal(kWhere, "k.cols()", static_cast<long>(k.cols()),
                               static_cast<long>(shape.kv_width()), "num_kv_heads * head_dim");
  kvlab::detail::require_equal(kWhere, "v.rows()", static_cast<long>(v.rows()), kv_len, "k.rows()");
  kvlab::detail::require_equal(kWhere, "v.cols()", static_cast<long>(v.cols()),
                               static_cast<long>(shape.kv_width()), "num_kv_heads * head_dim");
  if (first_position < 0 || first_position > kv_len - q_len) {
    kvlab::detail::fail(kWhere, "first_position",
                        "in [0, k.rows() - q.rows()] = [0, " + std::to_string(kv_len - q_len) + "]",
                        first_position);
  }
  kvlab::detail::require_at_least(kWhere, "window", window, 0);
  kvlab::detail::require_at_least(kWhere, "sinks", sinks, 0);
  if (sinks > 0 && window == 0) {
    kvlab::detail::fail(kWhere, "sinks", "0 without a window (every key is seen)", sinks);
  }

  // [loops]
  const int hd = shape.head_dim();
  RowMatrix<T> out(q.rows(), shape.q_width());  // [q_len, num_heads * head_dim]
  std::vector<long> seen;                       // [keys seen]: their positions
  std::vector<double> p;                        // [keys seen]: scores, then probabilities
  for (int h = 0; h < shape.num_heads(); ++h) {
    const int hk = shape.kv_head_of(h);  // the K/V head this query head reads
    for (long i = 0; i < q_len; ++i) {
      const long last = first_position + i;  // the causal mask: keys 0 .. last
      // the band: keys first .. last, the last `window` of them (all with no window)
      const long first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
      // the sinks that left the band: keys 0 .. sink_end - 1 (none without sinks)
      const long sink_end = sinks < first ? sinks : first;
      seen.clear();
      for (long j = 0; j < sink_end; ++j) seen.push_back(j);
      for (long j = first; j <= last; ++j) seen.push_back(j);
      p.assign(seen.size(), 0.0);  // p[n] for key seen[n]
      // 1. One score per visible key: the scaled dot product of the query with the key.
      double max_score = -INFINITY;
      for (std::size_t n = 0; n < seen.size(); ++n) {
        const long j = seen[n];
        double dot = 0;
        for (int c = 0; c < hd; ++c) dot += double(q(i, h * hd + c)) * double(k(j, hk * hd + c));
        const double score = shape.scale() * dot;
        p[n] = score;
        if (score > max_score) max_score = score;
      }
      // 2. Softmax: exp(score - max) (the max subtracted, so no exponent overflows), normalised.
      double sum = 0;
      for (double& x : p) sum += (x = std::exp(x - max_score));
      // 3. The probability-weighted sum of the visible value rows.
      for (int c = 0; c < hd; ++c) {
        double acc = 0;
        for (std::size_t n = 0; n < seen.size(); ++n) acc += p[n] * double(v(seen[n], hk * hd + c));
        out(i, h * hd + c) = static_cast<T>(acc / sum);
      }
    }
  }
  // [loops]
  return out;
}

/// `reference_attention` with the queries aligned to the end of the keys: query row `i` at
/// position `kv_len - q_len + i` (prefill when q_len = kv_len, decode when q_len = 1).
/// \throws InvalidArgument as the five-argument form (also if `q_len > kv_len`).
template <typename Q, typename K, typename V, typename T = typename Q::Scalar>
RowMatrix<T> reference_attention(const AttentionShape& shape, const Eigen::MatrixBase<Q>& q,
                                 const Eigen::MatrixBase<K>& k, const Eigen::MatrixBase<V>& v) {
  return reference_attention(shape, q, k, v, static_cast<int>(k.rows() - q.rows()));
}

}  // namespace kvlab::cpu
