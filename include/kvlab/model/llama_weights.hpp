/// \file
/// \brief `LlamaWeights`: every tensor of a Llama-style decoder, as Eigen matrices.
///
/// The tensors (token embedding, per-layer RMSNorm weights, attention and SwiGLU matrices, final
/// norm, classifier) are in llama2.c's layout (`[out, in]`, row-major). It also makes a random
/// model fixed by a seed. Read from llama2.c checkpoints by `load_llama_checkpoint`; checked in the
/// tests by a write/read round trip.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/core/random.hpp"
#include "kvlab/matrix.hpp"
#include "kvlab/model/llama_config.hpp"

namespace kvlab {

/// The weights of one transformer block, in llama2.c's layout: a matrix `W` is `[out, in]`
/// (row-major, as PyTorch's `Linear` stores it) and maps a row of tokens `x` to `x * W^T`.
struct LlamaLayerWeights {
  RowVector<float> rms_att;  ///< RMSNorm weight before attention, [dim]
  RowMatrix<float> wq;       ///< query projection, [n_heads * head_dim, dim]
  RowMatrix<float> wk;       ///< key projection, [n_kv_heads * head_dim, dim]
  RowMatrix<float> wv;       ///< value projection, [n_kv_heads * head_dim, dim]
  RowMatrix<float> wo;       ///< attention output projection, [dim, n_heads * head_dim]
  RowVector<float> rms_ffn;  ///< RMSNorm weight before the MLP, [dim]
  RowMatrix<float> w1;       ///< MLP gate (through SiLU), [hidden_dim, dim]
  RowMatrix<float> w2;       ///< MLP down projection, [dim, hidden_dim]
  RowMatrix<float> w3;       ///< MLP up projection, [hidden_dim, dim]
};

/// All weights of a Llama-style decoder with shape `config`.
///
/// Tensors appear here in the order of llama2.c's checkpoint file (embedding, then each kind of
/// per-layer tensor for all layers, then the final norm and the optional classifier); the file
/// groups a kind across layers, this struct groups a layer's tensors. `wcls` is empty when
/// `config.shared_classifier` (the classifier is then the token embedding; see `classifier()`).
struct LlamaWeights {
  LlamaConfig config;  ///< the shape
  /// token embeddings, [vocab_size, dim]: row t is token t's input vector
  RowMatrix<float> token_embedding;
  std::vector<LlamaLayerWeights> layers;  ///< the transformer blocks, [n_layers]
  RowVector<float> rms_final;             ///< RMSNorm weight before the classifier, [dim]
  /// separate classifier, [vocab_size, dim]; empty when the classifier is shared
  RowMatrix<float> wcls;

  /// The classifier, [vocab_size, dim]: `wcls`, or the token embedding when shared.
  const RowMatrix<float>& classifier() const {
    return config.shared_classifier ? token_embedding : wcls;
  }

  /// Zero-filled weights of shape `config` (filled by a loader or by hand).
  /// \throws InvalidArgument if `config` is not valid (see `LlamaConfig::validate`).
  static LlamaWeights zeros(const LlamaConfig& config) {
    config.validate("kvlab::LlamaWeights::zeros");
    LlamaWeights w;
    w.config = config;
    const int d = config.dim, kv = config.kv_dim(), hid = config.hidden_dim;
    w.token_embedding = RowMatrix<float>::Zero(config.vocab_size, d);
    w.layers.resize(static_cast<std::size_t>(config.n_layers));
    for (LlamaLayerWeights& l : w.layers) {
      l.rms_att = RowVector<float>::Zero(d);
      l.wq = RowMatrix<float>::Zero(d, d);
      l.wk = RowMatrix<float>::Zero(kv, d);
      l.wv = RowMatrix<float>::Zero(kv, d);
      l.wo = RowMatrix<float>::Zero(d, d);
      l.rms_ffn = RowVector<float>::Zero(d);
      l.w1 = RowMatrix<float>::Zero(hid, d);
      l.w2 = RowMatrix<float>::Zero(d, hid);
      l.w3 = RowMatrix<float>::Zero(hid, d);
    }
    w.rms_final = RowVector<float>::Zero(d);
    if (!config.shared_classifier) w.wcls = RowMatrix<float>::Zero(config.vocab_size, d);
    return w;
  }

  /// Random weights fixed by `seed` (the same on every platform), drawn in the checkpoint's
  /// order: embedding and classifier uniform in [-1, 1); each matrix uniform in
  /// [-1/sqrt(in), 1/sqrt(in)) so that activations keep their scale; RMSNorm weights uniform
  /// in [0.8, 1.2). A model that produces varied, reproducible tokens — not language.
  /// \throws InvalidArgument if `config` is not valid.
  static LlamaWeights random(const LlamaConfig& config, std::uint64_t seed) {
    LlamaWeights w = zeros(config);
    Rng rng(seed);
    const auto scaled = [&rng](RowMatrix<float>& m) {  // m: [out, in]
      const double a = 1.0 / std::sqrt(static_cast<double>(m.cols()));
      fill_uniform(m, rng, -a, a);
    };
    fill_uniform(w.token_embedding, rng, -1.0, 1.0);
    for (LlamaLayerWeights& l : w.layers) fill_uniform(l.rms_att, rng, 0.8, 1.2);
    for (LlamaLayerWeights& l : w.layers) scaled(l.wq);
    for (LlamaLayerWeights& l : w.layers) scaled(l.wk);
    for (LlamaLayerWeights& l : w.layers) scaled(l.wv);
    for (LlamaLayerWeights& l : w.layers) scaled(l.wo);
    for (LlamaLayerWeights& l : w.layers) fill_uniform(l.rms_ffn, rng, 0.8, 1.2);
    for (LlamaLayerWeights& l : w.layers) scaled(l.w1);
    for (LlamaLayerWeights& l : w.layers) scaled(l.w2);
    for (LlamaLayerWeights& l : w.layers) scaled(l.w3);
    fill_uniform(w.rms_final, rng, 0.8, 1.2);
    if (!config.shared_classifier) fill_uniform(w.wcls, rng, -1.0, 1.0);
    return w;
  }

  /// The built-in model of `kvlab-generate`, the tests and tutorial 06: `random(config,
  /// kBuiltinSeed)`, by default of shape `LlamaConfig::tiny()`. It runs without any file.
  /// \throws InvalidArgument if `config` is not valid.
  static LlamaWeights builtin(const LlamaConfig& config = LlamaConfig::tiny()) {
    return random(config, kBuiltinSeed);
  }

  /// The seed of `builtin()`.
  static constexpr std::uint64_t kBuiltinSeed = 20240605;

  /// Checks that every tensor has the shape `config` implies and `config` is valid.
  /// \throws InvalidArgument naming the first tensor whose shape is wrong, e.g.
  ///         `"layers[2].wk shape: expected [16, 48], got [48, 48]"`.
  void check(const char* where = "kvlab::LlamaWeights::check") const {
    config.validate(where);
    const int d = config.dim, kv = config.kv_dim(), hid = config.hidden_dim;
    check_shape(where, "token_embedding", token_embedding.rows(), token_embedding.cols(),
                config.vocab_size, d);
    if (layers.size() != static_cast<std::size_t>(config.n_layers)) {
      detail::fail(where, "layers.size()", config.n_layers, layers.size());
    }
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const LlamaLayerWeights& l = layers[i];
      const std::string at = "layers[" + std::to_string(i) + "].";
      check_shape(where, at + "rms_att", 1, l.rms_att.cols(), 1, d);
      check_shape(where, at + "wq", l.wq.rows(), l.wq.cols(), d, d);
      check_shape(where, at + "wk", l.wk.rows(), l.wk.cols(), kv, d);
      check_shape(where, at + "wv", l.wv.rows(), l.wv.cols(), kv, d);
      check_shape(where, at + "wo", l.wo.rows(), l.wo.cols(), d, d);
      check_shape(where, at + "rms_ffn", 1, l.rms_ffn.cols(), 1, d);
      check_shape(where, at + "w1", l.w1.rows(), l.w1.cols(), hid, d);
      check_shape(where, at + "w2", l.w2.rows(), l.w2.cols(), d, hid);
      check_shape(where, at + "w3", l.w3.rows(), l.w3.cols(), hid, d);
    }
    check_shape(where, "rms_final", 1, rms_final.cols(), 1, d);
    if (config.shared_classifier) {
      check_shape(where, "wcls (shared classifier: empty)", wcls.rows(), wcls.cols(), 0, 0);
    } else {
      check_shape(where, "wcls", wcls.rows(), wcls.cols(), config.vocab_size, d);
    }
  }

 private:
  static void check_shape(const char* where, const std::string& name, Eigen::Index rows,
                          Eigen::Index cols, Eigen::Index want_rows, Eigen::Index want_cols) {
    if (rows != want_rows || cols != want_cols) {
      detail::fail(where, name + " shape",
                   "[" + std::to_string(want_rows) + ", " + std::to_string(want_cols) + "]",
                   "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
    }
  }
};

}  // namespace kvlab
