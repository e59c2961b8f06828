/// \file
/// \brief How the CPU attention kernels read a run of consecutive K/V rows against several queries
/// at once: `score_row_run` (a run of key rows scored against several queries) and `add_row_run`
/// (a run of value rows added into several queries' sums). A row is read in blocks of 32 values
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
///  - AVX2 with FMA (compiled with `-mavx2 -mfma`, or `-march=native` on a CPU that has them,
///    and not by nvcc; fp16 rows also need F16C): a block's values are made floats once in vector
///    registers and used for up to four queries; the scores of four rows are computed side by
///    side, and the value rows of a run are added block by block into sums that stay in registers
///    for the whole run. This is what lets one decode step read its K and V at the memory's speed
///    (`bench/bench_decode_bandwidth.cpp`, `bench/bench_kv_dtype.cpp`): each row is loaded once for
///    all the queries of its GQA group, several rows are in flight, and no query's sum goes through
///    memory between rows.
/// `kRowRunsAvx2` says which form a build has, `kVectorRows<T, S>` whether it applies to queries
/// of type T and rows stored as S. Internal (`cpu::detail`), used by `attention_tile.hpp`; tested
/// against the decoded rows in `tests/test_row_runs.cpp`, built both ways.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kvlab/core/quant_blocks.hpp"
#include "kvlab/kv_storage.hpp"

#if defined(__AVX2__) && defined(__FMA__) && !defined(__CUDACC__)
#include <immintrin.h>
/// 1: this build reads runs of rows with AVX2 and FMA (the compiler targets both; not nvcc).
#define KVLAB_ROW_RUNS_AVX2 1
#else
/// 0: this build reads runs of rows with plain loops (no AVX2 with FMA targeted, or nvcc).
#define KVLAB_ROW_RUNS_AVX2 0
#endif

namespace kvlab::cpu::detail {

/// Whether `S` is a quantized block (`BlockQ8_0`, `BlockQ4_0`): its rows are read block by
/// block with the scale taken out of each block's sum instead of being decoded.
template <typename S>
constexpr bool kQuantizedStorage = StorageUnit<S>::kValues == kQuantBlock;

/// Whether this build reads runs of rows with AVX2 and FMA (true) or with plain loops (false).
constexpr bool kRowRunsAvx2 = KVLAB_ROW_RUNS_AVX2 != 0;

/// Whether this build converts fp16 with F16C (the compiler targets it).
#if defined(__F16C__)
constexpr bool kRowRunsF16c = true;
#else
constexpr bool kRowRunsF16c = false;
#endif

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
/// or bf16 values. A run's value rows are read across, block by block from row to row, and such
/// strides over long runs of large rows are prefetched poorly by the memory: at head_dim 128,
/// runs of 4 fp16 rows made a decode step faster than runs of 16 where its cache lay beyond the
/// L3, and runs of 4 fp32 rows faster than runs of 2 (`bench/results/README.md`, "K/V rows read
/// in runs").
template <typename S>
constexpr int run_rows() {
  return kQuantizedStorage<S> ? kRowRun : 4;
}

#ifndef KVLAB_PREFETCH_AHEAD
/// How far ahead of a K/V row, in bytes, the CPU attention kernels ask for memory
/// (`cpu::detail::kPrefetchAhead`); define it before including kvlab to tune it for another
/// machine, 0 to ask for nothing ahead.
#define KVLAB_PREFETCH_AHEAD 1024
#endif

/// How far ahead of a K/V row the attention kernels ask for memory, in bytes
/// (`KVLAB_PREFETCH_AHEAD`): at each row they read, they ask for the row of the same head
/// `rows_ahead` positions on. A decode step reads each head's rows in order, each one once: the
/// memory's own prefetcher follows such a stream where it lies in order in memory, but a step that
/// also computes on each row was left waiting on its loads — fp32 GQA and MHA steps over a
/// contiguous cache of 16384 tokens read their rows at 0.52–0.56 and 0.65–0.67 of the read
/// bandwidth on machine D of `bench/results/README.md` (1 and 2 threads); asked for 1024 bytes
/// (two 128-value fp32 rows) ahead, at 0.78–0.94 and 0.77–0.79. In a block pool the next rows
/// lie in another block, wherever the block table puts it, which no hardware prefetcher can
/// guess. Other distances (0 to 4096 bytes): `bench/results/cpu-prefetch-ahead.txt`.
constexpr std::size_t kPrefetchAhead = KVLAB_PREFETCH_AHEAD;

/// The fewest bytes of one head's rows that a pass of the attention kernels must read for them
/// to ask for rows ahead: a shorter range sits in the L1 and L2 caches after the first step, its
/// loads wait for nothing, and the asks only cost instructions (stories260K, head_dim 8, whose
/// 256-token cache holds 8 KiB per head, generated 4–5 % fewer tokens per second with them,
/// `bench/results/cpu-prefetch-ahead.txt`).
constexpr std::size_t kPrefetchMinBytes = std::size_t{64} << 10;

#ifndef KVLAB_PREFETCH_FAR
/// How far ahead of a K/V row, in bytes, the CPU attention kernels also ask for memory to be
/// brought into the L2 cache (`cpu::detail::kPrefetchFar`); define it before including kvlab to
/// tune it for another machine, 0 to ask for nothing that far (with `KVLAB_PREFETCH_AHEAD` 0,
/// nothing is asked for at either distance).
#define KVLAB_PREFETCH_FAR 4096
#endif

/// How far ahead of a K/V row the attention kernels ask for memory to be brought into the L2
/// cache, in bytes (`KVLAB_PREFETCH_FAR`), besides their ask `kPrefetchAhead` bytes on into the L1:
/// a page of 4 KiB, where the memory's own prefetcher, which stops at the end of each page, has
/// not yet begun. Asked into the L1 from that far, the lines waited in the L1's few miss slots and
/// the step slowed down (MHA 0.74 → 0.60 of the read bandwidth); asked into the L2, each ask frees
/// its slot when the L2 takes it over, and an fp32 MHA step over a contiguous cache of 16384
/// tokens took 0.91–0.94× the time on machine D (0.72–0.79 → 0.77–0.85 of the read bandwidth, one
/// and two threads; `bench/results/cpu-prefetch-ahead.txt`, §7). The attention kernels ask that
/// far only where they read rows one by one (`attend_partial`).
constexpr std::size_t kPrefetchFar = KVLAB_PREFETCH_FAR;

/// The fewest bytes of one head's rows that a pass must read for the attention kernels to ask
/// `kPrefetchFar` bytes ahead as well: a shorter range is likely still in the caches from the
/// step before, and the far asks only cost instructions and block-table lookups (an MHA step over
/// a pool of 16-token HND blocks, 1024 tokens, 512 KiB per head, took 1.19× the time with them;
/// from 2048 tokens on, 0.72–0.95×; `bench/results/cpu-prefetch-ahead.txt`, §7).
constexpr std::size_t kPrefetchFarMinBytes = std::size_t{1} << 20;

/// Rows of `row_bytes` bytes that make up `bytes` bytes (at least one; 0 if `bytes` is 0):
/// `rows_ahead(row_bytes, kPrefetchAhead)` rows on, the kernels ask for a row into the L1,
/// `rows_ahead(row_bytes, kPrefetchFar)` rows on, into the L2.
inline int rows_ahead(std::size_t row_bytes, std::size_t bytes = kPrefetchAhead) {
  if (bytes == 0) return 0;
  return static_cast<int>(std::max<std::size_t>(1, bytes / row_bytes));
}

/// The cache a line asked for ahead is brought into (`prefetch_line`).
enum class CacheLevel {
  L1,  ///< the L1 cache (and every level below it): x86's `prefetcht0`
  L2,  ///< the L2 cache (and below), not the L1: x86's `prefetcht1`
};

/// Asks for the 64-byte line at `at` to be brought into the cache `level`, without waiting for
/// it (a hint: nothing is read, nothing can fault). On x86 it is the instruction itself, in a
/// volatile asm statement: GCC 12 removed calls to a function whose only work was
/// `__builtin_prefetch`, as code without effect (its mod/ref analysis; `-fno-ipa-modref` kept
/// them), and the decode step lost what it gained from them. Elsewhere it is `__builtin_prefetch`;
/// nothing where the compiler has neither.
inline void prefetch_line(const char* at, CacheLevel level = CacheLevel::L1) {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  if (level == CacheLevel::L1)
    asm volatile("prefetcht0 %0" : : "m"(*at));
  else
    asm volatile("prefetcht1 %0" : : "m"(*at));
#elif defined(__GNUC__) || defined(__clang__)
  if (level == CacheLevel::L1)
    __builtin_prefetch(at, 0, 3);  // for reading, kept in every cache level
  else
    __builtin_prefetch(at, 0, 2);  // for reading, kept from the L2 down
#else
  (void)at;
  (void)level;
#endif
}

/// Asks for the `bytes` bytes from `row` to be brought into the cache `level`, line by line
/// (`prefetch_line`).
inline void prefetch_row(const void* row, std::size_t bytes, CacheLevel level = CacheLevel::L1) {
  const char* at = static_cast<const char*>(row);
  for (std::size_t line = 0; line < bytes; line += 64) prefetch_line(at + line, level);
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
/// against 20 loads and 24 vector operations row by row (`score_rows_four_queries`), which the
/// GQA step (four queries per K/V head) spends most of its time on where its rows are in the
/// caches: a fp32 GQA step over 4096 and 8192 tokens took 0.95–0.96× the time on machine D
/// (`bench/results/cpu-prefetch-ahead.txt`, §8). A row left over goes row by row.
template <typename S>
void score_row_pairs_four_queries(const S* const* rows, int run, int head_dim,
                                  const float* queries, float scale, float* out,
                                  std::ptrdiff_t out_stride) {
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
/// in turn; without this, each row's next line is asked for only when the loop reaches it, and a
/// GQA decode step with its cache beyond the L3 spent most of its value pass waiting on those
/// loads: asked for up front, a fp32 GQA step over a contiguous cache took 0.64–0.89 of its time
/// on machine A (`bench/results/README.md`, "The value rows asked for before they are read").
/// Where the rows of a token's heads lie side by side (the token-major NHD paged pool) the same
/// step measured slower (up to 1.47× in two of three rounds), so `attend_partial` leaves it out
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
