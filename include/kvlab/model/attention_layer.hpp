/// \file
/// \brief The small model that kvlab's decoders run, and one step of it.
///
/// `AttentionLayer` holds the projection weights Wq, Wk, Wv, Wo of one layer and `AttentionStack`
/// is a residual stack of them; `run_stack` is one step of the stack over a ragged batch of
/// sequences of a `KVStore`.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/random.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/cpu/layer_ops.hpp"
#include "kvlab/matrix.hpp"
#include "kvlab/model/attention_step.hpp"
#include "kvlab/store/kv_store.hpp"

namespace kvlab {

/// The four projections of one attention layer.
///
/// Weights are stored `[out, in]` (as PyTorch's `Linear` and llama2.c store them), and a row
/// of tokens `x` (`[n, d_model]`) is projected as `x * W^T`:
///  - `q = x * Wq^T`: `[n, num_heads * head_dim]`
///  - `k = x * Wk^T`, `v = x * Wv^T`: `[n, num_kv_heads * head_dim]`
///  - `y = attn * Wo^T`: `[n, d_model]`
template <typename T>
class AttentionLayer {
 public:
  /// A layer with the given weights.
  /// \param shape    the head layout
  /// \param d_model  width of the layer's input and output, >= 1
  /// \param wq       [num_heads * head_dim, d_model]
  /// \param wk       [num_kv_heads * head_dim, d_model]
  /// \param wv       [num_kv_heads * head_dim, d_model]
  /// \param wo       [d_model, num_heads * head_dim]
  /// \throws InvalidArgument if a weight has the wrong shape or d_model < 1.
  AttentionLayer(const AttentionShape& shape, int d_model, RowMatrix<T> wq, RowMatrix<T> wk,
                 RowMatrix<T> wv, RowMatrix<T> wo)
      : shape_(shape),
        d_model_(d_model),
        wq_(std::move(wq)),
        wk_(std::move(wk)),
        wv_(std::move(wv)),
        wo_(std::move(wo)) {
    constexpr const char* kWhere = "kvlab::AttentionLayer";
    detail::require_at_least(kWhere, "d_model", d_model, 1);
    check_weight(kWhere, "wq", wq_, shape.q_width(), d_model);
    check_weight(kWhere, "wk", wk_, shape.kv_width(), d_model);
    check_weight(kWhere, "wv", wv_, shape.kv_width(), d_model);
    check_weight(kWhere, "wo", wo_, d_model, shape.q_width());
  }

  /// A layer with weights drawn uniformly from `[-1/sqrt(in), 1/sqrt(in))` by `rng`, so that
  /// activations keep their scale through the projections.
  /// \throws InvalidArgument if `d_model < 1`.
  static AttentionLayer random(const AttentionShape& shape, int d_model, Rng& rng) {
    detail::require_at_least("kvlab::AttentionLayer::random", "d_model", d_model, 1);
    const double a = 1.0 / std::sqrt(static_cast<double>(d_model));
    const double b = 1.0 / std::sqrt(static_cast<double>(shape.q_width()));
    RowMatrix<T> wq = random_matrix<T>(shape.q_width(), d_model, rng, -a, a);
    RowMatrix<T> wk = random_matrix<T>(shape.kv_width(), d_model, rng, -a, a);
    RowMatrix<T> wv = random_matrix<T>(shape.kv_width(), d_model, rng, -a, a);
    RowMatrix<T> wo = random_matrix<T>(d_model, shape.q_width(), rng, -b, b);
    return AttentionLayer(shape, d_model, std::move(wq), std::move(wk), std::move(wv),
                          std::move(wo));
  }

  /// The head layout.
  const AttentionShape& shape() const { return shape_; }
  /// Width of the layer's input and output.
  int d_model() const { return d_model_; }
  /// Query weights, [num_heads * head_dim, d_model].
  const RowMatrix<T>& wq() const { return wq_; }
  /// Key weights, [num_kv_heads * head_dim, d_model].
  const RowMatrix<T>& wk() const { return wk_; }
  /// Value weights, [num_kv_heads * head_dim, d_model].
  const RowMatrix<T>& wv() const { return wv_; }
  /// Output weights, [d_model, num_heads * head_dim].
  const RowMatrix<T>& wo() const { return wo_; }

  /// The four projections as the per-layer step takes them (`attention_step`).
  AttentionWeights<T> weights() const { return AttentionWeights<T>{wq_, wk_, wv_, wo_}; }

  /// Queries of `x` ([n, d_model]): [n, num_heads * head_dim]. Counts n * num_heads query
  /// projections.
  /// \throws InvalidArgument if `x.cols() != d_model()`.
  RowMatrix<T> project_q(const RowMatrix<T>& x, CostCounters* counters = nullptr) const {
    check_input("kvlab::AttentionLayer::project_q", x);
    RowMatrix<T> q;
    cpu::linear(x, wq_, q);
    if (counters != nullptr) add_projection_counts(shape_, d_model_, rows(x), 0, 0, *counters);
    return q;
  }

  /// Keys and values of `x` ([n, d_model]): `k`, `v` become [n, num_kv_heads * head_dim].
  /// Counts n * num_kv_heads K/V projections. `k`, `v` and `x` must be three distinct matrices.
  /// \throws InvalidArgument if `x.cols() != d_model()`.
  void project_kv(const RowMatrix<T>& x, RowMatrix<T>& k, RowMatrix<T>& v,
                  CostCounters* counters = nullptr) const {
    check_input("kvlab::AttentionLayer::project_kv", x);
    if (&k == &x || &v == &x || &k == &v) {
      detail::fail("kvlab::AttentionLayer::project_kv", "k, v",
                   "two matrices distinct from x and each other", "an alias");
    }
    cpu::linear(x, wk_, k);
    cpu::linear(x, wv_, v);
    if (counters != nullptr) add_projection_counts(shape_, d_model_, 0, rows(x), 0, *counters);
  }

  /// Output projection of attention results `attn` ([n, num_heads * head_dim]): [n, d_model].
  /// \throws InvalidArgument if `attn.cols() != num_heads * head_dim`.
  RowMatrix<T> project_out(const RowMatrix<T>& attn, CostCounters* counters = nullptr) const {
    detail::require_equal("kvlab::AttentionLayer::project_out", "attn.cols()",
                          static_cast<long>(attn.cols()), static_cast<long>(shape_.q_width()),
                          "num_heads * head_dim");
    RowMatrix<T> y;
    cpu::linear(attn, wo_, y);
    if (counters != nullptr) add_projection_counts(shape_, d_model_, 0, 0, rows(attn), *counters);
    return y;
  }

 private:
  static std::uint64_t rows(const RowMatrix<T>& m) { return static_cast<std::uint64_t>(m.rows()); }
  static void check_weight(const char* where, const char* name, const RowMatrix<T>& w, int rows,
                           int cols) {
    if (w.rows() != rows || w.cols() != cols) {
      detail::fail(where, std::string(name) + " shape",
                   "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]",
                   "[" + std::to_string(w.rows()) + ", " + std::to_string(w.cols()) + "]");
    }
  }
  void check_input(const char* where, const RowMatrix<T>& x) const {
    detail::require_equal(where, "x.cols()", static_cast<long>(x.cols()),
                          static_cast<long>(d_model_), "d_model");
  }

  AttentionShape shape_;
  int d_model_;
  RowMatrix<T> wq_;  // [num_heads * head_dim, d_model]
  RowMatrix<T> wk_;  // [num_kv_heads * head_dim, d_model]
  RowMatrix<T> wv_;  // [num_kv_heads * head_dim, d_model]
  RowMatrix<T> wo_;  // [d_model, num_heads * head_dim]
};

/// A stack of attention layers with residual connections: `h_{l+1} = h_l + layer_l(h_l)`.
///
/// This is the smallest model in which caching matters across layers: layer `l + 1` needs the
/// keys and values of every earlier token *as seen by layer l*, so a decoder without a cache
/// must recompute the lower layers for the whole prefix. All layers share one head layout and
/// one `d_model`. Decoders hold the stack through a `shared_ptr<const AttentionStack>`, so
/// several decoders can run the same weights.
template <typename T>
class AttentionStack {
 public:
  /// A stack of the given layers (at least one, all with the same shape and d_model).
  /// \throws InvalidArgument if `layers` is empty or the layers disagree.
  explicit AttentionStack(std::vector<AttentionLayer<T>> layers) : layers_(std::move(layers)) {
    constexpr const char* kWhere = "kvlab::AttentionStack";
    detail::require_at_least(kWhere, "layers.size()", layers_.size(), std::size_t{1});
    const AttentionLayer<T>& first = layers_.front();
    for (std::size_t l = 1; l < layers_.size(); ++l) {
      const AttentionShape& s = layers_[l].shape();
      const std::string name = "layers[" + std::to_string(l) + "]";
      detail::require_equal(kWhere, name + ".d_model()", layers_[l].d_model(), first.d_model(),
                            "layers[0].d_model()");
      detail::require_equal(kWhere, name + ".shape().num_heads()", s.num_heads(),
                            first.shape().num_heads(), "layers[0]");
      detail::require_equal(kWhere, name + ".shape().num_kv_heads()", s.num_kv_heads(),
                            first.shape().num_kv_heads(), "layers[0]");
      detail::require_equal(kWhere, name + ".shape().head_dim()", s.head_dim(),
                            first.shape().head_dim(), "layers[0]");
      if (s.scale() != first.shape().scale()) {
        detail::fail(kWhere, name + ".shape().scale()",
                     std::to_string(first.shape().scale()) + " (layers[0])", s.scale());
      }
    }
  }

  /// A stack of `num_layers` random layers (see `AttentionLayer::random`), fixed by `seed`.
  /// \throws InvalidArgument if `num_layers < 1` or `d_model < 1`.
  static std::shared_ptr<const AttentionStack> random(int num_layers, const AttentionShape& shape,
                                                      int d_model, std::uint64_t seed) {
    detail::require_at_least("kvlab::AttentionStack::random", "num_layers", num_layers, 1);
    Rng rng(seed);
    std::vector<AttentionLayer<T>> layers;
    for (int l = 0; l < num_layers; ++l)
      layers.push_back(AttentionLayer<T>::random(shape, d_model, rng));
    return std::make_shared<const AttentionStack>(std::move(layers));
  }

  /// Number of layers.
  int num_layers() const { return static_cast<int>(layers_.size()); }
  /// Width of every layer's input and output.
  int d_model() const { return layers_.front().d_model(); }
  /// The head layout shared by all layers.
  const AttentionShape& shape() const { return layers_.front().shape(); }
  /// Layer `l`, in [0, num_layers()).
  /// \throws InvalidArgument if `l` is out of range.
  const AttentionLayer<T>& layer(int l) const {
    if (l < 0 || l >= num_layers()) {
      detail::fail("kvlab::AttentionStack::layer", "l",
                   "in [0, " + std::to_string(num_layers()) + ")", l);
    }
    return layers_[static_cast<std::size_t>(l)];
  }

 private:
  std::vector<AttentionLayer<T>> layers_;
};

/// One step of `stack` over a ragged batch of sequences kept in `store`: sequence `seqs[i]` adds
/// the rows `[x_indptr[i], x_indptr[i + 1])` of `x` as new tokens, and the outputs of the stack
/// at those tokens are returned, row for row. All rows of the step go through each weight matrix
/// in one product (the weights are read once per step, whatever the batch), and each layer's
/// attention is one call of the store's kernel over the ragged batch.
///
/// Per layer (`attention_step`): `h += attention(h) Woᵀ`, the residual around the attention
/// block; the store decides which rows a step computes (the new tokens when it keeps K and V,
/// every token when it recomputes) and keeps K and V.
///
/// \param stack     the model
/// \param store     its K/V, for every sequence of the batch (`num_layers`, K/V heads and
///                  head_dim those of the stack)
/// \param seqs      [batch]: distinct live sequences of `store`
/// \param x_indptr  [batch + 1]: CSR rows of `x` per sequence, at least one each
/// \param x         [x_indptr[batch], d_model]: the new tokens' inputs
/// \param counters  if not null, receives the work of the step
/// \param caller    the public function the user called, for error messages
/// \return          [x.rows(), d_model]
/// \throws InvalidArgument for a bad argument; CapacityError or OutOfBlocks if the store has no
///         room. Either way the store is unchanged.
template <typename T>
RowMatrix<T> run_stack(const AttentionStack<T>& stack, KVStore<T>& store,
                       const std::vector<int>& seqs, const std::vector<std::int32_t>& x_indptr,
                       const RowMatrix<T>& x, CostCounters* counters = nullptr,
                       const char* caller = "kvlab::run_stack") {
  detail::require_equal(caller, "store.num_layers()", store.num_layers(), stack.num_layers(),
                        "the stack's num_layers");
  detail::require_equal(caller, "store.num_kv_heads()", store.num_kv_heads(),
                        stack.shape().num_kv_heads(), "the stack's num_kv_heads");
  detail::require_equal(caller, "store.head_dim()", store.head_dim(), stack.shape().head_dim(),
                        "the stack's head_dim");
  detail::require_equal(caller, "x.cols()", static_cast<long>(x.cols()),
                        static_cast<long>(stack.d_model()), "d_model");
  CostCounters work;
  RowMatrix<T> h;  // [step rows, d_model]: the current layer's input, one row per step row
  OpenStep<T> open_step(store, seqs, x_indptr, x, h, caller);  // aborted unless committed
  StepScratch<T> scratch;
  RowMatrix<T> out;  // [rows that carry on, d_model]
  for (int l = 0; l < stack.num_layers(); ++l) {
    const AttentionLayer<T>& layer = stack.layer(l);
    const bool top = l + 1 == stack.num_layers();
    attention_step(layer.shape(), layer.weights(), nullptr, store, l, top, h, out, scratch, work);
    add_residual(open_step.batch(), h, out);
  }
  open_step.commit();
  if (counters != nullptr) *counters += work;
  return h;  // [x.rows(), d_model]
}

}  // namespace kvlab
