// A writer of GGUF files, written from the format's description (ggml's docs/gguf.md) and
// independently of kvlab's reader: the tests' files of every value type and tensor type, their
// defects, the small Llama models of the tests, and the fuzz target's seed corpus are made with
// it.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "kvlab/model/llama_weights.hpp"

namespace kvlab_test {

/// Appends the `n` low bytes of `value` to `out`, little-endian.
inline void put_le(std::string& out, std::uint64_t value, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFFu));
}
/// Appends a GGUF string: uint64 length, then the bytes.
inline void put_gguf_string(std::string& out, const std::string& s) {
  put_le(out, s.size(), 8);
  out += s;
}
/// The 4 bytes of `x`.
inline std::uint32_t f32_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

/// A GGUF file under construction: metadata entries and tensors, in the order added; `bytes()`
/// lays them out (header, metadata, tensor infos, padding to the alignment, data).
struct GgufWriter {
  std::uint32_t version = 3;
  std::uint32_t alignment = 32;  // used for the layout; written only if set_alignment is called
  std::uint64_t metadata_count = 0;
  std::string metadata;  // the entries' bytes
  struct Tensor {
    std::string name;
    std::vector<std::uint64_t> dims;  // innermost first
    std::uint32_t type;
    std::string data;  // the stored bytes
  };
  std::vector<Tensor> tensors;

  // --- metadata: key, type id, value --------------------------------------------------------
  void key(const std::string& k, std::uint32_t type) {
    put_gguf_string(metadata, k);
    put_le(metadata, type, 4);
    ++metadata_count;
  }
  void u8(const std::string& k, std::uint8_t v) { key(k, 0), put_le(metadata, v, 1); }
  void i8(const std::string& k, std::int8_t v) {
    key(k, 1), put_le(metadata, static_cast<std::uint8_t>(v), 1);
  }
  void u16(const std::string& k, std::uint16_t v) { key(k, 2), put_le(metadata, v, 2); }
  void i16(const std::string& k, std::int16_t v) {
    key(k, 3), put_le(metadata, static_cast<std::uint16_t>(v), 2);
  }
  void u32(const std::string& k, std::uint32_t v) { key(k, 4), put_le(metadata, v, 4); }
  void i32(const std::string& k, std::int32_t v) {
    key(k, 5), put_le(metadata, static_cast<std::uint32_t>(v), 4);
  }
  void f32(const std::string& k, float v) { key(k, 6), put_le(metadata, f32_bits(v), 4); }
  void boolean(const std::string& k, bool v) { key(k, 7), put_le(metadata, v ? 1 : 0, 1); }
  void str(const std::string& k, const std::string& v) { key(k, 8), put_gguf_string(metadata, v); }
  void u64(const std::string& k, std::uint64_t v) { key(k, 10), put_le(metadata, v, 8); }
  void i64(const std::string& k, std::int64_t v) {
    key(k, 11), put_le(metadata, static_cast<std::uint64_t>(v), 8);
  }
  void f64(const std::string& k, double v) {
    key(k, 12);
    std::uint64_t u;
    std::memcpy(&u, &v, 8);
    put_le(metadata, u, 8);
  }
  void strings(const std::string& k, const std::vector<std::string>& v) {
    key(k, 9);
    put_le(metadata, 8, 4);
    put_le(metadata, v.size(), 8);
    for (const std::string& s : v) put_gguf_string(metadata, s);
  }
  void i32s(const std::string& k, const std::vector<std::int32_t>& v) {
    key(k, 9);
    put_le(metadata, 5, 4);
    put_le(metadata, v.size(), 8);
    for (std::int32_t x : v) put_le(metadata, static_cast<std::uint32_t>(x), 4);
  }
  void set_alignment(std::uint32_t a) {
    alignment = a;
    u32("general.alignment", a);
  }

  // --- tensors ------------------------------------------------------------------------------
  void tensor(const std::string& name, std::vector<std::uint64_t> dims, std::uint32_t type,
              std::string data) {
    tensors.push_back(Tensor{name, std::move(dims), type, std::move(data)});
  }
  /// A float32 tensor of `values` ([rows, cols] row-major as dims {cols, rows}).
  void f32_tensor(const std::string& name, std::vector<std::uint64_t> dims, const float* values,
                  std::size_t n) {
    std::string data;
    for (std::size_t i = 0; i < n; ++i) put_le(data, f32_bits(values[i]), 4);
    tensor(name, std::move(dims), 0, std::move(data));
  }

  /// The file's bytes. `offset_shift` is added to every tensor's offset (to plant a bad one).
  std::string bytes(std::uint64_t offset_shift = 0) const {
    std::string out = "GGUF";
    put_le(out, version, 4);
    put_le(out, tensors.size(), 8);
    put_le(out, metadata_count, 8);
    out += metadata;
    std::uint64_t offset = 0;
    for (const Tensor& t : tensors) {
      put_gguf_string(out, t.name);
      put_le(out, t.dims.size(), 4);
      for (std::uint64_t d : t.dims) put_le(out, d, 8);
      put_le(out, t.type, 4);
      put_le(out, offset + offset_shift, 8);
      offset += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    while (out.size() % alignment != 0) out.push_back('\0');
    for (const Tensor& t : tensors) {
      out += t.data;
      while (out.size() % alignment != 0) out.push_back('\0');
    }
    return out;
  }
};

/// GPT-2's byte-level alphabet, written from its definition (`bytes_to_unicode`): bytes 33-126,
/// 161-172 and 174-255 stand for the characters of the same code, the other 68 for U+0100,
/// U+0101, ... in byte order; [256] characters as UTF-8. The tests' vocabularies start from it.
inline std::vector<std::string> gpt2_byte_chars() {
  std::vector<std::string> chars;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const int c = printable ? b : next++;
    std::string s;
    if (c < 0x80) {
      s.push_back(static_cast<char>(c));
    } else {
      s.push_back(static_cast<char>(0xC0 | (c >> 6)));
      s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
    chars.push_back(s);
  }
  return chars;
}

/// `w` as a GGUF file of the llama architecture, every tensor float32, with the metadata
/// `llama_config_from_gguf` reads (and a classifier `output.weight` when not shared).
inline GgufWriter llama_gguf(const kvlab::LlamaWeights& w) {
  const kvlab::LlamaConfig& c = w.config;
  GgufWriter g;
  g.str("general.architecture", "llama");
  g.u32("llama.embedding_length", static_cast<std::uint32_t>(c.dim));
  g.u32("llama.feed_forward_length", static_cast<std::uint32_t>(c.hidden_dim));
  g.u32("llama.block_count", static_cast<std::uint32_t>(c.n_layers));
  g.u32("llama.attention.head_count", static_cast<std::uint32_t>(c.n_heads));
  g.u32("llama.attention.head_count_kv", static_cast<std::uint32_t>(c.n_kv_heads));
  g.u32("llama.context_length", static_cast<std::uint32_t>(c.seq_len));
  g.f32("llama.rope.freq_base", c.rope_theta);
  g.f32("llama.attention.layer_norm_rms_epsilon", c.norm_eps);
  g.u32("llama.rope.dimension_count", static_cast<std::uint32_t>(c.head_dim()));
  const auto u = [](Eigen::Index v) { return static_cast<std::uint64_t>(v); };
  const auto matrix = [&](const std::string& name, const kvlab::RowMatrix<float>& m) {
    g.f32_tensor(name, {u(m.cols()), u(m.rows())}, m.data(), static_cast<std::size_t>(m.size()));
  };
  const auto vector = [&](const std::string& name, const kvlab::RowVector<float>& v) {
    g.f32_tensor(name, {u(v.size())}, v.data(), static_cast<std::size_t>(v.size()));
  };
  matrix("token_embd.weight", w.token_embedding);
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    const kvlab::LlamaLayerWeights& x = w.layers[l];
    const std::string b = "blk." + std::to_string(l) + ".";
    vector(b + "attn_norm.weight", x.rms_att);
    matrix(b + "attn_q.weight", x.wq);
    matrix(b + "attn_k.weight", x.wk);
    matrix(b + "attn_v.weight", x.wv);
    matrix(b + "attn_output.weight", x.wo);
    vector(b + "ffn_norm.weight", x.rms_ffn);
    matrix(b + "ffn_gate.weight", x.w1);
    matrix(b + "ffn_up.weight", x.w3);
    matrix(b + "ffn_down.weight", x.w2);
  }
  vector("output_norm.weight", w.rms_final);
  if (!c.shared_classifier) matrix("output.weight", w.wcls);
  return g;
}

}  // namespace kvlab_test
