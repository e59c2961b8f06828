/// \file
/// \brief How a cache stores the keys and values it is given: `KVDtype` and `KVStorage<S>`.
///
/// `KVDtype` names the storage types (fp32, fp16, bf16, int8, int4). `KVStorage<S>` is the one
/// place where a row of values becomes stored elements of type `S` and back: `float` as is,
/// `Eigen::half` and `Eigen::bfloat16` rounded to nearest even, `BlockQ8_0` and `BlockQ4_0`
/// quantized per block of 32 values with an fp16 scale. The bound on what each loses is derived
/// below and checked exhaustively in `tests/test_kv_storage.cpp`. The caches encode a row when it
/// is appended; the attention kernels decode the rows they read, one at a time (never a decoded
/// copy of the cache), and read int8 and int4 rows block by block without decoding them (`levels`,
/// `cpu/row_runs.hpp`).
///
/// Beside `matrix.hpp`, below every folder: the caches (`cache/`) and the kernels (`cpu/`) both
/// read it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "kvlab/config.hpp"
#include "kvlab/core/quant_blocks.hpp"
#include "kvlab/matrix.hpp"

namespace kvlab {

/// How each K and V value is stored in a cache: the precisions of kvlab's caches
/// (`KVStorage`) and of the size calculator (`bytes_per_token`).
enum class KVDtype {
  fp32,  ///< IEEE 754 single precision: 32 bits (`float`).
  fp16,  ///< IEEE 754 half precision: 16 bits (`Eigen::half`, rounded to nearest even).
  bf16,  ///< bfloat16 (8 exponent bits, 7 mantissa bits): 16 bits (`Eigen::bfloat16`).
  int8,  ///< 8-bit integer: in kvlab's caches q8_0 (`BlockQ8_0`), 32 values and an fp16 scale.
  int4,  ///< 4-bit integer, two per byte: in kvlab's caches q4_0 (`BlockQ4_0`), likewise.
};

/// Bits that one K or V value takes, scales aside: 32, 16, 16, 8 or 4 (`stored_bits_per_value`
/// counts the scales of int8 and int4 too).
/// \throws InvalidArgument for a value that is not one of the enumerators.
constexpr int bits_per_element(KVDtype dtype) {
  switch (dtype) {
    case KVDtype::fp32:
      return 32;
    case KVDtype::fp16:
      return 16;
    case KVDtype::bf16:
      return 16;
    case KVDtype::int8:
      return 8;
    case KVDtype::int4:
      return 4;
  }
  detail::fail("kvlab::bits_per_element", "dtype", "one of fp32, fp16, bf16, int8, int4",
               static_cast<int>(dtype));
}

/// The name of a storage precision: "fp32", "fp16", "bf16", "int8" or "int4" (the CUDA kernels
/// name their storage types the same way, `cuda::storage_name`).
/// \throws InvalidArgument for a value that is not one of the enumerators.
inline std::string dtype_name(KVDtype dtype) {
  switch (dtype) {
    case KVDtype::fp32:
      return "fp32";
    case KVDtype::fp16:
      return "fp16";
    case KVDtype::bf16:
      return "bf16";
    case KVDtype::int8:
      return "int8";
    case KVDtype::int4:
      return "int4";
  }
  detail::fail("kvlab::dtype_name", "dtype", "one of fp32, fp16, bf16, int8, int4",
               static_cast<int>(dtype));
}

/// The precision named `name` ("fp32", "fp16", "bf16", "int8" or "int4").
/// \throws InvalidArgument for any other name.
inline KVDtype parse_kv_dtype(const std::string& name) {
  for (KVDtype d : {KVDtype::fp32, KVDtype::fp16, KVDtype::bf16, KVDtype::int8, KVDtype::int4}) {
    if (name == dtype_name(d)) return d;
  }
  detail::fail("kvlab::parse_kv_dtype", "name", "fp32, fp16, bf16, int8 or int4", "'" + name + "'");
}

/// Bits a kvlab cache stores per value, scales included: 32, 16, 16, 8.5 (q8_0: 34 bytes per
/// 32 values) or 4.5 (q4_0: 18 bytes per 32 values).
/// \throws InvalidArgument for a value that is not one of the enumerators.
inline double stored_bits_per_value(KVDtype dtype) {
  switch (dtype) {
    case KVDtype::int8:
      return 8.0 * sizeof(BlockQ8_0) / kQuantBlock;
    case KVDtype::int4:
      return 8.0 * sizeof(BlockQ4_0) / kQuantBlock;
    default:
      return bits_per_element(dtype);
  }
}

namespace detail {

/// The value of bf16 bits `b`, exactly: the top half of a float.
inline float bf16_bits_to_float(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}
/// `x` as a float: a `double` is rounded to float first (the storage codecs work in float).
template <typename T>
float as_float(T x) {
  return static_cast<float>(x);
}
/// Quantizes the `n` values at `x` (a multiple of 32) into blocks of `S` (`BlockQ8_0` or
/// `BlockQ4_0`) with `quantize_block`, each block's values first made floats.
template <typename S, typename T>
void quantize_blocks(const T* x, int n, S* out) {
  for (int b = 0; b < n / kQuantBlock; ++b) {
    const T* v = x + b * kQuantBlock;
    if constexpr (std::is_same<T, float>::value) {
      quantize_block(v, out[b]);
    } else {
      float block[kQuantBlock];  // the values as floats
      for (int i = 0; i < kQuantBlock; ++i) block[i] = as_float(v[i]);
      quantize_block(block, out[b]);
    }
  }
}

/// The first of `x[0, n)` that is not finite, or the first of a block of `values` values whose
/// largest magnitude exceeds `max`, or -1 (the check of the quantized forms).
template <typename T>
int first_unquantizable(const T* x, int n, int values, float max) {
  for (int b = 0; b < n / values; ++b) {
    for (int i = 0; i < values; ++i) {
      const float v = as_float(x[b * values + i]);
      if (!std::isfinite(v) || std::fabs(v) > max) return b * values + i;
    }
  }
  return -1;
}

}  // namespace detail

/// How values are stored as elements of type `S`: specialised for `float` and `double` (kept
/// as they are), `Eigen::half`, `Eigen::bfloat16`, `BlockQ8_0` and `BlockQ4_0`. Every
/// specialisation has:
///  - `kValues`: values per stored element (1, or 32 for a block); a row's length must be a
///    multiple of it;
///  - `name()`: "fp32", "fp64", "fp16", "bf16", "int8", "int4";
///  - `encode(x, n, out)`: values `x[0, n)` (float or double; a double is rounded to float
///    first) into `n / kValues` elements;
///  - `decode(in, n, out)`: the `n` values those elements hold, as float or double;
///  - `first_unrepresentable(x, n)`: the index of the first value that cannot be stored (NaN,
///    ±Inf, or a magnitude whose rounding or scale overflows fp16), or -1 — the caches call it
///    on every row before they change anything;
///  - `limit()`: what `first_unrepresentable` accepts, in words, for error messages;
///  - `error_bounds(in, n, bound)`: for each stored value, an upper bound on |x − decode| that
///    follows from the stored elements alone (derived in each specialisation's comment).
template <typename S>
struct KVStorage;

namespace detail {

/// A number type that stores values as given (converted to it): what `KVStorage<float>` and
/// `KVStorage<double>` share.
template <typename S>
struct StoredAsGiven {
  static constexpr int kValues = 1;  ///< values per element
  /// x converted to S.
  template <typename T>
  static void encode(const T* x, int n, S* out) {
    for (int i = 0; i < n; ++i) out[i] = static_cast<S>(x[i]);
  }
  /// The stored values.
  template <typename T>
  static void decode(const S* in, int n, T* out) {
    for (int i = 0; i < n; ++i) out[i] = static_cast<T>(in[i]);
  }
  /// -1: every value is kept (NaN as NaN, as in any float buffer).
  template <typename T>
  static int first_unrepresentable(const T*, int) {
    return -1;
  }
  /// Every value.
  static const char* limit() { return "any value"; }
  /// 0: exact (for input of type S).
  template <typename B>
  static void error_bounds(const S*, int n, B* bound) {
    std::fill(bound, bound + n, B(0));
  }
};

}  // namespace detail

/// `float`: values kept as given (a double rounded to float); nothing is refused or lost for
/// float input.
template <>
struct KVStorage<float> : detail::StoredAsGiven<float> {
  /// "fp32".
  static const char* name() { return "fp32"; }
};

/// `double`: values kept as given, for the double-precision oracle paths (not a `KVDtype`).
template <>
struct KVStorage<double> : detail::StoredAsGiven<double> {
  /// "fp64".
  static const char* name() { return "fp64"; }
};

/// fp16: each value rounded to the nearest fp16 value, ties to even (Eigen's `float_to_half_rtne`,
/// F16C's `vcvtps2ph` where available — checked bit for bit against an independent rounding in
/// the tests). 11 significant bits, largest finite 65504.
///
/// Bound: rounding to nearest moves a value in the normal range (|x̂| >= 2^-14) by at most half
/// a unit in the last place, |x − x̂| <= 2^-11 |x|, hence <= 2^-11 |x̂| / (1 − 2^-11); in the
/// subnormal range the spacing is 2^-24, so |x − x̂| <= 2^-25. `error_bounds` gives the sum of
/// both terms, valid everywhere.
template <>
struct KVStorage<Eigen::half> {
  static constexpr int kValues = 1;  ///< values per element
  /// "fp16".
  static const char* name() { return "fp16"; }
  /// Each value rounded to nearest even.
  template <typename T>
  static void encode(const T* x, int n, Eigen::half* out) {
    for (int i = 0; i < n; ++i) out[i] = Eigen::half(detail::as_float(x[i]));
  }
  /// The stored values, exactly (`detail::half_bits_to_float`, vectorised).
  template <typename T>
  static void decode(const Eigen::half* in, int n, T* out) {
    static_assert(sizeof(Eigen::half) == sizeof(std::uint16_t), "fp16: 16 bits");
    for (int i = 0; i < n; ++i) {
      std::uint16_t bits;
      std::memcpy(&bits, in + i, sizeof bits);
      out[i] = static_cast<T>(detail::half_bits_to_float(bits));
    }
  }
  /// The first value that is NaN, ±Inf, or rounds beyond 65504 (|x| >= 65520), or -1.
  template <typename T>
  static int first_unrepresentable(const T* x, int n) {
    for (int i = 0; i < n; ++i) {
      const float v = detail::as_float(x[i]);
      if (!(std::fabs(v) < 65520.f)) return i;  // also NaN
    }
    return -1;
  }
  /// What fp16 holds.
  static const char* limit() { return "a finite value with |x| < 65520 (fp16's range)"; }
  /// 2^-11 |x̂| / (1 − 2^-11) + 2^-25 per value.
  template <typename B>
  static void error_bounds(const Eigen::half* in, int n, B* bound) {
    const double u = std::ldexp(1.0, -11);
    for (int i = 0; i < n; ++i)
      bound[i] = static_cast<B>(u / (1 - u) * std::fabs(static_cast<double>(in[i])) +
                                std::ldexp(1.0, -25));
  }
};

/// bf16: each value rounded to the nearest bfloat16 value, ties to even (Eigen's
/// `float_to_bfloat16_rtne`; checked bit for bit in the tests): float's exponent range, 8
/// significant bits.
///
/// Bound, as for fp16 with 8 bits: |x − x̂| <= 2^-8 |x̂| / (1 − 2^-8) in the normal range, and
/// <= 2^-134 among float's subnormals (spacing 2^-133); `error_bounds` gives the sum.
template <>
struct KVStorage<Eigen::bfloat16> {
  static constexpr int kValues = 1;  ///< values per element
  /// "bf16".
  static const char* name() { return "bf16"; }
  /// Each value rounded to nearest even.
  template <typename T>
  static void encode(const T* x, int n, Eigen::bfloat16* out) {
    for (int i = 0; i < n; ++i) out[i] = Eigen::bfloat16(detail::as_float(x[i]));
  }
  /// The stored values, exactly (`detail::bf16_bits_to_float`, vectorised).
  template <typename T>
  static void decode(const Eigen::bfloat16* in, int n, T* out) {
    static_assert(sizeof(Eigen::bfloat16) == sizeof(std::uint16_t), "bf16: 16 bits");
    for (int i = 0; i < n; ++i) {
      std::uint16_t bits;
      std::memcpy(&bits, in + i, sizeof bits);
      out[i] = static_cast<T>(detail::bf16_bits_to_float(bits));
    }
  }
  /// The first value that is NaN, ±Inf, or rounds to ±Inf (|x| >= 2^128 − 2^119), or -1.
  template <typename T>
  static int first_unrepresentable(const T* x, int n) {
    const float edge = std::ldexp(1.f, 127) * (2.f - std::ldexp(1.f, -8));  // 2^128 − 2^119
    for (int i = 0; i < n; ++i) {
      const float v = detail::as_float(x[i]);
      if (!(std::fabs(v) < edge)) return i;
    }
    return -1;
  }
  /// What bf16 holds.
  static const char* limit() { return "a finite value with |x| < 2^128 - 2^119 (bf16's range)"; }
  /// 2^-8 |x̂| / (1 − 2^-8) + 2^-134 per value.
  template <typename B>
  static void error_bounds(const Eigen::bfloat16* in, int n, B* bound) {
    const double u = std::ldexp(1.0, -8);
    for (int i = 0; i < n; ++i)
      bound[i] = static_cast<B>(u / (1 - u) * std::fabs(static_cast<double>(in[i])) +
                                std::ldexp(1.0, -134));
  }
};

/// int8, llama.cpp's q8_0 form: per block of 32 values, the scale d = max|x| / 127 stored in
/// fp16, and q = round(x / d) in [-127, 127] (half away from zero), the value read back as d·q.
///
/// One difference from llama.cpp, for the bound: the stored scale is max|x| / 127 rounded *up*
/// to fp16 (llama.cpp rounds it to nearest) and q is computed with that stored scale (llama.cpp
/// uses the fp32 one). Then |x / d| <= 127 for every value of the block, so no value is clipped
/// and rounding to the nearest level gives
///   |x − d·q| <= d / 2   for every value, d the block's stored scale.
/// A block of zeros stores d = 0 and reads back zeros exactly; a block whose max|x| / 127 is
/// below fp16's smallest step stores d = 2^-24 and its values read back within 2^-25.
template <>
struct KVStorage<BlockQ8_0> {
  static constexpr int kValues = kQuantBlock;  ///< values per element
  /// "int8".
  static const char* name() { return "int8"; }
  /// Each block of 32 values quantized as above (`detail::quantize_block`, which the CUDA
  /// caches run too).
  template <typename T>
  static void encode(const T* x, int n, BlockQ8_0* out) {
    detail::quantize_blocks(x, n, out);
  }
  /// d·q for every value.
  template <typename T>
  static void decode(const BlockQ8_0* in, int n, T* out) {
    for (int b = 0; b < n / kValues; ++b) {
      float x[kValues];  // [32]: the block's levels
      const float d = levels(in[b], x);
      T* o = out + b * kValues;
      for (int i = 0; i < kValues; ++i) o[i] = static_cast<T>(d * x[i]);
    }
  }
  /// The block's levels q[i] as floats into `x` ([32]), and its scale d returned: value i is
  /// d · x[i] (exact in float). What the attention kernels read, one block at a time, to take
  /// the product by d out of the sum over the block (`cpu/row_runs.hpp`).
  static float levels(const BlockQ8_0& block, float* x) {
    for (int i = 0; i < kValues; ++i) x[i] = static_cast<float>(block.q[i]);
    return detail::half_value(block.d);
  }
  /// The first value that is NaN or ±Inf, or the first of a block whose scale would overflow
  /// fp16 (max|x| > 127 · 65504), or -1.
  template <typename T>
  static int first_unrepresentable(const T* x, int n) {
    return detail::first_unquantizable(x, n, kValues, 127.f * 65504.f);
  }
  /// What q8_0 holds.
  static const char* limit() { return "a finite value with |x| <= 127 * 65504 (q8_0's scale)"; }
  /// d / 2 per value, d its block's stored scale.
  template <typename B>
  static void error_bounds(const BlockQ8_0* in, int n, B* bound) {
    for (int i = 0; i < n; ++i)
      bound[i] = static_cast<B>(detail::half_value(in[i / kValues].d) / 2.f);
  }
};

/// int4, llama.cpp's q4_0 form: per block of 32 values, m is the value of largest magnitude
/// (with its sign), the scale d = m / −8 stored in fp16, and each value becomes the nibble
/// n = min(15, floor(x / d + 8.5)) in [0, 15], read back as d·(n − 8). The extreme value is
/// exactly level −8; the 16 levels run from −8·d to 7·d.
///
/// As for q8_0, kvlab rounds |d| *up* to fp16 and computes the nibbles with the stored scale,
/// so |x / d| <= 8 for every value and nothing falls below level −8. Rounding to the nearest
/// level then gives
///   |x − d·(n − 8)| <= |d| / 2   for every value with x / d <= 7.5,
/// and a value with x / d in (7.5, 8] — the far side of the block from its extreme, which the
/// asymmetric levels cannot reach — is clipped to level 7, within |d|. Read back from the
/// stored nibble alone: |d| / 2 unless n = 15, where |d|. (A symmetric rule, d = max|x| / 7,
/// would bound every value by |d| / 2 but with a d 8/7 larger and one level unused; kvlab
/// keeps llama.cpp's rule so that its figures compare with llama.cpp's.)
template <>
struct KVStorage<BlockQ4_0> {
  static constexpr int kValues = kQuantBlock;  ///< values per element
  /// "int4".
  static const char* name() { return "int4"; }
  /// Each block of 32 values quantized as above (`detail::quantize_block`, which the CUDA
  /// caches run too).
  template <typename T>
  static void encode(const T* x, int n, BlockQ4_0* out) {
    detail::quantize_blocks(x, n, out);
  }
  /// d·(n − 8) for every value.
  template <typename T>
  static void decode(const BlockQ4_0* in, int n, T* out) {
    for (int b = 0; b < n / kValues; ++b) {
      float x[kValues];  // [32]: the block's levels
      const float d = levels(in[b], x);
      T* o = out + b * kValues;
      for (int i = 0; i < kValues; ++i) o[i] = static_cast<T>(d * x[i]);
    }
  }
  /// The block's levels n_i − 8 as floats into `x` ([32]), and its scale d returned: value i is
  /// d · x[i] (exact in float). What the attention kernels read, one block at a time
  /// (`cpu/row_runs.hpp`).
  static float levels(const BlockQ4_0& block, float* x) {
    constexpr int kHalf = kValues / 2;
    // low nibbles: values [0, 16); high nibbles: values [16, 32)
    for (int j = 0; j < kHalf; ++j) x[j] = static_cast<float>((block.q[j] & 0x0F) - 8);
    for (int j = 0; j < kHalf; ++j) x[j + kHalf] = static_cast<float>((block.q[j] >> 4) - 8);
    return detail::half_value(block.d);
  }
  /// The first value that is NaN or ±Inf, or the first of a block whose scale would overflow
  /// fp16 (max|x| > 8 · 65504), or -1.
  template <typename T>
  static int first_unrepresentable(const T* x, int n) {
    return detail::first_unquantizable(x, n, kValues, 8.f * 65504.f);
  }
  /// What q4_0 holds.
  static const char* limit() { return "a finite value with |x| <= 8 * 65504 (q4_0's scale)"; }
  /// |d| / 2 per value, or |d| where the stored nibble is 15 (possibly clipped).
  template <typename B>
  static void error_bounds(const BlockQ4_0* in, int n, B* bound) {
    constexpr int kHalf = kValues / 2;
    for (int i = 0; i < n; ++i) {
      const BlockQ4_0& block = in[i / kValues];
      const int j = i % kValues;
      const int nib = j < kHalf ? block.q[j] & 0x0F : block.q[j - kHalf] >> 4;
      const float d = std::fabs(detail::half_value(block.d));
      bound[i] = static_cast<B>(nib == 15 ? d : d / 2.f);
    }
  }
};

/// A storage type as a value, for `visit_kv_dtype`.
template <typename S>
struct StorageTag {
  using type = S;  ///< the storage type
};

/// Calls `f(StorageTag<S>{})` with the storage type `S` of `dtype` — float, `Eigen::half`,
/// `Eigen::bfloat16`, `BlockQ8_0` or `BlockQ4_0` — and returns what it returns: the one place
/// where a precision chosen at run time becomes a type (every branch of `f` is compiled).
/// \throws InvalidArgument for a value outside the enumeration.
template <typename F>
decltype(auto) visit_kv_dtype(KVDtype dtype, F&& f) {
  switch (dtype) {
    case KVDtype::fp32:
      return f(StorageTag<float>{});
    case KVDtype::fp16:
      return f(StorageTag<Eigen::half>{});
    case KVDtype::bf16:
      return f(StorageTag<Eigen::bfloat16>{});
    case KVDtype::int8:
      return f(StorageTag<BlockQ8_0>{});
    case KVDtype::int4:
      return f(StorageTag<BlockQ4_0>{});
  }
  detail::fail("kvlab::visit_kv_dtype", "dtype", "fp32, fp16, bf16, int8 or int4",
               static_cast<int>(dtype));
}

namespace detail {

/// Throws InvalidArgument (naming `where`) unless `head_dim` is a multiple of the values per
/// element of storage `S` (32 for the quantized forms).
template <typename S>
void require_storage_head_dim(const char* where, int head_dim) {
  if (head_dim % KVStorage<S>::kValues != 0) {
    fail(where, "head_dim",
         std::string("a multiple of ") + std::to_string(KVStorage<S>::kValues) +
             " (the values of one " + KVStorage<S>::name() + " block)",
         head_dim);
  }
}

/// Throws InvalidArgument (naming `where` and `name`, with the row and column) if a value of the
/// `[rows, width]` rows `x` cannot be stored as `S`: nothing has been written when it throws.
template <typename S, typename Matrix>
void require_storable(const char* where, const char* name, const Matrix& x) {
  if constexpr (std::is_same<S, float>::value || std::is_same<S, double>::value) {
    (void)where, (void)name, (void)x;  // fp32 / fp64 storage: everything is kept
  } else {
    for (Eigen::Index r = 0; r < x.rows(); ++r) {
      const int bad =
          KVStorage<S>::first_unrepresentable(x.row(r).data(), static_cast<int>(x.cols()));
      if (bad >= 0) {
        fail(where, std::string(name) + "(" + std::to_string(r) + ", " + std::to_string(bad) + ")",
             std::string(KVStorage<S>::limit()) + " to store as " + KVStorage<S>::name(),
             static_cast<double>(x(r, bad)));
      }
    }
  }
}

}  // namespace detail
}  // namespace kvlab
