/// \file
/// \brief `LlamaModel`: a Llama-style decoder (token embedding, RMSNorm, rotary position
/// embedding, grouped-query attention, SwiGLU MLP, final norm, classifier) whose math follows
/// llama2.c's `run.c`, with the attention backend chosen per instance: naive (recompute the
/// whole prefix every step), cached (a `ContiguousKVCache`) or paged (a `PagedKVCache`). Checked
/// in the tests: the three backends give the same greedy tokens for 200+ steps and the same
/// logits within a stated tolerance, on a random model and on stories260K.bin, with exact cost
/// counts.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kvlab/cache/contiguous_kv_cache.hpp"
#include "kvlab/cache/paged_kv_cache.hpp"
#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/cpu/decode_attention.hpp"
#include "kvlab/cpu/naive_attention.hpp"
#include "kvlab/cpu/paged_attention.hpp"
#include "kvlab/cpu/parallel.hpp"
#include "kvlab/cpu/types.hpp"
#include "kvlab/model/llama_config.hpp"
#include "kvlab/model/llama_weights.hpp"

namespace kvlab {

/// How a `LlamaModel` attends to its past.
enum class LlamaBackend : int {
  /// No cache: every step runs the whole sequence through the lower layers again and
  /// re-projects K and V of every token in every layer (`cpu::naive_attention`).
  Naive = 0,
  /// A `ContiguousKVCache` holding `max_tokens` positions per layer; each step projects the new
  /// tokens only (`cpu::decode_attention`).
  Cached = 1,
  /// A `PagedKVCache` of blocks, taken as the sequence grows; each step projects the new tokens
  /// only and attends through the block table (`cpu::paged_prefill_attention`).
  Paged = 2,
};

/// Name of a backend: "naive", "cached" or "paged".
inline const char* to_string(LlamaBackend backend) {
  return backend == LlamaBackend::Naive    ? "naive"
         : backend == LlamaBackend::Cached ? "cached"
                                           : "paged";
}

/// The backend named `name` ("naive", "cached" or "paged").
/// \throws InvalidArgument for any other name.
inline LlamaBackend parse_llama_backend(const std::string& name) {
  if (name == "naive") return LlamaBackend::Naive;
  if (name == "cached") return LlamaBackend::Cached;
  if (name == "paged") return LlamaBackend::Paged;
  detail::fail("kvlab::parse_llama_backend", "name", "naive, cached or paged", "'" + name + "'");
}

/// The work of a `LlamaModel`, counted exactly.
///
/// `attention` counts what kvlab's decoders count (`CostCounters`): q and K/V projections per
/// token, layer and head, their multiply-adds and those of the output projection, and the
/// attention kernels' dot products and bytes. The MLP and the classifier are counted beside it
/// (they cost the same per computed position with or without a cache, but the naive backend
/// computes more positions), so that `macs()` is every multiply-add of the matrix products.
struct LlamaCounters {
  /// projections q, k, v, o and attention, as `CostCounters` defines them
  CostCounters attention;
  /// multiply-adds of w1, w3 and w2: 3 * dim * hidden_dim per computed position
  std::uint64_t mlp_macs = 0;
  /// multiply-adds of the classifier: dim * vocab_size per logits row
  std::uint64_t classifier_macs = 0;

  /// Every multiply-add of the matrix products: attention + MLP + classifier.
  std::uint64_t macs() const { return attention.macs + mlp_macs + classifier_macs; }

  /// Adds every count of `other`.
  LlamaCounters& operator+=(const LlamaCounters& other) {
    attention += other.attention;
    mlp_macs += other.mlp_macs;
    classifier_macs += other.classifier_macs;
    return *this;
  }
  /// True when every count is equal.
  bool operator==(const LlamaCounters& o) const {
    return attention == o.attention && mlp_macs == o.mlp_macs &&
           classifier_macs == o.classifier_macs;
  }
  /// True when any count differs.
  bool operator!=(const LlamaCounters& o) const { return !(*this == o); }
};

/// Rotary position embedding (RoPE) exactly as llama2.c's run.c applies it: within each head,
/// values `(i, i + 1)` for even `i` are a pair, rotated by the angle `pos * freq` with
/// `freq = 1 / 10000^(i / head_dim)` (in float, as run.c computes it).
///
/// A rotation keeps each pair's length, and the dot product of a query rotated to position m
/// with a key rotated to position n depends on m - n only: attention sees relative positions.
/// The angles are tabulated once for `max_positions` positions, so every backend rotates with
/// the very same numbers.
class RotaryEmbedding {
 public:
  /// A table for positions [0, max_positions) of heads of `head_dim` values.
  /// \throws InvalidArgument if `head_dim` is not even and >= 2, or `max_positions < 1`.
  RotaryEmbedding(int head_dim, int max_positions) : head_dim_(head_dim) {
    constexpr const char* kWhere = "kvlab::RotaryEmbedding";
    detail::require_at_least(kWhere, "head_dim", head_dim, 2);
    if (head_dim % 2 != 0) detail::fail(kWhere, "head_dim", "an even number", head_dim);
    detail::require_at_least(kWhere, "max_positions", max_positions, 1);
    cos_.resize(max_positions, head_dim / 2);
    sin_.resize(max_positions, head_dim / 2);
    for (int pos = 0; pos < max_positions; ++pos) {
      for (int j = 0; j < head_dim / 2; ++j) {
        const float freq =
            1.0f / std::pow(10000.0f, static_cast<float>(2 * j) / static_cast<float>(head_dim));
        const float angle = static_cast<float>(pos) * freq;
        cos_(pos, j) = std::cos(angle);
        sin_(pos, j) = std::sin(angle);
      }
    }
  }

  /// Values per head.
  int head_dim() const { return head_dim_; }
  /// Positions in the table.
  int max_positions() const { return static_cast<int>(cos_.rows()); }

  /// Rotates every head of every row of `x` in place; row `r` is the token at position
  /// `first_position + r`.
  /// \param x               [n, heads * head_dim]: queries or keys, token-major
  /// \param first_position  the position of row 0
  /// \throws InvalidArgument if `x.cols()` is not a multiple of head_dim or a position is
  ///         outside [0, max_positions).
  void apply(RowMatrix<float>& x, int first_position) const {
    constexpr const char* kWhere = "kvlab::RotaryEmbedding::apply";
    if (x.cols() % head_dim_ != 0) {
      detail::fail(kWhere, "x.cols()", "a multiple of head_dim (" + std::to_string(head_dim_) + ")",
                   x.cols());
    }
    if (first_position < 0 || first_position + x.rows() > max_positions()) {
      detail::fail(kWhere, "first_position",
                   "positions within [0, " + std::to_string(max_positions()) + ")",
                   std::to_string(first_position) + " + " + std::to_string(x.rows()) + " rows");
    }
    const Eigen::Index heads = x.cols() / head_dim_;
    for (Eigen::Index r = 0; r < x.rows(); ++r) {
      const Eigen::Index pos = first_position + r;
      float* row = x.row(r).data();  // [heads * head_dim]
      for (Eigen::Index h = 0; h < heads; ++h) {
        for (int j = 0; j < head_dim_ / 2; ++j) {
          float* pair = row + h * head_dim_ + 2 * j;  // values (i, i + 1), i = 2j within head h
          const float c = cos_(pos, j), s = sin_(pos, j);
          const float v0 = pair[0], v1 = pair[1];
          pair[0] = v0 * c - v1 * s;
          pair[1] = v0 * s + v1 * c;
        }
      }
    }
  }

 private:
  int head_dim_;
  RowMatrix<float> cos_;  // [max_positions, head_dim / 2]
  RowMatrix<float> sin_;  // [max_positions, head_dim / 2]
};

namespace detail {

/// Weight elements times rows below which `matmul_wt` runs on one thread.
constexpr long long kMatmulParallelMinMacs = 1 << 17;

/// `out = x * W^T` (x [rows, in], W [out, in], out [rows, out]): the `matmul` of run.c. With
/// OpenMP and enough work, W's rows are split between the threads (as run.c splits them), each
/// thread computing its columns of `out`; an exception in a thread is passed on after the loop.
inline void matmul_wt(const RowMatrix<float>& x, const RowMatrix<float>& w, RowMatrix<float>& out) {
  out.resize(x.rows(), w.rows());
  int threads = 1;
#if defined(_OPENMP)
  if (1LL * x.rows() * w.size() >= kMatmulParallelMinMacs) threads = omp_get_max_threads();
#endif
  if (threads <= 1 || w.rows() < threads) {
    out.noalias() = x * w.transpose();
    return;
  }
  // Chunk c of `threads` computes W's rows [r0, r1) — its columns of out.
  parallel_for(threads, true, [&](int c) {
    const Eigen::Index r0 = w.rows() * c / threads, r1 = w.rows() * (c + 1) / threads;
    out.middleCols(r0, r1 - r0).noalias() = x * w.middleRows(r0, r1 - r0).transpose();
  });
}

/// RMSNorm of every row, as run.c: `out = weight * x / sqrt(mean(x^2) + 1e-5)`.
/// x [rows, dim], weight [dim], out [rows, dim] (resized; may not alias x).
inline void rmsnorm(const RowMatrix<float>& x, const RowVector<float>& weight,
                    RowMatrix<float>& out) {
  out.resize(x.rows(), x.cols());
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    const float mean_square = x.row(r).squaredNorm() / static_cast<float>(x.cols()) + 1e-5f;
    out.row(r) = (x.row(r) * (1.0f / std::sqrt(mean_square))).cwiseProduct(weight);
  }
}

}  // namespace detail

/// A Llama-style decoder on `LlamaWeights`, with one of three attention backends.
///
/// The forward pass of one token, in run.c's order (`forward()` runs several at once):
///  1. x = the token's row of the embedding table;
///  2. per layer: xb = RMSNorm(x); q, k, v = xb Wq^T, xb Wk^T, xb Wv^T; RoPE rotates q and k by
///     the token's position; k and v join the past (backend below); attention of q over the
///     past; x += attention · Wo^T; xb = RMSNorm(x); x += (SiLU(xb W1^T) * (xb W3^T)) W2^T;
///  3. logits = RMSNorm(x) · classifier^T.
///
/// The backends differ only in how step 2 reaches the keys and values of past tokens:
///  - **naive** keeps only the token ids. Every call runs the whole sequence through every layer
///    again (K/V of all t tokens in every layer, queries of all t positions below the top layer,
///    as the layer above needs their outputs) and attends with `cpu::naive_attention`: Θ(t)
///    K/V projections per step, Θ(n²) over n tokens.
///  - **cached** appends k and v of the new tokens to a `ContiguousKVCache` and attends with
///    `cpu::decode_attention`: the new tokens only, Θ(1) projections per step.
///  - **paged** writes them into the blocks of a `PagedKVCache` (`block_size` tokens each,
///    allocated as the sequence grows) and attends with `cpu::paged_prefill_attention`: the same
///    work as cached, the cache in blocks.
/// All three compute the same function; they differ by rounding (sums in different orders), so
/// greedy decoding gives the same tokens unless two logits are within rounding of each other.
///
/// A model instance holds one sequence. `prefill` (the prompt at once, causal within it) and
/// `decode` (one token) append to it; `reset` starts over. Each call records its work in
/// `last_step()` and adds it to `total()`. The weights are shared (`shared_ptr<const>`), so many
/// instances, one per backend or per sequence, can run the same model.
class LlamaModel {
 public:
  /// A model with no token yet.
  /// \param weights     the weights (checked against their config)
  /// \param backend     how attention reaches past tokens
  /// \param block_size  tokens per block of the paged backend (ignored by the others), >= 1
  /// \param max_tokens  the longest sequence; 0 means `config.seq_len`, the model's own limit
  /// \throws InvalidArgument if `weights` is null or malformed, `block_size < 1`, or
  ///         `max_tokens` is not in [0, seq_len].
  LlamaModel(std::shared_ptr<const LlamaWeights> weights, LlamaBackend backend, int block_size = 16,
             int max_tokens = 0)
      : weights_(checked(std::move(weights))),
        backend_(backend),
        block_size_(block_size),
        max_tokens_(checked_max_tokens(weights_->config, block_size, max_tokens)),
        shape_(weights_->config.n_heads, weights_->config.n_kv_heads, weights_->config.head_dim()),
        rope_(weights_->config.head_dim(), max_tokens_) {
    const LlamaConfig& c = weights_->config;
    if (backend == LlamaBackend::Cached) {
      cache_ = std::make_unique<ContiguousKVCache<float>>(c.n_layers, c.n_kv_heads, c.head_dim(),
                                                          max_tokens_);
    } else if (backend == LlamaBackend::Paged) {
      const int num_blocks = (max_tokens_ - 1) / block_size + 1;  // enough for max_tokens
      pool_ = std::make_unique<PagedKVCache<float>>(c.n_layers, c.n_kv_heads, c.head_dim(),
                                                    block_size, num_blocks);
      seq_ = pool_->add_sequence();
    }
  }

  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  /// The model's shape.
  const LlamaConfig& config() const { return weights_->config; }
  /// The weights.
  const LlamaWeights& weights() const { return *weights_; }
  /// The attention backend.
  LlamaBackend backend() const { return backend_; }
  /// Tokens per block of the paged backend (as given; unused by the others).
  int block_size() const { return block_size_; }
  /// The longest sequence this instance holds.
  int max_tokens() const { return max_tokens_; }
  /// The head layout of every layer's attention.
  const AttentionShape& shape() const { return shape_; }
  /// Number of tokens fed so far (the position of the next one).
  int position() const { return static_cast<int>(tokens_.size()); }
  /// The tokens fed so far, [position()].
  const std::vector<int>& tokens() const { return tokens_; }
  /// The work of the last `forward`, `prefill` or `decode` call.
  const LlamaCounters& last_step() const { return last_step_; }
  /// The work of every call since construction or `reset`.
  const LlamaCounters& total() const { return total_; }
  /// The contiguous cache of the cached backend (null for the others).
  const ContiguousKVCache<float>* contiguous_cache() const { return cache_.get(); }
  /// The block pool of the paged backend (null for the others); this model's sequence is
  /// `paged_sequence()`.
  const PagedKVCache<float>* paged_cache() const { return pool_.get(); }
  /// This model's sequence id in `paged_cache()` (-1 for the other backends).
  int paged_sequence() const { return seq_; }

  /// Feeds `tokens` at positions [position(), position() + p) and returns the logits after each,
  /// [p, vocab_size]: row i is the distribution of the token that follows tokens[i].
  /// \throws InvalidArgument if `tokens` is empty or holds an id outside [0, vocab_size);
  ///         CapacityError if the sequence would exceed `max_tokens()`. Either way nothing changes.
  RowMatrix<float> forward(const std::vector<int>& tokens) {
    return step(tokens, static_cast<int>(tokens.size()));
  }

  /// Feeds a prompt (or any run of tokens) at once and returns the logits after its last token,
  /// [vocab_size]: the distribution of the first generated token. The classifier runs on the last
  /// position only.
  /// \throws as `forward`.
  RowVector<float> prefill(const std::vector<int>& tokens) { return step(tokens, 1).row(0); }

  /// Feeds one token and returns the logits after it, [vocab_size].
  /// \throws as `forward`.
  RowVector<float> decode(int token) { return step({token}, 1).row(0); }

  /// Forgets every token and zeroes the counters (the cache's memory stays reserved).
  void reset() {
    if (cache_) cache_->clear();
    if (pool_) pool_->truncate(seq_, 0);
    tokens_.clear();
    last_step_ = LlamaCounters{};
    total_ = LlamaCounters{};
  }

 private:
  static std::shared_ptr<const LlamaWeights> checked(std::shared_ptr<const LlamaWeights> weights) {
    if (!weights) detail::fail("kvlab::LlamaModel", "weights", "non-null weights", "nullptr");
    weights->check("kvlab::LlamaModel");
    return weights;
  }
  // The sequence limit (max_tokens, 0 meaning seq_len), checked with block_size before anything is
  // allocated.
  static int checked_max_tokens(const LlamaConfig& c, int block_size, int max_tokens) {
    constexpr const char* kWhere = "kvlab::LlamaModel";
    detail::require_at_least(kWhere, "block_size", block_size, 1);
    if (max_tokens < 0 || max_tokens > c.seq_len) {
      detail::fail(kWhere, "max_tokens", "in [0, seq_len (" + std::to_string(c.seq_len) + ")]",
                   max_tokens);
    }
    return max_tokens == 0 ? c.seq_len : max_tokens;
  }

  // Checks `tokens`, runs them, and returns the logits of the last `out_rows` of them.
  RowMatrix<float> step(const std::vector<int>& tokens, int out_rows) {
    constexpr const char* kWhere = "kvlab::LlamaModel::forward";
    const LlamaConfig& c = config();
    detail::require_at_least(kWhere, "tokens.size()", tokens.size(), std::size_t{1});
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] < 0 || tokens[i] >= c.vocab_size) {
        detail::fail(kWhere, "tokens[" + std::to_string(i) + "]",
                     "an id in [0, " + std::to_string(c.vocab_size) + ")", tokens[i]);
      }
    }
    if (tokens.size() > static_cast<std::size_t>(max_tokens_ - position())) {
      detail::fail<CapacityError>(kWhere, "tokens.size()",
                                  "at most " + std::to_string(max_tokens_ - position()) +
                                      " (max_tokens " + std::to_string(max_tokens_) +
                                      ", position " + std::to_string(position()) + ")",
                                  tokens.size());
    }
    LlamaCounters counters;
    RowMatrix<float> x;  // [p, dim]: the new tokens' residual stream after the last layer
    switch (backend_) {
      case LlamaBackend::Naive:
        x = layers_naive(tokens, counters);
        break;
      case LlamaBackend::Cached:
        x = layers_cached(tokens, counters);
        break;
      case LlamaBackend::Paged:
        x = layers_paged(tokens, counters);
        break;
    }
    // 3. Final RMSNorm and classifier, on the rows whose logits are wanted.
    const RowMatrix<float> last = x.bottomRows(out_rows);  // [out_rows, dim]
    // [out_rows, dim], [out_rows, vocab_size]
    RowMatrix<float> normed, logits;
    detail::rmsnorm(last, weights_->rms_final, normed);
    detail::matmul_wt(normed, weights_->classifier(), logits);
    counters.classifier_macs += static_cast<std::uint64_t>(out_rows) * c.dim * c.vocab_size;

    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
    last_step_ = counters;
    total_ += counters;
    return logits;
  }

  // Rows `ids` of the embedding table: [ids.size(), dim].
  RowMatrix<float> embed(const std::vector<int>& ids) const {
    RowMatrix<float> x(static_cast<Eigen::Index>(ids.size()), config().dim);  // [n, dim]
    for (std::size_t i = 0; i < ids.size(); ++i)
      x.row(static_cast<Eigen::Index>(i)) = weights_->token_embedding.row(ids[i]);
    return x;
  }

  // q = xb Wq^T ([rows, dim] -> [rows, n_heads * head_dim]), counted as AttentionLayer::project_q
  // counts it.
  void project_q(const LlamaLayerWeights& w, const RowMatrix<float>& xb, RowMatrix<float>& q,
                 LlamaCounters& c) const {
    detail::matmul_wt(xb, w.wq, q);
    c.attention.q_projections += static_cast<std::uint64_t>(xb.rows()) * shape_.num_heads();
    c.attention.macs += static_cast<std::uint64_t>(xb.rows()) * config().dim * shape_.q_width();
  }
  // k, v = xb Wk^T, xb Wv^T ([rows, kv_dim] each), counted as AttentionLayer::project_kv counts
  // them.
  void project_kv(const LlamaLayerWeights& w, const RowMatrix<float>& xb, RowMatrix<float>& k,
                  RowMatrix<float>& v, LlamaCounters& c) const {
    detail::matmul_wt(xb, w.wk, k);
    detail::matmul_wt(xb, w.wv, v);
    c.attention.kv_projections += static_cast<std::uint64_t>(xb.rows()) * shape_.num_kv_heads();
    c.attention.macs +=
        2 * static_cast<std::uint64_t>(xb.rows()) * config().dim * shape_.kv_width();
  }
  // x += attn Wo^T: the output projection and the residual.
  void project_out(const LlamaLayerWeights& w, const RowMatrix<float>& attn, RowMatrix<float>& x,
                   LlamaCounters& c) const {
    RowMatrix<float> out;  // [rows, dim]
    detail::matmul_wt(attn, w.wo, out);
    x += out;
    c.attention.macs += static_cast<std::uint64_t>(attn.rows()) * config().dim * shape_.q_width();
  }
  // x += W2 (SiLU(W1 RMSNorm(x)) * W3 RMSNorm(x)): the MLP block and its residual.
  void mlp(const LlamaLayerWeights& w, RowMatrix<float>& x, LlamaCounters& c) const {
    // [rows, dim], [rows, hidden_dim], [rows, hidden_dim], [rows, dim]
    RowMatrix<float> xb, hb, hb2, out;
    detail::rmsnorm(x, w.rms_ffn, xb);  // ffn RMSNorm
    detail::matmul_wt(xb, w.w1, hb);    // gate: xb W1^T
    detail::matmul_wt(xb, w.w3, hb2);   // up:   xb W3^T
    // SiLU(gate) * up
    hb.array() = hb.array() * (1.0f + (-hb.array()).exp()).inverse() * hb2.array();
    detail::matmul_wt(hb, w.w2, out);  // down: W2
    x += out;                          // residual
    c.mlp_macs += 3 * static_cast<std::uint64_t>(x.rows()) * config().dim * config().hidden_dim;
  }

  // Naive: the whole sequence (old tokens and new) through every layer again.
  RowMatrix<float> layers_naive(const std::vector<int>& tokens, LlamaCounters& c) const {
    std::vector<int> all = tokens_;  // [t]: every token, the new ones last
    all.insert(all.end(), tokens.begin(), tokens.end());
    const int p = static_cast<int>(tokens.size());
    const int t = static_cast<int>(all.size());
    RowMatrix<float> x = embed(all);  // [rows, dim]: rows = t below the top layer, p after it
    // [t, dim], [rows, dim], [rows, dim], [t, kv_dim], [t, kv_dim]
    RowMatrix<float> xb, xq, q, k, v;
    RowMatrix<float> attn;  // [rows, dim]
    const int num_layers = config().n_layers;
    for (int l = 0; l < num_layers; ++l) {
      const LlamaLayerWeights& w = weights_->layers[static_cast<std::size_t>(l)];
      // Positions whose output is needed: all t below the top layer (the next layer's K/V need
      // them), only the p new ones in the top layer.
      const int rows = l + 1 == num_layers ? p : t;
      detail::rmsnorm(x, w.rms_att, xb);  // attention RMSNorm, all t positions
      project_kv(w, xb, k, v, c);         // K and V of every token, again
      rope_.apply(k, 0);                  // keys rotated to positions 0..t-1
      xq = xb.bottomRows(rows);           // the positions that need a query
      project_q(w, xq, q, c);
      rope_.apply(q, t - rows);  // queries rotated to their positions
      cpu::naive_attention(shape_, q, k, v, attn, &c.attention);  // causal, full score matrix
      if (rows != t) x = RowMatrix<float>(x.bottomRows(rows));    // keep the rows still needed
      project_out(w, attn, x, c);                                 // x += attn Wo^T
      mlp(w, x, c);                                               // x += MLP(x)
    }
    return x;  // [p, dim]
  }

  // Cached: the new tokens only; K and V go into the contiguous cache.
  RowMatrix<float> layers_cached(const std::vector<int>& tokens, LlamaCounters& c) {
    const int pos = position();
    RowMatrix<float> x = embed(tokens);  // [p, dim]
    RowMatrix<float> xb, q, k, v, attn;  // [p, dim], [p, dim], [p, kv_dim], [p, kv_dim], [p, dim]
    try {
      for (int l = 0; l < config().n_layers; ++l) {
        const LlamaLayerWeights& w = weights_->layers[static_cast<std::size_t>(l)];
        detail::rmsnorm(x, w.rms_att, xb);  // attention RMSNorm
        project_q(w, xb, q, c);             // q, k, v of the new tokens only
        project_kv(w, xb, k, v, c);
        rope_.apply(q, pos);  // rotate q and k to their positions
        rope_.apply(k, pos);
        cache_->append(l, k, v);  // keep k (rotated) and v for every later step
        // over the whole cache
        cpu::decode_attention(shape_, q, cache_->view(l), attn, &c.attention);
        project_out(w, attn, x, c);  // x += attn Wo^T
        mlp(w, x, c);                // x += MLP(x)
      }
    } catch (...) {
      cache_->truncate(pos);  // undo this call's appends
      throw;
    }
    return x;
  }

  // Paged: the new tokens only; K and V go into the sequence's blocks.
  RowMatrix<float> layers_paged(const std::vector<int>& tokens, LlamaCounters& c) {
    const int pos = position();
    const int p = static_cast<int>(tokens.size());
    const std::vector<std::int64_t> slots = pool_->append(seq_, p);  // [p]: room for the new tokens
    RowMatrix<float> x = embed(tokens);                              // [p, dim]
    RowMatrix<float> xb, q, k, v, attn;  // [p, dim], [p, dim], [p, kv_dim], [p, kv_dim], [p, dim]
    try {
      const BlockTables tables = pool_->tables({seq_});  // the same blocks in every layer
      const std::vector<std::int32_t> qo_indptr{0, p};   // [2]: all p queries are this sequence's
      for (int l = 0; l < config().n_layers; ++l) {
        const LlamaLayerWeights& w = weights_->layers[static_cast<std::size_t>(l)];
        detail::rmsnorm(x, w.rms_att, xb);  // attention RMSNorm
        project_q(w, xb, q, c);             // q, k, v of the new tokens only
        project_kv(w, xb, k, v, c);
        rope_.apply(q, pos);  // rotate q and k to their positions
        rope_.apply(k, pos);
        pool_->write(l, slots, k, v);  // keep k (rotated) and v in the blocks
        cpu::paged_prefill_attention(shape_, q, qo_indptr, pool_->view(l, tables), attn,
                                     &c.attention);
        project_out(w, attn, x, c);  // x += attn Wo^T
        mlp(w, x, c);                // x += MLP(x)
      }
    } catch (...) {
      pool_->truncate(seq_, pos);  // undo the append
      throw;
    }
    return x;
  }

  std::shared_ptr<const LlamaWeights> weights_;
  LlamaBackend backend_;
  int block_size_;
  int max_tokens_;
  AttentionShape shape_;
  RotaryEmbedding rope_;
  std::vector<int> tokens_;  // [position]: every token fed so far
  // cached backend: [n_layers][n_kv_heads][max_tokens][head_dim]
  std::unique_ptr<ContiguousKVCache<float>> cache_;
  // paged backend: [n_layers][num_blocks, block_size, n_kv_heads, head_dim]
  std::unique_ptr<PagedKVCache<float>> pool_;
  // paged backend: this model's sequence in pool_
  int seq_ = -1;
  LlamaCounters last_step_;
  LlamaCounters total_;
};

}  // namespace kvlab
