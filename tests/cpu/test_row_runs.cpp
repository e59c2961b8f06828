// How the attention kernels read runs of K/V rows (cpu/row_runs.hpp) stored as q8_0 / q4_0
// blocks (without decoding them), fp32, fp16 and bf16: the scores of a run of key rows and the
// sums of a run of value rows equal those computed from the decoded rows, within float's rounding
// (bounds derived below), on random and adversarial rows, for runs shorter than, equal to and
// longer than the run the kernels hand over, and for every number of queries up to 9 (groups of
// four and the rest); and the kernels that use them equal the reference attention over the
// decoded rows, each case asserting which of attend_partial's three ways (runs, matrix products,
// one row at a time) it took.
//
// Built twice: test_row_runs with the test suite's flags (the portable loops, unless those
// flags target AVX2), and, where the compiler accepts -march=native, test_row_runs_native
// with the flags of the benchmarks and apps (KVLAB_TEST_NATIVE), where a CPU with AVX2 and FMA
// must get the AVX2 form (and fp16 rows too where it has F16C): the test fails if it does not.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <type_traits>
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
template <>
float largest_storable<Eigen::half>() {
  return 65504.f;
}
// fp32 and bf16 hold far more; 1e30 keeps a score's sum of 128 products of queries up to 2 finite
template <>
float largest_storable<Eigen::bfloat16>() {
  return 1e30f;
}
template <>
float largest_storable<float>() {
  return 1e30f;
}

// Rows stored as S, and what they hold, decoded in double.
template <typename S>
struct StoredRows {
  std::vector<std::vector<S>> stored;        // [rows][head_dim / KVStorage<S>::kValues]
  std::vector<std::vector<double>> decoded;  // [rows][head_dim]
  std::vector<const S*> rows;                // [rows]: stored[r].data()
  explicit StoredRows(const std::vector<std::vector<float>>& values) {
    for (const std::vector<float>& row : values) {
      const int head_dim = static_cast<int>(row.size());
      stored.emplace_back(row.size() / static_cast<std::size_t>(KVStorage<S>::kValues));
      decoded.emplace_back(row.size());
      KVStorage<S>::encode(row.data(), head_dim, stored.back().data());
      KVStorage<S>::decode(stored.back().data(), head_dim, decoded.back().data());
    }
    for (const std::vector<S>& row : stored) rows.push_back(row.data());
  }
};

// Calls f(head_dim, count, rows, begin, run) at each head_dim for runs [begin, begin + run) of the
// rows of test_rows taken twice (22 rows) stored as S, cut into runs of 1, 2, 4, 5, 16 (the run
// the kernels hand over), 17 and 22 rows, and every number of queries from 1 to 9 (groups of four
// and the rest).
template <typename S, typename F>
void for_each_case(std::initializer_list<int> head_dims, kvlab::Rng& rng, F&& f) {
  static_assert(kvlab::cpu::detail::kRowRun == 16, "the runs below cross it");
  for (int head_dim : head_dims) {
    std::vector<std::vector<float>> values = test_rows(head_dim, largest_storable<S>(), rng);
    const std::vector<std::vector<float>> again = test_rows(head_dim, largest_storable<S>(), rng);
    values.insert(values.end(), again.begin(), again.end());
    const StoredRows<S> rows(values);
    const int total = static_cast<int>(values.size());
    for (int run : {1, 2, 4, 5, 16, 17, 22})
      for (int begin = 0; begin < total; begin += run)
        for (int count = 1; count <= 9; ++count) {
          const int length = std::min(run, total - begin);
          CAPTURE(head_dim, count, begin, length);
          f(head_dim, count, rows, begin, length);
        }
  }
}
}  // namespace

TEST_CASE("this build reads runs of rows in the form its flags select") {
  using kvlab::cpu::detail::kVectorRows;
#if defined(KVLAB_TEST_NATIVE) && (defined(__x86_64__) || defined(__i386__))
  // Built with -march=native: on a CPU with AVX2 and FMA the kernels must use them.
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    CHECK(kvlab::cpu::detail::kRowRunsAvx2);
    if (__builtin_cpu_supports("f16c")) CHECK(kVectorRows<float, Eigen::half>);
  } else {
    WARN("this CPU has no AVX2 with FMA: the portable form is tested");
  }
#endif
  INFO("runs of rows read with " << (kvlab::cpu::detail::kRowRunsAvx2 ? "AVX2" : "plain loops"));
  CHECK(kvlab::cpu::detail::kRowRunsAvx2 == (KVLAB_ROW_RUNS_AVX2 != 0));
  // the vector form covers the stored types of float queries read in runs, and no double queries
  const bool avx2 = kvlab::cpu::detail::kRowRunsAvx2;
  CHECK(kVectorRows<float, float> == avx2);
  CHECK(kVectorRows<float, Eigen::half> == (avx2 && kvlab::cpu::detail::kRowRunsF16c));
  CHECK(kVectorRows<float, Eigen::bfloat16> == avx2);
  CHECK(kVectorRows<float, BlockQ8_0> == avx2);
  CHECK(kVectorRows<float, BlockQ4_0> == avx2);
  CHECK_FALSE(kVectorRows<double, double>);
  CHECK_FALSE(kVectorRows<double, BlockQ8_0>);
}

TEST_CASE("the rows asked for ahead are the rows the walk reads later") {
  using kvlab::cpu::detail::kPrefetchAhead;
  using kvlab::cpu::detail::kPrefetchFar;
  using kvlab::cpu::detail::rows_ahead;
  // kPrefetchAhead (into the L1) and kPrefetchFar (into the L2) bytes in whole rows, at least one
  // (none when that ask is off)
  for (const std::size_t row_bytes :
       {std::size_t{136}, std::size_t{256}, std::size_t{512}, std::size_t{4096}}) {
    INFO("rows of " << row_bytes << " bytes, kPrefetchAhead " << kPrefetchAhead << ", kPrefetchFar "
                    << kPrefetchFar);
    const int expected =
        kPrefetchAhead == 0 ? 0 : std::max(1, static_cast<int>(kPrefetchAhead / row_bytes));
    CHECK(rows_ahead(row_bytes) == expected);
    CHECK(rows_ahead(row_bytes, kPrefetchAhead) == expected);
    const int expected_far =
        kPrefetchFar == 0 ? 0 : std::max(1, static_cast<int>(kPrefetchFar / row_bytes));
    CHECK(rows_ahead(row_bytes, kPrefetchFar) == expected_far);
  }
  CHECK(rows_ahead(512, 4096) == 8);   // a page of 128-value fp32 rows
  CHECK(rows_ahead(256, 4096) == 16);  // of fp16 rows
  CHECK(rows_ahead(512, 0) == 0);
  // key_later / value_later (the rows asked for) against the rows keys() / values() hand over
  // (the rows read), for every position and several distances (the L1's and the L2's: rows of
  // 256 bytes are 4 and 16 apart), in a contiguous cache, its ring,
  // and both pool layouts with blocks in a scrambled order (rows ahead in the same block and in a
  // later one)
  constexpr int kHeads = 3, kHeadDim = 32, kTokens = 37;
  std::vector<float> k(static_cast<std::size_t>(kHeads) * 64 * kHeadDim);  // room for every layout
  std::vector<float> v(k.size());
  const auto check_source = [&](const auto& source, int head) {
    INFO("head " << head);
    std::vector<const float*> keys, values;  // [kTokens]: the rows read at each position
    source.keys(0, kTokens, [&](int, const float* row) { keys.push_back(row); });
    source.values(0, kTokens, [&](int, const float* row) { values.push_back(row); });
    REQUIRE(keys.size() == static_cast<std::size_t>(kTokens));
    REQUIRE(values.size() == static_cast<std::size_t>(kTokens));
    for (const int ahead : {1, 2, 7, 9, 16, 33})  // up to 4 blocks on
      for (int pos = 0; pos + ahead < kTokens; ++pos) {
        INFO("position " << pos << ", " << ahead << " ahead");
        const auto at = static_cast<std::size_t>(pos);
        CHECK(source.key_later(pos, keys[at], ahead) == keys[at + static_cast<std::size_t>(ahead)]);
        CHECK(source.value_later(pos, values[at], ahead) ==
              values[at + static_cast<std::size_t>(ahead)]);
      }
  };
  for (const int window : {0, 16}) {
    kvlab::ContiguousKVView<float> view;
    view.k = k.data();
    view.v = v.data();
    view.num_kv_heads = kHeads;
    view.head_dim = kHeadDim;
    view.capacity = window > 0 ? window : 64;
    view.length = kTokens;
    view.window = window;
    static_assert(kvlab::cpu::detail::ContiguousRows<float>::asks_ahead(), "a contiguous cache");
    for (int head = 0; head < kHeads; ++head)
      check_source(kvlab::cpu::detail::ContiguousRows<float>{view, head}, head);
  }
  for (const kvlab::KVLayout layout : {kvlab::KVLayout::NHD, kvlab::KVLayout::HND}) {
    constexpr int kBlock = 8;
    const std::vector<std::int32_t> indptr = {0, 5};
    const std::vector<std::int32_t> indices = {3, 0, 7, 5, 1};  // 5 blocks of 8 hold 37 tokens
    const std::vector<std::int32_t> last = {kTokens - 4 * kBlock};
    kvlab::PagedKVView<float> view;
    view.k = k.data();
    view.v = v.data();
    view.num_blocks = 8;
    view.block_size = kBlock;
    view.num_kv_heads = kHeads;
    view.head_dim = kHeadDim;
    view.batch = 1;
    view.indptr = indptr.data();
    view.indices = indices.data();
    view.last_page_len = last.data();
    view.layout = layout;
    const kvlab::cpu::detail::PagedRows<float> first{view, 0, 0};
    CHECK(first.asks_ahead() == (layout == kvlab::KVLayout::HND));  // not where a token is one read
    for (int head = 0; head < kHeads; ++head)
      check_source(kvlab::cpu::detail::PagedRows<float>{view, 0, head}, head);
  }
}

TEST_CASE("a decode step asks for rows ahead exactly where the rules say it does") {
  // kPrefetchMinBytes per head decides: a contiguous fp32 cache of 2 heads of 128 values holds
  // 512 bytes per row, so 128 rows are 64 KiB; rows of quantized blocks never ask (the NHD pool
  // neither: `asks_ahead`, checked above); rows read in runs ask only near, not far, and rows read
  // one by one ask far from kPrefetchFarMinBytes per head on.
  using kvlab::cpu::detail::attend_path_counts;
  using kvlab::cpu::detail::kPrefetchAhead;
  using kvlab::cpu::detail::kPrefetchMinBytes;
  const kvlab::AttentionShape shape(8, 2, 128);
  using kvlab::cpu::detail::kPrefetchFarMinBytes;
  // ranges over kPrefetchFarMinBytes (near and far asks), between the two minimums (near asks
  // only), under kPrefetchMinBytes (none)
  const int far_len = static_cast<int>(kPrefetchFarMinBytes / 512) + 8;
  const int long_len = static_cast<int>(kPrefetchMinBytes / 512) + 8;
  const int short_len = static_cast<int>(kPrefetchMinBytes / 512) / 2;
  const auto asked = [](const std::function<void()>& f) {
    const std::uint64_t before = attend_path_counts().asked_ahead.load();
    f();
    return attend_path_counts().asked_ahead.load() > before;
  };
  const auto asked_far = [](const std::function<void()>& f) {
    const std::uint64_t before = attend_path_counts().asked_far.load();
    f();
    return attend_path_counts().asked_far.load() > before;
  };
  // Far asks (into the L2, kPrefetchFar) only where rows are read one by one: an MHA step, and a
  // GQA group of 4 where this build has no vector form for runs of fp32 rows.
  const kvlab::AttentionShape mha(2, 2, 128);
  const bool gqa_by_runs = kvlab::cpu::detail::kVectorRows<float, float>;
  kvlab::Rng rng(41);
  for (const int len : {far_len, long_len, short_len}) {
    INFO(len << " tokens");
    kvlab::ContiguousKVCache<float> fp32(1, shape.num_kv_heads(), shape.head_dim(), len);
    kvlab::ContiguousKVCache<float, BlockQ8_0> q8(1, shape.num_kv_heads(), shape.head_dim(), len);
    const RowMatrix<float> k = kvlab::random_matrix<float>(len, shape.kv_width(), rng);
    const RowMatrix<float> v = kvlab::random_matrix<float>(len, shape.kv_width(), rng);
    fp32.append(0, k, v);
    q8.append(0, k, v);
    const RowMatrix<float> q = kvlab::random_matrix<float>(1, shape.q_width(), rng);
    const bool expected = kPrefetchAhead > 0 && len != short_len;
    CHECK(asked([&] { kvlab::cpu::decode_attention(shape, q, fp32.view(0)); }) == expected);
    CHECK_FALSE(asked([&] { kvlab::cpu::decode_attention(shape, q, q8.view(0)); }));
    const bool far = expected && kvlab::cpu::detail::kPrefetchFar > 0 && len == far_len;
    CHECK(asked_far([&] { kvlab::cpu::decode_attention(shape, q, fp32.view(0)); }) ==
          (far && !gqa_by_runs));
    CHECK_FALSE(asked_far([&] { kvlab::cpu::decode_attention(shape, q, q8.view(0)); }));
    // the same cache read by an MHA step: its 2 K/V heads with one query each
    const RowMatrix<float> q_mha = kvlab::random_matrix<float>(1, mha.q_width(), rng);
    CHECK(asked([&] { kvlab::cpu::decode_attention(mha, q_mha, fp32.view(0)); }) == expected);
    CHECK(asked_far([&] { kvlab::cpu::decode_attention(mha, q_mha, fp32.view(0)); }) == far);
  }
}

// Bounds. Both functions compute, in float, sums of the products that the decoded rows would give
// (each product q_i · d x_i exact up to one rounding), in some order. A float sum of n terms, each
// carrying at most m roundings, is within γ_{n+m} · Σ|terms| of the exact sum, with γ_k = k u /
// (1 − k u) and u = 2^-24 (Higham, Accuracy and Stability of Numerical Algorithms, §3.1). For a
// score: n = head_dim products, m = 3 (the product by the level, by d, by the scale; fp32, fp16
// and bf16 rows have no d, so fewer), so
//   |score − exact| <= γ_{head_dim+3} · scale · Σ_i |q_i · x̂_i|.
// For a run of R value rows added to a sum a: R + 1 terms, each product with two roundings (w·d,
// then the product by the level, inside the fused multiply-add or not), so
//   |a' − (a + Σ_r w_r x̂_r)| <= γ_{R+2} (|a| + Σ_r |w_r x̂_r|).
TEMPLATE_TEST_CASE("a run of key rows scores every query as the decoded rows do", "", BlockQ8_0,
                   BlockQ4_0, float, Eigen::half, Eigen::bfloat16) {
  using S = TestType;
  constexpr double u = 0x1p-24;
  const auto gamma = [&](int k) { return k * u / (1 - k * u); };
  kvlab::Rng rng(17);
  for_each_case<S>(
      {32, 64, 128}, rng,
      [&](int head_dim, int count, const StoredRows<S>& rows, int begin, int run) {
        const RowMatrix<float> queries = kvlab::random_matrix<float>(count, head_dim, rng, -2, 2);
        const float scale = 0.125f;
        const int stride = run + 3;  // the entries past the run must stay untouched
        std::vector<float> out(static_cast<std::size_t>(count * stride), -7.f);
        kvlab::cpu::detail::score_row_run(rows.rows.data() + begin, run, head_dim, queries.data(),
                                          count, scale, out.data(), stride);
        for (int c = 0; c < count; ++c) {
          for (int r = 0; r < run; ++r) {
            const std::vector<double>& decoded = rows.decoded[static_cast<std::size_t>(begin + r)];
            double exact = 0, magnitude = 0;
            for (int i = 0; i < head_dim; ++i) {
              const double product = double(queries(c, i)) * decoded[static_cast<std::size_t>(i)];
              exact += product;
              magnitude += std::fabs(product);
            }
            const double got = out[static_cast<std::size_t>(c * stride + r)];
            CHECK(std::fabs(got - scale * exact) <= gamma(head_dim + 3) * scale * magnitude);
          }
          for (int r = run; r < stride; ++r)
            CHECK(out[static_cast<std::size_t>(c * stride + r)] == -7.f);  // the stride is followed
        }
      });
}

TEMPLATE_TEST_CASE("a run of value rows adds to every query's sum as the decoded rows do", "",
                   BlockQ8_0, BlockQ4_0, float, Eigen::half, Eigen::bfloat16) {
  using S = TestType;
  constexpr double u = 0x1p-24;
  const auto gamma = [&](int k) { return k * u / (1 - k * u); };
  kvlab::Rng rng(19);
  for_each_case<S>(
      {32, 96}, rng, [&](int head_dim, int count, const StoredRows<S>& rows, int begin, int run) {
        // [count, run + 2]: columns 1 .. run are the weights (the stride is followed)
        const RowMatrix<float> weights = kvlab::random_matrix<float>(count, run + 2, rng, 0, 1);
        RowMatrix<float> acc = kvlab::random_matrix<float>(count, head_dim, rng, -4, 4);
        const RowMatrix<float> before = acc;
        kvlab::cpu::detail::add_row_run(rows.rows.data() + begin, run, head_dim, weights.data() + 1,
                                        run + 2, count, acc.data());
        // asking for the rows first (or not, as in the NHD pool) changes nothing in the sums
        RowMatrix<float> unasked = before;
        kvlab::cpu::detail::add_row_run(rows.rows.data() + begin, run, head_dim, weights.data() + 1,
                                        run + 2, count, unasked.data(), /*prefetch=*/false);
        CHECK(unasked == acc);
        for (int c = 0; c < count; ++c)
          for (int i = 0; i < head_dim; ++i) {
            double want = before(c, i), magnitude = std::fabs(before(c, i));
            for (int r = 0; r < run; ++r) {
              const double term =
                  double(weights(c, 1 + r)) *
                  rows.decoded[static_cast<std::size_t>(begin + r)][static_cast<std::size_t>(i)];
              want += term;
              magnitude += std::fabs(term);
            }
            CHECK(std::fabs(acc(c, i) - want) <= gamma(run + 2) * magnitude);
          }
      });
}

// Through the kernels: decode steps and a prefill chunk, GQA groups of 1, 4 and 6 queries (a
// group of four and two left over), contiguous and paged (NHD: the rows of all heads of a token
// at once), without a window and with one (W = 20: the rows that a prefill chunk's queries see
// change from key to key, which cuts the kernels' runs of rows), against the reference over the
// decoded rows. Tolerance 1e-5 relative to the row's largest value, the rule of every float
// comparison (test_support.hpp).
// The three ways attend_partial reads K/V rows (attention_tile.hpp), and the one it must take:
// runs for quantized rows, and for fp32 (groups of 4 or more), fp16 and bf16 rows where the
// build has their vector form and head_dim is whole blocks of 32; matrix products for other
// fp32 rows under a tile of several query rows (a prefill); one row at a time otherwise.
enum class Path { runs, products, rows };
const char* path_name(Path p) {
  return p == Path::runs ? "runs" : p == Path::products ? "products" : "rows";
}
template <typename S>
Path expected_path(int head_dim, int group, int q_len) {
  constexpr bool fp32 = std::is_same<S, float>::value;
  if (kvlab::cpu::detail::kQuantizedStorage<S>) return Path::runs;
  if (kvlab::cpu::detail::kVectorRows<float, S> && head_dim % 32 == 0 && (!fp32 || group >= 4))
    return Path::runs;
  return fp32 && q_len > 1 ? Path::products : Path::rows;
}
// Whether each path ran (its count grew) during f().
std::array<bool, 3> paths_taken(const std::function<void()>& f) {
  auto& c = kvlab::cpu::detail::attend_path_counts();
  const std::array<std::uint64_t, 3> before = {c.runs.load(), c.products.load(), c.rows.load()};
  f();
  return {c.runs.load() > before[0], c.products.load() > before[1], c.rows.load() > before[2]};
}
std::array<bool, 3> only(Path p) { return {p == Path::runs, p == Path::products, p == Path::rows}; }

TEMPLATE_TEST_CASE(
    "decode and paged attention over rows read in runs equal the reference over the decoded rows",
    "", BlockQ8_0, BlockQ4_0, float, Eigen::half, Eigen::bfloat16) {
  using S = TestType;
  // fp32, fp16 and bf16 rows are read in runs when head_dim is whole blocks of 32 and the build
  // has their vector form (fp32: for groups of 4 or 6, not 1), one by one otherwise (40, and 12:
  // the one-by-one loop's vectors of 8 and its rest of 4)
  const std::vector<int> head_dims = kvlab::cpu::detail::kQuantizedStorage<S>
                                         ? std::vector<int>{64}
                                         : std::vector<int>{64, 40, 12};
  for (int head_dim : head_dims)
    for (int group : {1, 4, 6})
      for (int window : {0, 20}) {
        const kvlab::AttentionShape shape(2 * group, 2, head_dim);
        const int kv_len = 90, hd = shape.head_dim();
        kvlab::Rng rng(23);
        const RowMatrix<float> k =
            kvlab::random_matrix<float>(kv_len, shape.kv_width(), rng, -2, 2);
        const RowMatrix<float> v = kvlab::random_matrix<float>(kv_len, shape.kv_width(), rng);
        // a ring of kv_len + W slots takes the kv_len keys in one chunk, without wrapping
        kvlab::ContiguousKVCache<float, S> cache(1, shape.num_kv_heads(), hd, kv_len + window,
                                                 window);
        cache.append(0, k, v);
        RowMatrix<float> k_back(kv_len, shape.kv_width()), v_back(kv_len, shape.kv_width());
        for (int t = 0; t < kv_len; ++t)
          for (int h = 0; h < shape.num_kv_heads(); ++h) {
            KVStorage<S>::decode(cache.view(0).key(h, t), hd, &k_back(t, h * hd));
            KVStorage<S>::decode(cache.view(0).value(h, t), hd, &v_back(t, h * hd));
          }
        kvlab::PagedKVCache<float, S> pool(1, shape.num_kv_heads(), hd, 7, 16, kvlab::KVLayout::NHD,
                                           window);
        const int seq = pool.add_sequence();
        pool.append(seq, k, v);
        for (int q_len : {1, 7}) {
          CAPTURE(head_dim, group, window, q_len);
          const RowMatrix<float> q = kvlab::random_matrix<float>(q_len, shape.q_width(), rng);
          const RowMatrix<float> want =
              kvlab::cpu::reference_attention(shape, q, k_back, v_back, kv_len - q_len, window);
          const Path path = expected_path<S>(head_dim, group, q_len);
          CAPTURE(path_name(path));
          RowMatrix<float> got;
          CHECK(paths_taken([&] { got = kvlab::cpu::decode_attention(shape, q, cache.view(0)); }) ==
                only(path));
          CHECK(kvlab_test::max_row_relative_error(got, want) <= 1e-5);
          const kvlab::BlockTables tables = pool.tables({seq});
          CHECK(paths_taken([&] {
                  got = kvlab::cpu::paged_prefill_attention(shape, q, {0, q_len},
                                                            pool.view(0, tables));
                }) == only(path));
          CHECK(kvlab_test::max_row_relative_error(got, want) <= 1e-5);
        }
      }
}
