/// \file
/// \brief The byte layouts of the quantized K/V storage, and `StorageUnit`.
///
/// `BlockQ8_0` (int8) and `BlockQ4_0` (int4) each hold 32 values of one head's row with one fp16
/// scale, llama.cpp's q8_0 and q4_0 forms; `BlockQ4_1` is the weight format of the same family that
/// GGUF files use. `StorageUnit` gives how many values one stored element holds, which the cache
/// views use to address rows of any storage type. Host and device, no Eigen; the encoding and
/// decoding live in `kv_storage.hpp`, on top of the block-level functions here
/// (`detail::quantize_block`, `detail::dequantize`), which the CUDA kernels call too.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

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
  std::uint16_t d;                  ///< the scale, fp16 bits
  std::uint8_t q[kQuantBlock / 2];  ///< nibbles: values j (low) and j + 16 (high) in byte j
};
static_assert(sizeof(BlockQ4_0) == 18, "q4_0: 2 bytes of scale + 16 of nibbles, no padding");

/// 32 values in 4 bits each with a scale and a minimum: value i is `d · n_i + m`, n_i in [0, 15]
/// the nibble, d and m fp16 bits. Nibbles in llama.cpp's order, as in `BlockQ4_0`. 20 bytes per
/// 32 values: 5 bits per value. A weight format of GGUF files (ggml's q4_1), not a cache format.
struct BlockQ4_1 {
  std::uint16_t d;                  ///< the scale, fp16 bits
  std::uint16_t m;                  ///< the minimum, fp16 bits
  std::uint8_t q[kQuantBlock / 2];  ///< nibbles: values j (low) and j + 16 (high) in byte j
};
static_assert(sizeof(BlockQ4_1) == 20, "q4_1: 2 + 2 bytes of scale and minimum + 16 of nibbles");

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

/// Bytes of one head's row of `head_dim` values stored as `S` (`head_dim` a multiple of
/// `StorageUnit<S>::kValues`): what the counters count per row read. Host and device.
template <typename S>
KVLAB_HOST_DEVICE constexpr std::size_t storage_row_bytes(int head_dim) {
  return static_cast<std::size_t>(head_dim / StorageUnit<S>::kValues) * sizeof(S);
}

namespace detail {

/// The value of fp16 bits `h`, exactly, in plain integer and float operations that a compiler
/// vectorises (Eigen's scalar conversion is not, in a loop): the 15 bits of exponent and
/// fraction shifted into a float's place make a float 2^-112 times the value — right for
/// normal and subnormal values alike — so one multiplication by 2^112 finishes it; an all-ones
/// exponent (±Inf, NaN) gets a float's all-ones exponent. Host and device. Checked bit for bit
/// against Eigen's conversion for all 65,536 patterns in the tests.
KVLAB_HOST_DEVICE inline float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t magnitude = static_cast<std::uint32_t>(h & 0x7FFFu) << 13;
  float scaled;
  std::memcpy(&scaled, &magnitude, sizeof scaled);
  scaled *= 0x1p112f;
  std::uint32_t bits;
  std::memcpy(&bits, &scaled, sizeof bits);
  bits |= (h & 0x7C00u) == 0x7C00u ? 0x7F800000u : 0u;    // ±Inf and NaN
  bits |= static_cast<std::uint32_t>(h & 0x8000u) << 16;  // the sign
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}
/// The value of fp16 bits `bits` (exact): a quantization block's scale. Host and device.
KVLAB_HOST_DEVICE inline float half_value(std::uint16_t bits) { return half_bits_to_float(bits); }

/// The fp16 bits of the smallest fp16 value >= `x`, for `x` >= 0 finite (+Inf above 65504): a
/// quantization scale rounded up, so that no value of its block falls outside the levels
/// (`KVStorage<BlockQ8_0>`). Integer operations on the float's bits, host and device alike:
///  - x >= 2^-14 (fp16's normal range): the exponent rebiased, the top 10 of the 23 fraction
///    bits kept, plus one step if any of the 13 dropped bits is set (a carry into the exponent
///    is the next binade, and past 65504 it gives +Inf's bits);
///  - below: fp16's subnormals are multiples of 2^-24, so the bits are ceil(x · 2^24) (exact:
///    a multiplication by a power of two), 1024 being the smallest normal's bits.
KVLAB_HOST_DEVICE inline std::uint16_t half_bits_up(float x) {
  std::uint32_t f;
  std::memcpy(&f, &x, sizeof f);
  const int exponent = static_cast<int>((f >> 23) & 0xFFu) - 127;
  if (exponent >= -14) {
    if (exponent > 15) return 0x7C00u;  // beyond fp16's largest binade: +Inf
    const std::uint32_t fraction = f & 0x7FFFFFu;
    std::uint32_t h = (static_cast<std::uint32_t>(exponent + 15) << 10) | (fraction >> 13);
    if ((fraction & 0x1FFFu) != 0) ++h;
    return static_cast<std::uint16_t>(h);
  }
  return static_cast<std::uint16_t>(ceilf(x * 0x1p24f));
}

/// Quantizes 32 values to one q8_0 block, as `KVStorage<BlockQ8_0>` describes: the scale
/// max|x| / 127 rounded up to fp16, each value round(x / d) (half away from zero) by the stored
/// scale's inverse. The one implementation of the encoding, host and device.
KVLAB_HOST_DEVICE inline void quantize_block(const float* x, BlockQ8_0& block) {
  float max = 0.f;
  for (int i = 0; i < kQuantBlock; ++i) max = fmaxf(max, fabsf(x[i]));
  block.d = half_bits_up(max / 127.f);
  const float d = half_value(block.d);
  const float inverse = d > 0.f ? 1.f / d : 0.f;
  for (int i = 0; i < kQuantBlock; ++i) {
    // |x / d| <= 127 (d rounded up), up to the rounding of the product: clamp for safety
    const float level = roundf(x[i] * inverse);
    block.q[i] = static_cast<std::int8_t>(level < -127.f ? -127.f : level > 127.f ? 127.f : level);
  }
}

/// Quantizes 32 values to one q4_0 block, as `KVStorage<BlockQ4_0>` describes: d = m / −8 for
/// the value m of largest magnitude (the first of equals), |d| rounded up to fp16, and each
/// value the nibble min(15, floor(x / d + 8.5)) by the stored scale's inverse. The product and
/// the sum are each rounded (on the device `__fmul_rn`, `__fadd_rn`, which nvcc does not fuse):
/// the host computes the same unless its build fuses them into one FMA (GCC does with
/// -march=native on a CPU that has FMA; a value at a rounding tie may then get the other of its
/// two nearest levels, within the same bound). The one implementation, host and device.
KVLAB_HOST_DEVICE inline void quantize_block(const float* x, BlockQ4_0& block) {
  constexpr int kHalf = kQuantBlock / 2;
  float extreme = 0.f;
  for (int i = 0; i < kQuantBlock; ++i)
    if (fabsf(x[i]) > fabsf(extreme)) extreme = x[i];
  const std::uint16_t magnitude = half_bits_up(fabsf(extreme) / 8.f);
  // d = extreme / -8: the sign opposite to the extreme's (fp16 bit 15)
  block.d = static_cast<std::uint16_t>(magnitude | (extreme > 0.f ? 0x8000u : 0u));
  const float d = half_value(block.d);
  const float inverse = d != 0.f ? 1.f / d : 0.f;
  std::uint8_t nibble[kQuantBlock];
  for (int i = 0; i < kQuantBlock; ++i) {
#if defined(__CUDA_ARCH__)
    const float level = floorf(__fadd_rn(__fmul_rn(x[i], inverse), 8.5f));
#else
    const float level = floorf(x[i] * inverse + 8.5f);
#endif
    nibble[i] = static_cast<std::uint8_t>(level < 0.f ? 0.f : level > 15.f ? 15.f : level);
  }
  for (int j = 0; j < kHalf; ++j)
    block.q[j] = static_cast<std::uint8_t>(nibble[j] | (nibble[j + kHalf] << 4));
}

/// Value `i` (in [0, 32)) of a q8_0 block: d·q[i], exact in float. Host and device.
KVLAB_HOST_DEVICE inline float dequantize(const BlockQ8_0& block, int i) {
  return half_value(block.d) * static_cast<float>(block.q[i]);
}
/// Value `i` (in [0, 32)) of a q4_0 block: d·(n_i − 8), exact in float. Host and device.
KVLAB_HOST_DEVICE inline float dequantize(const BlockQ4_0& block, int i) {
  const int n = i < kQuantBlock / 2 ? block.q[i] & 0x0F : block.q[i - kQuantBlock / 2] >> 4;
  return half_value(block.d) * static_cast<float>(n - 8);
}

/// Value `i` (in [0, 32)) of a q4_1 block: d·n_i + m, as ggml computes it (a product, then a
/// sum, each rounded to float unless the build fuses them). Host and device.
KVLAB_HOST_DEVICE inline float dequantize(const BlockQ4_1& block, int i) {
  const int n = i < kQuantBlock / 2 ? block.q[i] & 0x0F : block.q[i - kQuantBlock / 2] >> 4;
  return half_value(block.d) * static_cast<float>(n) + half_value(block.m);
}

}  // namespace detail

}  // namespace kvlab
