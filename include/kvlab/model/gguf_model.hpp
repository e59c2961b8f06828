/// \file
/// \brief A Llama-architecture model from a GGUF file.
///
/// `llama_config_from_gguf` reads the shape from the metadata (the keys under llama);
/// `load_gguf_weights` reads the tensors (dequantized to float) into `LlamaWeights`. Checked in the
/// tests on files the tests write (each missing key, wrong architecture and wrong shape refused)
/// and on SmolLM2-135M-Instruct against a double-precision reference made from the same file by
/// other code (`tests/golden/`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/model/gguf.hpp"
#include "kvlab/model/llama_config.hpp"
#include "kvlab/model/llama_weights.hpp"

namespace kvlab {

namespace detail {

// Integer `key` of `file` as an int in [minimum, INT32_MAX], named on error.
inline int gguf_int(const GgufFile& file, const std::string& key, std::int64_t minimum = 1) {
  const std::int64_t v = file.get_int(key);
  if (v < minimum || v > INT32_MAX) {
    detail::fail("kvlab::llama_config_from_gguf", file.path() + ": key '" + key + "'",
                 "in [" + std::to_string(minimum) + ", 2^31 - 1]", v);
  }
  return static_cast<int>(v);
}

}  // namespace detail

/// The shape of the Llama-architecture model in `file`, from its metadata:
///  - `general.architecture` must be "llama" (SmolLM2, Llama 2/3, Mistral and TinyLlama files
///    all say so);
///  - `llama.embedding_length` (dim), `llama.feed_forward_length` (hidden_dim),
///    `llama.block_count` (n_layers), `llama.attention.head_count` (n_heads),
///    `llama.attention.head_count_kv` (n_kv_heads; n_heads when absent, as llama.cpp reads it),
///    `llama.context_length` (seq_len), `llama.rope.freq_base` (rope_theta; 10000 when absent),
///    `llama.attention.layer_norm_rms_epsilon` (norm_eps);
///  - vocab_size: the rows of `token_embd.weight` (`llama.vocab_size`, when present, must agree);
///  - shared_classifier: true when the file has no `output.weight` (tied embeddings);
///  - `llama.rope.dimension_count`, `llama.attention.key_length` and `value_length`, when
///    present, must equal head_dim (kvlab rotates and attends over whole heads).
/// \throws InvalidArgument naming the file and the key for a missing key, another architecture,
///         a value of the wrong type or out of range, or a config `LlamaConfig::validate`
///         refuses.
inline LlamaConfig llama_config_from_gguf(const GgufFile& file) {
  constexpr const char* kWhere = "kvlab::llama_config_from_gguf";
  const std::string at = file.path() + ": ";
  const std::string& arch = file.get_string("general.architecture");
  if (arch != "llama") {
    detail::fail(kWhere, at + "key 'general.architecture'", "\"llama\"", "\"" + arch + "\"");
  }
  LlamaConfig c;
  c.dim = detail::gguf_int(file, "llama.embedding_length");
  c.hidden_dim = detail::gguf_int(file, "llama.feed_forward_length");
  c.n_layers = detail::gguf_int(file, "llama.block_count");
  c.n_heads = detail::gguf_int(file, "llama.attention.head_count");
  c.n_kv_heads = file.find("llama.attention.head_count_kv") != nullptr
                     ? detail::gguf_int(file, "llama.attention.head_count_kv")
                     : c.n_heads;
  c.seq_len = detail::gguf_int(file, "llama.context_length");
  if (file.find("llama.rope.freq_base") != nullptr)
    c.rope_theta = static_cast<float>(file.get_float("llama.rope.freq_base"));
  c.norm_eps = static_cast<float>(file.get_float("llama.attention.layer_norm_rms_epsilon"));
  const GgufTensorInfo& embedding = file.tensor("token_embd.weight");
  if (embedding.dims.size() != 2 || embedding.dims[1] > INT32_MAX) {
    detail::fail(kWhere, at + "tensor 'token_embd.weight': dims", "[dim, vocab_size]",
                 embedding.shape());
  }
  c.vocab_size = static_cast<int>(embedding.dims[1]);
  if (file.find("llama.vocab_size") != nullptr) {
    detail::require_equal(kWhere, at + "key 'llama.vocab_size'",
                          static_cast<std::int64_t>(file.get_int("llama.vocab_size")),
                          static_cast<std::int64_t>(c.vocab_size), "rows of token_embd.weight");
  }
  c.shared_classifier = file.find_tensor("output.weight") == nullptr;
  c.validate(kWhere, at);
  for (const char* key : {"llama.rope.dimension_count", "llama.attention.key_length",
                          "llama.attention.value_length"}) {
    if (file.find(key) != nullptr) {
      detail::require_equal(
          kWhere, at + "key '" + key + "'", static_cast<std::int64_t>(detail::gguf_int(file, key)),
          static_cast<std::int64_t>(c.head_dim()), "head_dim = embedding_length / head_count");
    }
  }
  return c;
}

/// The weights of the Llama-architecture model in `file`, dequantized to float, in
/// `LlamaWeights`' layout. GGUF stores a matrix `[out, in]` with dims `{in, out}` (innermost
/// first), so its rows are `LlamaWeights`' rows as they are:
///
/// | GGUF tensor | `LlamaWeights` | dims in the file |
/// |---|---|---|
/// | `token_embd.weight` | `token_embedding` | {dim, vocab_size} |
/// | `blk.N.attn_norm.weight` | `layers[N].rms_att` | {dim} |
/// | `blk.N.attn_q.weight`, `attn_k`, `attn_v` | `wq`, `wk`, `wv` | {dim, dim}, {dim, kv_dim} ×2 |
/// | `blk.N.attn_output.weight` | `wo` | {dim, dim} |
/// | `blk.N.ffn_norm.weight` | `rms_ffn` | {dim} |
/// | `blk.N.ffn_gate.weight`, `ffn_up`, `ffn_down` | `w1`, `w3`, `w2` | {dim, hidden} ×2, {hidden,
/// dim} | | `output_norm.weight` | `rms_final` | {dim} | | `output.weight` (absent: tied) | `wcls`
/// | {dim, vocab_size} |
///
/// The rows of `attn_q` and `attn_k` are in the order that rotates adjacent pairs
/// (`RotaryEmbedding`), which is what kvlab's RoPE does: nothing is permuted.
/// \throws InvalidArgument naming the tensor when one is missing, its dims disagree with the
///         config, or it holds a value that is not finite; and as `llama_config_from_gguf`.
inline LlamaWeights load_gguf_weights(const GgufFile& file) {
  const LlamaConfig c = llama_config_from_gguf(file);
  const auto u = [](int v) { return static_cast<std::uint64_t>(v); };
  const std::uint64_t d = u(c.dim), kv = u(c.kv_dim()), hid = u(c.hidden_dim);
  // Every tensor's dims are checked before any is read: nothing is built from a wrong file. Each
  // is checked as it is named, so a layer count the tensors do not back (a block_count of 10^8
  // in a small file) fails at its first missing tensor, not after listing them all.
  const auto check = [&](const std::string& name, const std::vector<std::uint64_t>& dims) {
    const GgufTensorInfo& t = file.tensor(name);
    if (t.dims != dims) {
      GgufTensorInfo want;
      want.dims = dims;
      detail::fail("kvlab::load_gguf_weights", file.path() + ": tensor '" + name + "': dims",
                   want.shape() + " (from the metadata: " + to_string(c) + ")", t.shape());
    }
  };
  check("token_embd.weight", {d, u(c.vocab_size)});
  check("output_norm.weight", {d});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    check(b + "attn_norm.weight", {d});
    check(b + "attn_q.weight", {d, d});
    check(b + "attn_k.weight", {d, kv});
    check(b + "attn_v.weight", {d, kv});
    check(b + "attn_output.weight", {d, d});
    check(b + "ffn_norm.weight", {d});
    check(b + "ffn_gate.weight", {d, hid});
    check(b + "ffn_up.weight", {d, hid});
    check(b + "ffn_down.weight", {hid, d});
  }
  if (!c.shared_classifier) check("output.weight", {d, u(c.vocab_size)});
  LlamaWeights w;
  w.config = c;
  w.token_embedding = file.read_matrix("token_embd.weight");
  w.layers.resize(static_cast<std::size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    LlamaLayerWeights& layer = w.layers[static_cast<std::size_t>(l)];
    layer.rms_att = file.read_matrix(b + "attn_norm.weight");
    layer.wq = file.read_matrix(b + "attn_q.weight");
    layer.wk = file.read_matrix(b + "attn_k.weight");
    layer.wv = file.read_matrix(b + "attn_v.weight");
    layer.wo = file.read_matrix(b + "attn_output.weight");
    layer.rms_ffn = file.read_matrix(b + "ffn_norm.weight");
    layer.w1 = file.read_matrix(b + "ffn_gate.weight");
    layer.w3 = file.read_matrix(b + "ffn_up.weight");
    layer.w2 = file.read_matrix(b + "ffn_down.weight");
  }
  w.rms_final = file.read_matrix("output_norm.weight");
  if (!c.shared_classifier) w.wcls = file.read_matrix("output.weight");
  w.check("kvlab::load_gguf_weights");
  return w;
}

/// `load_gguf_weights(GgufFile(path))`: the model in GGUF file `path`.
/// \throws InvalidArgument as `GgufFile` and `load_gguf_weights`.
inline LlamaWeights load_gguf_weights(const std::string& path) {
  return load_gguf_weights(GgufFile(path));
}

}  // namespace kvlab
