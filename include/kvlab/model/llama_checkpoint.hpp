/// \file
/// \brief Reading llama2.c checkpoints (the legacy version-0 `.bin` format of `run.c`).
///
/// A checkpoint is the 7-int32 header, then float32 weights in run.c's order. Every defect (a file
/// that is missing, truncated, too long, whose header is absurd or overflows, or holding NaN or
/// infinite weights) is an InvalidArgument naming the file, the field, the expected and the actual
/// value, raised before anything is allocated for the weights. Checked in the tests against
/// stories260K.bin, against files the tests write, and against truncated, extended and garbage
/// files.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/matrix.hpp"
#include "kvlab/model/llama_config.hpp"
#include "kvlab/model/llama_weights.hpp"

namespace kvlab {

/// The first int32 of a llama2.c checkpoint in the newer export formats (version 1 and 2 of
/// llama2.c's `export.py`): the bytes "ak42" read as a little-endian int32. Version-0 files start
/// with `dim` instead.
constexpr std::int32_t kLlama2cMagic = 0x616b3432;

namespace detail {

/// An open checkpoint: its stream, size in bytes and name, for reading with named errors.
struct CheckpointFile {
  std::string path;        ///< the file's name, as given
  std::ifstream stream;    ///< open, binary
  std::uint64_t size = 0;  ///< bytes in the file
};

/// Opens `path` for reading and measures it.
inline CheckpointFile open_checkpoint(const char* where, const std::string& path) {
  CheckpointFile file{path, std::ifstream(path, std::ios::binary), 0};
  if (path.empty()) detail::fail(where, "path", "the name of a llama2.c checkpoint", "''");
  if (!file.stream)
    detail::fail(where, path, "an existing, readable llama2.c checkpoint",
                 "a path that cannot be opened");
  file.stream.seekg(0, std::ios::end);
  const std::streamoff end = file.stream.tellg();
  if (!file.stream || end < 0)
    detail::fail(where, path, "a file whose size can be read", "an error while seeking");
  file.size = static_cast<std::uint64_t>(end);
  file.stream.seekg(0, std::ios::beg);
  return file;
}

/// True on a little-endian host (the byte order of llama2.c's files).
inline bool little_endian_host() {
  const std::uint32_t one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

/// Reads the header of `file` (at offset 0) into a config, checking every field.
inline LlamaConfig read_checkpoint_header(const char* where, CheckpointFile& file) {
  const std::string prefix = file.path + ": ";
  if (!little_endian_host()) {
    detail::fail(where, prefix + "byte order",
                 "a little-endian host (llama2.c files are little-endian)", "big-endian");
  }
  if (file.size < 28) {
    detail::fail(where, prefix + "header",
                 "28 bytes (7 int32: dim, hidden_dim, n_layers, n_heads, n_kv_heads, "
                 "vocab_size, seq_len)",
                 std::to_string(file.size) + " bytes (the whole file)");
  }
  // [7]: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
  std::int32_t h[7] = {};
  file.stream.read(reinterpret_cast<char*>(h), sizeof h);
  if (!file.stream) detail::fail(where, prefix + "header", "28 readable bytes", "a read error");
  if (h[0] == kLlama2cMagic) {
    detail::fail(where, prefix + "format",
                 "a legacy version-0 checkpoint (header starts with dim; "
                 "llama2.c's export.py --version 0 writes one)",
                 "the magic \"ak42\" of llama2.c's version " + std::to_string(h[1]) + " format");
  }
  LlamaConfig c;
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  // llama2.c's convention: a negative vocab_size means the classifier is stored separately.
  if (h[5] == INT32_MIN)
    detail::fail(where, prefix + "vocab_size", "a value in [-2^31+1, 2^31-1], not 0", h[5]);
  c.vocab_size = h[5] < 0 ? -h[5] : h[5];
  c.shared_classifier = h[5] > 0;
  c.seq_len = h[6];
  c.validate(where, prefix);
  return c;
}

/// Reads `m.size()` float32 values into `m` (row-major, as in the file), naming `name` on error.
template <typename Matrix>
void read_tensor(const char* where, CheckpointFile& file, Matrix& m, const std::string& name) {
  const auto bytes =
      static_cast<std::streamsize>(m.size()) * static_cast<std::streamsize>(sizeof(float));
  file.stream.read(reinterpret_cast<char*>(m.data()), bytes);
  if (file.stream.gcount() != bytes) {
    detail::fail(where, file.path + ": " + name, std::to_string(bytes) + " bytes",
                 std::to_string(file.stream.gcount()) + " (read error)");
  }
  for (Eigen::Index i = 0; i < m.size(); ++i) {
    if (!std::isfinite(m.data()[i])) {
      detail::fail(where, file.path + ": " + name, "finite float32 values",
                   std::to_string(m.data()[i]) + " at index " + std::to_string(i));
    }
  }
}

}  // namespace detail

/// The configuration stored in the header of llama2.c checkpoint `path`, checked, and checked
/// against the file's size; the weights are not read.
/// \throws InvalidArgument as `load_llama_checkpoint`.
inline LlamaConfig read_llama_config(const std::string& path) {
  constexpr const char* kWhere = "kvlab::read_llama_config";
  detail::CheckpointFile file = detail::open_checkpoint(kWhere, path);
  const LlamaConfig config = detail::read_checkpoint_header(kWhere, file);
  const std::uint64_t expected = config.checkpoint_bytes(kWhere, path + ": ");
  detail::require_equal(kWhere, path + ": file size", file.size, expected,
                        "28-byte header + weights of " + to_string(config));
  return config;
}

/// Reads a llama2.c checkpoint in the legacy version-0 format, as `run.c` does.
///
/// Layout (little-endian):
///  - header, 7 int32: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (negative:
///    the classifier is stored separately), seq_len;
///  - float32 tensors, each kind for all layers before the next kind: token_embedding_table
///    [vocab_size, dim], rms_att_weight [n_layers, dim], wq [n_layers, dim, dim], wk and wv
///    [n_layers, kv_dim, dim], wo [n_layers, dim, dim], rms_ffn_weight [n_layers, dim], w1
///    [n_layers, hidden_dim, dim], w2 [n_layers, dim, hidden_dim], w3 [n_layers, hidden_dim, dim],
///    rms_final_weight [dim]; then the legacy RoPE tables freq_cis_real and freq_cis_imag
///    [seq_len, head_dim / 2] each (skipped: the rotation is computed as run.c computes it); then
///    wcls [vocab_size, dim] if vocab_size was negative.
///
/// Order of checks, all before the weights are allocated: the file opens; it holds the 28-byte
/// header; the header is not a newer format ("ak42" magic); every field is sane (see
/// `LlamaConfig::validate`: sizes >= 1, n_heads a multiple of n_kv_heads, dim a multiple of
/// n_heads, even head size, no overflow); the file size equals 28 + 4 * `num_weights()` exactly
/// (shorter: truncated; longer: not this model, or another format). Then the weights are read
/// once into Eigen matrices and checked to be finite.
///
/// \param path  the checkpoint, e.g. `stories260K.bin` from the tinyllamas model page
/// \return      the weights; `weights.config` is the header's shape
/// \throws InvalidArgument whose message names the function, the file and the field, e.g.
///         `"kvlab::load_llama_checkpoint: m.bin: n_heads: expected a multiple of n_kv_heads (3),
///         got 8"` or `"...: m.bin: file size: expected 1056540 (28-byte header + weights of dim
///         64, ...), got 1056536"`.
inline LlamaWeights load_llama_checkpoint(const std::string& path) {
  constexpr const char* kWhere = "kvlab::load_llama_checkpoint";
  detail::CheckpointFile file = detail::open_checkpoint(kWhere, path);
  const LlamaConfig config = detail::read_checkpoint_header(kWhere, file);
  const std::uint64_t expected = config.checkpoint_bytes(kWhere, path + ": ");
  detail::require_equal(kWhere, path + ": file size", file.size, expected,
                        "28-byte header + weights of " + to_string(config));

  LlamaWeights w = LlamaWeights::zeros(config);
  std::vector<LlamaLayerWeights>& layers = w.layers;
  const auto per_layer = [&](const char* name, auto member) {  // one kind of tensor, every layer
    for (std::size_t l = 0; l < layers.size(); ++l) {
      detail::read_tensor(kWhere, file, layers[l].*member,
                          std::string(name) + "[" + std::to_string(l) + "]");
    }
  };
  detail::read_tensor(kWhere, file, w.token_embedding, "token_embedding_table");
  per_layer("rms_att_weight", &LlamaLayerWeights::rms_att);
  per_layer("wq", &LlamaLayerWeights::wq);
  per_layer("wk", &LlamaLayerWeights::wk);
  per_layer("wv", &LlamaLayerWeights::wv);
  per_layer("wo", &LlamaLayerWeights::wo);
  per_layer("rms_ffn_weight", &LlamaLayerWeights::rms_ffn);
  per_layer("w1", &LlamaLayerWeights::w1);
  per_layer("w2", &LlamaLayerWeights::w2);
  per_layer("w3", &LlamaLayerWeights::w3);
  detail::read_tensor(kWhere, file, w.rms_final, "rms_final_weight");
  // The legacy freq_cis_real / freq_cis_imag tables: seq_len * head_dim / 2 floats each.
  const auto rope_bytes = static_cast<std::streamoff>(config.seq_len) * config.head_dim() * 4;
  file.stream.seekg(rope_bytes, std::ios::cur);
  if (!config.shared_classifier) detail::read_tensor(kWhere, file, w.wcls, "wcls");
  return w;
}

}  // namespace kvlab
