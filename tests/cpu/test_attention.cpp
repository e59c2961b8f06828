// The reference attention (cpu::reference_attention, plain loops) against values computed by
// hand; the two tuned kernels against it, against each other; their exact counters, their
// numerics at extreme logits, and their argument checks.
//
// Tolerances: kernels and reference compute the same sums in different orders; the reference
// sums in double. Differences are rounding only, ~sqrt(head_dim) ulps of the row scale:
//   double: 1e-12 relative to max(1, the row's largest |value|);
//   float:  1e-5  relative (float eps is 6e-8; head_dim 256 and the softmax give ~1e-6).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#if defined(_OPENMP)
#include <omp.h>
#endif
#include <limits>
#include <vector>

#include "kvlab/kvlab.hpp"
#include "test_support.hpp"

using kvlab::AttentionShape;
using kvlab::RowMatrix;
using kvlab::cpu::reference_attention;
using kvlab_test::max_row_relative_error;
using kvlab_test::names;
using kvlab_test::tolerance;

namespace {

// A [rows, cols] float matrix of zeros (a plain matrix, as the kernels' arguments are).
RowMatrix<float> zeros(Eigen::Index rows, Eigen::Index cols) {
  return RowMatrix<float>::Zero(rows, cols);
}

// A view over caller-owned storage, [num_kv_heads, capacity, head_dim], holding rows of `k`
// and `v` ([length, kv_width]) and NaN in every slot past `length`, so that a kernel that
// reads beyond the valid rows produces NaN.
template <typename T>
struct PaddedCache {
  std::vector<T> k, v;  // [num_kv_heads * capacity * head_dim]
  kvlab::ContiguousKVView<T> view;
  PaddedCache(const AttentionShape& shape, const RowMatrix<T>& keys, const RowMatrix<T>& values,
              int capacity) {
    const int d = shape.head_dim();
    const std::size_t size = static_cast<std::size_t>(shape.num_kv_heads()) * capacity * d;
    k.assign(size, std::numeric_limits<T>::quiet_NaN());
    v.assign(size, std::numeric_limits<T>::quiet_NaN());
    view = {k.data(), v.data(), shape.num_kv_heads(), d, capacity, static_cast<int>(keys.rows())};
    for (int h = 0; h < shape.num_kv_heads(); ++h)
      for (int t = 0; t < keys.rows(); ++t)
        for (int c = 0; c < d; ++c) {
          k[static_cast<std::size_t>(view.offset(h, t) + c)] = keys(t, h * d + c);
          v[static_cast<std::size_t>(view.offset(h, t) + c)] = values(t, h * d + c);
        }
  }
};

template <typename T>
void check_kernels(const AttentionShape& shape, int q_len, int kv_len, std::uint64_t seed) {
  kvlab::Rng rng(seed);
  const RowMatrix<T> q = kvlab::random_matrix<T>(q_len, shape.q_width(), rng);
  const RowMatrix<T> k = kvlab::random_matrix<T>(kv_len, shape.kv_width(), rng);
  const RowMatrix<T> v = kvlab::random_matrix<T>(kv_len, shape.kv_width(), rng);
  const RowMatrix<T> want = reference_attention(shape, q, k, v);

  const RowMatrix<T> naive = kvlab::cpu::naive_attention(shape, q, k, v);
  CHECK(max_row_relative_error(naive, want) <= tolerance<T>());

  const PaddedCache<T> cache(shape, k, v, kv_len + 5);  // 5 NaN rows past the end
  const RowMatrix<T> decode = kvlab::cpu::decode_attention(shape, q, cache.view);
  CHECK(max_row_relative_error(decode, want) <= tolerance<T>());
}

}  // namespace

TEST_CASE(
    "reference_attention: hand-computed values, the causal mask, GQA and the position offset") {
  // One head, head_dim 2, scale 1: q0 = (1, 0) sees k0 only; q1 = (1, 0) sees k0 = (1, 0) and
  // k1 = (0, 1), scores 1 and 0, so p = (e, 1) / (e + 1).
  const AttentionShape one(1, 1, 2, /*scale=*/1.0);
  RowMatrix<double> q(2, 2), k(2, 2), v(2, 2);
  q << 1, 0, 1, 0;
  k << 1, 0, 0, 1;
  v << 1, 2, 3, 4;
  const RowMatrix<double> out = reference_attention(one, q, k, v);
  const double e = std::exp(1.0);
  CHECK(out(0, 0) == 1.0);  // softmax of one score is 1: exactly v0
  CHECK(out(0, 1) == 2.0);
  CHECK(out(1, 0) == Approx((e * 1 + 3) / (e + 1)).epsilon(1e-15));
  CHECK(out(1, 1) == Approx((e * 2 + 4) / (e + 1)).epsilon(1e-15));
  // GQA: 2 query heads over 1 K/V head read the same keys, so equal queries give equal outputs.
  const AttentionShape gqa(2, 1, 2, 1.0);
  RowMatrix<double> q2(2, 4);
  q2 << 1, 0, 1, 0, 1, 0, 1, 0;
  const RowMatrix<double> out2 = reference_attention(gqa, q2, k, v);
  CHECK(out2.leftCols(2) == out);
  CHECK(out2.rightCols(2) == out);
  // The position offset: a chunk of queries at positions 3 and 4 of 6 keys equals rows 3 and 4 of
  // the whole prefill, and decode (one query at the end) equals its last row.
  kvlab::Rng rng(4);
  const AttentionShape shape(4, 2, 8);
  const RowMatrix<double> qs = kvlab::random_matrix<double>(6, 32, rng);
  const RowMatrix<double> ks = kvlab::random_matrix<double>(6, 16, rng);
  const RowMatrix<double> vs = kvlab::random_matrix<double>(6, 16, rng);
  const RowMatrix<double> all = reference_attention(shape, qs, ks, vs);
  CHECK(reference_attention(shape, qs.middleRows(3, 2), ks, vs, 3) == all.middleRows(3, 2));
  CHECK(reference_attention(shape, qs.bottomRows(1), ks, vs) == all.bottomRows(1));
  CHECK_THROWS_MATCHES(reference_attention(shape, qs.middleRows(3, 2), ks, vs, 5),
                       kvlab::InvalidArgument,
                       names("first_position", "in [0, k.rows() - q.rows()] = [0, 4]", "5"));
  CHECK_THROWS_MATCHES(reference_attention(shape, qs, ks.leftCols(8), vs), kvlab::InvalidArgument,
                       names("k.cols()", "16 (num_kv_heads * head_dim)", "8"));
}

TEST_CASE("the attention functions take any Eigen expression: rows, row blocks, column-major") {
  const AttentionShape shape(4, 2, 8);
  kvlab::Rng rng(12);
  const RowMatrix<float> q = kvlab::random_matrix<float>(6, 32, rng);
  const RowMatrix<float> k = kvlab::random_matrix<float>(6, 16, rng);
  const RowMatrix<float> v = kvlab::random_matrix<float>(6, 16, rng);
  const RowMatrix<float> all = kvlab::cpu::naive_attention(shape, q, k, v);
  // A block of rows and a single row, read in place (other row counts: other products, so
  // rounding); a column-major copy, copied once into the same layout (the same bits).
  CHECK(max_row_relative_error(kvlab::cpu::naive_attention(shape, q.bottomRows(2), k, v),
                               RowMatrix<float>(all.bottomRows(2))) <= tolerance<float>());
  const Eigen::MatrixXf q_col = q, k_col = k, v_col = v;  // column-major
  CHECK(kvlab::cpu::naive_attention(shape, q_col, k_col, v_col) == all);
  kvlab::ContiguousKVCache<float> cache(1, 2, 8, 6);
  cache.append(0, k.topRows(5), v.topRows(5));  // a row block
  cache.append(0, k.row(5), v.row(5));          // a row
  const RowMatrix<float> decoded = kvlab::cpu::decode_attention(shape, q.row(5), cache.view(0));
  CHECK(max_row_relative_error(decoded, RowMatrix<float>(all.row(5))) <= tolerance<float>());
  CHECK(max_row_relative_error(
            kvlab::cpu::decode_attention(shape, q_col.bottomRows(3), cache.view(0)),
            RowMatrix<float>(all.bottomRows(3))) <= tolerance<float>());
  // The output may not share memory with an input, even through a block of it.
  RowMatrix<float> out = q;
  CHECK_THROWS_MATCHES(kvlab::cpu::decode_attention(shape, out.bottomRows(1), cache.view(0), out),
                       kvlab::InvalidArgument, names("out", "a matrix other than q", "q"));
}

TEMPLATE_TEST_CASE("naive_attention and decode_attention equal the reference", "", float, double) {
  struct Heads {
    int num_heads, num_kv_heads;
  };
  const Heads layouts[] = {{1, 1}, {4, 4}, {4, 2}, {4, 1}, {8, 2}, {32, 8}, {32, 1}};
  std::uint64_t seed = 1;
  for (const Heads& heads : layouts) {
    for (int head_dim : {1, 8, 64, 80, 96, 128, 256}) {
      const AttentionShape shape(heads.num_heads, heads.num_kv_heads, head_dim);
      // Decode (1 query), a prefill of the whole sequence, and prefills that end past one or
      // more 16-row query tiles of decode_attention, each after a prefix.
      const int lengths[][2] = {{1, 1}, {1, 23}, {23, 23}, {16, 40}, {17, 17}, {33, 50}};
      for (const auto& len : lengths) {
        const int q_len = len[0], kv_len = len[1];
        // keep the triple loop cheap
        if (heads.num_heads * head_dim * kv_len > 32 * 128 * 50) continue;
        INFO("heads " << heads.num_heads << "/" << heads.num_kv_heads << ", head_dim " << head_dim
                      << ", q_len " << q_len << ", kv_len " << kv_len);
        check_kernels<TestType>(shape, q_len, kv_len, seed++);
      }
    }
  }
}

TEST_CASE("decode_attention equals naive_attention over long caches") {
  for (int kv_len : {1000, 4097}) {
    const AttentionShape shape(8, 2, 64);
    kvlab::Rng rng(static_cast<std::uint64_t>(kv_len));
    const RowMatrix<float> q = kvlab::random_matrix<float>(3, shape.q_width(), rng);
    const RowMatrix<float> k = kvlab::random_matrix<float>(kv_len, shape.kv_width(), rng);
    const RowMatrix<float> v = kvlab::random_matrix<float>(kv_len, shape.kv_width(), rng);
    const PaddedCache<float> cache(shape, k, v, kv_len);
    const RowMatrix<float> naive = kvlab::cpu::naive_attention(shape, q, k, v);
    const RowMatrix<float> decode = kvlab::cpu::decode_attention(shape, q, cache.view);
    CHECK(max_row_relative_error(decode, naive) <= 1e-5);
  }
}

TEST_CASE("decode_attention gives the same bits on 1 and 2 threads") {
  // 8 K/V heads x 4096 rows x 64 values: above kDecodeParallelMinElements, so with OpenMP the
  // K/V heads are split between threads. Each head is computed by one thread in the same order
  // either way, so the results must be identical, not merely close.
  const AttentionShape shape(32, 8, 64);
  const int kv_len = 4096;
  REQUIRE(1LL * kv_len * 64 * 8 >= kvlab::cpu::kDecodeParallelMinElements);
  kvlab::Rng rng(8);
  const RowMatrix<float> q = kvlab::random_matrix<float>(1, shape.q_width(), rng);
  const RowMatrix<float> k = kvlab::random_matrix<float>(kv_len, shape.kv_width(), rng);
  const RowMatrix<float> v = kvlab::random_matrix<float>(kv_len, shape.kv_width(), rng);
  const PaddedCache<float> cache(shape, k, v, kv_len);
#if defined(_OPENMP)
  const int threads_before = omp_get_max_threads();
  omp_set_num_threads(1);
  const RowMatrix<float> one = kvlab::cpu::decode_attention(shape, q, cache.view);
  omp_set_num_threads(2);
  const RowMatrix<float> two = kvlab::cpu::decode_attention(shape, q, cache.view);
  omp_set_num_threads(threads_before);
  CHECK(one == two);
#else
  WARN("built without OpenMP: only the serial path is checked");
  const RowMatrix<float> one = kvlab::cpu::decode_attention(shape, q, cache.view);
#endif
  CHECK(max_row_relative_error(one, kvlab::cpu::naive_attention(shape, q, k, v)) <=
        tolerance<float>());
}

TEST_CASE("counters: naive materialises every score, decode reads K/V once per group") {
  const AttentionShape shape(8, 2, 16);  // group size 4
  const int q_len = 5, kv_len = 12;
  kvlab::Rng rng(3);
  const RowMatrix<double> q = kvlab::random_matrix<double>(q_len, shape.q_width(), rng);
  const RowMatrix<double> k = kvlab::random_matrix<double>(kv_len, shape.kv_width(), rng);
  const RowMatrix<double> v = kvlab::random_matrix<double>(kv_len, shape.kv_width(), rng);

  kvlab::CostCounters naive;
  (void)kvlab::cpu::naive_attention(shape, q, k, v, &naive);
  CHECK(naive.qk_dots == 8u * q_len * kv_len);  // masked entries included
  CHECK(naive.macs == 2u * 8 * q_len * kv_len * 16);
  CHECK(naive.kv_bytes_read == 2u * 8 * kv_len * 16 * sizeof(double));  // once per query head
  CHECK(naive.kv_projections == 0);

  const PaddedCache<double> cache(shape, k, v, kv_len);
  kvlab::CostCounters decode;
  (void)kvlab::cpu::decode_attention(shape, q, cache.view, &decode);
  // Query i (position 7 + i) sees 8 + i keys: 8 + 9 + 10 + 11 + 12 = 50 per query head.
  CHECK(decode.qk_dots == 8u * 50);
  CHECK(decode.macs == 2u * 8 * 50 * 16);
  CHECK(decode.kv_bytes_read == 2u * 2 * kv_len * 16 * sizeof(double));  // once per K/V head

  kvlab::CostCounters step;
  const RowMatrix<double> one = q.bottomRows(1);
  (void)kvlab::cpu::decode_attention(shape, one, cache.view, &step);
  CHECK(step.qk_dots == 8u * kv_len);
  CHECK(step.kv_bytes_read == 2u * 2 * kv_len * 16 * sizeof(double));
}

TEST_CASE("decode_attention counters over several query tiles") {
  // A prefill of 2.5 tiles of T rows after 10 cached tokens: tiles of T, T and T / 2 query rows.
  // Each tile streams the rows its last query sees: 10 + T, 10 + 2 T and 10 + 2.5 T rows per K/V
  // head (T = 48: 58 + 106 + 130 = 294).
  constexpr int T = kvlab::cpu::kDecodeQueryTile;
  static_assert(T % 2 == 0, "the last tile is half a tile");
  const AttentionShape shape(6, 3, 8);
  kvlab::Rng rng(4);
  const int prefix = 10, q_len = 2 * T + T / 2;
  const RowMatrix<double> q = kvlab::random_matrix<double>(q_len, shape.q_width(), rng);
  const RowMatrix<double> k = kvlab::random_matrix<double>(prefix + q_len, shape.kv_width(), rng);
  const RowMatrix<double> v = kvlab::random_matrix<double>(prefix + q_len, shape.kv_width(), rng);
  const PaddedCache<double> cache(shape, k, v, prefix + q_len);
  kvlab::CostCounters c;
  const RowMatrix<double> out = kvlab::cpu::decode_attention(shape, q, cache.view, &c);
  const std::uint64_t streamed = 3 * prefix + T + 2 * T + q_len;  // per K/V head
  CHECK(c.kv_bytes_read == 2u * 3 * streamed * 8 * sizeof(double));
  // Query i sees prefix + 1 + i keys: q_len * prefix + (1 + ... + q_len) per query head.
  const std::uint64_t seen = q_len * prefix + q_len * (q_len + 1) / 2;
  CHECK(c.qk_dots == 6u * seen);
  CHECK(c.macs == 2u * 6 * seen * 8);
  CHECK(max_row_relative_error(out, reference_attention(shape, q, k, v)) <= tolerance<double>());
}

TEST_CASE("attention with logits of +-1e4 stays finite and picks the dominant key") {
  const AttentionShape shape(2, 1, 4, 1.0);
  // Key 1 aligned with the query (score +1e4), key 0 and 2 opposed (score -1e4).
  RowMatrix<float> q(1, 8), k(3, 4), v(3, 4);
  q << 100, 0, 0, 0, 0, 100, 0, 0;
  k << -100, -100, 0, 0,  //
      100, 100, 0, 0,     //
      -100, -100, 0, 0;
  v << 1, 2, 3, 4,  //
      5, 6, 7, 8,   //
      9, 10, 11, 12;
  const RowMatrix<float> naive = kvlab::cpu::naive_attention(shape, q, k, v);
  const PaddedCache<float> cache(shape, k, v, 3);
  const RowMatrix<float> decode = kvlab::cpu::decode_attention(shape, q, cache.view);
  for (const RowMatrix<float>* out : {&naive, &decode}) {
    REQUIRE(out->allFinite());
    for (int c = 0; c < 4; ++c) {
      CHECK((*out)(0, c) == v(1, c));      // all weight on key 1: exp(-2e4) underflows to 0
      CHECK((*out)(0, 4 + c) == v(1, c));  // head 1 shares the K/V head
    }
  }
}

TEST_CASE("naive_attention rejects bad arguments, naming them") {
  using kvlab::InvalidArgument;
  const AttentionShape shape(4, 2, 8);  // q_width 32, kv_width 16
  const RowMatrix<float> q = zeros(3, 32), k = zeros(5, 16);
  const RowMatrix<float>& v = k;
  RowMatrix<float> out;
  CHECK_THROWS_MATCHES(kvlab::cpu::naive_attention(shape, RowMatrix<float>(0, 32), k, v),
                       InvalidArgument, names("q.rows()", ">= 1", "0"));
  CHECK_THROWS_MATCHES(kvlab::cpu::naive_attention(shape, zeros(3, 30), k, v), InvalidArgument,
                       names("q.cols()", "32 (num_heads * head_dim)", "30"));
  CHECK_THROWS_MATCHES(kvlab::cpu::naive_attention(shape, q, zeros(5, 17), v), InvalidArgument,
                       names("k.cols()", "16", "17"));
  CHECK_THROWS_MATCHES(kvlab::cpu::naive_attention(shape, q, k, zeros(4, 16)), InvalidArgument,
                       names("v.rows()", "5 (k.rows())", "4"));
  CHECK_THROWS_MATCHES(kvlab::cpu::naive_attention(shape, q, k, zeros(5, 8)), InvalidArgument,
                       names("v.cols()", "16", "8"));
  CHECK_THROWS_MATCHES(kvlab::cpu::naive_attention(shape, q, zeros(2, 16), zeros(2, 16)),
                       InvalidArgument, names("k.rows()", ">= q.rows() (3)", "2"));
  RowMatrix<float> aliased = q;
  CHECK_THROWS_MATCHES(kvlab::cpu::naive_attention(shape, aliased, k, v, aliased), InvalidArgument,
                       names("out", "a matrix other than q, k and v", "one of them"));
  CHECK(aliased == q);  // unchanged
}

TEST_CASE("decode_attention rejects bad arguments and views, naming them") {
  using kvlab::InvalidArgument;
  const AttentionShape shape(4, 2, 8);
  kvlab::ContiguousKVCache<float> cache(1, 2, 8, 10);
  cache.append(0, zeros(4, 16), zeros(4, 16));
  const RowMatrix<float> q = zeros(1, 32);
  const auto good = cache.view(0);
  CHECK_NOTHROW(kvlab::cpu::decode_attention(shape, q, good));

  CHECK_THROWS_MATCHES(kvlab::cpu::decode_attention(shape, RowMatrix<float>(0, 32), good),
                       InvalidArgument, names("q.rows()", ">= 1", "0"));
  CHECK_THROWS_MATCHES(kvlab::cpu::decode_attention(shape, zeros(1, 33), good), InvalidArgument,
                       names("q.cols()", "32", "33"));
  CHECK_THROWS_MATCHES(kvlab::cpu::decode_attention(AttentionShape(4, 4, 8), q, good),
                       InvalidArgument,
                       names("cache.num_kv_heads", "4 (shape.num_kv_heads())", "2"));
  CHECK_THROWS_MATCHES(kvlab::cpu::decode_attention(AttentionShape(2, 2, 16), q, good),
                       InvalidArgument, names("cache.head_dim", "16 (shape.head_dim())", "8"));
  CHECK_THROWS_MATCHES(kvlab::cpu::decode_attention(shape, zeros(5, 32), good), InvalidArgument,
                       names("cache.length", "in [q.rows() (5), cache.capacity (10)]", "4"));
  auto too_long = good;
  too_long.length = 11;
  CHECK_THROWS_MATCHES(kvlab::cpu::decode_attention(shape, q, too_long), InvalidArgument,
                       names("cache.length", "in [q.rows() (1), cache.capacity (10)]", "11"));
  auto null_keys = good;
  null_keys.k = nullptr;
  CHECK_THROWS_MATCHES(kvlab::cpu::decode_attention(shape, q, null_keys), InvalidArgument,
                       names("cache.k / cache.v", "non-null pointers", "a null pointer"));
  RowMatrix<float> aliased = q;
  CHECK_THROWS_MATCHES(kvlab::cpu::decode_attention(shape, aliased, good, aliased), InvalidArgument,
                       names("out", "a matrix other than q", "q"));
}
