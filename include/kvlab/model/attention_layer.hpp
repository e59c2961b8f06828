/// \file
/// \brief `AttentionLayer` (projection weights Wq, Wk, Wv, Wo of one layer) and
/// `AttentionStack` (a residual stack of them), the model that kvlab's decoders run.
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
#include "kvlab/cpu/types.hpp"

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

  /// Queries of `x` ([n, d_model]): [n, num_heads * head_dim]. Counts n * num_heads query
  /// projections.
  /// \throws InvalidArgument if `x.cols() != d_model()`.
  RowMatrix<T> project_q(const RowMatrix<T>& x, CostCounters* counters = nullptr) const {
    check_input("kvlab::AttentionLayer::project_q", x);
    if (counters != nullptr) {
      counters->q_projections += static_cast<std::uint64_t>(x.rows()) * shape_.num_heads();
      counters->macs += static_cast<std::uint64_t>(x.rows()) * d_model_ * shape_.q_width();
    }
    return x * wq_.transpose();
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
    if (counters != nullptr) {
      counters->kv_projections += static_cast<std::uint64_t>(x.rows()) * shape_.num_kv_heads();
      counters->macs += 2 * static_cast<std::uint64_t>(x.rows()) * d_model_ * shape_.kv_width();
    }
    k.noalias() = x * wk_.transpose();
    v.noalias() = x * wv_.transpose();
  }

  /// Output projection of attention results `attn` ([n, num_heads * head_dim]): [n, d_model].
  /// \throws InvalidArgument if `attn.cols() != num_heads * head_dim`.
  RowMatrix<T> project_out(const RowMatrix<T>& attn, CostCounters* counters = nullptr) const {
    detail::require_equal("kvlab::AttentionLayer::project_out", "attn.cols()",
                          static_cast<long>(attn.cols()), static_cast<long>(shape_.q_width()),
                          "num_heads * head_dim");
    if (counters != nullptr) {
      counters->macs += static_cast<std::uint64_t>(attn.rows()) * d_model_ * shape_.q_width();
    }
    return attn * wo_.transpose();
  }

 private:
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

}  // namespace kvlab
