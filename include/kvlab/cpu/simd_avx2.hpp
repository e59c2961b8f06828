/// \file
/// \brief AVX2 building blocks of the CPU attention kernels: one 32-value block of a K/V row as
/// vectors, and the dot products and sums over them.
///
/// A K/V row is read in blocks of 32 values (`kQuantBlock`). A block stored as q8_0 or q4_0 becomes
/// its levels as floats (`half_levels`), its fp16 scale kept apart (`scale_of`, `block_scales`):
/// the scale multiplies a block's sum, not each value. A block of fp32, fp16 or bf16 values
/// becomes its values (`eight_values`). `part_values` gives a whole block or a half,
/// `block_dot` and `add_block` score it against a query. `dot` and `add_scaled` are the fp32
/// row-by-row forms (one key scored, one value row added; and one row of `cpu::linear`).
///
/// Compiled only where the compiler targets AVX2 and FMA (`-mavx2 -mfma`, or `-march=native` on
/// a CPU that has them) and not under nvcc: `KVLAB_ROW_RUNS_AVX2` / `kRowRunsAvx2` say whether this
/// build has them, `kRowRunsF16c` whether fp16 is converted by F16C. The plain loops that compute
/// the same are `row_runs.hpp`'s portable forms. Internal (`cpu::detail::avx2`); tested through
/// `row_runs.hpp` and `cpu::linear` in `tests/cpu/test_row_runs.cpp` and
/// `tests/cpu/test_layer_ops.cpp`, built both ways.
///
/// \par Measured
/// `bench/results/README.md`, "K/V rows read in runs" and "after the row-by-row loop left Eigen's
/// dot" (bench_kv_dtype, bench_decode_bandwidth, bench_paged_decode).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvlab/core/quant_blocks.hpp"
#include "kvlab/kv_storage.hpp"

#if defined(__AVX2__) && defined(__FMA__) && !defined(__CUDACC__)
#include <immintrin.h>
/// 1: this build reads K/V rows with AVX2 and FMA (the compiler targets both; not nvcc).
#define KVLAB_ROW_RUNS_AVX2 1
#else
/// 0: this build reads K/V rows with plain loops (no AVX2 with FMA targeted, or nvcc).
#define KVLAB_ROW_RUNS_AVX2 0
#endif

namespace kvlab::cpu::detail {

/// Whether `S` is a quantized block (`BlockQ8_0`, `BlockQ4_0`): its rows are read block by
/// block with the scale taken out of each block's sum instead of being decoded.
template <typename S>
constexpr bool kQuantizedStorage = StorageUnit<S>::kValues == kQuantBlock;

/// Whether this build reads K/V rows with AVX2 and FMA (true) or with plain loops (false).
constexpr bool kRowRunsAvx2 = KVLAB_ROW_RUNS_AVX2 != 0;

/// Whether this build converts fp16 with F16C (the compiler targets it).
#if defined(__F16C__)
constexpr bool kRowRunsF16c = true;
#else
constexpr bool kRowRunsF16c = false;
#endif

#if KVLAB_ROW_RUNS_AVX2
namespace avx2 {

/// The scale of a block as a float (F16C's conversion where the build has it, exact like
/// `half_value`).
inline float scale_of(std::uint16_t bits) {
#if defined(__F16C__)
  return _cvtsh_ss(bits);
#else
  return half_value(bits);
#endif
}

/// The scales of block `b` of rows [0, run) (run <= `kRowRun`) as floats: d[r] for row r. With
/// F16C, eight rows' scales are gathered in a register and converted at once (written one by one
/// to memory and read back as a vector, they would stall the read until the writes land).
template <typename S>
void block_scales(const S* const* rows, int run, int b, float* d) {
  int r = 0;
#if defined(__F16C__)
  for (; r + 8 <= run; r += 8) {
    __m128i bits = _mm_cvtsi32_si128(rows[r][b].d);  // [8] fp16 bits
    bits = _mm_insert_epi16(bits, rows[r + 1][b].d, 1);
    bits = _mm_insert_epi16(bits, rows[r + 2][b].d, 2);
    bits = _mm_insert_epi16(bits, rows[r + 3][b].d, 3);
    bits = _mm_insert_epi16(bits, rows[r + 4][b].d, 4);
    bits = _mm_insert_epi16(bits, rows[r + 5][b].d, 5);
    bits = _mm_insert_epi16(bits, rows[r + 6][b].d, 6);
    bits = _mm_insert_epi16(bits, rows[r + 7][b].d, 7);
    _mm256_storeu_ps(d + r, _mm256_cvtph_ps(bits));
  }
#endif
  for (; r < run; ++r) d[r] = scale_of(rows[r][b].d);
}

/// Levels [16 h, 16 h + 16) of a q8_0 block (h = 0 or 1) as floats: x[k] holds levels
/// [16 h + 8 k, 16 h + 8 k + 8).
inline void half_levels(const BlockQ8_0& block, int h, __m256 (&x)[2]) {
  for (int k = 0; k < 2; ++k) {
    const __m128i bytes =
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block.q + 16 * h + 8 * k));
    x[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
  }
}

/// Levels [16 h, 16 h + 16) of a q4_0 block (h = 0: the low nibbles of its 16 bytes, h = 1: the
/// high nibbles) as floats n − 8: x[k] holds levels [16 h + 8 k, 16 h + 8 k + 8).
inline void half_levels(const BlockQ4_0& block, int h, __m256 (&x)[2]) {
  const __m256i eight = _mm256_set1_epi32(8);
  for (int k = 0; k < 2; ++k) {
    // bytes [8 k, 8 k + 8), one per 32-bit lane
    const __m256i bytes =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(block.q + 8 * k)));
    const __m256i n =
        h == 0 ? _mm256_and_si256(bytes, _mm256_set1_epi32(0x0F)) : _mm256_srli_epi32(bytes, 4);
    x[k] = _mm256_cvtepi32_ps(_mm256_sub_epi32(n, eight));
  }
}

#if defined(__F16C__)
/// Eight fp16 values from `at` as floats (F16C).
inline __m256 eight_values(const Eigen::half* at) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
}
#endif

/// Eight fp32 values from `at`.
inline __m256 eight_values(const float* at) { return _mm256_loadu_ps(at); }

/// Eight bf16 values from `at` as floats: each one's 16 bits become the high half of a float.
inline __m256 eight_values(const Eigen::bfloat16* at) {
  const __m256i bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(bits, 16));
}

/// Part h of block b of a row stored as `S`, as floats, before the block's scale: the block cut
/// into P parts of 32 / P values (P = 1 or 2), x[k] holding its values [32 / P · h + 8 k, + 8).
template <int P, typename S>
inline void part_values(const S* row, int b, int h, __m256 (&x)[4 / P]) {
  static_assert(P == 1 || P == 2, "a block is read whole or in halves");
  if constexpr (kQuantizedStorage<S>) {
    if constexpr (P == 1) {
      __m256 low[2], high[2];  // levels [0, 16), [16, 32)
      half_levels(row[b], 0, low);
      half_levels(row[b], 1, high);
      x[0] = low[0];
      x[1] = low[1];
      x[2] = high[0];
      x[3] = high[1];
    } else {
      half_levels(row[b], h, x);
    }
  } else {
    const S* at = row + b * kQuantBlock + h * (kQuantBlock / P);  // the part's first value
    for (int k = 0; k < 4 / P; ++k) x[k] = eight_values(at + 8 * k);
  }
}

/// The sum of the 8 lanes of `v`.
inline float sum_lanes(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/// a · b over `n` floats, read in order: blocks of 32 on four independent chains of
/// multiply-adds, then blocks of 8, then the last n % 8 one by one. One row of `cpu::linear`
/// (`detail::linear_one_row`) and one key of `attend_partial`'s row-by-row loop.
inline float dot(const float* a, const float* b, std::ptrdiff_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  std::ptrdiff_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8)
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float sum = sum_lanes(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < n; ++i) sum += a[i] * b[i];  // the last n % 8 values
  return sum;
}

/// acc += weight · row over `n` floats: one value row added to one query's sum.
inline void add_scaled(float weight, const float* row, std::ptrdiff_t n, float* acc) {
  const __m256 w = _mm256_set1_ps(weight);
  std::ptrdiff_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(acc + i,
                     _mm256_fmadd_ps(w, _mm256_loadu_ps(row + i), _mm256_loadu_ps(acc + i)));
  for (; i < n; ++i) acc[i] += weight * row[i];  // the last n % 8 values
}

/// The sums of the lanes of four vectors: lane i of the result is the sum of the 8 lanes of v[i].
inline __m128 sum_lanes4(const __m256 (&v)[4]) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/// q · (the block's values) for a block's 32 query values `qb`: two chains of two products.
inline __m256 block_dot(const float* qb, const __m256 (&x)[4]) {
  const __m256 p0 =
      _mm256_fmadd_ps(_mm256_loadu_ps(qb + 8), x[1], _mm256_mul_ps(_mm256_loadu_ps(qb), x[0]));
  const __m256 p1 = _mm256_fmadd_ps(_mm256_loadu_ps(qb + 24), x[3],
                                    _mm256_mul_ps(_mm256_loadu_ps(qb + 16), x[2]));
  return _mm256_add_ps(p0, p1);
}

/// `sum` plus block b's `dot` (`block_dot`) of a row, times the block's scale where it has one.
template <typename S>
inline __m256 add_block(const S* row, int b, __m256 dot, __m256 sum) {
  if constexpr (kQuantizedStorage<S>) {
    return _mm256_fmadd_ps(_mm256_set1_ps(scale_of(row[b].d)), dot, sum);
  } else {
    return _mm256_add_ps(dot, sum);
  }
}

}  // namespace avx2
#endif

}  // namespace kvlab::cpu::detail
