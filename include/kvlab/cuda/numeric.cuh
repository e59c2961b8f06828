/// \file
/// \brief The storage types of kvlab's CUDA kernels — `float`, `__half` (fp16) and
/// `__nv_bfloat16` (bf16) — with their conversions to and from `float` (every kernel computes in
/// fp32), their names, and the 8-value loads the attention kernel reads K/V rows with.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

namespace kvlab::cuda {

/// True for the element types the CUDA kernels store: float, __half, __nv_bfloat16.
template <typename T>
constexpr bool is_storage_type = std::is_same<T, float>::value || std::is_same<T, __half>::value ||
                                 std::is_same<T, __nv_bfloat16>::value;

/// Name of a storage type: "fp32", "fp16" or "bf16".
template <typename T>
constexpr const char* storage_name() {
  static_assert(is_storage_type<T>, "kvlab's CUDA kernels store float, __half or __nv_bfloat16");
  return std::is_same<T, float>::value ? "fp32" : std::is_same<T, __half>::value ? "fp16" : "bf16";
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

/// Loads values [0, 8) at `p` (16-byte aligned) in one or two vector loads.
template <typename T>
__device__ inline Pack8<T> load8(const T* p) {
  Pack8<T> pack;
  if constexpr (std::is_same<T, float>::value) {
    pack.lo = reinterpret_cast<const float4*>(p)[0];
    pack.hi = reinterpret_cast<const float4*>(p)[1];
  } else {
    pack.bits = *reinterpret_cast<const uint4*>(p);
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

}  // namespace detail
}  // namespace kvlab::cuda
