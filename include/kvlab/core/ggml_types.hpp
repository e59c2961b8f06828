/// \file
/// \brief The tensor types of GGUF files that kvlab reads, and how a row of each becomes floats.
///
/// The types are F32, F16, BF16, Q8_0, Q4_0 and Q4_1, with their block sizes; `dequantize_row`
/// turns a row of any of them into floats exactly as ggml defines them. Checked in the tests on
/// hand-built blocks whose values are known, and against a double-precision reference of the real
/// model's tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "kvlab/config.hpp"
#include "kvlab/core/quant_blocks.hpp"

namespace kvlab {

/// A ggml tensor type, by the id a GGUF file stores (`ggml_type` in ggml.h). kvlab reads the six
/// listed here; `ggml_type_name` names the others so that a file holding one is refused by name.
enum class GgmlType : std::uint32_t {
  F32 = 0,   ///< float32, one value per element
  F16 = 1,   ///< IEEE half precision, one value per element
  Q4_0 = 2,  ///< blocks of 32 values: fp16 scale d, 16 bytes of nibbles; value d·(n − 8)
  Q4_1 = 3,  ///< blocks of 32 values: fp16 scale d and minimum m, 16 bytes of nibbles; d·n + m
  Q8_0 = 8,  ///< blocks of 32 values: fp16 scale d, 32 int8 q; value d·q
  BF16 = 30  ///< bfloat16, one value per element
};

/// The name ggml gives type id `id` ("F32", "Q4_K", ...), or "unknown type <id>" for an id ggml
/// does not define (ids 4, 5 and 31–33, 36–38 were removed from ggml and are unknown here too).
inline std::string ggml_type_name(std::uint32_t id) {
  static const char* const kNames[] = {
      "F32",     "F16",   "Q4_0",   "Q4_1",  nullptr, nullptr,  "Q5_0",  "Q5_1",    "Q8_0",
      "Q8_1",    "Q2_K",  "Q3_K",   "Q4_K",  "Q5_K",  "Q6_K",   "Q8_K",  "IQ2_XXS", "IQ2_XS",
      "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8",    "I16",     "I32",
      "I64",     "F64",   "IQ1_M",  "BF16",  nullptr, nullptr,  nullptr, "TQ1_0",   "TQ2_0",
      nullptr,   nullptr, nullptr,  "MXFP4", "NVFP4", "Q1_0"};
  constexpr std::uint32_t kCount = sizeof kNames / sizeof kNames[0];
  if (id < kCount && kNames[id] != nullptr) return kNames[id];
  return "unknown type " + std::to_string(id);
}

/// True for the types kvlab reads: F32, F16, BF16, Q8_0, Q4_0, Q4_1.
inline bool ggml_type_supported(std::uint32_t id) {
  switch (static_cast<GgmlType>(id)) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q8_0:
    case GgmlType::BF16:
      return true;
  }
  return false;
}

/// Values per block of `type`: 32 for the quantized types, 1 for the others. A row (a tensor's
/// first dimension) must hold a whole number of blocks.
inline int ggml_block_values(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q8_0:
      return kQuantBlock;
    default:
      return 1;
  }
}

/// Bytes per block of `type`: 4 (F32), 2 (F16, BF16), 18 (Q4_0), 20 (Q4_1), 34 (Q8_0).
inline std::size_t ggml_block_bytes(GgmlType type) {
  switch (type) {
    case GgmlType::F32:
      return 4;
    case GgmlType::F16:
    case GgmlType::BF16:
      return 2;
    case GgmlType::Q4_0:
      return sizeof(BlockQ4_0);
    case GgmlType::Q4_1:
      return sizeof(BlockQ4_1);
    case GgmlType::Q8_0:
      return sizeof(BlockQ8_0);
  }
  detail::fail("kvlab::ggml_block_bytes", "type", "F32, F16, BF16, Q8_0, Q4_0 or Q4_1",
               ggml_type_name(static_cast<std::uint32_t>(type)));
}

/// Bytes of `n` values of `type`; `n` a multiple of `ggml_block_values(type)`.
/// \throws InvalidArgument if `n` is not a whole number of blocks, or the size overflows.
inline std::uint64_t ggml_row_bytes(GgmlType type, std::uint64_t n) {
  constexpr const char* kWhere = "kvlab::ggml_row_bytes";
  const auto per_block = static_cast<std::uint64_t>(ggml_block_values(type));
  if (n % per_block != 0) {
    detail::fail(kWhere, "n",
                 "a multiple of " + std::to_string(per_block) + " (a " +
                     ggml_type_name(static_cast<std::uint32_t>(type)) + " block)",
                 n);
  }
  return detail::checked_size_product(kWhere, "n", ggml_block_bytes(type), n / per_block, "",
                                      detail::kMaxSignedSize);
}

/// Decodes `n` values of `type` stored at `data` (`ggml_row_bytes(type, n)` bytes, in the file's
/// little-endian order, any alignment) into `out` [n], as ggml's `dequantize_row_*` does:
///  - F32 as is; F16 and BF16 widened exactly;
///  - Q8_0: per block of 32, d·q[i];
///  - Q4_0: per block, d·(n_i − 8), nibble n_i of byte i (low) for values 0–15 and of byte
///    i − 16 (high) for values 16–31;
///  - Q4_1: per block, d·n_i + m, the same nibble order.
/// \throws InvalidArgument if `n` is not a whole number of blocks of `type`.
inline void dequantize_row(GgmlType type, const unsigned char* data, std::int64_t n, float* out) {
  constexpr const char* kWhere = "kvlab::dequantize_row";
  if (n < 0) detail::fail(kWhere, "n", ">= 0", n);
  const std::uint64_t bytes = ggml_row_bytes(type, static_cast<std::uint64_t>(n));  // checks n
  (void)bytes;
  // Each block is copied out first: the file's bytes have no alignment.
  const auto blocks = [&](auto block, auto decode) {
    const std::int64_t count = n / kQuantBlock;
    for (std::int64_t b = 0; b < count; ++b) {
      std::memcpy(&block, data + static_cast<std::size_t>(b) * sizeof block, sizeof block);
      for (int i = 0; i < kQuantBlock; ++i) out[b * kQuantBlock + i] = decode(block, i);
    }
  };
  switch (type) {
    case GgmlType::F32:
      std::memcpy(out, data, static_cast<std::size_t>(n) * sizeof(float));
      return;
    case GgmlType::F16:
    case GgmlType::BF16:
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t bits;  // one value's 16 bits
        std::memcpy(&bits, data + 2 * i, sizeof bits);
        if (type == GgmlType::F16) {
          out[i] = detail::half_bits_to_float(bits);
        } else {
          const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;  // bf16: top half
          std::memcpy(out + i, &wide, sizeof(float));
        }
      }
      return;
    case GgmlType::Q8_0:
      return blocks(BlockQ8_0{},
                    [](const BlockQ8_0& b, int i) { return detail::dequantize(b, i); });
    case GgmlType::Q4_0:
      return blocks(BlockQ4_0{},
                    [](const BlockQ4_0& b, int i) { return detail::dequantize(b, i); });
    case GgmlType::Q4_1:
      return blocks(BlockQ4_1{},
                    [](const BlockQ4_1& b, int i) { return detail::dequantize(b, i); });
  }
}

}  // namespace kvlab
