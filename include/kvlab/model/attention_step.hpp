/// \file
/// \brief `attention_step`: one layer's attention over the rows of a step, for every model.
///
/// It projects q, k and v, rotates them (RoPE) where the model has it, keeps k and v in a
/// `KVStore`, attends and projects back. Written once, with its counting, for every model (the toy
/// `AttentionStack` and `LlamaModel`) and every way of keeping K/V. Checked through the models:
/// every store gives the same outputs (`tests/store/test_kv_store.cpp`,
/// `tests/model/test_llama_model.cpp`).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/fault_points.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/cpu/layer_ops.hpp"
#include "kvlab/matrix.hpp"
#include "kvlab/model/phase_times.hpp"
#include "kvlab/model/rope.hpp"
#include "kvlab/store/kv_store.hpp"

namespace kvlab {

/// The four projections of one attention block, stored `[out, in]` as PyTorch's `Linear` and
/// llama2.c store them (references to a model's own matrices).
template <typename T>
struct AttentionWeights {
  const RowMatrix<T>& wq;  ///< [num_heads * head_dim, d_model]
  const RowMatrix<T>& wk;  ///< [num_kv_heads * head_dim, d_model]
  const RowMatrix<T>& wv;  ///< [num_kv_heads * head_dim, d_model]
  const RowMatrix<T>& wo;  ///< [d_model, num_heads * head_dim]
};

/// Buffers of one step, reused from layer to layer.
template <typename T>
struct StepScratch {
  RowMatrix<T> k;     ///< [step rows, num_kv_heads * head_dim]
  RowMatrix<T> v;     ///< [step rows, num_kv_heads * head_dim]
  RowMatrix<T> xq;    ///< [query rows, d_model]: the rows that need a query, when not all do
  RowMatrix<T> q;     ///< [query rows, num_heads * head_dim]
  RowMatrix<T> attn;  ///< [query rows, num_heads * head_dim]
};

/// The rows of `x` (one per row of the open step of `batch`) that carry on past the top layer:
/// the new tokens of each sequence, its last rows. When the step computes the new tokens only
/// (a store that keeps K and V) that is every row, and `out` is a copy of `x`.
/// \param batch  the step (see `StepBatch`)
/// \param x      [batch.rows(), width]
/// \param out    [batch.new_rows(), width] (resized); not `x`
/// \throws InvalidArgument (`out` unchanged) if `x` has not one row per step row, or `out` is `x`.
template <typename T>
void new_token_rows(const StepBatch& batch, const RowMatrix<T>& x, RowMatrix<T>& out) {
  constexpr const char* kWhere = "kvlab::new_token_rows";
  detail::require_equal(kWhere, "x.rows()", static_cast<long>(x.rows()),
                        static_cast<long>(batch.rows()), "batch.rows()");
  if (&out == &x) detail::fail(kWhere, "out", "a matrix other than x", "x");
  out.resize(batch.new_rows(), x.cols());
  for (int i = 0; i < batch.size(); ++i) {
    const int n = batch.new_tokens(i);  // the sequence's last n rows
    out.middleRows(batch.new_begin(i), n) =
        x.middleRows(batch.row_begin(i) + batch.computed(i) - n, n);
  }
}

/// The residual: `x += out`, where `out` is a layer's output for the step's query rows. When the
/// layer computed fewer rows than `x` holds (the top layer of a recomputing step: the new
/// tokens only), `x` is first cut to those rows (`new_token_rows`).
/// \param batch  the step
/// \param x      [batch.rows() or batch.new_rows(), width]: the residual stream (resized to
///               out's rows)
/// \param out    [batch.rows() or batch.new_rows(), width]
/// \throws InvalidArgument (`x` unchanged) if `out` has neither shape.
template <typename T>
void add_residual(const StepBatch& batch, RowMatrix<T>& x, const RowMatrix<T>& out) {
  constexpr const char* kWhere = "kvlab::add_residual";
  detail::require_equal(kWhere, "out.cols()", static_cast<long>(out.cols()),
                        static_cast<long>(x.cols()), "x.cols()");
  if (out.rows() != x.rows()) {  // the new tokens' rows only
    detail::require_equal(kWhere, "out.rows()", static_cast<long>(out.rows()),
                          static_cast<long>(batch.new_rows()), "x.rows() or the step's new rows");
    RowMatrix<T> kept;  // [new rows, width]
    new_token_rows(batch, x, kept);
    x = std::move(kept);
  }
  x += out;  // the residual
}

/// One layer's attention over the rows of the step open in `store` — the only place where kvlab
/// runs it (every model, every store):
///  1. `k = xb Wkᵀ`, `v = xb Wvᵀ` for every row the step computes (with `q = xb Wqᵀ` in the
///     same call when every row needs a query, see 3), and RoPE rotates each row of `k` to its
///     position (when the model has RoPE);
///  2. the store keeps k and v (`KVStore::append`: a cache stores them for later steps; the
///     recompute store holds them for this layer only);
///  3. `q = xb Wqᵀ` for the rows whose outputs carry on — every row, except in the top layer of
///     a recomputing step, where only the new tokens' outputs are needed — rotated the same way;
///  4. each sequence's queries attend to its keys and values (`KVStore::attend`: the store's
///     kernel);
///  5. `out = attention Woᵀ`, one row per query row.
/// Projections are counted here (`add_projection_counts`), attention by the store's kernel.
///
/// \param shape     the head layout of the layer
/// \param w         the layer's projections
/// \param rope      the rotary embedding, or null for a model without one
/// \param store     where K and V are kept; a step is open (`KVStore::begin_step`)
/// \param layer     the layer, in [0, store.num_layers())
/// \param top       true for the model's last layer
/// \param xb        [step rows, d_model]: the layer's (normalised) input, one row per step row
/// \param out       [query rows, d_model] (resized): the attention output, projected back
/// \param scratch   buffers reused from layer to layer
/// \param counters  receives the projections and the attention
/// \param times     where not null, receives the seconds of the projections (`matmuls`), of
///                  RoPE (`rope`) and of the store's append and attend (`attention`)
/// \throws InvalidArgument for shapes that do not fit; whatever the store throws.
template <typename T>
void attention_step(const AttentionShape& shape, const AttentionWeights<T>& w,
                    const RotaryEmbedding* rope, KVStore<T>& store, int layer, bool top,
                    const RowMatrix<T>& xb, RowMatrix<T>& out, StepScratch<T>& scratch,
                    CostCounters& counters, PhaseTimes* times = nullptr) {
  using detail::timed;
  const StepBatch& batch = store.step();
  detail::require_equal("kvlab::attention_step", "xb.rows()", static_cast<long>(xb.rows()),
                        static_cast<long>(batch.rows()), "the step's rows");
  // The rows whose outputs carry on, which need a query: every row, or in the top layer of a
  // recomputing step each sequence's new tokens (its last rows).
  const bool new_only = top && !batch.new_rows_only();
  const std::vector<std::int32_t>& q_indptr = new_only ? batch.new_indptr : batch.row_indptr;
  // 1. K and V of every row the step computes (and the queries, in the same call, when every
  // row needs one), rotated to their positions.
  timed(times, &PhaseTimes::matmuls, [&] {
    if (new_only) {
      cpu::linear(xb, {{w.wk, scratch.k}, {w.wv, scratch.v}});
    } else {
      cpu::linear(xb, {{w.wk, scratch.k}, {w.wv, scratch.v}, {w.wq, scratch.q}});
    }
  });
  timed(times, &PhaseTimes::rope, [&] {
    for (int i = 0; rope != nullptr && i < batch.size(); ++i) {
      rope->apply(scratch.k.middleRows(batch.row_begin(i), batch.computed(i)), batch.first(i));
    }
  });
  // 2. Keep them (or hold them for this layer).
  timed(times, &PhaseTimes::attention, [&] { store.append(layer, scratch.k, scratch.v); });
  KVLAB_FAULT_POINT("attention_step");  // a test's fault, after the store changed
  // 3. Queries of the rows whose outputs carry on, rotated the same way.
  if (new_only) {
    new_token_rows(batch, xb, scratch.xq);  // [query rows, d_model]
    timed(times, &PhaseTimes::matmuls, [&] { cpu::linear(scratch.xq, w.wq, scratch.q); });
  }
  timed(times, &PhaseTimes::rope, [&] {
    for (int i = 0; rope != nullptr && i < batch.size(); ++i) {
      const auto s = static_cast<std::size_t>(i);
      const int n = q_indptr[s + 1] - q_indptr[s];  // the sequence's queries: its last n rows
      rope->apply(scratch.q.middleRows(q_indptr[s], n), batch.first(i) + batch.computed(i) - n);
    }
  });
  // 4. Each sequence's queries attend to its keys and values.
  timed(times, &PhaseTimes::attention,
        [&] { store.attend(layer, shape, scratch.q, q_indptr, scratch.attn, &counters); });
  // 5. Back to the model's width.
  timed(times, &PhaseTimes::matmuls, [&] { cpu::linear(scratch.attn, w.wo, out); });
  add_projection_counts(shape, static_cast<int>(xb.cols()),
                        static_cast<std::uint64_t>(scratch.q.rows()),
                        static_cast<std::uint64_t>(xb.rows()),
                        static_cast<std::uint64_t>(scratch.q.rows()), counters);
}

}  // namespace kvlab
