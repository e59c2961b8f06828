/// \file
/// \brief `NaiveDecoder`: decoding without a cache. Every step re-projects K and V for the
/// whole prefix (and, below the top layer, recomputes every position), as a model without a
/// cache must. The baseline that `CachedDecoder` is checked against.
#pragma once

#include <memory>
#include <utility>

#include "kvlab/core/counters.hpp"
#include "kvlab/cpu/naive_attention.hpp"
#include "kvlab/cpu/types.hpp"
#include "kvlab/model/attention_layer.hpp"
#include "kvlab/model/decoder.hpp"

namespace kvlab {

/// A decoder that keeps only its inputs and recomputes from them at every step.
///
/// At step t (t tokens so far, p of them new) each layer:
///  1. projects K and V for all t tokens — the work a cache would have saved;
///  2. projects queries only where an output is needed: all t positions below the top layer
///     (the next layer needs their outputs for its own K and V), the p new ones at the top;
///  3. runs `cpu::naive_attention`, which materialises the [queries, t] score matrix.
///
/// So a one-layer model costs t K/V projections and t scores per query head per step: over n
/// steps n(n+1)/2 of each, Θ(n²). A deeper model also recomputes t positions in each lower
/// layer: t² scores per head per lower layer per step, Θ(n³) in total. Memory: the inputs,
/// [t, d_model].
template <typename T>
class NaiveDecoder : public Decoder<T> {
 public:
  /// A decoder running `stack`, with no token yet.
  explicit NaiveDecoder(std::shared_ptr<const AttentionStack<T>> stack)
      : Decoder<T>(std::move(stack)), inputs_(0, this->stack().d_model()) {}

 protected:
  RowMatrix<T> forward(const RowMatrix<T>& x, CostCounters& counters) override {
    const AttentionStack<T>& stack = this->stack();
    const Eigen::Index p = x.rows();
    RowMatrix<T> all(inputs_.rows() + p, stack.d_model());  // [t, d_model]: every input so far
    all << inputs_, x;
    const Eigen::Index t = all.rows();

    RowMatrix<T> h = all;  // [rows, d_model]: the current layer's input
    RowMatrix<T> k, v;     // [t, num_kv_heads * head_dim]
    for (int l = 0; l < stack.num_layers(); ++l) {
      const AttentionLayer<T>& layer = stack.layer(l);
      const bool top = (l + 1 == stack.num_layers());
      const Eigen::Index rows = top ? p : t;  // positions whose output is needed
      // 1. K and V of the whole prefix, again.
      layer.project_kv(h, k, v, &counters);
      // 2. Queries of the positions that need an output.
      const RowMatrix<T> h_rows = h.bottomRows(rows);             // [rows, d_model]
      const RowMatrix<T> q = layer.project_q(h_rows, &counters);  // [rows, num_heads * head_dim]
      // 3. Attention over the whole prefix, then the output projection and the residual.
      const RowMatrix<T> attn = cpu::naive_attention(layer.shape(), q, k, v, &counters);
      h = h_rows + layer.project_out(attn, &counters);
    }
    inputs_ = std::move(all);
    return h;  // [p, d_model]
  }

  void truncate(int position) override { inputs_.conservativeResize(position, Eigen::NoChange); }

 private:
  RowMatrix<T> inputs_;  // [position, d_model]: every token fed so far
};

}  // namespace kvlab
