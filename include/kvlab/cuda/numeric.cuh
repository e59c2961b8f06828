/// \file
/// \brief The storage types of kvlab's CUDA kernels, with their conversions to and from `float`.
///
/// The types are `float`, `__half` (fp16) and `__nv_bfloat16` (bf16), and for K/V caches the
/// quantized blocks `BlockQ8_0` (int8) and `BlockQ4_0` (int4). Every kernel computes in fp32. The
/// header also gives their names, and the 8-value loads the attention kernel reads K/V rows with (a
/// quantized row decoded in registers as it is read).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kvlab/core/quant_blocks.hpp"

namespace kvlab::cuda {

/// True for the element types the CUDA kernels store: float, __half, __nv_bfloat16.
template <typename T>
constexpr bool is_storage_type = std::is_same<T, float>::value || std::is_same<T, __half>::value ||
                                 std::is_same<T, __nv_bfloat16>::value;

/// True for the quantized K/V storage types: `BlockQ8_0` (int8) and `BlockQ4_0` (int4), 32
/// values per element. A cache of these is read by the attention kernels with fp32 queries.
template <typename S>
constexpr bool is_quantized_storage =
    std::is_same<S, BlockQ8_0>::value || std::is_same<S, BlockQ4_0>::value;

/// True for a K/V cache of `S` read with queries (and output) of `T`: the same number type, or
/// fp32 queries with a cache of any storage (fp16, bf16, int8 or int4 rows are made floats as
/// they are read, as the CPU kernels read them).
template <typename T, typename S>
constexpr bool is_cache_pairing = is_storage_type<T> &&
                                  (std::is_same<T, S>::value ||
                                   (std::is_same<T, float>::value &&
                                    (is_storage_type<S> || is_quantized_storage<S>)));

/// Name of a storage type: "fp32", "fp16", "bf16", "int8" or "int4" (`KVStorage`'s names).
template <typename T>
constexpr const char* storage_name() {
  static_assert(is_storage_type<T> || is_quantized_storage<T>,
                "kvlab's CUDA kernels store float, __half, __nv_bfloat16, BlockQ8_0 or BlockQ4_0");
  return std::is_same<T, float>::value           ? "fp32"
         : std::is_same<T, __half>::value        ? "fp16"
         : std::is_same<T, __nv_bfloat16>::value ? "bf16"
         : std::is_same<T, BlockQ8_0>::value     ? "int8"
                                                 : "int4";
}

/// `x` as a float (exact for every storage type). Host and device.
__host__ __device__ inline float to_float(float x) { return x; }
/// `x` as a float (exact). Host and device.
__host__ __device__ inline float to_float(__half x) { return __half2float(x); }
/// `x` as a float (exact). Host and device.
__host__ __device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

/// `x` rounded to the storage type `T` (round to nearest even). Host and device.
template <typename T>
__host__ __device__ inline T from_float(float x);
/// `x` itself.
template <>
__host__ __device__ inline float from_float<float>(float x) {
  return x;
}
/// `x` rounded to fp16.
template <>
__host__ __device__ inline __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
/// `x` rounded to bf16.
template <>
__host__ __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

namespace detail {

/// Eight consecutive values of `T` as loaded from memory: 32 bytes of float, 16 of fp16/bf16.
template <typename T>
struct Pack8;
/// Eight floats: two 16-byte loads.
template <>
struct Pack8<float> {
  float4 lo, hi;
};
/// Eight fp16 values: one 16-byte load.
template <>
struct Pack8<__half> {
  uint4 bits;
};
/// Eight bf16 values: one 16-byte load.
template <>
struct Pack8<__nv_bfloat16> {
  uint4 bits;
};
/// Eight values of a q8_0 row: their block's scale and their 8 levels.
template <>
struct Pack8<BlockQ8_0> {
  float d;           ///< the block's scale
  std::int8_t q[8];  ///< the levels: value i is d · q[i]
};
/// Eight values of a q4_0 row: their block's scale and the 8 bytes that hold their nibbles.
template <>
struct Pack8<BlockQ4_0> {
  float d;            ///< the block's scale
  std::uint8_t q[8];  ///< bytes j .. j + 7 of the block
  bool high;          ///< the values are the high nibbles (values 16–31 of the block)
};

/// Loads values [8 chunk, 8 chunk + 8) of the row that starts at `row`: one or two vector
/// loads for float, fp16 and bf16 (`row` 16-byte aligned); for a quantized row, the scale of
/// the block that holds them and their 8 bytes (blocks are 34 or 18 bytes: 2-byte aligned, so
/// these are narrow loads).
template <typename T>
__device__ inline Pack8<T> load8(const T* row, int chunk) {
  Pack8<T> pack;
  if constexpr (std::is_same<T, float>::value) {
    const T* p = row + chunk * 8;
    pack.lo = reinterpret_cast<const float4*>(p)[0];
    pack.hi = reinterpret_cast<const float4*>(p)[1];
  } else if constexpr (std::is_same<T, BlockQ8_0>::value) {
    const BlockQ8_0& block = row[chunk / 4];  // 32 values: 4 chunks per block
    pack.d = kvlab::detail::half_value(block.d);
    memcpy(pack.q, block.q + 8 * (chunk % 4), sizeof pack.q);
  } else if constexpr (std::is_same<T, BlockQ4_0>::value) {
    // values j (low nibble) and j + 16 (high) share byte j: chunks 0, 1 are the low nibbles
    // of bytes 0-7 and 8-15, chunks 2, 3 their high nibbles
    const BlockQ4_0& block = row[chunk / 4];
    pack.d = kvlab::detail::half_value(block.d);
    memcpy(pack.q, block.q + 8 * (chunk % 2), sizeof pack.q);
    pack.high = chunk % 4 >= 2;
  } else {
    pack.bits = *reinterpret_cast<const uint4*>(row + chunk * 8);
  }
  return pack;
}

/// Eight zeros.
template <typename T>
__device__ inline Pack8<T> zero8() {
  Pack8<T> pack;
  if constexpr (std::is_same<T, float>::value) {
    pack.lo = make_float4(0.f, 0.f, 0.f, 0.f);
    pack.hi = pack.lo;
  } else if constexpr (std::is_same<T, BlockQ8_0>::value) {
    pack.d = 0.f;
    for (std::int8_t& q : pack.q) q = 0;
  } else if constexpr (std::is_same<T, BlockQ4_0>::value) {
    pack.d = 0.f;
    for (std::uint8_t& q : pack.q) q = 0x88;  // level 8 - 8 = 0
    pack.high = false;
  } else {
    pack.bits = make_uint4(0u, 0u, 0u, 0u);
  }
  return pack;
}

/// The eight values of `pack` as floats.
__device__ inline void unpack8(const Pack8<float>& pack, float (&x)[8]) {
  x[0] = pack.lo.x, x[1] = pack.lo.y, x[2] = pack.lo.z, x[3] = pack.lo.w;
  x[4] = pack.hi.x, x[5] = pack.hi.y, x[6] = pack.hi.z, x[7] = pack.hi.w;
}
/// The eight values of `pack` as floats.
__device__ inline void unpack8(const Pack8<__half>& pack, float (&x)[8]) {
  const unsigned words[4] = {pack.bits.x, pack.bits.y, pack.bits.z, pack.bits.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2 pair;
    static_assert(sizeof pair == sizeof words[i], "two fp16 values per 32-bit word");
    memcpy(&pair, &words[i], sizeof pair);
    const float2 f = __half22float2(pair);
    x[2 * i] = f.x;
    x[2 * i + 1] = f.y;
  }
}
/// The eight values of `pack` as floats.
__device__ inline void unpack8(const Pack8<__nv_bfloat16>& pack, float (&x)[8]) {
  const unsigned words[4] = {pack.bits.x, pack.bits.y, pack.bits.z, pack.bits.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __nv_bfloat162 pair;
    static_assert(sizeof pair == sizeof words[i], "two bf16 values per 32-bit word");
    memcpy(&pair, &words[i], sizeof pair);
    const float2 f = __bfloat1622float2(pair);
    x[2 * i] = f.x;
    x[2 * i + 1] = f.y;
  }
}

/// The eight values of `pack` as floats: d · q (exact in float, as `KVStorage<BlockQ8_0>` decodes).
__device__ inline void unpack8(const Pack8<BlockQ8_0>& pack, float (&x)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = pack.d * static_cast<float>(pack.q[i]);
}
/// The eight values of `pack` as floats: d · (n − 8) (exact, as `KVStorage<BlockQ4_0>` decodes).
__device__ inline void unpack8(const Pack8<BlockQ4_0>& pack, float (&x)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int n = pack.high ? pack.q[i] >> 4 : pack.q[i] & 0x0F;
    x[i] = pack.d * static_cast<float>(n - 8);
  }
}

}  // namespace detail
}  // namespace kvlab::cuda
