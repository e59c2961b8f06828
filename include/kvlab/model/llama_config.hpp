/// \file
/// \brief `LlamaConfig`: the numbers that fix the shape of a Llama-style model, validated.
///
/// They are the seven numbers of a llama2.c checkpoint header (dim, hidden_dim, n_layers, n_heads,
/// n_kv_heads, vocab_size, seq_len) and whether the classifier shares the token embedding, RoPE's
/// base and RMSNorm's epsilon (which GGUF files give). The sizes they imply are computed in checked
/// 64-bit arithmetic. Checked in the tests against the header of stories260K.bin and against absurd
/// headers.
#pragma once

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#include "kvlab/analysis/kv_cache_size.hpp"
#include "kvlab/config.hpp"

namespace kvlab {

namespace detail {
/// `x` in the fewest digits that read back as the same float ("100000", "1e-05").
inline std::string shortest(float x) {
  std::ostringstream out;
  out << x;  // 6 significant digits: enough for the round numbers of model configs
  return out.str();
}
}  // namespace detail

/// The shape of a Llama-style decoder, as llama2.c's `Config` holds it.
///
/// A model has `n_layers` blocks of (RMSNorm, attention with `n_heads` query heads over
/// `n_kv_heads` K/V heads of `dim / n_heads` values each, RMSNorm, SwiGLU MLP of width
/// `hidden_dim`) on a residual stream of width `dim`; tokens are ids in `[0, vocab_size)`;
/// positions run up to `seq_len`. The classifier that turns the final hidden state into
/// `vocab_size` logits is the token embedding itself (`shared_classifier`, as in every
/// TinyStories checkpoint) or a separate `[vocab_size, dim]` matrix. llama2.c's file format
/// stores the flag as the sign of `vocab_size` (negative: separate classifier).
///
/// `validate()` checks everything the forward pass relies on: sizes >= 1, `n_heads` a multiple
/// of `n_kv_heads` (grouped-query attention), `dim` a multiple of `n_heads`, an even head size
/// (RoPE rotates pairs of values), and no size overflowing 64 bits.
struct LlamaConfig {
  int dim = 0;                    ///< width of the residual stream (= n_heads * head_dim)
  int hidden_dim = 0;             ///< width of the SwiGLU MLP
  int n_layers = 0;               ///< transformer blocks
  int n_heads = 0;                ///< query heads per layer
  int n_kv_heads = 0;             ///< key/value heads per layer (divides n_heads)
  int vocab_size = 0;             ///< token ids are in [0, vocab_size)
  int seq_len = 0;                ///< the longest sequence (prompt + generated tokens)
  bool shared_classifier = true;  ///< true: logits use the token embedding as classifier
  /// RoPE's base: pair j of a head turns by `pos / rope_theta^(2j / head_dim)` (10000 in
  /// llama2.c and Llama 2; 100000 in SmolLM2)
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;  ///< RMSNorm's epsilon, added to the mean square

  /// Values per head: `dim / n_heads`.
  int head_dim() const { return dim / n_heads; }
  /// Width of a K or V row: `n_kv_heads * head_dim()`.
  int kv_dim() const { return n_kv_heads * head_dim(); }

  /// Throws InvalidArgument, naming `where` and the field (prefixed by `prefix`, e.g.\ a file
  /// name and ": "), for the first value that breaks the rules above.
  void validate(const char* where, const std::string& prefix = "") const {
    const auto at_least_one = [&](const char* name, int value) {
      if (value < 1) detail::fail(where, prefix + name, ">= 1", value);
    };
    at_least_one("dim", dim);
    at_least_one("hidden_dim", hidden_dim);
    at_least_one("n_layers", n_layers);
    at_least_one("n_heads", n_heads);
    at_least_one("n_kv_heads", n_kv_heads);
    at_least_one("vocab_size", vocab_size);
    at_least_one("seq_len", seq_len);
    if (n_heads % n_kv_heads != 0) {
      detail::fail(where, prefix + "n_heads",
                   "a multiple of n_kv_heads (" + std::to_string(n_kv_heads) + ")", n_heads);
    }
    if (dim % n_heads != 0) {
      detail::fail(where, prefix + "dim", "a multiple of n_heads (" + std::to_string(n_heads) + ")",
                   dim);
    }
    if (head_dim() % 2 != 0) {
      detail::fail(where, prefix + "dim / n_heads",
                   "an even head size (RoPE rotates pairs of values)", head_dim());
    }
    if (!(rope_theta > 1.0f) || !std::isfinite(rope_theta))
      detail::fail(where, prefix + "rope_theta", "a finite base > 1", rope_theta);
    if (!(norm_eps > 0.0f) || !std::isfinite(norm_eps))
      detail::fail(where, prefix + "norm_eps", "a finite epsilon > 0", norm_eps);
    (void)num_weights(where, prefix);  // throws if a size overflows
  }

  /// Parameters of the model: embedding, per layer (2 norms, wq, wk, wv, wo, w1, w2, w3), final
  /// norm, and the classifier when it is not shared. Checked against overflow.
  /// \throws InvalidArgument (naming `where`) if a size overflows 64 bits.
  std::uint64_t num_parameters(const char* where = "kvlab::LlamaConfig::num_parameters",
                               const std::string& prefix = "") const {
    // Each product names the field that makes it overflow; each sum, the running count.
    constexpr std::uint64_t kMax = detail::kMaxSignedSize;  // sizes become stream offsets
    const auto u = [](int v) { return static_cast<std::uint64_t>(v < 0 ? 0 : v); };
    const auto product = [&](const char* field, std::uint64_t a, std::uint64_t b) {
      return detail::checked_size_product(where, prefix + field, a, b, "", kMax);
    };
    const auto sum = [&](std::uint64_t a, std::uint64_t b) {
      return detail::checked_size_sum(where, prefix + "parameter count", a, b, "", kMax);
    };
    const std::uint64_t d = u(dim);
    const std::uint64_t kv = u(n_kv_heads) * u(dim / (n_heads < 1 ? 1 : n_heads));  // kv_dim
    const std::uint64_t embedding = product("vocab_size", d, u(vocab_size));  // [vocab_size, dim]
    std::uint64_t layer = 2 * d;                           // rms_att, rms_ffn: [dim] each
    layer = sum(layer, product("dim", d, d));              // wq [dim, dim]
    layer = sum(layer, product("n_kv_heads", 2 * d, kv));  // wk, wv [kv_dim, dim]
    layer = sum(layer, product("dim", d, d));              // wo [dim, dim]
    layer = sum(layer, product("hidden_dim", 3 * d, u(hidden_dim)));  // w1, w3, w2
    std::uint64_t total = sum(embedding, product("n_layers", layer, u(n_layers)));
    total = sum(total, d);                                  // rms_final [dim]
    if (!shared_classifier) total = sum(total, embedding);  // wcls [vocab_size, dim]
    return total;
  }

  /// float32 values after the header of a llama2.c version-0 file: the parameters plus the
  /// legacy RoPE tables `freq_cis_real` and `freq_cis_imag` (seq_len * head_dim / 2 each), which
  /// run.c skips and kvlab skips too (it computes the rotation as run.c does).
  /// \throws InvalidArgument (naming `where`) if a size overflows 64 bits.
  std::uint64_t num_weights(const char* where = "kvlab::LlamaConfig::num_weights",
                            const std::string& prefix = "") const {
    const std::uint64_t params = num_parameters(where, prefix);
    // 2 tables of seq_len * head_dim / 2 values each
    const std::uint64_t rope = detail::checked_size_product(
        where, prefix + "seq_len", static_cast<std::uint64_t>(dim / (n_heads < 1 ? 1 : n_heads)),
        static_cast<std::uint64_t>(seq_len < 0 ? 0 : seq_len), "", detail::kMaxSignedSize);
    return detail::checked_size_sum(where, prefix + "weight count", params, rope, "",
                                    detail::kMaxSignedSize);
  }

  /// Bytes of a llama2.c version-0 checkpoint of this shape: the 28-byte header (7 int32) and
  /// `num_weights()` float32 values.
  /// \throws InvalidArgument (naming `where`) if the size overflows 64 bits.
  std::uint64_t checkpoint_bytes(const char* where = "kvlab::LlamaConfig::checkpoint_bytes",
                                 const std::string& prefix = "") const {
    const std::uint64_t floats = num_weights(where, prefix);
    return detail::checked_size_sum(
        where, prefix + "file size", 28,
        detail::checked_size_product(where, prefix + "weight count", 4, floats, "",
                                     detail::kMaxSignedSize),
        "", detail::kMaxSignedSize);
  }

  /// Bytes of weights that one decode step (one token through the model) reads: every layer's
  /// norms and matrices, the final norm, the whole classifier (the embedding table when shared)
  /// and one embedding row. Decoding one token is a pass over these bytes, so at batch size 1 it
  /// is bound by memory bandwidth: time per token >= this / bandwidth.
  std::uint64_t decode_weight_bytes() const {
    const std::uint64_t d = static_cast<std::uint64_t>(dim);
    const std::uint64_t per_layer = 2 * d + 2 * d * d +
                                    2 * static_cast<std::uint64_t>(kv_dim()) * d +
                                    3 * static_cast<std::uint64_t>(hidden_dim) * d;
    const std::uint64_t floats = static_cast<std::uint64_t>(n_layers) * per_layer + d +
                                 static_cast<std::uint64_t>(vocab_size) * d + d;
    return 4 * floats;
  }

  /// A small model for tests, tutorials and `kvlab-generate` without `--model`: dim 48, hidden
  /// 128, 3 layers, 6 query heads over 2 K/V heads (GQA, head_dim 8), vocab 256, seq_len 512,
  /// separate classifier. Small enough that the naive backend runs 200+ steps in about a second.
  /// (With random weights a shared classifier makes every token predict itself — its embedding
  /// is closest to itself — so greedy decoding would repeat one token; a separate one does not.)
  static LlamaConfig tiny() {
    return LlamaConfig()
        .with_dim(48)
        .with_hidden_dim(128)
        .with_layers(3)
        .with_heads(6, 2)
        .with_vocab_size(256)
        .with_seq_len(512)
        .with_shared_classifier(false);
  }

  /// The shape of stories260K.bin (llama2.c's smallest TinyStories model): dim 64, hidden 172,
  /// 5 layers, 8 heads over 4 K/V heads, vocab 512, seq_len 512, shared classifier.
  static LlamaConfig stories260k() {
    return LlamaConfig()
        .with_dim(64)
        .with_hidden_dim(172)
        .with_layers(5)
        .with_heads(8, 4)
        .with_vocab_size(512)
        .with_seq_len(512);
  }

  /// The shape of stories15M.bin: dim 288, hidden 768, 6 layers, 6 heads (MHA), vocab 32000,
  /// seq_len 256, shared classifier (about 15 million parameters, 60 MB of float32).
  static LlamaConfig stories15m() {
    return LlamaConfig()
        .with_dim(288)
        .with_hidden_dim(768)
        .with_layers(6)
        .with_heads(6, 6)
        .with_vocab_size(32000)
        .with_seq_len(256);
  }

  /// Named construction, field by field (seven ints in a row are easy to swap):
  /// `LlamaConfig().with_dim(288).with_hidden_dim(768).with_layers(6).with_heads(6, 6)
  /// .with_vocab_size(32000).with_seq_len(256)`. Nothing is checked until `validate()` (a
  /// model checks its config when it is built).
  LlamaConfig& with_dim(int value) {
    dim = value;
    return *this;
  }
  /// Sets `hidden_dim`; see `with_dim`.
  LlamaConfig& with_hidden_dim(int value) {
    hidden_dim = value;
    return *this;
  }
  /// Sets `n_layers`; see `with_dim`.
  LlamaConfig& with_layers(int value) {
    n_layers = value;
    return *this;
  }
  /// Sets `n_heads` (query heads) and `n_kv_heads` (key/value heads); see `with_dim`.
  LlamaConfig& with_heads(int query_heads, int kv_heads) {
    n_heads = query_heads;
    n_kv_heads = kv_heads;
    return *this;
  }
  /// Sets `vocab_size`; see `with_dim`.
  LlamaConfig& with_vocab_size(int value) {
    vocab_size = value;
    return *this;
  }
  /// Sets `seq_len`; see `with_dim`.
  LlamaConfig& with_seq_len(int value) {
    seq_len = value;
    return *this;
  }
  /// Sets `shared_classifier`; see `with_dim`.
  LlamaConfig& with_shared_classifier(bool value) {
    shared_classifier = value;
    return *this;
  }

  /// Sets `rope_theta`; see `with_dim`.
  LlamaConfig& with_rope_theta(float value) {
    rope_theta = value;
    return *this;
  }
  /// Sets `norm_eps`; see `with_dim`.
  LlamaConfig& with_norm_eps(float value) {
    norm_eps = value;
    return *this;
  }

  /// True when every field is equal.
  bool operator==(const LlamaConfig& o) const {
    return dim == o.dim && hidden_dim == o.hidden_dim && n_layers == o.n_layers &&
           n_heads == o.n_heads && n_kv_heads == o.n_kv_heads && vocab_size == o.vocab_size &&
           seq_len == o.seq_len && shared_classifier == o.shared_classifier &&
           rope_theta == o.rope_theta && norm_eps == o.norm_eps;
  }
  /// True when any field differs.
  bool operator!=(const LlamaConfig& o) const { return !(*this == o); }
};

/// The attention dimensions of `config` in the size calculator's terms (`ModelConfig`), named
/// `name`: `bytes_per_token(to_model_config(config), KVDtype::fp32)` is what one token of this
/// model adds to its KV cache in float.
/// \throws InvalidArgument if `config` is not a valid model (`LlamaConfig::validate`).
inline ModelConfig to_model_config(const LlamaConfig& config, const std::string& name = "llama") {
  config.validate("kvlab::to_model_config");
  ModelConfig out;
  out.name = name;
  out.num_layers = config.n_layers;
  out.num_heads = config.n_heads;
  out.num_kv_heads = config.n_kv_heads;
  out.head_dim = config.dim / config.n_heads;
  return out;
}

/// One line describing `config`, e.g.\ "dim 64, hidden 172, 5 layers, 8 heads / 4 kv heads,
/// vocab 512, seq_len 512, shared classifier" (then RoPE's base and RMSNorm's epsilon when they
/// are not llama2.c's 10000 and 1e-5).
inline std::string to_string(const LlamaConfig& c) {
  std::string extra;
  if (c.rope_theta != 10000.0f) extra += ", rope base " + detail::shortest(c.rope_theta);
  if (c.norm_eps != 1e-5f) extra += ", norm eps " + detail::shortest(c.norm_eps);
  return "dim " + std::to_string(c.dim) + ", hidden " + std::to_string(c.hidden_dim) + ", " +
         std::to_string(c.n_layers) + " layers, " + std::to_string(c.n_heads) + " heads / " +
         std::to_string(c.n_kv_heads) + " kv heads, vocab " + std::to_string(c.vocab_size) +
         ", seq_len " + std::to_string(c.seq_len) +
         (c.shared_classifier ? ", shared classifier" : ", separate classifier") + extra;
}

}  // namespace kvlab
