/// \file
/// \brief `RecomputeStore`: the `KVStore` of decoding without a cache.
///
/// It keeps each sequence's inputs, not its K and V, so every step runs the whole sequence through
/// every layer again and attends with `cpu::naive_attention` — Θ(t) K/V projections per step, Θ(n²)
/// over n tokens. It is the baseline that the caches are checked against
/// (`tests/store/test_kv_store.cpp`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/cpu/naive_attention.hpp"
#include "kvlab/matrix.hpp"
#include "kvlab/store/kv_store.hpp"

namespace kvlab {

/// Decoding without a cache, as a `KVStore`: each sequence keeps the layer-0 inputs of its
/// tokens (`[length, input_width]`: embeddings, or a toy model's input rows), and a step
/// computes every token of each of its sequences again.
///
/// At a step in which a sequence of `t` tokens adds `p`:
///  - `begin_step` gives the step all `t + p` rows of the sequence (first position 0): its kept
///    inputs, then the new ones;
///  - each layer projects K and V of all of them — the work a cache would have saved — and
///    `append` holds them for that layer only;
///  - `attend` runs `cpu::naive_attention` per sequence over those rows: the queries are all
///    `t + p` positions below the top layer (the next layer needs their outputs for its own K
///    and V), the `p` new ones at the top;
///  - `end_step` keeps the `p` new inputs.
/// So a one-layer model costs t + p K/V projections per step: over n tokens n(n+1)/2, Θ(n²).
/// Memory: the inputs, `length · input_width` values per sequence, and no K or V between steps.
/// With a sliding window of W keys each query's attention keeps its band (`cpu::naive_attention`
/// with the window): the oracle of the windowed stores.
template <typename T>
class RecomputeStore : public KVStore<T> {
 public:
  /// A store for a model of `num_layers` layers of `num_kv_heads` K/V heads of `head_dim`
  /// values, whose layer-0 inputs have `input_width` values per token.
  /// With `window` >= 1, each query attends to its last `window` keys.
  /// \throws InvalidArgument if any size is below 1 or `window` is negative.
  RecomputeStore(int num_layers, int num_kv_heads, int head_dim, int input_width, int window = 0)
      : KVStore<T>("kvlab::RecomputeStore", num_layers, num_kv_heads, head_dim),
        input_width_(input_width),
        window_(window) {
    detail::require_at_least("kvlab::RecomputeStore", "input_width", input_width, 1);
    detail::require_at_least("kvlab::RecomputeStore", "window", window, 0);
  }
  int window() const override { return window_; }

  const char* name() const override { return "recompute"; }
  /// The inputs are kept as given: "fp32" (or "fp64").
  const char* storage_name() const override { return KVStorage<T>::name(); }
  /// `input_width · sizeof(T)`: one input row per token (no K/V).
  std::size_t bytes_per_token() const override {
    return static_cast<std::size_t>(input_width_) * sizeof(T);
  }
  /// Values per token of the kept inputs.
  int input_width() const { return input_width_; }

  int add_sequence() override {
    inputs_.emplace(next_id_, RowMatrix<T>(0, input_width_));
    return next_id_++;
  }
  std::vector<int> sequences() const override {
    std::vector<int> ids;
    for (const auto& entry : inputs_) ids.push_back(entry.first);
    return ids;
  }
  std::size_t bytes_reserved() const override { return bytes_used(); }
  std::size_t bytes_used() const override {
    std::size_t rows = 0;
    for (const auto& entry : inputs_) rows += static_cast<std::size_t>(entry.second.rows());
    return rows * static_cast<std::size_t>(input_width_) * sizeof(T);
  }

  /// The kept inputs of `seq`: [length(seq), input_width].
  /// \throws InvalidArgument if `seq` is not live.
  const RowMatrix<T>& inputs(int seq) const {
    if (!do_contains(seq))
      detail::fail("kvlab::RecomputeStore::inputs", "seq", "a live sequence id", seq);
    return inputs_.at(seq);
  }

 protected:
  bool do_contains(int seq) const override { return inputs_.count(seq) != 0; }
  int do_length(int seq) const override { return static_cast<int>(inputs_.at(seq).rows()); }
  void do_free_sequence(int seq) override { inputs_.erase(seq); }
  int do_fork(int seq) override {
    inputs_.emplace(next_id_, inputs_.at(seq));  // the inputs are all there is to copy
    return next_id_++;
  }
  void do_truncate(int seq, int length) override {
    inputs_.at(seq).conservativeResize(length, Eigen::NoChange);
  }

  void do_begin_step(StepBatch& batch, const RowMatrix<T>& new_inputs, RowMatrix<T>& inputs,
                     const char* caller) override {
    detail::require_equal(caller, "new_inputs.cols()", static_cast<long>(new_inputs.cols()),
                          static_cast<long>(input_width_), "the store's input_width");
    // Every sequence is computed whole: its kept inputs, then its new ones.
    batch.row_indptr.assign(1, 0);
    batch.first_position.clear();
    for (int i = 0; i < batch.size(); ++i) {
      const int kept = do_length(batch.seq(i));
      batch.row_indptr.push_back(batch.row_indptr.back() + kept + batch.new_tokens(i));
      batch.first_position.push_back(0);
    }
    inputs.resize(batch.rows(), input_width_);  // [rows, input_width]
    for (int i = 0; i < batch.size(); ++i) {
      const RowMatrix<T>& kept = inputs_.at(batch.seq(i));  // [length, input_width]
      inputs.middleRows(batch.row_begin(i), kept.rows()) = kept;
      inputs.middleRows(batch.row_begin(i) + kept.rows(), batch.new_tokens(i)) =
          new_inputs.middleRows(batch.new_begin(i), batch.new_tokens(i));
    }
    pending_ = new_inputs;  // kept at end_step
  }

  void do_append(int /*layer*/, const RowMatrix<T>& k, const RowMatrix<T>& v) override {
    k_ = k;  // held for this layer's attend only: nothing is kept between steps
    v_ = v;
  }

  void do_attend(int /*layer*/, const AttentionShape& shape, const RowMatrix<T>& q,
                 const std::vector<std::int32_t>& q_indptr, RowMatrix<T>& out,
                 CostCounters* counters) override {
    const StepBatch& batch = this->step();
    if (batch.size() == 1) {  // one sequence: its rows are the whole of k_ and v_
      cpu::naive_attention(shape, q, k_, v_, out, counters, window_);
      return;
    }
    out.resize(q.rows(), shape.q_width());
    RowMatrix<T> part;  // [queries of one sequence, num_heads * head_dim]
    for (int i = 0; i < batch.size(); ++i) {
      const auto s = static_cast<std::size_t>(i);
      const int rows = batch.computed(i);
      cpu::naive_attention(shape, q.middleRows(q_indptr[s], q_indptr[s + 1] - q_indptr[s]),
                           k_.middleRows(batch.row_begin(i), rows),
                           v_.middleRows(batch.row_begin(i), rows), part, counters, window_);
      out.middleRows(q_indptr[s], part.rows()) = part;
    }
  }

  void do_end_step() override {
    const StepBatch& batch = this->step();
    for (int i = 0; i < batch.size(); ++i) {
      RowMatrix<T>& kept = inputs_.at(batch.seq(i));  // [length, input_width]
      const Eigen::Index length = kept.rows();
      kept.conservativeResize(length + batch.new_tokens(i), Eigen::NoChange);
      kept.bottomRows(batch.new_tokens(i)) =
          pending_.middleRows(batch.new_begin(i), batch.new_tokens(i));
    }
    release_step();
  }
  void do_abort_step() noexcept override { release_step(); }

 private:
  void release_step() noexcept {
    pending_.resize(0, 0);
    k_.resize(0, 0);
    v_.resize(0, 0);
  }

  int input_width_;
  int window_;                          // 0, or the window of every query's attention
  std::map<int, RowMatrix<T>> inputs_;  // seq -> [length, input_width]: the kept inputs
  int next_id_ = 0;
  RowMatrix<T> pending_;  // [new rows, input_width]: the open step's new inputs
  RowMatrix<T> k_;        // [step rows, num_kv_heads * head_dim]: the current layer's keys
  RowMatrix<T> v_;        // [step rows, num_kv_heads * head_dim]: the current layer's values
};

}  // namespace kvlab
