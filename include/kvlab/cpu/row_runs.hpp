/// \file
/// \brief Runs of consecutive K/V rows read against several queries at once: `score_row_run`
/// and `add_row_run`.
///
/// A run of key rows is scored against several queries (`score_row_run`), a run of value rows
/// added into several queries' sums (`add_row_run`). A row is read in blocks of 32 values
/// (`kQuantBlock`):
///  - rows stored in quantized blocks (`BlockQ8_0`, `BlockQ4_0`) are never decoded. Block b of a
///    row holds the values d_b · x_b[i] (`KVStorage<S>::levels`), so
///      q · k = Σ_b d_b · (Σ_i q[32 b + i] · x_b[i]),
///    and the block's scale multiplies the block's sum, not each value;
///  - rows of fp32, fp16 or bf16 values have no scale: a block is its 32 values (fp16 and bf16
///    made floats as they are loaded).
/// Both compute what the decoded rows (`KVStorage<S>::decode`) would give, summed in another
/// order: equal to rounding.
///
/// Two forms of the same arithmetic, chosen when the header is compiled:
///  - portable: plain loops, one row and one query at a time (the form to read);
///  - AVX2 with FMA (`simd_avx2.hpp`; fp16 rows also need F16C): a block's values are made
///    floats once in vector registers and used for up to four queries; the scores of several rows
///    are computed side by side, and the value rows of a run are added block by block into sums
///    that stay in registers for the whole run. Each row is loaded once for all the queries of its
///    GQA group, several rows are in flight, and no query's sum goes through memory between rows.
/// `kVectorRows<T, S>` says whether the AVX2 form applies to queries of type T and rows stored as
/// S. Internal (`cpu::detail`), used by `attention_tile.hpp`; tested against the decoded rows in
/// `tests/cpu/test_row_runs.cpp`, built both ways.
///
/// \par Measured
/// `bench/results/README.md`, "K/V rows read in runs" (bench_kv_dtype: int8, int4, fp16 and bf16
/// steps against fp32; the run lengths of `run_rows`) and "the value rows asked for before they
/// are read" (bench_decode_bandwidth: `prefetch_rows`); the GQA key pass two rows at a time
/// (`score_row_pairs_four_queries`) in `bench/results/cpu-prefetch-ahead.txt`, section 8.
#pragma once

#include <cstddef>
#include <type_traits>

#include "kvlab/core/quant_blocks.hpp"
#include "kvlab/cpu/prefetch.hpp"
#include "kvlab/cpu/simd_avx2.hpp"
#include "kvlab/kv_storage.hpp"

namespace kvlab::cpu::detail {

/// Whether this build has the AVX2 form for float queries over rows stored as `S`: int8, int4,
/// fp32, bf16, and fp16 where the compiler also targets F16C (its conversion instruction).
template <typename T, typename S>
constexpr bool kVectorRows = (kRowRunsAvx2 && std::is_same<T, float>::value) &&
                             (kQuantizedStorage<S> || std::is_same<S, float>::value ||
                              std::is_same<S, Eigen::bfloat16>::value ||
                              (kRowRunsF16c && std::is_same<S, Eigen::half>::value));

/// The most rows that the attention kernels hand to `score_row_run` and `add_row_run` at once
/// (consecutive keys met by the same queries); the functions accept runs of any length.
constexpr int kRowRun = 16;

/// Rows per run for rows stored as `S`: `kRowRun` rows of quantized blocks, 4 rows of fp32, fp16
/// or bf16 values, whose rows are larger: a run's value rows are read across, block by block from
/// row to row, and the memory prefetches such strides over long runs of large rows poorly.
template <typename S>
constexpr int run_rows() {
  return kQuantizedStorage<S> ? kRowRun : 4;
}

/// Block `b` of a row stored as `S` as floats (x[i]: its value 32 b + i, before the scale), and
/// the block's scale: d_b for quantized blocks (`KVStorage<S>::levels`), 1 for fp32, fp16 and bf16
/// values (decoded exactly).
template <typename T, typename S>
T block_values(const S* row, int b, float (&x)[kQuantBlock]) {
  if constexpr (kQuantizedStorage<S>) {
    return static_cast<T>(KVStorage<S>::levels(row[b], x));
  } else {
    KVStorage<S>::decode(row + b * kQuantBlock, kQuantBlock, x);
    return T(1);
  }
}

/// Portable form of `score_row_run`: for each row, for each query, for each block, the sum of the
/// query's 32 values times the block's values, times the block's scale.
template <typename T, typename S>
void score_row_run_portable(const S* const* rows, int run, int head_dim, const T* queries,
                            int count, T scale, T* out, std::ptrdiff_t out_stride) {
  for (int r = 0; r < run; ++r)
    for (int c = 0; c < count; ++c) {
      const T* query = queries + static_cast<std::ptrdiff_t>(c) * head_dim;  // [head_dim]
      T dot = 0;
      for (int b = 0; b < head_dim / kQuantBlock; ++b) {
        float x[kQuantBlock];  // [32]: block b's values
        const T d = block_values<T>(rows[r], b, x);
        T part = 0;  // Σ_i q[32 b + i] · x_b[i]
        for (int i = 0; i < kQuantBlock; ++i) part += query[b * kQuantBlock + i] * x[i];
        dot += d * part;
      }
      out[c * out_stride + r] = scale * dot;
    }
}

/// Portable form of `add_row_run`: for each row, for each block, each query's weight times the
/// block's scale, times the block's values, added to the query's sum.
template <typename T, typename S>
void add_row_run_portable(const S* const* rows, int run, int head_dim, const T* weights,
                          std::ptrdiff_t weight_stride, int count, T* acc) {
  for (int r = 0; r < run; ++r)
    for (int b = 0; b < head_dim / kQuantBlock; ++b) {
      float x[kQuantBlock];  // [32]: block b's values
      const T d = block_values<T>(rows[r], b, x);
      for (int c = 0; c < count; ++c) {
        const T w = weights[c * weight_stride + r] * d;  // the row's weight times the block's scale
        T* a = acc + static_cast<std::ptrdiff_t>(c) * head_dim + b * kQuantBlock;  // [32]
        for (int i = 0; i < kQuantBlock; ++i) a[i] += w * x[i];
      }
    }
}

#if KVLAB_ROW_RUNS_AVX2
namespace avx2 {

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
        __m256 x[4];  // row r0 + r's block b, 32 values
        part_values<1>(rows[r0 + r], b, 0, x);
        sum[r] = add_block(rows[r0 + r], b, block_dot(query + b * kQuantBlock, x), sum[r]);
      }
    _mm_storeu_ps(out + r0, _mm_mul_ps(sum_lanes4(sum), _mm_set1_ps(scale)));
  }
  for (; r0 < run; ++r0) {
    __m256 sum = _mm256_setzero_ps();  // 8 partial sums
    for (int b = 0; b < head_dim / kQuantBlock; ++b) {
      __m256 x[4];  // block b's 32 values
      part_values<1>(rows[r0], b, 0, x);
      sum = add_block(rows[r0], b, block_dot(query + b * kQuantBlock, x), sum);
    }
    out[r0] = scale * sum_lanes(sum);
  }
}

/// The scores of rows [0, run) against four queries (out[c · out_stride + r]), row by row: each
/// block's values made floats once for all four queries.
template <typename S>
void score_rows_four_queries(const S* const* rows, int run, int head_dim, const float* queries,
                             float scale, float* out, std::ptrdiff_t out_stride) {
  for (int r = 0; r < run; ++r) {
    __m256 sum[4];  // [4 queries]: 8 partial sums each
    for (int c = 0; c < 4; ++c) sum[c] = _mm256_setzero_ps();
    for (int b = 0; b < head_dim / kQuantBlock; ++b) {
      __m256 x[4];  // block b's 32 values
      part_values<1>(rows[r], b, 0, x);
      for (int c = 0; c < 4; ++c)
        sum[c] = add_block(
            rows[r], b,
            block_dot(queries + static_cast<std::ptrdiff_t>(c) * head_dim + b * kQuantBlock, x),
            sum[c]);
    }
    alignas(16) float s[4];  // the four queries' scores
    _mm_store_ps(s, _mm_mul_ps(sum_lanes4(sum), _mm_set1_ps(scale)));
    for (int c = 0; c < 4; ++c) out[c * out_stride + r] = s[c];
  }
}

/// The scores of rows [0, run) of fp32, fp16 or bf16 values (no block scale) against four queries
/// (out[c · out_stride + r]), two rows at a time, half a block (16 values) at a time: each pair of
/// query vectors loaded serves both rows, and the eight sums (2 rows × 4 queries) take their
/// products by multiply-adds alone. Per row and block that is 12 loads and 16 multiply-adds,
/// against 20 loads and 24 vector operations row by row (`score_rows_four_queries`). A row left
/// over goes row by row.
template <typename S>
void score_row_pairs_four_queries(const S* const* rows, int run, int head_dim, const float* queries,
                                  float scale, float* out, std::ptrdiff_t out_stride) {
  int r0 = 0;
  for (; r0 + 2 <= run; r0 += 2) {
    __m256 sum[2][4];  // [2 rows, 4 queries]: 8 partial sums each
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 4; ++c) sum[r][c] = _mm256_setzero_ps();
    for (int b = 0; b < head_dim / kQuantBlock; ++b)
      for (int h = 0; h < 2; ++h) {
        __m256 x0[2], x1[2];  // rows r0 and r0 + 1: half h of block b, 16 values
        part_values<2>(rows[r0], b, h, x0);
        part_values<2>(rows[r0 + 1], b, h, x1);
        for (int c = 0; c < 4; ++c) {
          const float* q = queries + static_cast<std::ptrdiff_t>(c) * head_dim + b * kQuantBlock +
                           h * (kQuantBlock / 2);  // [16]
          const __m256 q0 = _mm256_loadu_ps(q), q1 = _mm256_loadu_ps(q + 8);
          sum[0][c] = _mm256_fmadd_ps(q1, x0[1], _mm256_fmadd_ps(q0, x0[0], sum[0][c]));
          sum[1][c] = _mm256_fmadd_ps(q1, x1[1], _mm256_fmadd_ps(q0, x1[0], sum[1][c]));
        }
      }
    for (int r = 0; r < 2; ++r) {
      alignas(16) float s[4];  // the four queries' scores of row r0 + r
      _mm_store_ps(s, _mm_mul_ps(sum_lanes4(sum[r]), _mm_set1_ps(scale)));
      for (int c = 0; c < 4; ++c) out[c * out_stride + r0 + r] = s[c];
    }
  }
  if (r0 < run)
    score_rows_four_queries(rows + r0, run - r0, head_dim, queries, scale, out + r0, out_stride);
}

/// `score_row_run` with vectors: groups of four queries, two rows at a time (row by row for
/// quantized blocks, whose scale each block's sum needs); a query left over, four rows at a time.
template <typename S>
void score_rows(const S* const* rows, int run, int head_dim, const float* queries, int count,
                float scale, float* out, std::ptrdiff_t out_stride) {
  int c = 0;
  for (; c + 4 <= count; c += 4)
    if constexpr (kQuantizedStorage<S>)
      score_rows_four_queries(rows, run, head_dim,
                              queries + static_cast<std::ptrdiff_t>(c) * head_dim, scale,
                              out + c * out_stride, out_stride);
    else
      score_row_pairs_four_queries(rows, run, head_dim,
                                   queries + static_cast<std::ptrdiff_t>(c) * head_dim, scale,
                                   out + c * out_stride, out_stride);
  for (; c < count; ++c)
    score_rows_one_query(rows, run, head_dim, queries + static_cast<std::ptrdiff_t>(c) * head_dim,
                         scale, out + c * out_stride);
}

/// Asks for every 64-byte line of rows [0, run) (each `head_dim` values stored as `S`) to be
/// brought into the L1 cache, all at once. `add_rows_to` reads its rows across, a part of each row
/// in turn; without this, each row's next line is asked for only when the loop reaches it, and the
/// value pass waits on those loads. Where the rows of a token's heads lie side by side (the
/// token-major NHD paged pool) the asks made the step slower, so `attend_partial` leaves them out
/// there (`add_row_run`'s `prefetch`).
template <typename S>
inline void prefetch_rows(const S* const* rows, int run, int head_dim) {
  const std::size_t bytes = storage_row_bytes<S>(head_dim);
  for (int r = 0; r < run; ++r) prefetch_row(rows[r], bytes);
}

/// Adds up to `kRowRun` value rows to `Q` queries' sums (Q ≤ 4), a block part at a time: part h
/// of a block is its values [32 / P · h, 32 / P · (h + 1)); the queries' sums over that part (Q · 4
/// / P vectors, at most 8) stay in registers while every row of the run is added to them.
template <int Q, int P, typename S>
void add_rows_to(const S* const* rows, int run, int head_dim, const float* weights,
                 std::ptrdiff_t weight_stride, float* acc) {
  constexpr int V = 4 / P;  // vectors per part
  static_assert(Q * V <= 8, "the sums of a part must fit in 8 registers");
  float w[Q][kRowRun];  // [Q, run]: row r's weight for query c (times block b's scale)
  for (int c = 0; c < Q; ++c)
    for (int r = 0; r < run; ++r) w[c][r] = weights[c * weight_stride + r];
  for (int b = 0; b < head_dim / kQuantBlock; ++b) {
    if constexpr (kQuantizedStorage<S>) {
      float d[kRowRun];  // [run]: block b's scale in each row
      block_scales(rows, run, b, d);
      for (int c = 0; c < Q; ++c)
        for (int r = 0; r < run; ++r) w[c][r] = weights[c * weight_stride + r] * d[r];
    }
    for (int h = 0; h < P; ++h) {
      const std::ptrdiff_t at = b * kQuantBlock + h * (kQuantBlock / P);  // part's first value
      __m256 sum[Q][V];  // [Q, V]: the queries' sums over the part
      for (int c = 0; c < Q; ++c)
        for (int k = 0; k < V; ++k)
          sum[c][k] = _mm256_loadu_ps(acc + c * static_cast<std::ptrdiff_t>(head_dim) + at + 8 * k);
      for (int r = 0; r < run; ++r) {
        __m256 x[V];  // row r's part h of block b
        part_values<P>(rows[r], b, h, x);
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

/// `add_row_run` with vectors: runs of up to `kRowRun` rows, each asked for first
/// (`prefetch_rows`) if `prefetch`, then added to groups of up to four queries (one or two queries
/// take whole blocks at a time, three or four half blocks).
template <typename S>
void add_rows(const S* const* rows, int run, int head_dim, const float* weights,
              std::ptrdiff_t weight_stride, int count, float* acc, bool prefetch) {
  for (int r = 0; r < run; r += kRowRun) {
    const int n = run - r < kRowRun ? run - r : kRowRun;
    if (prefetch) prefetch_rows(rows + r, n, head_dim);
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

/// The scores of a run of `run` key rows stored as `S` (`rows[r]`: `head_dim` values, in
/// `head_dim` / 32 blocks when quantized; head_dim a multiple of 32) against `count` queries
/// (`queries`: [count, head_dim], row-major): out[c · out_stride + r] = scale · (query c) · (row
/// r's values), with a quantized block's scale taken out of the block's sum.
template <typename T, typename S>
void score_row_run(const S* const* rows, int run, int head_dim, const T* queries, int count,
                   T scale, T* out, std::ptrdiff_t out_stride) {
#if KVLAB_ROW_RUNS_AVX2
  if constexpr (kVectorRows<T, S>) {
    avx2::score_rows(rows, run, head_dim, queries, count, scale, out, out_stride);
    return;
  }
#endif
  score_row_run_portable(rows, run, head_dim, queries, count, scale, out, out_stride);
}

/// Adds a run of `run` value rows stored as `S` (`rows[r]`, as for `score_row_run`) to `count`
/// queries' sums: acc row c ([count, head_dim], row-major) += Σ_r weights[c · weight_stride + r] ·
/// (row r's values), the rows added in order, each weight multiplied by a quantized block's scale
/// once per block. `prefetch`: ask for each run's rows before reading them (`prefetch_rows`; the
/// vector form only, and no change to the result).
template <typename T, typename S>
void add_row_run(const S* const* rows, int run, int head_dim, const T* weights,
                 std::ptrdiff_t weight_stride, int count, T* acc, bool prefetch = true) {
#if KVLAB_ROW_RUNS_AVX2
  if constexpr (kVectorRows<T, S>) {
    avx2::add_rows(rows, run, head_dim, weights, weight_stride, count, acc, prefetch);
    return;
  }
#endif
  (void)prefetch;  // a hint for the vector form only
  add_row_run_portable(rows, run, head_dim, weights, weight_stride, count, acc);
}

}  // namespace kvlab::cpu::detail
