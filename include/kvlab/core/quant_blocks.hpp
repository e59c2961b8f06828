/// \file
/// \brief The byte layouts of the quantized K/V storage — `BlockQ8_0` (int8) and `BlockQ4_0`
/// (int4), each 32 values of one head's row with one fp16 scale, llama.cpp's q8_0 and q4_0 forms
/// — and `StorageUnit`, how many values one stored element holds, which the cache views use to
/// address rows of any storage type. Host and device, no Eigen; the encoding and decoding live in
/// `kv_storage.hpp`.
#pragma once

#include <cstdint>

#include "kvlab/config.hpp"

namespace kvlab {

/// Values per quantization block: a head's row of `head_dim` values is `head_dim / 32` blocks.
constexpr int kQuantBlock = 32;

/// 32 values in 8 bits each: value i is `d · q[i]`, q in [-127, 127], d = fp16 bits of the
/// block's scale (>= 0). 34 bytes per 32 values: 8.5 bits per value, the scale included.
struct BlockQ8_0 {
  std::uint16_t d;             ///< the scale, fp16 bits
  std::int8_t q[kQuantBlock];  ///< the 32 quantized values
};
static_assert(sizeof(BlockQ8_0) == 34, "q8_0: 2 bytes of scale + 32 of values, no padding");

/// 32 values in 4 bits each: value i is `d · (n_i − 8)`, n_i in [0, 15] the nibble, d = fp16 bits
/// of the block's scale (either sign). Byte j holds value j in its low nibble and value j + 16
/// in its high nibble (llama.cpp's order). 18 bytes per 32 values: 4.5 bits per value.
struct BlockQ4_0 {
  std::uint16_t d;                 ///< the scale, fp16 bits
  std::uint8_t q[kQuantBlock / 2];  ///< nibbles: values j (low) and j + 16 (high) in byte j
};
static_assert(sizeof(BlockQ4_0) == 18, "q4_0: 2 bytes of scale + 16 of nibbles, no padding");

/// Values held by one stored element of type `S`: 1 for a number type (float, fp16, bf16), 32
/// for a quantized block. A head's row of `head_dim` values is `head_dim / kValues` elements, the
/// unit in which the views (`ContiguousKVView`, `PagedKVView`) count offsets.
template <typename S>
struct StorageUnit {
  static constexpr int kValues = 1;  ///< values per stored element
};
/// A q8_0 block holds 32 values.
template <>
struct StorageUnit<BlockQ8_0> {
  static constexpr int kValues = kQuantBlock;  ///< values per stored element
};
/// A q4_0 block holds 32 values.
template <>
struct StorageUnit<BlockQ4_0> {
  static constexpr int kValues = kQuantBlock;  ///< values per stored element
};

}  // namespace kvlab
