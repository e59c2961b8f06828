// The KV-cache size calculator: per-token and whole-cache sizes of five published models,
// pinned to values computed by hand from 2 · layers · kv_heads · head_dim · bytes per element;
// precision scaling, int4 rounding, the byte formatter, bad arguments and overflow.
// These are the numbers that docs/pages/04_kv_cache_size.md shows.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kvlab/kvlab.hpp"
#include "test_support.hpp"

using kvlab::bytes_per_token;
using kvlab::InvalidArgument;
using kvlab::kv_cache_bytes;
using kvlab::KVDtype;
using kvlab::ModelConfig;
using kvlab_test::names;

namespace {

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * kKiB;
constexpr std::uint64_t kGiB = 1024 * kMiB;

}  // namespace

TEST_CASE("bits per element and names of the storage precisions") {
  static_assert(kvlab::bits_per_element(KVDtype::fp32) == 32, "fp32");
  static_assert(kvlab::bits_per_element(KVDtype::fp16) == 16, "fp16");
  static_assert(kvlab::bits_per_element(KVDtype::bf16) == 16, "bf16");
  static_assert(kvlab::bits_per_element(KVDtype::int8) == 8, "int8");
  static_assert(kvlab::bits_per_element(KVDtype::int4) == 4, "int4");
  CHECK(kvlab::dtype_name(KVDtype::fp32) == "fp32");
  CHECK(kvlab::dtype_name(KVDtype::fp16) == "fp16");
  CHECK(kvlab::dtype_name(KVDtype::bf16) == "bf16");
  CHECK(kvlab::dtype_name(KVDtype::int8) == "int8");
  CHECK(kvlab::dtype_name(KVDtype::int4) == "int4");
  const auto bad = static_cast<KVDtype>(7);
  CHECK_THROWS_MATCHES(kvlab::bits_per_element(bad), InvalidArgument,
                       names("dtype", "one of fp32, fp16, bf16, int8, int4", "7"));
  CHECK_THROWS_MATCHES(kvlab::dtype_name(bad), InvalidArgument,
                       names("dtype", "one of fp32, fp16, bf16, int8, int4", "7"));
  CHECK_THROWS_MATCHES(bytes_per_token(kvlab::llama2_7b_config(), bad), InvalidArgument,
                       names("dtype", "one of fp32, fp16, bf16, int8, int4", "7"));
}

TEST_CASE("the published configurations") {
  // Layers, query heads, K/V heads and head_dim as their sources state them (see the header),
  // and d_model = num_heads * head_dim against the published hidden size.
  const std::vector<ModelConfig> models = kvlab::published_model_configs();
  REQUIRE(models.size() == 5);
  struct Want {
    const char* name;
    int layers, heads, kv_heads, head_dim;
    std::int64_t d_model;
  };
  const Want want[] = {
      {"Llama-2-7B", 32, 32, 32, 128, 4096},   // hidden_size 4096
      {"Llama-2-70B", 80, 64, 8, 128, 8192},   // hidden_size 8192
      {"Mistral-7B", 32, 32, 8, 128, 4096},    // hidden_size 4096
      {"OPT-13B", 40, 40, 40, 128, 5120},      // hidden_size 5120
      {"GPT-3 175B", 96, 96, 96, 128, 12288},  // d_model 12288
  };
  for (std::size_t i = 0; i < models.size(); ++i) {
    INFO(want[i].name);
    CHECK(models[i].name == want[i].name);
    CHECK(models[i].num_layers == want[i].layers);
    CHECK(models[i].num_heads == want[i].heads);
    CHECK(models[i].num_kv_heads == want[i].kv_heads);
    CHECK(models[i].head_dim == want[i].head_dim);
    CHECK(models[i].d_model() == want[i].d_model);
  }
}

TEST_CASE("bytes per token in fp16 of the five models") {
  // 2 (K and V) · layers · kv_heads · head_dim · 2 bytes (fp16):
  // Llama-2-7B:  2 · 32 · 32 · 128 · 2 = 524,288 bytes = 512 KiB.
  CHECK(bytes_per_token(kvlab::llama2_7b_config(), KVDtype::fp16) == 524288);
  CHECK(bytes_per_token(kvlab::llama2_7b_config(), KVDtype::fp16) == 512 * kKiB);
  // Llama-2-70B: 2 · 80 · 8 · 128 · 2 = 327,680 bytes = 320 KiB (GQA: 8 K/V heads for 64
  // query heads, so 8× less than the 2,621,440 bytes that 64 K/V heads would take).
  CHECK(bytes_per_token(kvlab::llama2_70b_config(), KVDtype::fp16) == 327680);
  CHECK(bytes_per_token(kvlab::llama2_70b_config(), KVDtype::fp16) == 320 * kKiB);
  // Mistral-7B:  2 · 32 · 8 · 128 · 2 = 131,072 bytes = 128 KiB (4× less than Llama-2-7B).
  CHECK(bytes_per_token(kvlab::mistral_7b_config(), KVDtype::fp16) == 131072);
  CHECK(bytes_per_token(kvlab::mistral_7b_config(), KVDtype::fp16) == 128 * kKiB);
  // OPT-13B:     2 · 40 · 40 · 128 · 2 = 819,200 bytes = 800 KiB exactly (800 · 1024). The
  // "800 KB" often quoted is the binary unit: in decimal units it is 819.2 KB.
  CHECK(bytes_per_token(kvlab::opt_13b_config(), KVDtype::fp16) == 819200);
  CHECK(bytes_per_token(kvlab::opt_13b_config(), KVDtype::fp16) == 800 * kKiB);
  CHECK(bytes_per_token(kvlab::opt_13b_config(), KVDtype::fp16) != 800 * 1000);
  // GPT-3 175B:  2 · 96 · 96 · 128 · 2 = 4,718,592 bytes = 4.5 MiB (4608 KiB).
  CHECK(bytes_per_token(kvlab::gpt3_175b_config(), KVDtype::fp16) == 4718592);
  CHECK(bytes_per_token(kvlab::gpt3_175b_config(), KVDtype::fp16) == 4608 * kKiB);
  CHECK(bytes_per_token(kvlab::gpt3_175b_config(), KVDtype::fp16) == 9 * kMiB / 2);
}

TEST_CASE("K/V heads, not query heads, set the size") {
  const std::uint64_t llama7 = bytes_per_token(kvlab::llama2_7b_config(), KVDtype::fp16);
  const std::uint64_t llama70 = bytes_per_token(kvlab::llama2_70b_config(), KVDtype::fp16);
  const std::uint64_t mistral = bytes_per_token(kvlab::mistral_7b_config(), KVDtype::fp16);
  // Llama-2-70B with a K/V head per query head would take 2 · 80 · 64 · 128 · 2 = 2,621,440
  // bytes per token: 8 times its GQA size.
  ModelConfig llama70_mha = kvlab::llama2_70b_config();
  llama70_mha.num_kv_heads = 64;
  CHECK(bytes_per_token(llama70_mha, KVDtype::fp16) == 2621440);
  CHECK(bytes_per_token(llama70_mha, KVDtype::fp16) == 8 * llama70);
  // The query heads do not enter: fewer of them change nothing.
  ModelConfig fewer_queries = kvlab::llama2_70b_config();
  fewer_queries.num_heads = 8;
  CHECK(bytes_per_token(fewer_queries, KVDtype::fp16) == llama70);
  // Llama-2-70B needs less per token than Llama-2-7B (80 · 8 < 32 · 32), and Mistral-7B a
  // quarter of Llama-2-7B (8 K/V heads instead of 32).
  CHECK(llama70 < llama7);
  CHECK(4 * mistral == llama7);
}

TEST_CASE("GPT-3 175B: the quoted 20 KB per token is off by more than 200x") {
  const std::uint64_t per_token = bytes_per_token(kvlab::gpt3_175b_config(), KVDtype::fp16);
  const std::uint64_t quoted = 20000;  // "20 KB" in decimal units
  // 4,718,592 / 20,000 = 235.9296: more than 200 times the quoted figure.
  CHECK(per_token > 200 * quoted);
  CHECK((per_token + quoted / 2) / quoted == 236);  // ≈ 236 to the nearest integer
  // Read as 20 KiB (20,480 bytes) it is still 230.4 times too small.
  CHECK(per_token > 230 * 20 * kKiB);
  CHECK((per_token + 10 * kKiB) / (20 * kKiB) == 230);
  // Even one layer of GPT-3 holds 2 · 96 · 128 · 2 = 2 · 12288 · 2 = 49,152 bytes (48 KiB)
  // per token in fp16, more than the quoted figure for the whole model.
  ModelConfig one_layer = kvlab::gpt3_175b_config();
  one_layer.num_layers = 1;
  CHECK(bytes_per_token(one_layer, KVDtype::fp16) == 49152);
  CHECK(bytes_per_token(one_layer, KVDtype::fp16) > quoted);
}

TEST_CASE("whole caches: 4096 tokens per sequence in fp16") {
  // bytes per token · 4096 tokens · batch 1:
  // Llama-2-7B:  524,288 · 4096 = 2,147,483,648 bytes = 2 GiB exactly.
  CHECK(kv_cache_bytes(kvlab::llama2_7b_config(), 4096, 1, KVDtype::fp16) == 2147483648ULL);
  CHECK(kv_cache_bytes(kvlab::llama2_7b_config(), 4096, 1, KVDtype::fp16) == 2 * kGiB);
  // Llama-2-70B: 327,680 · 4096 = 1,342,177,280 bytes = 1.25 GiB.
  CHECK(kv_cache_bytes(kvlab::llama2_70b_config(), 4096, 1, KVDtype::fp16) == 1342177280ULL);
  CHECK(kv_cache_bytes(kvlab::llama2_70b_config(), 4096, 1, KVDtype::fp16) == 5 * kGiB / 4);
  // Mistral-7B:  131,072 · 4096 = 536,870,912 bytes = 512 MiB.
  CHECK(kv_cache_bytes(kvlab::mistral_7b_config(), 4096, 1, KVDtype::fp16) == 536870912ULL);
  CHECK(kv_cache_bytes(kvlab::mistral_7b_config(), 4096, 1, KVDtype::fp16) == 512 * kMiB);
  // OPT-13B:     819,200 · 4096 = 3,355,443,200 bytes = 3.125 GiB.
  CHECK(kv_cache_bytes(kvlab::opt_13b_config(), 4096, 1, KVDtype::fp16) == 3355443200ULL);
  CHECK(kv_cache_bytes(kvlab::opt_13b_config(), 4096, 1, KVDtype::fp16) == 25 * kGiB / 8);
  // GPT-3 175B:  4,718,592 · 4096 = 19,327,352,832 bytes = 18 GiB; at its context length of
  // 2048 tokens, 9 GiB.
  CHECK(kv_cache_bytes(kvlab::gpt3_175b_config(), 4096, 1, KVDtype::fp16) == 19327352832ULL);
  CHECK(kv_cache_bytes(kvlab::gpt3_175b_config(), 4096, 1, KVDtype::fp16) == 18 * kGiB);
  CHECK(kv_cache_bytes(kvlab::gpt3_175b_config(), 2048, 1, KVDtype::fp16) == 9 * kGiB);
}

TEST_CASE("the cache grows linearly in tokens and batch, and is empty with no tokens") {
  const ModelConfig llama = kvlab::llama2_7b_config();
  // Llama-2-7B, 4096 tokens, batch 8, fp16: 8 · 2 GiB = 16 GiB.
  CHECK(kv_cache_bytes(llama, 4096, 8, KVDtype::fp16) == 16 * kGiB);
  CHECK(kv_cache_bytes(llama, 1, 1, KVDtype::fp16) == bytes_per_token(llama, KVDtype::fp16));
  CHECK(kv_cache_bytes(llama, 0, 1, KVDtype::fp16) == 0);
  CHECK(kv_cache_bytes(llama, 0, 64, KVDtype::fp16) == 0);
  for (std::int64_t tokens : {1, 7, 100, 4096})
    for (std::int64_t batch : {1, 3, 32}) {
      CHECK(kv_cache_bytes(llama, tokens, batch, KVDtype::int8) ==
            bytes_per_token(llama, KVDtype::int8) * static_cast<std::uint64_t>(tokens * batch));
    }
}

TEST_CASE("precision scales the cache: fp32, fp16, bf16, int8, int4") {
  const ModelConfig llama = kvlab::llama2_7b_config();
  // Llama-2-7B per token: 2 · 32 · 32 · 128 = 262,144 values, times bits / 8.
  CHECK(bytes_per_token(llama, KVDtype::fp32) == 1048576);  // · 4   = 1 MiB
  CHECK(bytes_per_token(llama, KVDtype::fp16) == 524288);   // · 2   = 512 KiB
  CHECK(bytes_per_token(llama, KVDtype::bf16) == 524288);   // · 2   = 512 KiB
  CHECK(bytes_per_token(llama, KVDtype::int8) == 262144);   // · 1   = 256 KiB
  CHECK(bytes_per_token(llama, KVDtype::int4) == 131072);   // · 1/2 = 128 KiB
  // 4096 tokens, batch 1: 4 GiB, 2 GiB, 2 GiB, 1 GiB, 512 MiB.
  CHECK(kv_cache_bytes(llama, 4096, 1, KVDtype::fp32) == 4 * kGiB);
  CHECK(kv_cache_bytes(llama, 4096, 1, KVDtype::fp16) == 2 * kGiB);
  CHECK(kv_cache_bytes(llama, 4096, 1, KVDtype::bf16) == 2 * kGiB);
  CHECK(kv_cache_bytes(llama, 4096, 1, KVDtype::int8) == 1 * kGiB);
  CHECK(kv_cache_bytes(llama, 4096, 1, KVDtype::int4) == 512 * kMiB);
  // Every model: fp32 = 2 · fp16 = 4 · int8 = 8 · int4.
  for (const ModelConfig& model : kvlab::published_model_configs()) {
    INFO(model.name);
    const std::uint64_t fp16 = bytes_per_token(model, KVDtype::fp16);
    CHECK(bytes_per_token(model, KVDtype::fp32) == 2 * fp16);
    CHECK(bytes_per_token(model, KVDtype::bf16) == fp16);
    CHECK(2 * bytes_per_token(model, KVDtype::int8) == fp16);
    CHECK(4 * bytes_per_token(model, KVDtype::int4) == fp16);
  }
}

TEST_CASE("stored bytes per token: int8 and int4 blocks count their fp16 scales") {
  const ModelConfig llama = kvlab::llama2_7b_config();
  // 2 · 32 layers · 32 heads · 4 blocks of 32 values · 34 (q8_0) or 18 (q4_0) bytes
  CHECK(kvlab::stored_bytes_per_token(llama, KVDtype::int8) == 278528);  // 272 KiB
  CHECK(kvlab::stored_bytes_per_token(llama, KVDtype::int4) == 147456);  // 144 KiB
  CHECK(kvlab::stored_bytes_per_token(llama, KVDtype::fp16) ==
        bytes_per_token(llama, KVDtype::fp16));
  CHECK(kvlab::stored_bytes_per_token(kvlab::mistral_7b_config(), KVDtype::int8) == 69632);
  CHECK(kvlab::stored_bits_per_value(KVDtype::int8) == 8.5);
  CHECK(kvlab::stored_bits_per_value(KVDtype::int4) == 4.5);
  for (const ModelConfig& model : kvlab::published_model_configs()) {  // head_dim 128: exact
    INFO(model.name);
    CHECK(32 * kvlab::stored_bytes_per_token(model, KVDtype::int8) ==
          34 * bytes_per_token(model, KVDtype::int8));
    CHECK(16 * kvlab::stored_bytes_per_token(model, KVDtype::int4) ==
          18 * bytes_per_token(model, KVDtype::int4));
  }
  // stories260K: heads of 8 values, no whole block of 32
  const ModelConfig stories{"stories260K", 5, 8, 4, 8};
  CHECK_THROWS_MATCHES(
      kvlab::stored_bytes_per_token(stories, KVDtype::int8), InvalidArgument,
      names("config.head_dim", "a multiple of 32 (the values of one int8 block)", "8"));
  CHECK(kvlab::stored_bytes_per_token(stories, KVDtype::fp16) == 640);
}

TEST_CASE("a sliding window caps the tokens kept: Mistral-7B at 32768 tokens keeps 4096") {
  const ModelConfig mistral = kvlab::mistral_7b_config();
  // 131,072 bytes per token in fp16 (128 KiB): 4 GiB for 32768 tokens, 512 MiB with W = 4096
  CHECK(kv_cache_bytes(mistral, 32768, 1, KVDtype::fp16) == 4 * kGiB);
  CHECK(kv_cache_bytes(mistral, 32768, 1, KVDtype::fp16, 4096) == 512 * kMiB);
  CHECK(kv_cache_bytes(mistral, 1000, 2, KVDtype::fp16, 4096) ==
        kv_cache_bytes(mistral, 1000, 2, KVDtype::fp16));  // shorter than the window
  CHECK_THROWS_MATCHES(kv_cache_bytes(mistral, 10, 1, KVDtype::fp16, -1), InvalidArgument,
                       names("window", ">= 0", "-1"));
}

TEST_CASE("int4 rounds each row of head_dim values up to whole bytes") {
  // One layer, one K/V head: 2 rows (K and V) per token.
  SECTION("even head_dim packs exactly") {
    const ModelConfig even{"even", 1, 1, 1, 4};  // 4 values · 4 bits = 2 bytes per row
    CHECK(bytes_per_token(even, KVDtype::int4) == 2 * 2);
  }
  SECTION("odd head_dim leaves half a byte per row") {
    const ModelConfig odd{"odd", 1, 1, 1, 3};  // 3 · 4 bits = 12 bits -> 2 bytes per row
    CHECK(bytes_per_token(odd, KVDtype::int4) == 2 * 2);
    const ModelConfig one{"one", 1, 1, 1, 1};  // 4 bits -> 1 byte per row
    CHECK(bytes_per_token(one, KVDtype::int4) == 2 * 1);
    // 5 layers, 3 K/V heads, head_dim 127: 127 · 4 = 508 bits -> 64 bytes per row, not 63.5;
    // 2 · 5 · 3 · 64 = 1,920 bytes (exact packing would give 1,905).
    const ModelConfig wide{"wide", 5, 6, 3, 127};
    CHECK(bytes_per_token(wide, KVDtype::int4) == 1920);
    CHECK(bytes_per_token(wide, KVDtype::int8) == 2 * 5 * 3 * 127);
  }
}

TEST_CASE("format_bytes prints binary units") {
  using kvlab::format_bytes;
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(1) == "1 B");
  CHECK(format_bytes(1000) == "1000 B");  // 1 KB, but less than 1 KiB
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1024) == "1 KiB");
  CHECK(format_bytes(1536) == "1.5 KiB");
  CHECK(format_bytes(20000) == "19.531 KiB");  // 19.53125 KiB, rounded to three decimals
  CHECK(format_bytes(1048064) == "1023.5 KiB");
  CHECK(format_bytes(1048575) == "1023.999 KiB");  // 1023.99902... KiB
  CHECK(format_bytes(kGiB - 1) == "1 GiB");  // 1023.99999905... MiB rounds up to the next unit
  CHECK(format_bytes(std::numeric_limits<std::uint64_t>::max()) == "16384 PiB");
  // The sizes of the five models, as docs/pages/04_kv_cache_size.md shows them.
  CHECK(format_bytes(524288) == "512 KiB");
  CHECK(format_bytes(327680) == "320 KiB");
  CHECK(format_bytes(131072) == "128 KiB");
  CHECK(format_bytes(819200) == "800 KiB");
  CHECK(format_bytes(4718592) == "4.5 MiB");
  CHECK(format_bytes(2147483648ULL) == "2 GiB");
  CHECK(format_bytes(1342177280ULL) == "1.25 GiB");
  CHECK(format_bytes(536870912ULL) == "512 MiB");
  CHECK(format_bytes(3355443200ULL) == "3.125 GiB");
  CHECK(format_bytes(19327352832ULL) == "18 GiB");
  CHECK(format_bytes(49152) == "48 KiB");
  CHECK(format_bytes(1048576) == "1 MiB");
  CHECK(format_bytes(262144) == "256 KiB");
  CHECK(format_bytes(4 * kGiB) == "4 GiB");
  CHECK(format_bytes(1 * kGiB) == "1 GiB");
  CHECK(format_bytes(9 * kGiB) == "9 GiB");
  CHECK(format_bytes(16 * kGiB) == "16 GiB");
}

TEST_CASE("the documented example") {
  // The \code example of kvlab::kv_cache_bytes.
  const std::uint64_t bytes =
      kvlab::kv_cache_bytes(kvlab::llama2_7b_config(), 4096, 1, kvlab::KVDtype::fp16);
  CHECK(kvlab::format_bytes(bytes) == "2 GiB");
}

TEST_CASE("bad arguments name the argument, the expected and the actual value") {
  const ModelConfig good = kvlab::llama2_7b_config();
  SECTION("counts below 1") {
    ModelConfig c = good;
    c.num_layers = 0;
    CHECK_THROWS_MATCHES(bytes_per_token(c, KVDtype::fp16), InvalidArgument,
                         names("config.num_layers", ">= 1", "0"));
    c = good;
    c.num_heads = -2;
    CHECK_THROWS_MATCHES(bytes_per_token(c, KVDtype::fp16), InvalidArgument,
                         names("config.num_heads", ">= 1", "-2"));
    c = good;
    c.num_kv_heads = 0;
    CHECK_THROWS_MATCHES(bytes_per_token(c, KVDtype::fp16), InvalidArgument,
                         names("config.num_kv_heads", ">= 1", "0"));
    c = good;
    c.head_dim = 0;
    CHECK_THROWS_MATCHES(kv_cache_bytes(c, 10, 1, KVDtype::fp16), InvalidArgument,
                         names("config.head_dim", ">= 1", "0"));
  }
  SECTION("num_heads not a multiple of num_kv_heads") {
    ModelConfig c = good;
    c.num_kv_heads = 5;
    CHECK_THROWS_MATCHES(bytes_per_token(c, KVDtype::fp16), InvalidArgument,
                         names("config.num_heads", "a multiple of config.num_kv_heads (5)", "32"));
  }
  SECTION("tokens below 0, batch below 1") {
    CHECK_THROWS_MATCHES(kv_cache_bytes(good, -1, 1, KVDtype::fp16), InvalidArgument,
                         names("tokens", ">= 0", "-1"));
    CHECK_THROWS_MATCHES(kv_cache_bytes(good, 10, 0, KVDtype::fp16), InvalidArgument,
                         names("batch", ">= 1", "0"));
  }
  SECTION("the message says which function failed") {
    ModelConfig c = good;
    c.num_layers = 0;
    CHECK_THROWS_WITH(kv_cache_bytes(c, 1, 1, KVDtype::fp16),
                      Catch::Matchers::StartsWith("kvlab::kv_cache_bytes: config.num_layers"));
    CHECK_THROWS_WITH(bytes_per_token(c, KVDtype::fp16),
                      Catch::Matchers::StartsWith("kvlab::bytes_per_token: config.num_layers"));
  }
}

TEST_CASE("sizes that do not fit in 64 bits are rejected, not wrapped") {
  constexpr int kMax = std::numeric_limits<int>::max();  // 2,147,483,647
  SECTION("bytes per token") {
    // fp32: 2 · 4 · head_dim = 8 · 2,147,483,647 bytes for K and V of one head; the largest
    // K/V head count that keeps a layer within 2^64 - 1 is floor((2^64 - 1) / 17,179,869,176)
    // = 1,073,741,824 = 2^30.
    const ModelConfig huge{"huge", 1, kMax, kMax, kMax};
    CHECK_THROWS_MATCHES(
        bytes_per_token(huge, KVDtype::fp32), InvalidArgument,
        names("config.num_kv_heads", "at most 1073741824 (so that the size fits in std::uint64_t)",
              "2147483647"));
    // 2^30 K/V heads fit in one layer (8 · (2^31 - 1) · 2^30 = 2^64 - 2^33 bytes), not in two.
    const ModelConfig deep{"deep", 2, 1 << 30, 1 << 30, kMax};
    CHECK_THROWS_MATCHES(
        bytes_per_token(deep, KVDtype::fp32), InvalidArgument,
        names("config.num_layers", "at most 1 (so that the size fits in std::uint64_t)", "2"));
    const ModelConfig fits{"fits", 1, 1 << 30, 1 << 30, kMax};
    CHECK(bytes_per_token(fits, KVDtype::fp32) == 8ULL * 2147483647ULL * (1ULL << 30));
  }
  SECTION("tokens and batch") {
    const ModelConfig gpt3 = kvlab::gpt3_175b_config();
    // floor((2^64 - 1) / 4,718,592) = 3,909,374,676,536 tokens fit in one sequence.
    const std::int64_t max_tokens = 3909374676536LL;
    CHECK(kv_cache_bytes(gpt3, max_tokens, 1, KVDtype::fp16) == 4718592ULL * 3909374676536ULL);
    CHECK_THROWS_MATCHES(
        kv_cache_bytes(gpt3, max_tokens + 1, 1, KVDtype::fp16), InvalidArgument,
        names("tokens", "at most 3909374676536 (so that the size fits in std::uint64_t)",
              "3909374676537"));
    // With 2048 tokens a sequence is 9 GiB = 9,663,676,416 bytes; floor((2^64 - 1) / that)
    // = 1,908,874,353 sequences fit.
    CHECK(kv_cache_bytes(gpt3, 2048, 1908874353, KVDtype::fp16) == 9 * kGiB * 1908874353ULL);
    CHECK_THROWS_MATCHES(
        kv_cache_bytes(gpt3, 2048, 1908874354, KVDtype::fp16), InvalidArgument,
        names("batch", "at most 1908874353 (so that the size fits in std::uint64_t)",
              "1908874354"));
    CHECK_THROWS_MATCHES(kv_cache_bytes(gpt3, std::numeric_limits<std::int64_t>::max(),
                                        std::numeric_limits<std::int64_t>::max(), KVDtype::fp16),
                         InvalidArgument,
                         names("tokens", "at most 3909374676536", "9223372036854775807"));
  }
}
