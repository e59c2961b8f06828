/// \file
/// \brief How the CPU attention kernels read K/V rows stored in quantized blocks (`BlockQ8_0`,
/// `BlockQ4_0`) without decoding them: `score_quantized_rows` (a run of key rows against several
/// queries) and `add_quantized_rows` (a run of value rows into several queries' sums). Block b of a
/// row holds the values d_b · x_b[i] (`KVStorage<S>::levels`), so
///   q · k = Σ_b d_b · (Σ_i q[32 b + i] · x_b[i]),
/// and the block's scale multiplies the block's sum, not each value. Both compute what the
/// decoded rows (`KVStorage<S>::decode`) would give, summed in another order: equal to rounding.
///
/// Two forms of the same arithmetic, chosen when the header is compiled:
///  - portable: plain loops, one row and one query at a time (the form to read);
///  - AVX2 with FMA (compiled with `-mavx2 -mfma`, or `-march=native` on a CPU that has them,
///    and not by nvcc): a block's levels are made floats once in vector registers and used for
///    up to four queries; the scores of four rows are computed side by side, and the value rows of
///    a run are added block by block into sums that stay in registers for the whole run; the
///    reason int8 and int4 rows are read faster than fp32 rows (`bench/bench_kv_dtype.cpp`).
/// `kQuantizedRowsAvx2` says which form a build has. Internal (`cpu::detail`), used by
/// `attention_tile.hpp`; tested against the decoded rows in `tests/test_quantized_rows.cpp`,
/// built both ways.
#pragma once

#include <cstddef>
#include <cstdint>
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

/// Rows that the attention kernels hand to `score_quantized_rows` and `add_quantized_rows` at
/// once (consecutive keys met by the same queries); the functions accept runs of any length.
constexpr int kQuantizedRowRun = 16;

/// Portable form of `score_quantized_rows`: for each row, for each query, for each block, the sum
/// of the query's 32 values times the block's levels, times the block's scale.
template <typename T, typename S>
void score_quantized_rows_portable(const S* const* rows, int run, int head_dim, const T* queries,
                                   int count, T scale, T* out, std::ptrdiff_t out_stride) {
  for (int r = 0; r < run; ++r)
    for (int c = 0; c < count; ++c) {
      const T* query = queries + static_cast<std::ptrdiff_t>(c) * head_dim;  // [head_dim]
      T dot = 0;
      for (int b = 0; b < head_dim / kQuantBlock; ++b) {
        float x[kQuantBlock];  // [32]: block b's levels
        const T d = KVStorage<S>::levels(rows[r][b], x);
        T part = 0;  // Σ_i q[32 b + i] · x_b[i]
        for (int i = 0; i < kQuantBlock; ++i) part += query[b * kQuantBlock + i] * x[i];
        dot += d * part;
      }
      out[c * out_stride + r] = scale * dot;
    }
}

/// Portable form of `add_quantized_rows`: for each row, for each block, each query's weight times
/// the block's scale, times the block's levels, added to the query's sum.
template <typename T, typename S>
void add_quantized_rows_portable(const S* const* rows, int run, int head_dim, const T* weights,
                                 std::ptrdiff_t weight_stride, int count, T* acc) {
  for (int r = 0; r < run; ++r)
    for (int b = 0; b < head_dim / kQuantBlock; ++b) {
      float x[kQuantBlock];  // [32]: block b's levels
      const T d = KVStorage<S>::levels(rows[r][b], x);
      for (int c = 0; c < count; ++c) {
        const T w = weights[c * weight_stride + r] * d;  // the row's weight times the block's scale
        T* a = acc + static_cast<std::ptrdiff_t>(c) * head_dim + b * kQuantBlock;  // [32]
        for (int i = 0; i < kQuantBlock; ++i) a[i] += w * x[i];
      }
    }
}

#if KVLAB_QUANTIZED_ROWS_AVX2
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

/// The scales of block `b` of rows [0, run) (run <= `kQuantizedRowRun`) as floats: d[r] for row
/// r. With F16C, eight rows' scales are gathered in a register and converted at once (written
/// one by one to memory and read back as a vector, they would stall the read until the writes
/// land).
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

/// A block's 32 levels as floats: x[k] holds levels [8 k, 8 k + 8).
template <typename S>
inline void levels(const S& block, __m256 (&x)[4]) {
  __m256 low[2], high[2];  // levels [0, 16), [16, 32)
  half_levels(block, 0, low);
  half_levels(block, 1, high);
  x[0] = low[0];
  x[1] = low[1];
  x[2] = high[0];
  x[3] = high[1];
}

/// The sum of the 8 lanes of `v`.
inline float sum_lanes(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/// The sums of the lanes of four vectors: lane i of the result is the sum of the 8 lanes of v[i].
inline __m128 sum_lanes4(const __m256 (&v)[4]) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/// q · (the block's levels) for a block's 32 query values `qb`: two chains of two products.
inline __m256 block_dot(const float* qb, const __m256 (&x)[4]) {
  const __m256 p0 =
      _mm256_fmadd_ps(_mm256_loadu_ps(qb + 8), x[1], _mm256_mul_ps(_mm256_loadu_ps(qb), x[0]));
  const __m256 p1 = _mm256_fmadd_ps(_mm256_loadu_ps(qb + 24), x[3],
                                    _mm256_mul_ps(_mm256_loadu_ps(qb + 16), x[2]));
  return _mm256_add_ps(p0, p1);
}

/// The scores of rows [0, run) against one query (out[r]): four rows side by side (four
/// independent chains), then the rows left over one at a time.
template <typename S>
void score_rows_one_query(const S* const* rows, int run, int head_dim, const float* query,
                          float scale, float* out) {
  int r0 = 0;
  for (; r0 + 4 <= run; r0 += 4) {
    __m256 sum[4];  // [4 rows]: 8 partial sums each
    for (int r = 0; r < 4; ++r) sum[r] = _mm256_setzero_ps();
    for (int b = 0; b < head_dim / kQuantBlock; ++b)
      for (int r = 0; r < 4; ++r) {
        const S& block = rows[r0 + r][b];
        __m256 x[4];  // row r0 + r's block b, 32 levels
        levels(block, x);
        const __m256 d = _mm256_set1_ps(scale_of(block.d));
        sum[r] = _mm256_fmadd_ps(d, block_dot(query + b * kQuantBlock, x), sum[r]);
      }
    _mm_storeu_ps(out + r0, _mm_mul_ps(sum_lanes4(sum), _mm_set1_ps(scale)));
  }
  for (; r0 < run; ++r0) {
    __m256 sum = _mm256_setzero_ps();  // 8 partial sums
    for (int b = 0; b < head_dim / kQuantBlock; ++b) {
      __m256 x[4];  // block b's 32 levels
      levels(rows[r0][b], x);
      sum = _mm256_fmadd_ps(_mm256_set1_ps(scale_of(rows[r0][b].d)),
                            block_dot(query + b * kQuantBlock, x), sum);
    }
    out[r0] = scale * sum_lanes(sum);
  }
}

/// The scores of rows [0, run) against four queries (out[c · out_stride + r]), row by row: each
/// block's levels made floats once for all four queries.
template <typename S>
void score_rows_four_queries(const S* const* rows, int run, int head_dim, const float* queries,
                             float scale, float* out, std::ptrdiff_t out_stride) {
  for (int r = 0; r < run; ++r) {
    __m256 sum[4];  // [4 queries]: 8 partial sums each
    for (int c = 0; c < 4; ++c) sum[c] = _mm256_setzero_ps();
    for (int b = 0; b < head_dim / kQuantBlock; ++b) {
      __m256 x[4];  // block b's 32 levels
      levels(rows[r][b], x);
      const __m256 d = _mm256_set1_ps(scale_of(rows[r][b].d));
      for (int c = 0; c < 4; ++c)
        sum[c] = _mm256_fmadd_ps(
            d, block_dot(queries + static_cast<std::ptrdiff_t>(c) * head_dim + b * kQuantBlock, x),
            sum[c]);
    }
    alignas(16) float s[4];  // the four queries' scores
    _mm_store_ps(s, _mm_mul_ps(sum_lanes4(sum), _mm_set1_ps(scale)));
    for (int c = 0; c < 4; ++c) out[c * out_stride + r] = s[c];
  }
}

/// `score_quantized_rows` with vectors: groups of four queries row by row; a query left over, four
/// rows at a time.
template <typename S>
void score_rows(const S* const* rows, int run, int head_dim, const float* queries, int count,
                float scale, float* out, std::ptrdiff_t out_stride) {
  int c = 0;
  for (; c + 4 <= count; c += 4)
    score_rows_four_queries(rows, run, head_dim,
                            queries + static_cast<std::ptrdiff_t>(c) * head_dim, scale,
                            out + c * out_stride, out_stride);
  for (; c < count; ++c)
    score_rows_one_query(rows, run, head_dim, queries + static_cast<std::ptrdiff_t>(c) * head_dim,
                         scale, out + c * out_stride);
}

/// Adds up to `kQuantizedRowRun` value rows to `Q` queries' sums (Q ≤ 4), a block part at a time:
/// part h of a block is its levels [32 / P · h, 32 / P · (h + 1)); the queries' sums over that part
/// (Q · 4 / P vectors, at most 8) stay in registers while every row of the run is added to them.
template <int Q, int P, typename S>
void add_rows_to(const S* const* rows, int run, int head_dim, const float* weights,
                 std::ptrdiff_t weight_stride, float* acc) {
  constexpr int V = 4 / P;  // vectors per part
  static_assert(Q * V <= 8, "the sums of a part must fit in 8 registers");
  for (int b = 0; b < head_dim / kQuantBlock; ++b) {
    float d[kQuantizedRowRun];  // [run]: block b's scale in each row
    block_scales(rows, run, b, d);
    float w[Q][kQuantizedRowRun];  // [Q, run]: row r's weight for query c, times block b's scale
    for (int c = 0; c < Q; ++c)
      for (int r = 0; r < run; ++r) w[c][r] = weights[c * weight_stride + r] * d[r];
    for (int h = 0; h < P; ++h) {
      const std::ptrdiff_t at = b * kQuantBlock + h * (kQuantBlock / P);  // part's first value
      __m256 sum[Q][V];  // [Q, V]: the queries' sums over the part
      for (int c = 0; c < Q; ++c)
        for (int k = 0; k < V; ++k)
          sum[c][k] = _mm256_loadu_ps(acc + c * static_cast<std::ptrdiff_t>(head_dim) + at + 8 * k);
      for (int r = 0; r < run; ++r) {
        __m256 x[V];  // row r's part h of block b
        if constexpr (P == 1) {
          levels(rows[r][b], x);
        } else {
          half_levels(rows[r][b], h, x);
        }
        for (int c = 0; c < Q; ++c) {
          const __m256 wc = _mm256_broadcast_ss(&w[c][r]);
          for (int k = 0; k < V; ++k) sum[c][k] = _mm256_fmadd_ps(wc, x[k], sum[c][k]);
        }
      }
      for (int c = 0; c < Q; ++c)
        for (int k = 0; k < V; ++k)
          _mm256_storeu_ps(acc + c * static_cast<std::ptrdiff_t>(head_dim) + at + 8 * k, sum[c][k]);
    }
  }
}

/// `add_quantized_rows` with vectors: runs of up to `kQuantizedRowRun` rows, groups of up to four
/// queries (one or two queries take whole blocks at a time, three or four half blocks).
template <typename S>
void add_rows(const S* const* rows, int run, int head_dim, const float* weights,
              std::ptrdiff_t weight_stride, int count, float* acc) {
  for (int r = 0; r < run; r += kQuantizedRowRun) {
    const int n = run - r < kQuantizedRowRun ? run - r : kQuantizedRowRun;
    for (int c = 0; c < count;) {
      const float* w = weights + c * weight_stride + r;
      float* a = acc + static_cast<std::ptrdiff_t>(c) * head_dim;
      switch (count - c) {
        case 1:
          add_rows_to<1, 1>(rows + r, n, head_dim, w, weight_stride, a);
          c += 1;
          break;
        case 2:
          add_rows_to<2, 1>(rows + r, n, head_dim, w, weight_stride, a);
          c += 2;
          break;
        case 3:
          add_rows_to<3, 2>(rows + r, n, head_dim, w, weight_stride, a);
          c += 3;
          break;
        default:
          add_rows_to<4, 2>(rows + r, n, head_dim, w, weight_stride, a);
          c += 4;
          break;
      }
    }
  }
}

}  // namespace avx2
#endif

/// The scores of a run of `run` key rows stored in quantized blocks `S` (`rows[r]`: `head_dim` / 32
/// blocks) against `count` queries (`queries`: [count, head_dim], row-major):
/// out[c · out_stride + r] = scale · (query c) · (row r's values), with the block's scale taken
/// out of each block's sum.
template <typename T, typename S>
void score_quantized_rows(const S* const* rows, int run, int head_dim, const T* queries, int count,
                          T scale, T* out, std::ptrdiff_t out_stride) {
#if KVLAB_QUANTIZED_ROWS_AVX2
  if constexpr (std::is_same<T, float>::value) {
    avx2::score_rows(rows, run, head_dim, queries, count, scale, out, out_stride);
    return;
  }
#endif
  score_quantized_rows_portable(rows, run, head_dim, queries, count, scale, out, out_stride);
}

/// Adds a run of `run` value rows stored in quantized blocks `S` (`rows[r]`) to `count` queries'
/// sums: acc row c ([count, head_dim], row-major) += Σ_r weights[c · weight_stride + r] · (row r's
/// values), the rows added in order, each weight multiplied by the block's scale once per block.
template <typename T, typename S>
void add_quantized_rows(const S* const* rows, int run, int head_dim, const T* weights,
                        std::ptrdiff_t weight_stride, int count, T* acc) {
#if KVLAB_QUANTIZED_ROWS_AVX2
  if constexpr (std::is_same<T, float>::value) {
    avx2::add_rows(rows, run, head_dim, weights, weight_stride, count, acc);
    return;
  }
#endif
  add_quantized_rows_portable(rows, run, head_dim, weights, weight_stride, count, acc);
}

}  // namespace kvlab::cpu::detail
