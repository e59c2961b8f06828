// GGUF files: the reader on files written by tests/gguf_writer.hpp (from the format's
// description, independently of the reader) — every metadata value type in versions 2 and 3,
// arrays, the alignment, each tensor type decoded from hand-built blocks whose values are known
// and kept as stored (GgmlMatrix) — and the documented error for every kind of bad file
// (truncated at every byte, wrong magic, version 1, big-endian, absurd counts and lengths, a
// tensor outside the file, an unknown or unsupported type, bad dims, duplicates). Then a Llama
// model from a GGUF file: the config from the metadata, the weights round trip, and each missing
// key, other architecture and wrong shape refused.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gguf_writer.hpp"
#include "kvlab/kvlab.hpp"
#include "kvlab/model/gguf_model.hpp"
#include "model_writers.hpp"
#include "test_support.hpp"
#include "weights_equal.hpp"

using kvlab::GgmlType;
using kvlab::GgufFile;
using kvlab::GgufType;
using kvlab::InvalidArgument;
using kvlab_test::error_of;
using kvlab_test::GgufWriter;
using kvlab_test::put_le;
using kvlab_test::TempFile;

namespace {

// The error of opening `bytes` as a GGUF file ("" if it opens).
std::string open_error(const std::string& bytes) {
  TempFile f("bad.gguf");
  kvlab_test::write_bytes(f.path, bytes);
  return error_of([&] { GgufFile g(f.path); });
}

// A file holding one metadata value of each type, and arrays.
GgufWriter every_type() {
  GgufWriter g;
  g.u8("a.u8", 200);
  g.i8("a.i8", -100);
  g.u16("a.u16", 60000);
  g.i16("a.i16", -30000);
  g.u32("a.u32", 4000000000u);
  g.i32("a.i32", -2000000000);
  g.f32("a.f32", 0.1f);
  g.boolean("a.bool", true);
  g.str("a.str", "h\xC3\xA9llo");  // UTF-8 kept as bytes
  g.u64("a.u64", 0xFFFFFFFFFFFFFFFFull);
  g.i64("a.i64", -9000000000000000000ll);
  g.f64("a.f64", -2.5e300);
  g.strings("a.strings", {"", "x", "yz"});
  g.i32s("a.ints", {-1, 0, 7});
  // an array of arrays of uint8: [[1, 2], []]
  g.key("a.nested", 9);
  put_le(g.metadata, 9, 4);
  put_le(g.metadata, 2, 8);
  put_le(g.metadata, 0, 4), put_le(g.metadata, 2, 8), put_le(g.metadata, 1, 1),
      put_le(g.metadata, 2, 1);
  put_le(g.metadata, 0, 4), put_le(g.metadata, 0, 8);
  return g;
}

// Bytes of fp16 values (given as bits) and of little-endian structures.
std::string halfs(std::initializer_list<std::uint16_t> bits) {
  std::string s;
  for (std::uint16_t b : bits) put_le(s, b, 2);
  return s;
}

}  // namespace

TEST_CASE("GGUF: every metadata value type, in versions 2 and 3") {
  for (std::uint32_t version : {2u, 3u}) {
    CAPTURE(version);
    GgufWriter w = every_type();
    w.version = version;
    TempFile f("types.gguf");
    kvlab_test::write_bytes(f.path, w.bytes());
    const GgufFile g(f.path);
    CHECK(g.version() == version);
    CHECK(g.metadata().size() == 15);
    CHECK(g.metadata()[0].first == "a.u8");  // the file's order
    CHECK(g.get_int("a.u8") == 200);
    CHECK(g.get_int("a.i8") == -100);
    CHECK(g.get_int("a.u16") == 60000);
    CHECK(g.get_int("a.i16") == -30000);
    CHECK(g.get_int("a.u32") == 4000000000ll);
    CHECK(g.get_int("a.i32") == -2000000000);
    CHECK(g.get_float("a.f32") == static_cast<double>(0.1f));
    CHECK(g.at("a.bool").type == GgufType::BOOL);
    CHECK(g.at("a.bool").integer == 1);
    CHECK(g.get_string("a.str") == "h\xC3\xA9llo");
    CHECK(g.at("a.u64").unsigned_integer == 0xFFFFFFFFFFFFFFFFull);
    CHECK(g.get_int("a.i64") == -9000000000000000000ll);
    CHECK(g.get_float("a.f64") == -2.5e300);
    CHECK(g.get_strings("a.strings") == std::vector<std::string>{"", "x", "yz"});
    CHECK(g.get_ints("a.ints") == std::vector<std::int64_t>{-1, 0, 7});
    const kvlab::GgufValue& nested = g.at("a.nested");
    REQUIRE(nested.array.size() == 2);
    CHECK(nested.element_type == GgufType::ARRAY);
    CHECK(nested.array[0].array.size() == 2);
    CHECK(nested.array[0].array[1].integer == 2);
    CHECK(nested.array[1].array.empty());
    CHECK(g.tensors().empty());
    CHECK(g.find("a.missing") == nullptr);
    // Typed getters name the key and what it holds.
    CHECK(error_of([&] {
            g.get_int("a.missing");
          }).find("key 'a.missing': expected present, got missing") != std::string::npos);
    CHECK(error_of([&] {
            g.get_int("a.str");
          }).find("key 'a.str': expected an integer, got a string") != std::string::npos);
    CHECK(error_of([&] {
            g.get_int("a.u64");
          }).find("key 'a.u64': expected at most 2^63 - 1, got 18446744073709551615") !=
          std::string::npos);
    CHECK(error_of([&] {
            g.get_float("a.i32");
          }).find("expected a float32 or float64, got a int32") != std::string::npos);
    CHECK(error_of([&] {
            g.get_strings("a.ints");
          }).find("key 'a.ints': expected an array of strings, got an array of int32") !=
          std::string::npos);
    CHECK(error_of([&] {
            g.get_ints("a.u8");
          }).find("expected an array of integers, got a uint8") != std::string::npos);
  }
}

TEST_CASE("GGUF: each tensor type decoded from hand-built blocks whose values are known") {
  GgufWriter w;
  w.set_alignment(64);
  // F32: three values as they are.
  std::string f32;
  for (float x : {1.5f, -0.0f, 3e38f}) put_le(f32, kvlab_test::f32_bits(x), 4);
  w.tensor("f32", {3}, 0, f32);
  // F16: 1, -2, 65504 (the largest), 2^-24 (the smallest subnormal), 2^-14 (smallest normal).
  w.tensor("f16", {5}, 1, halfs({0x3C00, 0xC000, 0x7BFF, 0x0001, 0x0400}));
  // BF16: 1, -3, 2^-126 (smallest normal float), 0.15625 (0x3E20).
  w.tensor("bf16", {4}, 30, halfs({0x3F80, 0xC040, 0x0080, 0x3E20}));
  // Q8_0, two rows of one block: d = 0.5 (0x3800), q[i] = i - 16; d = -2 (0xC000), q[i] = 127 - i.
  std::string q8;
  put_le(q8, 0x3800, 2);
  for (int i = 0; i < 32; ++i) q8.push_back(static_cast<char>(i - 16));
  put_le(q8, 0xC000, 2);
  for (int i = 0; i < 32; ++i) q8.push_back(static_cast<char>(127 - i));
  w.tensor("q8_0", {32, 2}, 8, q8);
  // Q4_0: d = 2 (0x4000); byte j: low nibble j (value j), high nibble 15 - j (value j + 16).
  std::string q40 = halfs({0x4000});
  for (int j = 0; j < 16; ++j) q40.push_back(static_cast<char>(j | ((15 - j) << 4)));
  w.tensor("q4_0", {32}, 2, q40);
  // Q4_1: d = 0.25 (0x3400), m = -1 (0xBC00); the same nibbles.
  std::string q41 = halfs({0x3400, 0xBC00});
  for (int j = 0; j < 16; ++j) q41.push_back(static_cast<char>(j | ((15 - j) << 4)));
  w.tensor("q4_1", {32}, 3, q41);

  TempFile f("tensors.gguf");
  kvlab_test::write_bytes(f.path, w.bytes());
  const GgufFile g(f.path);
  CHECK(g.alignment() == 64);
  CHECK(g.data_offset() % 64 == 0);
  REQUIRE(g.tensors().size() == 6);
  const auto values = [&](const std::string& name) {
    const kvlab::RowMatrix<float> m = g.read_matrix(name);
    return std::vector<float>(m.data(), m.data() + m.size());
  };
  CHECK(values("f32") == std::vector<float>{1.5f, -0.0f, 3e38f});
  CHECK(values("f16") ==
        std::vector<float>{1.f, -2.f, 65504.f, std::ldexp(1.f, -24), std::ldexp(1.f, -14)});
  CHECK(values("bf16") == std::vector<float>{1.f, -3.f, std::ldexp(1.f, -126), 0.15625f});
  const kvlab::RowMatrix<float> q8m = g.read_matrix("q8_0");
  REQUIRE(q8m.rows() == 2);
  REQUIRE(q8m.cols() == 32);
  const kvlab::RowMatrix<float> q40m = g.read_matrix("q4_0");
  const kvlab::RowMatrix<float> q41m = g.read_matrix("q4_1");
  for (int i = 0; i < 32; ++i) {
    CAPTURE(i);
    CHECK(q8m(0, i) == 0.5f * static_cast<float>(i - 16));
    CHECK(q8m(1, i) == -2.f * static_cast<float>(127 - i));
    const int nibble = i < 16 ? i : 15 - (i - 16);  // value i: byte i's low, byte i-16's high
    CHECK(q40m(0, i) == 2.f * static_cast<float>(nibble - 8));
    CHECK(q41m(0, i) == 0.25f * static_cast<float>(nibble) - 1.f);
  }
  const kvlab::GgufTensorInfo& t = g.tensor("q8_0");
  CHECK(t.type == GgmlType::Q8_0);
  CHECK(t.shape() == "[32, 2]");
  CHECK(t.bytes == 68);
  CHECK(t.rows() == 2);
  CHECK(error_of([&] {
          g.read_matrix("q8_0", {32, 3});
        }).find("tensor 'q8_0': dims: expected [32, 3], got [32, 2]") != std::string::npos);
  CHECK(error_of([&] { g.tensor("nope"); }).find("tensor 'nope': expected present, got missing") !=
        std::string::npos);

  // The same tensors kept as the file stores them: the bytes written above, row by row, and the
  // floats read_matrix gives, bit for bit.
  const std::vector<std::pair<std::string, std::string>> stored = {
      {"f32", f32}, {"q8_0", q8}, {"q4_0", q40}, {"q4_1", q41}};
  for (const auto& [name, bytes] : stored) {
    CAPTURE(name);
    const kvlab::GgmlMatrix m = g.read_ggml_matrix(name);
    const kvlab::GgufTensorInfo& info = g.tensor(name);
    CHECK(m.type() == info.type);
    CHECK(m.rows() == static_cast<std::int64_t>(info.rows()));
    CHECK(m.cols() == static_cast<std::int64_t>(info.row_length()));
    CHECK(m.size_bytes() == info.bytes);
    REQUIRE(m.size_bytes() == bytes.size());
    CHECK(std::string(reinterpret_cast<const char*>(m.data()), m.size_bytes()) == bytes);
    CHECK(m.row(m.rows() - 1) ==
          m.data() + (m.rows() - 1) * static_cast<std::int64_t>(m.row_bytes()));
    const kvlab::RowMatrix<float> floats = g.read_matrix(name);
    const kvlab::RowMatrix<float> decoded = kvlab_test::decoded_rows(m);
    CHECK(decoded.cwiseEqual(floats).all());
    std::vector<float> last(static_cast<std::size_t>(m.cols()));  // [cols]
    m.decode_row(m.rows() - 1, last.data());
    CHECK(std::equal(last.begin(), last.end(), floats.row(floats.rows() - 1).data()));
  }
  CHECK(kvlab_test::decoded_rows(g.read_ggml_matrix("f16")).cwiseEqual(g.read_matrix("f16")).all());
  CHECK(
      kvlab_test::decoded_rows(g.read_ggml_matrix("bf16")).cwiseEqual(g.read_matrix("bf16")).all());
  const std::string dims_error = error_of([&] { g.read_ggml_matrix("q8_0", {32, 3}); });
  CHECK(dims_error.find("kvlab::GgufFile::read_ggml_matrix: ") == 0);
  CHECK(dims_error.find("tensor 'q8_0': dims: expected [32, 3], got [32, 2]") != std::string::npos);
}

TEST_CASE("GGUF: type names, block sizes and dequantize_row's checks") {
  CHECK(kvlab::ggml_type_name(12) == "Q4_K");
  CHECK(kvlab::ggml_type_name(30) == "BF16");
  CHECK(kvlab::ggml_type_name(4) == "unknown type 4");
  CHECK(kvlab::ggml_type_name(1000) == "unknown type 1000");
  CHECK(kvlab::ggml_row_bytes(GgmlType::Q4_1, 64) == 40);
  CHECK(kvlab::ggml_row_bytes(GgmlType::BF16, 3) == 6);
  float out[32];
  const unsigned char zeros[34] = {};
  CHECK_THROWS_AS(kvlab::dequantize_row(GgmlType::Q8_0, zeros, 31, out), InvalidArgument);
  CHECK_THROWS_AS(kvlab::dequantize_row(GgmlType::F32, zeros, -1, out), InvalidArgument);
  CHECK(kvlab::gguf_type_name(9) == "array");
  CHECK(kvlab::gguf_type_name(13) == "unknown type 13");
}

TEST_CASE("GGUF: every bad file is refused with the documented error") {
  SECTION("every truncation of a valid file: an error naming what was cut, never a crash") {
    GgufWriter w = every_type();
    const float v[32] = {};
    w.f32_tensor("t", {32}, v, 32);
    const std::string whole = w.bytes();
    CHECK(open_error(whole).empty());
    for (std::size_t n = 0; n < whole.size(); ++n) {
      CAPTURE(n);
      const std::string e = open_error(whole.substr(0, n));
      CHECK(!e.empty());
    }
    GgufWriter s;
    s.str("k", "hello");
    const std::string cut = s.bytes();
    // header 24, key 9, type 4, length 8: 3 of 5 bytes
    CHECK(
        open_error(cut.substr(0, 48))
            .find("key 'k' (a string of 5 bytes): expected 5 bytes at offset 45, got only 3 bytes "
                  "left in the file (truncated?)") != std::string::npos);
    CHECK(open_error(whole.substr(0, whole.size() - 1))
              .find("tensor 't': offset: expected its 128 bytes within the data section") !=
          std::string::npos);
  }
  SECTION("magic and version") {
    GgufWriter w;
    std::string b = w.bytes();
    CHECK(open_error("GG").find("magic: expected the 4 bytes \"GGUF\", got 2 bytes") !=
          std::string::npos);
    CHECK(open_error("GGML" + b.substr(4))
              .find("magic: expected \"GGUF\" (a GGUF file), got \"GGML\"") != std::string::npos);
    w.version = 1;
    CHECK(open_error(w.bytes()).find("version: expected 2 or 3 (version 1 has 32-bit counts") !=
          std::string::npos);
    w.version = 4;
    CHECK(open_error(w.bytes()).find("version: expected 2 or 3, got 4") != std::string::npos);
    w.version = 0x03000000u;
    CHECK(open_error(w.bytes()).find("got version 3 of a big-endian file") != std::string::npos);
  }
  SECTION("absurd counts and lengths are refused before anything is allocated") {
    std::string b = "GGUF";
    put_le(b, 3, 4), put_le(b, 0, 8), put_le(b, 1ull << 60, 8);
    CHECK(open_error(b).find("metadata count: expected at most 0") != std::string::npos);
    b = "GGUF";
    put_le(b, 3, 4), put_le(b, 1ull << 62, 8), put_le(b, 0, 8);
    CHECK(open_error(b).find("tensor count: expected at most 0") != std::string::npos);
    GgufWriter w;
    w.key("k", 8);
    put_le(w.metadata, 1ull << 63, 8);  // a string of 2^63 bytes
    CHECK(open_error(w.bytes()).find("key 'k' (a string of 9223372036854775808 bytes): expected "
                                     "9223372036854775808 bytes at offset 45") !=
          std::string::npos);
    GgufWriter a;
    a.key("arr", 9);
    put_le(a.metadata, 10, 4), put_le(a.metadata, 1ull << 61, 8);  // 2^61 uint64 values
    CHECK(open_error(a.bytes()).find("key 'arr' (its count): expected at most 1 (the uint64 "
                                     "elements that the 13 bytes left") != std::string::npos);
  }
  SECTION("bad values: unknown type, bool, nesting, duplicates, alignment") {
    GgufWriter w;
    w.key("k", 13);
    CHECK(open_error(w.bytes()).find(
              "key 'k' type: expected a GGUF value type (0 to 12), got 13") != std::string::npos);
    GgufWriter b;
    b.key("flag", 7);
    put_le(b.metadata, 2, 1);
    CHECK(open_error(b.bytes()).find("key 'flag': expected a bool (0 or 1), got 2") !=
          std::string::npos);
    GgufWriter n;
    n.key("deep", 9);
    for (int i = 0; i < 5; ++i) put_le(n.metadata, 9, 4), put_le(n.metadata, 1, 8);
    put_le(n.metadata, 0, 4), put_le(n.metadata, 0, 8);
    CHECK(open_error(n.bytes()).find("expected arrays nested at most 4 deep") != std::string::npos);
    GgufWriter d;
    d.u32("x", 1), d.u32("x", 2);
    CHECK(open_error(d.bytes()).find("key 'x': expected unique keys, got a second entry") !=
          std::string::npos);
    GgufWriter al;
    al.u32("general.alignment", 24);
    CHECK(open_error(al.bytes()).find("key 'general.alignment': expected a power of two, got 24") !=
          std::string::npos);
    GgufWriter at;
    at.u64("general.alignment", 32);
    CHECK(open_error(at.bytes()).find("key 'general.alignment': expected a uint32, got a uint64") !=
          std::string::npos);
  }
  SECTION("bad tensor infos: type, dims, offsets, duplicates") {
    const auto with = [](std::vector<std::uint64_t> dims, std::uint32_t type, std::string data) {
      GgufWriter w;
      w.tensor("t", std::move(dims), type, std::move(data));
      return w;
    };
    CHECK(
        open_error(with({256}, 12, std::string(144, '\0')).bytes())
            .find("tensor 't': type: expected one of F32, F16, BF16, Q8_0, Q4_0, Q4_1, got Q4_K") !=
        std::string::npos);
    CHECK(open_error(with({4}, 99, std::string(16, '\0')).bytes()).find("got unknown type 99") !=
          std::string::npos);
    CHECK(open_error(with({16}, 8, std::string(34, '\0')).bytes())
              .find("tensor 't': dims[0]: expected a multiple of 32 (whole Q8_0 blocks per row), "
                    "got 16") != std::string::npos);
    CHECK(
        open_error(with({4, 0}, 0, "").bytes()).find("tensor 't': dims[1]: expected >= 1, got 0") !=
        std::string::npos);
    CHECK(open_error(with({1ull << 40, 1ull << 40}, 0, "").bytes())
              .find("tensor 't': dims[1]: expected at most 8388607") != std::string::npos);
    CHECK(open_error(with({1, 1, 1, 1, 1}, 0, "").bytes())
              .find("tensor 't': n_dims: expected 1 to 4, got 5") != std::string::npos);
    GgufWriter off = with({8}, 0, std::string(32, '\0'));
    CHECK(open_error(off.bytes(32))
              .find("tensor 't': offset: expected its 32 bytes within the data section of 32 "
                    "bytes, got 32") != std::string::npos);
    CHECK(open_error(off.bytes(8)).find("tensor 't': offset: expected a multiple of 32, got 8") !=
          std::string::npos);
    GgufWriter dup = with({8}, 0, std::string(32, '\0'));
    dup.tensor("t", {8}, 0, std::string(32, '\0'));
    CHECK(open_error(dup.bytes()).find("tensor 't': expected unique tensor names") !=
          std::string::npos);
    GgufWriter nan = with({2}, 0, "");
    put_le(nan.tensors[0].data, 0x3F800000u, 4), put_le(nan.tensors[0].data, 0x7FC00000u, 4);
    TempFile f("nan.gguf");
    kvlab_test::write_bytes(f.path, nan.bytes());
    const GgufFile g(f.path);
    CHECK(error_of([&] {
            g.read_matrix("t");
          }).find("tensor 't': expected finite values, got nan at index 1") != std::string::npos);
  }
  SECTION("a missing file") {
    CHECK(error_of([] {
            GgufFile g("kvlab_test_no_such_file.gguf");
          }).find("kvlab_test_no_such_file.gguf: expected an existing, readable GGUF file") !=
          std::string::npos);
  }
}

TEST_CASE("GGUF Llama model: the config from the metadata, and the weights round trip") {
  for (bool shared : {true, false}) {
    CAPTURE(shared);
    const kvlab::LlamaConfig config = kvlab::LlamaConfig::tiny()
                                          .with_shared_classifier(shared)
                                          .with_rope_theta(100000.f)
                                          .with_norm_eps(1e-6f);
    const kvlab::LlamaWeights w = kvlab::LlamaWeights::random(config, 7);
    TempFile f("llama.gguf");
    kvlab_test::write_bytes(f.path, kvlab_test::llama_gguf(w).bytes());
    const kvlab::LlamaWeights r = kvlab::load_gguf_weights(f.path);
    CHECK(r.config == config);
    kvlab_test::check_equal(r, w);
  }
}

TEST_CASE("GGUF Llama model: each missing key, another architecture and a wrong shape refused") {
  const kvlab::LlamaWeights w = kvlab::LlamaWeights::random(kvlab::LlamaConfig::tiny(), 3);
  const auto load_error = [](const GgufWriter& g) {
    TempFile f("llama_bad.gguf");
    kvlab_test::write_bytes(f.path, g.bytes());
    return error_of([&] { kvlab::load_gguf_weights(f.path); });
  };
  CHECK(load_error(kvlab_test::llama_gguf(w)).empty());
  // A writer like llama_gguf's without one of its keys: rebuild with the key renamed.
  for (const char* key :
       {"general.architecture", "llama.embedding_length", "llama.feed_forward_length",
        "llama.block_count", "llama.attention.head_count", "llama.context_length",
        "llama.attention.layer_norm_rms_epsilon"}) {
    CAPTURE(key);
    GgufWriter g = kvlab_test::llama_gguf(w);
    const std::string k(key);
    const std::size_t at = g.metadata.find(k);
    REQUIRE(at != std::string::npos);
    g.metadata[at] = 'X';  // the key is now another one
    CHECK(load_error(g).find("key '" + k + "': expected present, got missing") !=
          std::string::npos);
  }
  GgufWriter arch = kvlab_test::llama_gguf(w);
  arch.metadata.replace(arch.metadata.find("llama"), 5, "gpt2x");  // the value, 5 bytes
  CHECK(load_error(arch).find("key 'general.architecture': expected \"llama\", got \"gpt2x\"") !=
        std::string::npos);
  GgufWriter heads = kvlab_test::llama_gguf(w);
  heads.u32("llama.vocab_size", 255);
  CHECK(load_error(heads).find(
            "key 'llama.vocab_size': expected 256 (rows of token_embd.weight), got 255") !=
        std::string::npos);
  GgufWriter shape = kvlab_test::llama_gguf(w);
  for (GgufWriter::Tensor& t : shape.tensors)
    if (t.name == "blk.1.attn_k.weight") t.dims = {16, 48}, t.data.resize(16 * 48 * 4);
  CHECK(load_error(shape).find(
            "tensor 'blk.1.attn_k.weight': dims: expected [48, 16] (from the metadata: dim 48") !=
        std::string::npos);
  GgufWriter missing = kvlab_test::llama_gguf(w);
  missing.tensors.pop_back();  // output.weight of the tiny model (separate classifier)
  missing.tensors.erase(missing.tensors.begin() + 3);  // blk.0.attn_k.weight
  CHECK(load_error(missing).find("tensor 'blk.0.attn_k.weight': expected present, got missing") !=
        std::string::npos);
  // A layer count the file's tensors do not back (found by fuzz_gguf: 10^8 layers in a small
  // file made the loader list 9 x 10^8 tensor names before finding the first missing one):
  // refused at the first missing tensor, without allocating for the others.
  GgufWriter layers = kvlab_test::llama_gguf(w);
  const std::size_t count_at = layers.metadata.find("llama.block_count");
  REQUIRE(count_at != std::string::npos);
  layers.metadata.replace(count_at + std::string("llama.block_count").size() + 4, 4,
                          std::string("\x00\xE1\xF5\x05", 4));  // u32 100000000, little-endian
  CHECK(load_error(layers).find("tensor 'blk.3.attn_norm.weight': expected present, got missing") !=
        std::string::npos);
  GgufWriter rope = kvlab_test::llama_gguf(w);
  rope.u32("llama.attention.key_length", 4);
  CHECK(load_error(rope).find("key 'llama.attention.key_length': expected 8 (head_dim") !=
        std::string::npos);
  GgufWriter bad_config = kvlab_test::llama_gguf(w);
  bad_config.metadata.clear(), bad_config.metadata_count = 0;
  bad_config.str("general.architecture", "llama");
  bad_config.u32("llama.embedding_length", 48), bad_config.u32("llama.feed_forward_length", 128);
  bad_config.u32("llama.block_count", 3), bad_config.u32("llama.attention.head_count", 6);
  bad_config.u32("llama.attention.head_count_kv", 4), bad_config.u32("llama.context_length", 64);
  bad_config.f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  CHECK(load_error(bad_config).find("n_heads: expected a multiple of n_kv_heads (4), got 6") !=
        std::string::npos);
}
