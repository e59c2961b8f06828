/// \file
/// \brief KV-cache size calculator: bytes per token and for a whole cache.
///
/// It works for any model configuration and storage precision, and comes with the configurations of
/// five published models. Checked against hand-computed sizes in
/// `tests/analysis/test_kv_cache_size.cpp`.
///
/// The size of a KV cache is
///
///     bytes = 2 · num_layers · num_kv_heads · row_bytes · tokens · batch
///     row_bytes = ceil(head_dim · bits_per_element / 8)
///
/// where the 2 counts K and V, and `row_bytes` holds the `head_dim` values of one head of one
/// token — the values only: int8 and int4 caches also store a scale per group of values, which
/// `stored_bytes_per_token` counts for kvlab's own (q8_0, q4_0). All arithmetic is exact, in
/// 64-bit unsigned integers, and checked for overflow.
///
/// Units: 1 KiB = 1024 bytes, 1 MiB = 1024² bytes, 1 GiB = 1024³ bytes; 1 KB = 1000 bytes,
/// 1 MB = 1000² bytes. With head_dim 128, as in the five models below, every size is a whole
/// number of KiB (Llama-2-7B: 512 KiB = 524,288 bytes per token in FP16), though not in
/// general of KB.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/kv_storage.hpp"

namespace kvlab {

/// The attention dimensions of a decoder-only transformer that fix the size of its KV cache.
///
/// The field names follow a Hugging Face `config.json` as noted on each field. The cache size
/// depends on `num_layers`, `num_kv_heads` and `head_dim` only; `num_heads` is kept so that a
/// configuration also gives the model width, `d_model()`, and so that it can be checked
/// (`num_heads` must be a multiple of `num_kv_heads`, as in kvlab::AttentionShape).
struct ModelConfig {
  /// A display name, for example "Llama-2-7B".
  std::string name;
  /// Decoder layers (transformer blocks), each with its own K and V cache
  /// (`num_hidden_layers`).
  int num_layers;
  /// Query heads per layer (`num_attention_heads`).
  int num_heads;
  /// Key/value heads per layer (`num_key_value_heads`): equal to `num_heads` for multi-head
  /// attention, fewer for grouped-query attention (GQA), 1 for multi-query attention (MQA).
  int num_kv_heads;
  /// Values per head (`hidden_size / num_attention_heads` for the models below).
  int head_dim;

  /// The model width, `num_heads * head_dim` (`hidden_size`, also called d_model, for the
  /// models below).
  std::int64_t d_model() const { return static_cast<std::int64_t>(num_heads) * head_dim; }
};

/// Llama-2-7B: 32 layers, 32 query heads, 32 K/V heads (multi-head attention), head_dim 128.
/// Source: `config.json` of meta-llama/Llama-2-7b-hf on Hugging Face: num_hidden_layers 32,
/// num_attention_heads 32, num_key_value_heads 32, hidden_size 4096 (4096 / 32 = 128).
inline ModelConfig llama2_7b_config() { return {"Llama-2-7B", 32, 32, 32, 128}; }

/// Llama-2-70B: 80 layers, 64 query heads, 8 K/V heads (grouped-query attention, groups of 8),
/// head_dim 128.
/// Source: `config.json` of meta-llama/Llama-2-70b-hf on Hugging Face: num_hidden_layers 80,
/// num_attention_heads 64, num_key_value_heads 8, hidden_size 8192 (8192 / 64 = 128).
inline ModelConfig llama2_70b_config() { return {"Llama-2-70B", 80, 64, 8, 128}; }

/// Mistral-7B (v0.1): 32 layers, 32 query heads, 8 K/V heads (grouped-query attention, groups
/// of 4), head_dim 128.
/// Source: `config.json` of mistralai/Mistral-7B-v0.1 on Hugging Face: num_hidden_layers 32,
/// num_attention_heads 32, num_key_value_heads 8, hidden_size 4096 (4096 / 32 = 128); its
/// `params.json` states head_dim 128 and n_kv_heads 8 directly. The model also sets
/// sliding_window 4096: a cache that keeps only the last 4096 tokens never holds more than
/// `kv_cache_bytes(config, 4096, batch, dtype)`, which this calculator does not model.
inline ModelConfig mistral_7b_config() { return {"Mistral-7B", 32, 32, 8, 128}; }

/// OPT-13B: 40 layers, 40 query heads, 40 K/V heads (multi-head attention), head_dim 128.
/// Source: `config.json` of facebook/opt-13b on Hugging Face: num_hidden_layers 40,
/// num_attention_heads 40, hidden_size 5120 (5120 / 40 = 128); OPT has no separate K/V head
/// count, so num_kv_heads = num_attention_heads.
inline ModelConfig opt_13b_config() { return {"OPT-13B", 40, 40, 40, 128}; }

/// GPT-3 175B: 96 layers, 96 query heads, 96 K/V heads (multi-head attention), head_dim 128,
/// d_model 12288.
/// Source: Brown et al., "Language Models are Few-Shot Learners" (arXiv:2005.14165),
/// Table 2.1, row "GPT-3 175B": n_layers 96, d_model 12288, n_heads 96, d_head 128.
inline ModelConfig gpt3_175b_config() { return {"GPT-3 175B", 96, 96, 96, 128}; }

/// The five configurations above, in the order Llama-2-7B, Llama-2-70B, Mistral-7B, OPT-13B,
/// GPT-3 175B.
inline std::vector<ModelConfig> published_model_configs() {
  return {llama2_7b_config(), llama2_70b_config(), mistral_7b_config(), opt_13b_config(),
          gpt3_175b_config()};
}

namespace detail {

/// Checks a ModelConfig: every count >= 1, and num_heads a multiple of num_kv_heads.
inline void check_model_config(const char* where, const ModelConfig& config) {
  require_at_least(where, "config.num_layers", config.num_layers, 1);
  require_at_least(where, "config.num_heads", config.num_heads, 1);
  require_at_least(where, "config.num_kv_heads", config.num_kv_heads, 1);
  require_at_least(where, "config.head_dim", config.head_dim, 1);
  if (config.num_heads % config.num_kv_heads != 0) {
    fail(where, "config.num_heads",
         "a multiple of config.num_kv_heads (" + std::to_string(config.num_kv_heads) + ")",
         config.num_heads);
  }
}

/// bytes_per_token, reporting errors as coming from `where`.
inline std::uint64_t kv_bytes_per_token(const char* where, const ModelConfig& config,
                                        KVDtype dtype) {
  check_model_config(where, config);
  const auto bits = static_cast<std::uint64_t>(bits_per_element(dtype));
  // One head's values of one token, rounded up to whole bytes: head_dim <= INT_MAX and
  // bits <= 32, so the product fits easily.
  const std::uint64_t row_bytes = (static_cast<std::uint64_t>(config.head_dim) * bits + 7) / 8;
  const std::uint64_t k_and_v = 2 * row_bytes;
  const std::uint64_t per_layer = checked_size_product(
      where, "config.num_kv_heads", k_and_v, static_cast<std::uint64_t>(config.num_kv_heads));
  return checked_size_product(where, "config.num_layers", per_layer,
                              static_cast<std::uint64_t>(config.num_layers));
}

}  // namespace detail

/// Bytes of K and V that one token adds to the cache of one sequence, over all layers:
///
///     2 · num_layers · num_kv_heads · ceil(head_dim · bits_per_element(dtype) / 8)
///
/// For fp32, fp16, bf16 and int8 this is exactly 2 · layers · kv_heads · head_dim · bits / 8.
/// For int4, two values share a byte, and each row of `head_dim` values (one head, one token,
/// K or V) is rounded up to whole bytes: an odd `head_dim` leaves half a byte unused per row
/// (head_dim 3 takes 2 bytes, not 1.5).
///
/// Examples in FP16: Llama-2-7B, 2 · 32 · 32 · 128 · 2 = 524,288 bytes = 512 KiB;
/// GPT-3 175B, 2 · 96 · 96 · 128 · 2 = 4,718,592 bytes = 4.5 MiB. A figure of "20 KB per
/// token for GPT-3 175B" that circulates is too small by a factor of more than 200
/// (4,718,592 / 20,000 ≈ 236): even one layer of GPT-3 holds 2 · 12288 · 2 = 49,152 bytes per
/// token.
///
/// \param config  the model; every count >= 1, num_heads a multiple of num_kv_heads
/// \param dtype   how each K and V value is stored
/// \return bytes per token, in 64-bit unsigned arithmetic
/// \throws InvalidArgument for a bad config or dtype, or if the result does not fit in
///         std::uint64_t (the message names the field that made it overflow).
inline std::uint64_t bytes_per_token(const ModelConfig& config, KVDtype dtype) {
  return detail::kv_bytes_per_token("kvlab::bytes_per_token", config, dtype);
}

/// Bytes of K and V that one token adds to a kvlab cache of one sequence, over all layers, as
/// the cache stores them (`KVStorage`): `bytes_per_token` for fp32, fp16 and bf16; for int8 and
/// int4 the q8_0 / q4_0 blocks, scales included — 34 and 18 bytes per 32 values, 8.5 and 4.5
/// bits per value:
///
///     2 · num_layers · num_kv_heads · (head_dim / 32) · 34   (int8; 18 for int4)
///
/// Llama-2-7B: 278,528 bytes (272 KiB) in int8, 147,456 (144 KiB) in int4, against 262,144 and
/// 131,072 for the values alone.
/// \throws InvalidArgument as `bytes_per_token`, or, for int8 and int4, if `config.head_dim` is
///         not a multiple of 32 (kvlab's caches refuse such heads: a block holds 32 values of
///         one head).
inline std::uint64_t stored_bytes_per_token(const ModelConfig& config, KVDtype dtype) {
  constexpr const char* kWhere = "kvlab::stored_bytes_per_token";
  if (dtype != KVDtype::int8 && dtype != KVDtype::int4)
    return detail::kv_bytes_per_token(kWhere, config, dtype);
  detail::check_model_config(kWhere, config);
  if (config.head_dim % kQuantBlock != 0) {
    detail::fail(kWhere, "config.head_dim",
                 "a multiple of " + std::to_string(kQuantBlock) + " (the values of one " +
                     dtype_name(dtype) + " block)",
                 config.head_dim);
  }
  const std::uint64_t block = dtype == KVDtype::int8 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
  const std::uint64_t row_bytes = static_cast<std::uint64_t>(config.head_dim / kQuantBlock) * block;
  const std::uint64_t per_layer =
      detail::checked_size_product(kWhere, "config.num_kv_heads", 2 * row_bytes,
                                   static_cast<std::uint64_t>(config.num_kv_heads));
  return detail::checked_size_product(kWhere, "config.num_layers", per_layer,
                                      static_cast<std::uint64_t>(config.num_layers));
}

/// Bytes of a KV cache holding `tokens` tokens for each of `batch` sequences:
/// `bytes_per_token(config, dtype) · tokens · batch`, that is
///
///     2 · num_layers · num_kv_heads · ceil(head_dim · bits / 8) · tokens · batch
///
/// The cache grows linearly in each of tokens, batch, layers and K/V heads. For example
/// Llama-2-7B with 4096 tokens in FP16 takes 524,288 · 4096 = 2,147,483,648 bytes = 2 GiB per
/// sequence.
///
/// \code
/// const std::uint64_t bytes = kvlab::kv_cache_bytes(kvlab::llama2_7b_config(), 4096, 1,
///                                                   kvlab::KVDtype::fp16);
/// std::cout << kvlab::format_bytes(bytes) << '\n';  // 2 GiB
/// \endcode
///
/// \param config  the model; every count >= 1, num_heads a multiple of num_kv_heads
/// \param tokens  tokens cached per sequence, >= 0 (an empty cache takes 0 bytes)
/// \param batch   sequences, >= 1
/// With a sliding window of `window` keys (>= 1) a decode step reads only the last `window`
/// tokens, so a cache need keep only `min(tokens, window)` of them: Mistral-7B (W = 4096) at
/// 32768 tokens in FP16 keeps 512 MiB instead of 4 GiB. (kvlab's ring keeps W − 1 + C for
/// steps of C tokens, its paged pool whole blocks: `tutorial_09`.)
///
/// \param dtype   how each K and V value is stored
/// \param window  the sliding window, or 0 (default) for none
/// \return bytes of K and V in all layers of all sequences
/// \throws InvalidArgument for a bad argument (a negative window among them), or if the result
///         does not fit in std::uint64_t (the message names `tokens` or `batch`, the factor
///         that made it overflow, and its largest allowed value).
inline std::uint64_t kv_cache_bytes(const ModelConfig& config, std::int64_t tokens,
                                    std::int64_t batch, KVDtype dtype, std::int64_t window = 0) {
  constexpr const char* kWhere = "kvlab::kv_cache_bytes";
  const std::uint64_t per_token = detail::kv_bytes_per_token(kWhere, config, dtype);
  detail::require_at_least(kWhere, "tokens", tokens, std::int64_t{0});
  detail::require_at_least(kWhere, "batch", batch, std::int64_t{1});
  detail::require_at_least(kWhere, "window", window, std::int64_t{0});
  if (window > 0 && tokens > window) tokens = window;  // the keys a step can still read
  const std::uint64_t per_sequence =
      detail::checked_size_product(kWhere, "tokens", per_token, static_cast<std::uint64_t>(tokens));
  if (per_sequence == 0) return 0;
  return detail::checked_size_product(kWhere, "batch", per_sequence,
                                      static_cast<std::uint64_t>(batch));
}

/// A byte count in binary units, for people: "0 B", "1023 B", "512 KiB", "4.5 MiB", "2 GiB".
///
/// The unit is the largest of B, KiB, MiB, GiB, TiB, PiB (powers of 1024) that is not above
/// the value; the number is rounded to at most three decimals (half up), and trailing zeros
/// are dropped, so exact multiples print as integers. A value that rounds up to 1024 of a
/// unit is printed as 1 of the next ("1 GiB" for 1,073,741,823 bytes). Above 1024 PiB the
/// count stays in PiB.
/// Decimal units (KB = 1000 bytes) are never used: 20,000 bytes print as "19.531 KiB".
inline std::string format_bytes(std::uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  constexpr int kLargest = 5;
  int unit = 0;
  while (unit < kLargest && bytes >> (10 * (unit + 1)) != 0) ++unit;
  if (unit == 0) return std::to_string(bytes) + " B";
  const std::uint64_t size = std::uint64_t{1} << (10 * unit);
  std::uint64_t whole = bytes / size;
  // remainder < 2^50, so remainder * 1000 < 2^60 cannot overflow.
  std::uint64_t thousandths = (bytes % size * 1000 + size / 2) / size;
  if (thousandths == 1000) {
    ++whole;
    thousandths = 0;
  }
  if (whole == 1024 && unit < kLargest) {
    ++unit;
    whole = 1;
  }
  std::string text = std::to_string(whole);
  if (thousandths != 0) {
    std::string digits = std::to_string(thousandths);
    digits.insert(0, 3 - digits.size(), '0');
    while (digits.back() == '0') digits.pop_back();
    text += "." + digits;
  }
  return text + " " + kUnits[unit];
}

}  // namespace kvlab
