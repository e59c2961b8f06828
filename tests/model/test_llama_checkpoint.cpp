// llama2.c checkpoints (legacy version 0): LlamaConfig's checks and sizes, the header of
// stories260K.bin, a write/read round trip of every tensor (shared and separate classifier,
// written by model_writers.hpp's writer, which follows run.c's layout independently of the
// loader), and the documented error for every kind of bad file: missing, shorter than a header,
// truncated, extended, absurd or overflowing header fields, the newer format's magic, NaN
// weights, and garbage bytes.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "kvlab/kvlab.hpp"
#include "model_files.hpp"
#include "model_writers.hpp"
#include "test_support.hpp"
#include "weights_equal.hpp"

using kvlab::InvalidArgument;
using kvlab::LlamaConfig;
using kvlab::LlamaLayerWeights;
using kvlab::LlamaWeights;
using kvlab_test::check_equal;
using kvlab_test::error_of;
using kvlab_test::names;
using kvlab_test::TempFile;
using kvlab_test::write_bytes;

namespace {

// Writes `w` as llama2.c's legacy_export does (model_writers.hpp).
void write_checkpoint(const std::string& path, const LlamaWeights& w) {
  kvlab_test::write_bytes(path, kvlab_test::checkpoint_bytes(w));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
std::string header_bytes(const std::vector<std::int32_t>& fields) {
  return std::string(reinterpret_cast<const char*>(fields.data()), fields.size() * 4);
}

}  // namespace

TEST_CASE("LlamaConfig: sizes of known models, and every rule of validate()") {
  // stories15M: 15,191,712 parameters; its file is 60,816,028 bytes (28-byte header, then the
  // parameters and 2 x 256 x 24 RoPE floats). The file size is the one published for
  // stories15M.bin on the tinyllamas page (and found by other readers of it).
  CHECK(LlamaConfig::stories15m().num_parameters() == 15191712);
  CHECK(LlamaConfig::stories15m().checkpoint_bytes() == 60816028);
  // stories260K.bin is 1,056,540 bytes (the file of karpathy/tinyllamas).
  CHECK(LlamaConfig::stories260k().checkpoint_bytes() == 1056540);
  CHECK(LlamaConfig::stories260k().head_dim() == 8);
  CHECK(LlamaConfig::stories260k().kv_dim() == 32);
  LlamaConfig separate = LlamaConfig::stories260k();
  separate.shared_classifier = false;
  CHECK(separate.checkpoint_bytes() == 1056540 + 4 * 512 * 64);
  // Decode reads every matrix once, the classifier (= embedding, 512 x 64) included, plus one
  // embedding row.
  CHECK(LlamaConfig::stories260k().decode_weight_bytes() ==
        4 * (5 * (2 * 64 + 2 * 64 * 64 + 2 * 32 * 64 + 3 * 172 * 64) + 64 + 512 * 64 + 64));
  // Named construction sets the fields it names, and the size calculator takes the config: one
  // stories15M token is 2 (K, V) x 6 layers x 6 K/V heads x 48 values x 4 bytes in float.
  const LlamaConfig named = LlamaConfig()
                                .with_dim(288)
                                .with_hidden_dim(768)
                                .with_layers(6)
                                .with_heads(6, 6)
                                .with_vocab_size(32000)
                                .with_seq_len(256);
  CHECK(named == LlamaConfig::stories15m());
  const kvlab::ModelConfig as_model = kvlab::to_model_config(named, "stories15M");
  CHECK(as_model.name == "stories15M");
  CHECK(kvlab::bytes_per_token(as_model, kvlab::KVDtype::fp32) == 2 * 6 * 6 * 48 * 4);
  CHECK(kvlab::bytes_per_token(kvlab::to_model_config(LlamaConfig::stories260k()),
                               kvlab::KVDtype::fp16) == 2 * 5 * 4 * 8 * 2);

  constexpr const char* where = "test";
  const auto invalid = [&](LlamaConfig c) {
    return error_of([&] { c.validate(where, "f.bin: "); });
  };
  LlamaConfig c = LlamaConfig::tiny();
  c.dim = 0;
  CHECK_THAT(invalid(c), Catch::Contains("f.bin: dim: expected >= 1, got 0"));
  c = LlamaConfig::tiny();
  c.n_layers = -3;
  CHECK_THAT(invalid(c), Catch::Contains("f.bin: n_layers: expected >= 1, got -3"));
  c = LlamaConfig::tiny();
  c.n_kv_heads = 4;  // 6 heads
  CHECK_THAT(invalid(c),
             Catch::Contains("f.bin: n_heads: expected a multiple of n_kv_heads (4), got 6"));
  c = LlamaConfig::tiny();
  c.dim = 50;  // 6 heads
  CHECK_THAT(invalid(c), Catch::Contains("f.bin: dim: expected a multiple of n_heads (6), got 50"));
  c = LlamaConfig::tiny();
  c.dim = 42;  // head_dim 7
  CHECK_THAT(invalid(c), Catch::Contains("f.bin: dim / n_heads: expected an even head size"));
  c = LlamaConfig::tiny();
  c.dim = c.hidden_dim = c.n_layers = c.vocab_size = 2147483646;
  c.n_heads = c.n_kv_heads = 1;
  CHECK_THAT(invalid(c), Catch::Contains("f.bin: parameter count: expected at most ") &&
                             Catch::Contains("(so that the size fits in std::int64_t)"));
  CHECK_NOTHROW(LlamaConfig::tiny().validate(where));
}

TEST_CASE("stories260K.bin: the header is the documented shape and the weights load") {
  const std::string path = kvlab_test::model_file_or_skip("stories260K.bin");
  const LlamaConfig config = kvlab::read_llama_config(path);
  // dim 64, hidden 172, 5 layers, 8/4 heads, vocab 512, seq_len 512
  CHECK(config == LlamaConfig::stories260k());
  const LlamaWeights w = kvlab::load_llama_checkpoint(path);
  CHECK(w.config == config);
  CHECK(w.wcls.size() == 0);
  CHECK(&w.classifier() == &w.token_embedding);
  CHECK_NOTHROW(w.check());
  // The file's last tensor before the RoPE tables is rms_final_weight: trained values, not 0 or 1.
  CHECK(w.rms_final.cwiseAbs().minCoeff() > 0.0f);
  CHECK((w.rms_final.array() != 1.0f).any());
}

TEST_CASE(
    "a checkpoint written here reads back to the same weights, with a shared or a separate "
    "classifier") {
  for (const bool shared : {true, false}) {
    CAPTURE(shared);
    // GQA (4 heads over 2 K/V heads), head_dim 6, odd hidden width, 3 layers.
    const LlamaConfig config = LlamaConfig()
                                   .with_dim(24)
                                   .with_hidden_dim(37)
                                   .with_layers(3)
                                   .with_heads(4, 2)
                                   .with_vocab_size(50)
                                   .with_seq_len(16)
                                   .with_shared_classifier(shared);
    const LlamaWeights original = LlamaWeights::random(config, shared ? 1 : 2);
    TempFile file(shared ? "roundtrip_shared.bin" : "roundtrip_separate.bin");
    write_checkpoint(file.path, original);
    CHECK(read_bytes(file.path).size() == config.checkpoint_bytes());
    CHECK(kvlab::read_llama_config(file.path) == config);
    const LlamaWeights loaded = kvlab::load_llama_checkpoint(file.path);
    check_equal(loaded, original);
    // The same weights make the same model, bit for bit.
    kvlab::LlamaModel a(std::make_shared<const LlamaWeights>(original),
                        kvlab::LlamaBackend::Cached);
    kvlab::LlamaModel b(std::make_shared<const LlamaWeights>(loaded), kvlab::LlamaBackend::Cached);
    CHECK(a.prefill({1, 2, 3}) == b.prefill({1, 2, 3}));
  }
}

TEST_CASE(
    "bad files give an InvalidArgument naming the file, the field, the expected and the actual "
    "value") {
  const LlamaConfig config = LlamaConfig()
                                 .with_dim(16)
                                 .with_hidden_dim(24)
                                 .with_layers(2)
                                 .with_heads(4, 2)
                                 .with_vocab_size(32)
                                 .with_seq_len(8);
  const LlamaWeights weights = LlamaWeights::random(config, 3);
  TempFile good("good.bin");
  write_checkpoint(good.path, weights);
  const std::string bytes = read_bytes(good.path);
  const std::string size = std::to_string(bytes.size());
  TempFile bad("bad.bin");
  const auto load = [&] { (void)kvlab::load_llama_checkpoint(bad.path); };

  SECTION("missing") {
    CHECK_THROWS_MATCHES(
        kvlab::load_llama_checkpoint("kvlab_test_no_such_file.bin"), InvalidArgument,
        names("kvlab_test_no_such_file.bin", "an existing, readable llama2.c checkpoint",
              "a path that cannot be opened"));
  }
  SECTION("shorter than the header") {
    write_bytes(bad.path, bytes.substr(0, 10));
    CHECK_THROWS_MATCHES(load(), InvalidArgument,
                         names(bad.path + ": header", "28 bytes", "10 bytes (the whole file)"));
  }
  SECTION("truncated by one float, or by all the weights") {
    write_bytes(bad.path, bytes.substr(0, bytes.size() - 4));
    CHECK_THROWS_MATCHES(
        load(), InvalidArgument,
        names(bad.path + ": file size", size + " (28-byte header + weights of dim 16",
              std::to_string(bytes.size() - 4)));
    write_bytes(bad.path, bytes.substr(0, 28));
    CHECK_THROWS_MATCHES(load(), InvalidArgument, names(bad.path + ": file size", size, "28"));
  }
  SECTION("extended by one byte, or by a separate classifier the header does not announce") {
    write_bytes(bad.path, bytes + "x");
    CHECK_THROWS_MATCHES(load(), InvalidArgument,
                         names(bad.path + ": file size", size, std::to_string(bytes.size() + 1)));
    write_bytes(bad.path, bytes + std::string(4 * 32 * 16, '\0'));
    CHECK_THROWS_AS(load(), InvalidArgument);
  }
  SECTION("the header of a separate classifier on a file without one") {
    std::string flipped = bytes;
    const std::int32_t negative = -32;
    flipped.replace(20, 4, reinterpret_cast<const char*>(&negative), 4);
    write_bytes(bad.path, flipped);
    CHECK_THROWS_MATCHES(
        load(), InvalidArgument,
        names(bad.path + ": file size", std::to_string(bytes.size() + 4 * 32 * 16), size));
  }
  SECTION("absurd header fields, each named") {
    const std::vector<std::int32_t> ok{16, 24, 2, 4, 2, 32, 8};
    const auto with = [&](int field, std::int32_t value) {
      std::vector<std::int32_t> h = ok;
      h[static_cast<std::size_t>(field)] = value;
      write_bytes(bad.path, header_bytes(h) + bytes.substr(28));
      return error_of(load);
    };
    CHECK_THAT(with(0, 0), Catch::Contains(bad.path + ": dim: expected >= 1, got 0"));
    CHECK_THAT(with(1, -5), Catch::Contains(bad.path + ": hidden_dim: expected >= 1, got -5"));
    CHECK_THAT(with(2, 0), Catch::Contains(bad.path + ": n_layers: expected >= 1, got 0"));
    CHECK_THAT(
        with(3, 3),
        Catch::Contains(bad.path + ": n_heads: expected a multiple of n_kv_heads (2), got 3"));
    CHECK_THAT(with(4, 0), Catch::Contains(bad.path + ": n_kv_heads: expected >= 1, got 0"));
    CHECK_THAT(with(5, 0), Catch::Contains(bad.path + ": vocab_size: expected >= 1, got 0"));
    CHECK_THAT(with(5, std::numeric_limits<std::int32_t>::min()),
               Catch::Contains(bad.path + ": vocab_size: expected"));
    CHECK_THAT(with(6, -1), Catch::Contains(bad.path + ": seq_len: expected >= 1, got -1"));
    CHECK_THAT(with(0, 18),
               Catch::Contains(bad.path + ": dim: expected a multiple of n_heads (4), got 18"));
    CHECK_THAT(with(0, 12),
               Catch::Contains(bad.path + ": dim / n_heads: expected an even head size"));
    // Sizes whose product overflows 64 bits: caught by the checked arithmetic, nothing allocated.
    std::vector<std::int32_t> huge{2147483646, 2147483646, 2147483646, 1,
                                   1,          2147483646, 2147483646};
    write_bytes(bad.path, header_bytes(huge));
    CHECK_THAT(error_of(load), Catch::Contains(bad.path + ": parameter count: expected at most "));
    // A consistent but enormous header (Llama 2 7B's shape) on a tiny file: the size check comes
    // before any allocation.
    write_bytes(bad.path, header_bytes({4096, 11008, 32, 32, 32, 32000, 4096}));
    CHECK_THAT(error_of(load), Catch::Contains(bad.path + ": file size: expected 26431471644") &&
                                   Catch::Contains("got 28"));
  }
  SECTION("llama2.c's newer format (magic \"ak42\") is named as such") {
    write_bytes(bad.path,
                header_bytes({kvlab::kLlama2cMagic, 1, 16, 24, 2, 4, 2}) + bytes.substr(28));
    CHECK_THROWS_MATCHES(load(), InvalidArgument,
                         names(bad.path + ": format", "a legacy version-0 checkpoint",
                               "the magic \"ak42\" of llama2.c's version 1 format"));
  }
  SECTION("a NaN or an infinity among the weights names the tensor") {
    std::string poisoned = bytes;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    // wq of layer 1 starts after the embedding (32 x 16), rms_att (2 x 16) and wq[0] (16 x 16).
    const std::size_t at = 28 + 4 * (32 * 16 + 2 * 16 + 16 * 16 + 5);
    poisoned.replace(at, 4, reinterpret_cast<const char*>(&nan), 4);
    write_bytes(bad.path, poisoned);
    CHECK_THROWS_MATCHES(load(), InvalidArgument,
                         names(bad.path + ": wq[1]", "finite float32 values", "nan at index 5"));
  }
  SECTION("garbage bytes") {
    kvlab::Rng rng(12);
    for (int trial = 0; trial < 20; ++trial) {
      std::string garbage(4096, '\0');
      for (char& ch : garbage) ch = static_cast<char>(rng.next_u64() & 0xFF);
      write_bytes(bad.path, garbage);
      CAPTURE(trial);
      CHECK_THAT(error_of(load),
                 Catch::StartsWith("kvlab::load_llama_checkpoint: " + bad.path + ": "));
    }
  }
  SECTION("the good file loads") { check_equal(kvlab::load_llama_checkpoint(good.path), weights); }
}
