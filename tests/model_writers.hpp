// Writers of the two llama2.c file formats, written from the formats' descriptions and
// independently of kvlab's readers: the tests' round trips and bad-file cases, and the seed
// corpora of the fuzz targets (tests/fuzz), are made with them. Also what the tests of files and
// models share: a temporary file, and the built-in model's weights.
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "kvlab/model/llama_weights.hpp"

namespace kvlab_test {

/// Appends `value` to `out`, little-endian.
inline void put_u32(std::string& out, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFFu));
}
/// Appends `value` to `out`, little-endian two's complement.
inline void put_i32(std::string& out, std::int32_t value) {
  std::uint32_t u;
  std::memcpy(&u, &value, 4);
  put_u32(out, u);
}
/// Appends `value` to `out`, little-endian IEEE 754 binary32.
inline void put_f32(std::string& out, float value) {
  std::uint32_t u;
  std::memcpy(&u, &value, 4);
  put_u32(out, u);
}

/// Appends the values of `m` to `out`, row-major (as llama2.c's serialize_fp32 writes them).
template <typename Matrix>
void put_tensor(std::string& out, const Matrix& m) {
  for (Eigen::Index r = 0; r < m.rows(); ++r)
    for (Eigen::Index c = 0; c < m.cols(); ++c) put_f32(out, static_cast<float>(m(r, c)));
}

/// The bytes of `w` as llama2.c's legacy_export writes them: header (vocab_size negative for a
/// separate classifier), embedding, each kind of per-layer tensor for all layers, final norm, the
/// RoPE tables freq_cis_real / freq_cis_imag ([seq_len, head_dim / 2] each: cos and sin of
/// pos * 10000^(-2j / head_dim)), then wcls when not shared.
inline std::string checkpoint_bytes(const kvlab::LlamaWeights& w) {
  const kvlab::LlamaConfig& c = w.config;
  std::string out;
  for (int v : {c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
                c.shared_classifier ? c.vocab_size : -c.vocab_size, c.seq_len})
    put_i32(out, v);
  put_tensor(out, w.token_embedding);
  for (const kvlab::LlamaLayerWeights& l : w.layers) put_tensor(out, l.rms_att);
  for (const kvlab::LlamaLayerWeights& l : w.layers) put_tensor(out, l.wq);
  for (const kvlab::LlamaLayerWeights& l : w.layers) put_tensor(out, l.wk);
  for (const kvlab::LlamaLayerWeights& l : w.layers) put_tensor(out, l.wv);
  for (const kvlab::LlamaLayerWeights& l : w.layers) put_tensor(out, l.wo);
  for (const kvlab::LlamaLayerWeights& l : w.layers) put_tensor(out, l.rms_ffn);
  for (const kvlab::LlamaLayerWeights& l : w.layers) put_tensor(out, l.w1);
  for (const kvlab::LlamaLayerWeights& l : w.layers) put_tensor(out, l.w2);
  for (const kvlab::LlamaLayerWeights& l : w.layers) put_tensor(out, l.w3);
  put_tensor(out, w.rms_final);
  const int half = c.head_dim() / 2;
  for (int part = 0; part < 2; ++part)  // freq_cis_real, then freq_cis_imag
    for (int pos = 0; pos < c.seq_len; ++pos)
      for (int j = 0; j < half; ++j) {
        const double angle = pos / std::pow(10000.0, 2.0 * j / c.head_dim());
        put_f32(out, static_cast<float>(part == 0 ? std::cos(angle) : std::sin(angle)));
      }
  if (!c.shared_classifier) put_tensor(out, w.wcls);
  return out;
}

/// The bytes of a tokenizer.bin: int32 max_token_length, then per token float32 score, int32
/// length, `length` bytes; all little-endian.
inline std::string tokenizer_bytes(std::int32_t max_token_length,
                                   const std::vector<std::string>& pieces,
                                   const std::vector<float>& scores) {
  std::string out;
  put_i32(out, max_token_length);
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    put_f32(out, scores[i]);
    put_i32(out, static_cast<std::int32_t>(pieces[i].size()));
    out += pieces[i];
  }
  return out;
}

/// Writes `bytes` to `path` (replacing it).
inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// A file `kvlab_test_<pid>_<name>` in the test's working directory, removed at the end of the
/// scope. Named after the process: CTest runs each case as a process of its own, side by side.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name)
      : path("kvlab_test_" + std::to_string(getpid()) + "_" + name) {}
  ~TempFile() { std::remove(path.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
};

/// The built-in model's weights (`LlamaWeights::builtin()`), made once and shared.
inline std::shared_ptr<const kvlab::LlamaWeights> builtin_weights() {
  static const auto weights =
      std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin());
  return weights;
}

}  // namespace kvlab_test
