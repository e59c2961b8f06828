// How the attention kernels read rows stored as q8_0 / q4_0 blocks without decoding them
// (cpu/quantized_rows.hpp): the scores of a key row and the sums of a value row equal those
// computed from the decoded row, within float's rounding (bounds derived below), on random and
// adversarial blocks and for every number of queries up to 9 (groups of four and the rest); and
// the kernels that use them equal the reference attention over the decoded rows.
//
// Built twice: test_quantized_rows with the test suite's flags (the portable loops, unless those
// flags target AVX2), and, where the compiler accepts -march=native, test_quantized_rows_native
// with the flags of the benchmarks and apps (KVLAB_TEST_NATIVE), where a CPU with AVX2 and FMA
// must get the AVX2 form: the test fails if it does not.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "kvlab/kvlab.hpp"
#include "test_support.hpp"

using kvlab::BlockQ4_0;
using kvlab::BlockQ8_0;
using kvlab::KVStorage;
using kvlab::RowMatrix;

namespace {

// Rows of head_dim values of the kinds the error bounds of kv_storage.hpp are checked on: random
// in [-1, 1), one outlier among small values, all equal, zeros, float subnormals, and values at
// the largest magnitude the storage holds.
std::vector<std::vector<float>> test_rows(int head_dim, float largest, kvlab::Rng& rng) {
  std::vector<std::vector<float>> rows;
  const RowMatrix<float> random = kvlab::random_matrix<float>(6, head_dim, rng);
  for (int r = 0; r < 6; ++r)
    rows.emplace_back(random.row(r).data(), random.row(r).data() + head_dim);
  std::vector<float> outlier(head_dim, 1e-3f);
  outlier[static_cast<std::size_t>(head_dim / 3)] = -50.f;
  rows.push_back(outlier);
  rows.emplace_back(head_dim, 0.75f);
  rows.emplace_back(head_dim, 0.f);
  std::vector<float> tiny(head_dim);
  for (int i = 0; i < head_dim; ++i)
    tiny[static_cast<std::size_t>(i)] = (i % 2 ? 1 : -1) * 1e-40f * float(i);
  rows.push_back(tiny);
  std::vector<float> large(head_dim);
  for (int i = 0; i < head_dim; ++i)
    large[static_cast<std::size_t>(i)] = (i % 3 ? largest : -largest) / float(1 + i % 5);
  rows.push_back(large);
  return rows;
}

template <typename S>
float largest_storable();
template <>
float largest_storable<BlockQ8_0>() {
  return 127.f * 65504.f;
}
template <>
float largest_storable<BlockQ4_0>() {
  return 8.f * 65504.f;
}

// A row stored as S, and what it holds, decoded in double.
template <typename S>
struct Stored {
  std::vector<S> row;           // [head_dim / 32] blocks
  std::vector<double> decoded;  // [head_dim]
  explicit Stored(const std::vector<float>& values)
      : row(values.size() / 32), decoded(values.size()) {
    const int head_dim = static_cast<int>(values.size());
    KVStorage<S>::encode(values.data(), head_dim, row.data());
    KVStorage<S>::decode(row.data(), head_dim, decoded.data());
  }
};

// Calls f(head_dim, count, stored) for every row of test_rows at each head_dim, stored as S, and
// every number of queries from 1 to 9 (groups of four and the rest).
template <typename S, typename F>
void for_each_case(std::initializer_list<int> head_dims, kvlab::Rng& rng, F&& f) {
  for (int head_dim : head_dims)
    for (const std::vector<float>& values : test_rows(head_dim, largest_storable<S>(), rng)) {
      const Stored<S> stored(values);
      for (int count = 1; count <= 9; ++count) {
        CAPTURE(head_dim, count);
        f(head_dim, count, stored);
      }
    }
}

}  // namespace

TEST_CASE("this build reads quantized rows in the form its flags select") {
#if defined(KVLAB_TEST_NATIVE) && (defined(__x86_64__) || defined(__i386__))
  // Built with -march=native: on a CPU with AVX2 and FMA the kernels must use them.
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    CHECK(kvlab::cpu::detail::kQuantizedRowsAvx2);
  } else {
    WARN("this CPU has no AVX2 with FMA: the portable form is tested");
  }
#endif
  INFO("quantized rows read with "
       << (kvlab::cpu::detail::kQuantizedRowsAvx2 ? "AVX2" : "plain loops"));
  CHECK(kvlab::cpu::detail::kQuantizedRowsAvx2 == (KVLAB_QUANTIZED_ROWS_AVX2 != 0));
}

// Bounds. Both functions compute, in float, sums of the products that the decoded row would give
// (each product q_i · d x_i exact up to one rounding), in some order. A float sum of n terms, each
// carrying at most m roundings, is within γ_{n+m} · Σ|terms| of the exact sum, with γ_k = k u /
// (1 − k u) and u = 2^-24 (Higham, Accuracy and Stability of Numerical Algorithms, §3.1). For a
// score: n = head_dim products, m = 3 (the product by the level, by d, by the scale), so
//   |score − exact| <= γ_{head_dim+3} · scale · Σ_i |q_i · x̂_i|.
// For a value row added to a sum a: two roundings per element (w·d, then the fused multiply-add;
// three without FMA), so |a' − (a + w x̂)| <= γ_3 (|a| + |w x̂|).
TEMPLATE_TEST_CASE("a quantized key row scores every query as its decoded row does", "", BlockQ8_0,
                   BlockQ4_0) {
  using S = TestType;
  constexpr double u = 0x1p-24;
  const auto gamma = [&](int k) { return k * u / (1 - k * u); };
  kvlab::Rng rng(17);
  for_each_case<S>({32, 64, 128}, rng, [&](int head_dim, int count, const Stored<S>& stored) {
    const RowMatrix<float> queries = kvlab::random_matrix<float>(count, head_dim, rng, -2, 2);
    const float scale = 0.125f;
    std::vector<float> out(static_cast<std::size_t>(2 * count), -7.f);  // every other entry written
    kvlab::cpu::detail::score_quantized_row(stored.row.data(), head_dim, queries.data(), count,
                                            scale, out.data(), 2);
    for (int c = 0; c < count; ++c) {
      double exact = 0, magnitude = 0;
      for (int i = 0; i < head_dim; ++i) {
        const double product = double(queries(c, i)) * stored.decoded[static_cast<std::size_t>(i)];
        exact += product;
        magnitude += std::fabs(product);
      }
      const double got = out[static_cast<std::size_t>(2 * c)];
      CHECK(std::fabs(got - scale * exact) <= gamma(head_dim + 3) * scale * magnitude);
      CHECK(out[static_cast<std::size_t>(2 * c + 1)] == -7.f);  // the stride is followed
    }
  });
}

TEMPLATE_TEST_CASE("a quantized value row adds to every query's sum as its decoded row does", "",
                   BlockQ8_0, BlockQ4_0) {
  using S = TestType;
  constexpr double u = 0x1p-24;
  const double gamma3 = 3 * u / (1 - 3 * u);
  kvlab::Rng rng(19);
  for_each_case<S>({32, 96}, rng, [&](int head_dim, int count, const Stored<S>& stored) {
    const RowMatrix<float> weights =
        kvlab::random_matrix<float>(count, 3, rng, 0, 1);  // column 1 used
    RowMatrix<float> acc = kvlab::random_matrix<float>(count, head_dim, rng, -4, 4);
    const RowMatrix<float> before = acc;
    kvlab::cpu::detail::add_quantized_row(stored.row.data(), head_dim, weights.data() + 1, 3, count,
                                          acc.data());
    for (int c = 0; c < count; ++c)
      for (int i = 0; i < head_dim; ++i) {
        const double term = double(weights(c, 1)) * stored.decoded[static_cast<std::size_t>(i)];
        const double want = double(before(c, i)) + term;
        CHECK(std::fabs(acc(c, i) - want) <= gamma3 * (std::fabs(before(c, i)) + std::fabs(term)));
      }
  });
}

// Through the kernels: decode steps and a prefill chunk, GQA groups of 1, 4 and 6 queries (a
// group of four and two left over), contiguous and paged (NHD: the rows of all heads of a token
// at once), against the reference over the decoded rows. Tolerance 1e-5 relative to the row's
// largest value, the rule of every float comparison (test_support.hpp).
TEMPLATE_TEST_CASE(
    "decode and paged attention over quantized rows equal the reference over the decoded rows", "",
    BlockQ8_0, BlockQ4_0) {
  using S = TestType;
  for (int group : {1, 4, 6}) {
    const kvlab::AttentionShape shape(2 * group, 2, 64);
    const int kv_len = 90, hd = shape.head_dim();
    kvlab::Rng rng(23);
    const RowMatrix<float> k = kvlab::random_matrix<float>(kv_len, shape.kv_width(), rng, -2, 2);
    const RowMatrix<float> v = kvlab::random_matrix<float>(kv_len, shape.kv_width(), rng);
    kvlab::ContiguousKVCache<float, S> cache(1, shape.num_kv_heads(), hd, kv_len);
    cache.append(0, k, v);
    RowMatrix<float> k_back(kv_len, shape.kv_width()), v_back(kv_len, shape.kv_width());
    for (int t = 0; t < kv_len; ++t)
      for (int h = 0; h < shape.num_kv_heads(); ++h) {
        KVStorage<S>::decode(cache.view(0).key(h, t), hd, &k_back(t, h * hd));
        KVStorage<S>::decode(cache.view(0).value(h, t), hd, &v_back(t, h * hd));
      }
    kvlab::PagedKVCache<float, S> pool(1, shape.num_kv_heads(), hd, 7, 16, kvlab::KVLayout::NHD);
    const int seq = pool.add_sequence();
    pool.append(seq, k, v);
    for (int q_len : {1, 7}) {
      CAPTURE(group, q_len);
      const RowMatrix<float> q = kvlab::random_matrix<float>(q_len, shape.q_width(), rng);
      const RowMatrix<float> want =
          kvlab::cpu::reference_attention(shape, q, k_back, v_back, kv_len - q_len);
      CHECK(kvlab_test::max_row_relative_error(
                kvlab::cpu::decode_attention(shape, q, cache.view(0)), want) <= 1e-5);
      const kvlab::BlockTables tables = pool.tables({seq});
      const RowMatrix<float> paged =
          kvlab::cpu::paged_prefill_attention(shape, q, {0, q_len}, pool.view(0, tables));
      CHECK(kvlab_test::max_row_relative_error(paged, want) <= 1e-5);
    }
  }
}
