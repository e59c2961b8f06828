/// \file
/// \brief How the CPU attention kernels read K/V rows stored in quantized blocks (`BlockQ8_0`,
/// `BlockQ4_0`) without decoding them: `score_quantized_row` (a key row against several queries)
/// and `add_quantized_row` (a value row into several queries' sums). Block b of a row holds the
/// values d_b · x_b[i] (`KVStorage<S>::levels`), so
///   q · k = Σ_b d_b · (Σ_i q[32 b + i] · x_b[i]),
/// and the block's scale multiplies the block's sum, not each value. Both compute what the
/// decoded row (`KVStorage<S>::decode`) would give, summed in another order: equal to rounding.
///
/// Two forms of the same arithmetic, chosen when the header is compiled:
///  - portable: plain loops, one query at a time (the form to read);
///  - AVX2 with FMA (compiled with `-mavx2 -mfma`, or `-march=native` on a CPU that has them,
///    and not by nvcc): a block's levels are made floats once in four vector registers and
///    used for up to four queries, whose partial sums stay in registers; the reason int8 and int4
///    rows are read faster than fp32 rows (`bench/bench_kv_dtype.cpp`).
/// `kQuantizedRowsAvx2` says which form a build has. Internal (`cpu::detail`), used by
/// `attention_tile.hpp`; tested against the decoded rows in `tests/test_quantized_rows.cpp`,
/// built both ways.
#pragma once

#include <cstddef>
#include <type_traits>

#include "kvlab/core/quant_blocks.hpp"
#include "kvlab/kv_storage.hpp"

#if defined(__AVX2__) && defined(__FMA__) && !defined(__CUDACC__)
#include <immintrin.h>
/// 1: this build reads quantized rows with AVX2 and FMA (the compiler targets both; not nvcc).
#define KVLAB_QUANTIZED_ROWS_AVX2 1
#else
/// 0: this build reads quantized rows with plain loops (no AVX2 with FMA targeted, or nvcc).
#define KVLAB_QUANTIZED_ROWS_AVX2 0
#endif

namespace kvlab::cpu::detail {

/// Whether `S` is a quantized block (`BlockQ8_0`, `BlockQ4_0`): its rows are read block by
/// block with the scale taken out of each block's sum instead of being decoded.
template <typename S>
constexpr bool kQuantizedStorage = StorageUnit<S>::kValues == kQuantBlock;

/// Whether this build reads quantized rows with AVX2 and FMA (true) or with plain loops (false).
constexpr bool kQuantizedRowsAvx2 = KVLAB_QUANTIZED_ROWS_AVX2 != 0;

/// Portable form of `score_quantized_row`: for each query, for each block, the sum of the
/// query's 32 values times the block's levels, times the block's scale.
template <typename T, typename S>
void score_quantized_row_portable(const S* row, int head_dim, const T* queries, int count, T scale,
                                  T* out, std::ptrdiff_t out_stride) {
  for (int c = 0; c < count; ++c) {
    const T* query = queries + static_cast<std::ptrdiff_t>(c) * head_dim;  // [head_dim]
    T dot = 0;
    for (int b = 0; b < head_dim / kQuantBlock; ++b) {
      float x[kQuantBlock];  // [32]: block b's levels
      const T d = KVStorage<S>::levels(row[b], x);
      T part = 0;  // Σ_i q[32 b + i] · x_b[i]
      for (int i = 0; i < kQuantBlock; ++i) part += query[b * kQuantBlock + i] * x[i];
      dot += d * part;
    }
    out[c * out_stride] = scale * dot;
  }
}

/// Portable form of `add_quantized_row`: for each block, each query's weight times the block's
/// scale, times the block's levels, added to the query's sum.
template <typename T, typename S>
void add_quantized_row_portable(const S* row, int head_dim, const T* weights,
                                std::ptrdiff_t weight_stride, int count, T* acc) {
  for (int b = 0; b < head_dim / kQuantBlock; ++b) {
    float x[kQuantBlock];  // [32]: block b's levels
    const T d = KVStorage<S>::levels(row[b], x);
    for (int c = 0; c < count; ++c) {
      const T w = weights[c * weight_stride] * d;  // the query's weight, times the block's scale
      T* a = acc + static_cast<std::ptrdiff_t>(c) * head_dim + b * kQuantBlock;  // [32]
      for (int i = 0; i < kQuantBlock; ++i) a[i] += w * x[i];
    }
  }
}

#if KVLAB_QUANTIZED_ROWS_AVX2
namespace avx2 {

/// The scale of a block, broadcast to 8 lanes (F16C's conversion where the build has it, exact
/// like `half_value`).
inline __m256 scale_of(std::uint16_t bits) {
#if defined(__F16C__)
  return _mm256_set1_ps(_cvtsh_ss(bits));
#else
  return _mm256_set1_ps(half_value(bits));
#endif
}

/// A q8_0 block's levels q[i] as floats: x[k] holds levels [8k, 8k + 8); its scale returned.
inline __m256 levels(const BlockQ8_0& block, __m256 (&x)[4]) {
  for (int k = 0; k < 4; ++k) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block.q + 8 * k));
    x[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
  }
  return scale_of(block.d);
}

/// A q4_0 block's levels n_i − 8 as floats: x[0], x[1] the low nibbles of bytes [0, 8) and
/// [8, 16) (values 0 … 15), x[2], x[3] their high nibbles (values 16 … 31); its scale returned.
inline __m256 levels(const BlockQ4_0& block, __m256 (&x)[4]) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block.q));  // 16 bytes
  const __m128i mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  const __m128i low = _mm_sub_epi8(_mm_and_si128(raw, mask), eight);                      // n − 8
  const __m128i high = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), eight);  // n − 8
  x[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(low));
  x[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(low, 8)));
  x[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(high));
  x[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(high, 8)));
  return scale_of(block.d);
}

/// The sum of the 8 lanes of `v`.
inline float sum_lanes(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/// `score_quantized_row` for `Q` queries (1 to 4): each block's levels are made floats once, and
/// each query's sum over the block (two chains of two products) is added, times the block's scale,
/// to its 8 partial sums, which stay in a register.
template <int Q, typename S>
void score_queries(const S* row, int head_dim, const float* queries, float scale, float* out,
                   std::ptrdiff_t out_stride) {
  __m256 sum[Q];  // [Q]: 8 partial sums per query
  for (int c = 0; c < Q; ++c) sum[c] = _mm256_setzero_ps();
  for (int b = 0; b < head_dim / kQuantBlock; ++b) {
    __m256 x[4];  // block b's 32 levels
    const __m256 d = levels(row[b], x);
    for (int c = 0; c < Q; ++c) {
      const float* qb = queries + static_cast<std::ptrdiff_t>(c) * head_dim + b * kQuantBlock;
      const __m256 p0 =
          _mm256_fmadd_ps(_mm256_loadu_ps(qb + 8), x[1], _mm256_mul_ps(_mm256_loadu_ps(qb), x[0]));
      const __m256 p1 = _mm256_fmadd_ps(_mm256_loadu_ps(qb + 24), x[3],
                                        _mm256_mul_ps(_mm256_loadu_ps(qb + 16), x[2]));
      sum[c] = _mm256_fmadd_ps(d, _mm256_add_ps(p0, p1), sum[c]);
    }
  }
  for (int c = 0; c < Q; ++c) out[c * out_stride] = scale * sum_lanes(sum[c]);
}

/// `add_quantized_row` with vectors: each block's levels made floats once for all the queries.
template <typename S>
void add_row(const S* row, int head_dim, const float* weights, std::ptrdiff_t weight_stride,
             int count, float* acc) {
  for (int b = 0; b < head_dim / kQuantBlock; ++b) {
    __m256 x[4];  // block b's 32 levels
    const __m256 d = levels(row[b], x);
    for (int c = 0; c < count; ++c) {
      const __m256 w = _mm256_mul_ps(_mm256_set1_ps(weights[c * weight_stride]), d);
      float* a = acc + static_cast<std::ptrdiff_t>(c) * head_dim + b * kQuantBlock;  // [32]
      for (int k = 0; k < 4; ++k)
        _mm256_storeu_ps(a + 8 * k, _mm256_fmadd_ps(w, x[k], _mm256_loadu_ps(a + 8 * k)));
    }
  }
}

}  // namespace avx2
#endif

/// The scores of one key row stored in quantized blocks `S` (`head_dim` / 32 blocks) against
/// `count` queries (`queries`: [count, head_dim], row-major): out[c · out_stride] = scale ·
/// (query c) · (the row's values), with the block's scale taken out of each block's sum.
template <typename T, typename S>
void score_quantized_row(const S* row, int head_dim, const T* queries, int count, T scale, T* out,
                         std::ptrdiff_t out_stride) {
#if KVLAB_QUANTIZED_ROWS_AVX2
  if constexpr (std::is_same<T, float>::value) {
    const std::ptrdiff_t step = head_dim;  // one query row
    int c = 0;
    for (; c + 4 <= count; c += 4)
      avx2::score_queries<4>(row, head_dim, queries + c * step, scale, out + c * out_stride,
                             out_stride);
    for (; c < count; ++c)
      avx2::score_queries<1>(row, head_dim, queries + c * step, scale, out + c * out_stride,
                             out_stride);
    return;
  }
#endif
  score_quantized_row_portable(row, head_dim, queries, count, scale, out, out_stride);
}

/// Adds one value row stored in quantized blocks `S` to `count` queries' sums: acc row c
/// ([count, head_dim], row-major) += weights[c · weight_stride] · (the row's values), each
/// query's weight multiplied by the block's scale once per block.
template <typename T, typename S>
void add_quantized_row(const S* row, int head_dim, const T* weights, std::ptrdiff_t weight_stride,
                       int count, T* acc) {
#if KVLAB_QUANTIZED_ROWS_AVX2
  if constexpr (std::is_same<T, float>::value) {
    avx2::add_row(row, head_dim, weights, weight_stride, count, acc);
    return;
  }
#endif
  add_quantized_row_portable(row, head_dim, weights, weight_stride, count, acc);
}

}  // namespace kvlab::cpu::detail
