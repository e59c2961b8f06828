// How K/V values are stored (kv_storage.hpp): fp16 and bf16 round to nearest even, checked bit
// for bit against an independent rounding written here; q8_0 and q4_0 keep every value within
// the bound derived in kv_storage.hpp, checked on random and adversarial rows; the caches refuse
// what a storage cannot hold and change nothing; attention over a reduced-precision cache stays
// within the output bound that follows from the per-value bounds (derived below), and equals
// the attention over the decoded rows.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kvlab/kvlab.hpp"
#include "test_support.hpp"

using kvlab::AttentionShape;
using kvlab::BlockQ4_0;
using kvlab::BlockQ8_0;
using kvlab::KVStorage;
using kvlab::RowMatrix;
using kvlab_test::names;

namespace {

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// The value of fp16 bits, decoded by hand (sign, 5-bit exponent, 10-bit fraction): independent
// of Eigen's conversion.
double half_to_double(std::uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1F, fraction = h & 0x3FF;
  const double magnitude = exponent == 0 ? std::ldexp(fraction, -24)  // subnormal
                                         : std::ldexp(1024 + fraction, exponent - 25);
  return sign ? -magnitude : magnitude;
}

// fp16 rounding to nearest even, by comparing distances in double to the two fp16 neighbours
// (every float and every fp16 value is exact in double, and so are the distances): the test's
// independent conversion. NaN gives 0x7E00 (any NaN is accepted), overflow ±Inf.
std::uint16_t half_bits_expected(float x) {
  if (std::isnan(x)) return 0x7E00;
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  // the largest finite fp16 value <= a: search the 0x7C00 finite magnitudes (ordered as bits)
  std::uint16_t lo = 0, hi = 0x7BFF;
  if (a >= half_to_double(0x7BFF)) {
    lo = 0x7BFF;
  } else {
    while (lo < hi) {  // invariant: value(lo) <= a < value(hi + 1)
      const std::uint16_t mid = static_cast<std::uint16_t>((lo + hi + 1) / 2);
      if (half_to_double(mid) <= a)
        lo = mid;
      else
        hi = static_cast<std::uint16_t>(mid - 1);
    }
  }
  const double below = half_to_double(lo);
  // the next value up: fp16's next step, or 65536 (the rounding edge to Inf) past 65504
  const double above = lo == 0x7BFF ? 65536.0 : half_to_double(static_cast<std::uint16_t>(lo + 1));
  const double to_below = a - below, to_above = above - a;
  std::uint16_t magnitude = lo;
  if (to_above < to_below || (to_above == to_below && (lo & 1) != 0)) magnitude = lo + 1;
  if (magnitude >= 0x7C00) return static_cast<std::uint16_t>(sign | 0x7C00);  // overflow: Inf
  return static_cast<std::uint16_t>(sign | magnitude);
}

// bf16 rounding to nearest even, by distances in double to the two bf16 neighbours (bf16 values
// are the floats whose low 16 bits are zero).
std::uint16_t bf16_bits_expected(float x) {
  if (std::isnan(x)) return 0x7FC0;
  if (std::isinf(x)) return static_cast<std::uint16_t>(bits_of(x) >> 16);
  const std::uint32_t u = bits_of(x);
  const std::uint32_t lower = u & 0xFFFF0000u;
  const double below = std::fabs(static_cast<double>(float_of(lower)));
  // the next bf16 magnitude up, as an exact double (2^128 past the largest finite one)
  const std::uint32_t upper_bits = (lower & 0x7FFFFFFFu) + 0x10000u;
  const double above =
      upper_bits >= 0x7F800000u ? std::ldexp(1.0, 128) : static_cast<double>(float_of(upper_bits));
  const double a = std::fabs(static_cast<double>(x));
  const double to_below = a - below, to_above = above - a;
  std::uint32_t result = lower;
  if (to_above < to_below || (to_above == to_below && (lower & 0x10000u) != 0)) {
    result = (u & 0x80000000u) | upper_bits;  // may become Inf: the float's own encoding
  }
  return static_cast<std::uint16_t>(result >> 16);
}

std::uint16_t half_bits_got(float x) {
  Eigen::half h;
  KVStorage<Eigen::half>::encode(&x, 1, &h);
  return Eigen::numext::bit_cast<std::uint16_t>(h);
}
std::uint16_t bf16_bits_got(float x) {
  Eigen::bfloat16 b;
  KVStorage<Eigen::bfloat16>::encode(&x, 1, &b);
  return Eigen::numext::bit_cast<std::uint16_t>(b);
}

// The floats a rounding must get right: ±0, subnormals, every power of two in range, the
// midpoints between neighbours (ties) and one float either side, the overflow edges, ±Inf, NaN,
// and random floats over the whole exponent range.
std::vector<float> rounding_cases(bool half) {
  std::vector<float> xs = {0.f,
                           -0.f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::denorm_min(),
                           std::numeric_limits<float>::max(),
                           -std::numeric_limits<float>::max(),
                           65504.f,
                           65519.f,
                           65520.f,
                           65535.f,
                           1e-8f,
                           3e-8f,
                           6e-8f};
  for (int e = -149; e <= 127; ++e) xs.push_back(std::ldexp(1.f, e));
  if (half) {  // every fp16 magnitude and its midpoint with the next, exact in float
    for (std::uint32_t h = 0; h < 0x7BFF; ++h) {
      const double mid = (half_to_double(static_cast<std::uint16_t>(h)) +
                          half_to_double(static_cast<std::uint16_t>(h + 1))) /
                         2;
      const float m = static_cast<float>(mid);
      REQUIRE(static_cast<double>(m) == mid);
      for (float x : {m, std::nextafter(m, 0.f), std::nextafter(m, 1e9f),
                      static_cast<float>(half_to_double(static_cast<std::uint16_t>(h)))}) {
        xs.push_back(x);
        xs.push_back(-x);
      }
    }
  } else {  // a tie and its neighbours for many bf16 values over the whole range
    for (std::uint32_t hi = 0; hi < 0x7F80; hi += 7) {
      const std::uint32_t tie = (hi << 16) | 0x8000u;
      for (std::uint32_t u : {tie, tie - 1, tie + 1, hi << 16}) {
        xs.push_back(float_of(u));
        xs.push_back(-float_of(u));
      }
    }
  }
  kvlab::Rng rng(17);
  for (int i = 0; i < 200000; ++i) {  // random bit patterns: every exponent and fraction
    const auto u = static_cast<std::uint32_t>(rng.uniform(0.0, 4294967296.0));
    xs.push_back(float_of(u));
  }
  return xs;
}

// Adversarial and random rows of 64 values (two blocks of 32) for the quantized forms.
std::vector<std::vector<float>> quantization_rows() {
  std::vector<std::vector<float>> rows;
  kvlab::Rng rng(5);
  const auto random_row = [&](double scale) {
    std::vector<float> r(64);
    for (float& x : r) x = static_cast<float>(rng.uniform(-scale, scale));
    return r;
  };
  for (double scale : {1.0, 1e-3, 1e-6, 1e-9, 1e3, 1e5}) {
    for (int i = 0; i < 200; ++i) rows.push_back(random_row(scale));
  }
  rows.push_back(std::vector<float>(64, 0.f));     // zeros: d = 0, exact
  rows.push_back(std::vector<float>(64, 0.37f));   // all equal
  rows.push_back(std::vector<float>(64, -2.5f));   // all equal, negative
  rows.push_back(std::vector<float>(64, 1e-40f));  // float subnormals
  std::vector<float> outlier = random_row(1e-2);   // one outlier per block
  outlier[3] = 100.f;
  outlier[40] = -250.f;
  rows.push_back(outlier);
  std::vector<float> both_sides(64);  // ±m: q4_0's far side is clipped
  for (int i = 0; i < 64; ++i) both_sides[static_cast<std::size_t>(i)] = i % 2 ? 1.f : -1.f;
  rows.push_back(both_sides);
  std::vector<float> ramp(64);  // every level of both forms
  for (int i = 0; i < 64; ++i) ramp[static_cast<std::size_t>(i)] = static_cast<float>(i - 31) / 8;
  rows.push_back(ramp);
  std::vector<float> at_limit(64, 1.f);  // the largest accepted magnitudes
  at_limit[0] = 8.f * 65504.f;
  at_limit[32] = -8.f * 65504.f;
  rows.push_back(at_limit);
  std::vector<float> mixed = random_row(1.0);  // a tiny block beside a normal one
  for (int i = 32; i < 64; ++i) mixed[static_cast<std::size_t>(i)] *= 1e-30f;
  rows.push_back(mixed);
  return rows;
}

// The stored scale of a block, as the kernels read it.
template <typename Block>
double scale_of(const Block& block) {
  return static_cast<double>(kvlab::detail::half_value(block.d));
}

}  // namespace

TEST_CASE("fp16 storage rounds to nearest even, bit for bit against an independent rounding") {
  int checked = 0;
  for (float x : rounding_cases(true)) {
    const std::uint16_t want = half_bits_expected(x), got = half_bits_got(x);
    if (std::isnan(x)) {
      CHECK((got & 0x7C00) == 0x7C00);  // a NaN: exponent all ones, fraction not zero
      CHECK((got & 0x3FF) != 0);
    } else if (got != want) {
      FAIL("x = " << x << " (bits " << bits_of(x) << "): fp16 bits " << got << ", expected "
                  << want);
    }
    ++checked;
  }
  INFO(checked << " floats");
  CHECK(checked > 300000);
}

TEST_CASE("fp16 and bf16 decode every bit pattern exactly") {
  for (std::uint32_t h = 0; h <= 0xFFFF; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float got = kvlab::detail::half_bits_to_float(bits);
    const double want = (h & 0x7C00) == 0x7C00 ? 0.0 : half_to_double(bits);  // finite: by hand
    const float eigen = static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(bits));
    if ((h & 0x7C00) == 0x7C00) {  // ±Inf, NaN: as Eigen decodes them
      CHECK(std::isnan(got) == std::isnan(eigen));
      if (!std::isnan(got)) CHECK(bits_of(got) == bits_of(eigen));
    } else if (static_cast<double>(got) != want || bits_of(got) != bits_of(eigen)) {
      FAIL("fp16 bits " << h << ": got " << got << ", expected " << want);
    }
    const float b = kvlab::detail::bf16_bits_to_float(bits);
    if (!std::isnan(b)) CHECK(bits_of(b) == (h << 16));
  }
}

TEST_CASE("a quantization scale rounds up to the next fp16 value, bit for bit") {
  // half_bits_up(x) is the smallest fp16 value >= x (x >= 0 finite; +Inf beyond 65504). Checked
  // at every fp16 value v (v itself, the floats just below and just above it) and at 10^5
  // random floats of every binade, against the definition: value(h) >= x > value(h − 1).
  using kvlab::detail::half_bits_up;
  using kvlab::detail::half_value;
  const auto smallest_at_least = [](float x, std::uint16_t h) {
    return half_value(h) >= x && (h == 0 || half_value(static_cast<std::uint16_t>(h - 1)) < x);
  };
  for (std::uint32_t h = 0; h < 0x7C00; ++h) {  // every finite fp16 value >= 0
    const float v = half_value(static_cast<std::uint16_t>(h));
    CHECK(half_bits_up(v) == h);
    if (h > 0) CHECK(half_bits_up(std::nextafter(v, 0.f)) == h);
    CHECK(half_bits_up(std::nextafter(v, INFINITY)) == h + 1);  // past 65504: +Inf's bits
  }
  kvlab::Rng rng(12);
  for (int i = 0; i < 100000; ++i) {
    const auto bits = static_cast<std::uint32_t>(rng.next_u64() % 0x47800000u);  // [0, 65536)
    float x;
    std::memcpy(&x, &bits, sizeof x);
    const std::uint16_t h = half_bits_up(x);
    if (!smallest_at_least(x, h)) FAIL("x = " << x << " (bits " << bits << "): fp16 bits " << h);
  }
  CHECK(half_bits_up(0.f) == 0);
  CHECK(half_bits_up(1e-45f) == 1);        // a float subnormal: fp16's smallest step, 2^-24
  CHECK(half_bits_up(70000.f) == 0x7C00);  // beyond fp16: +Inf
}

TEST_CASE("bf16 storage rounds to nearest even, bit for bit against an independent rounding") {
  int checked = 0;
  for (float x : rounding_cases(false)) {
    const std::uint16_t want = bf16_bits_expected(x), got = bf16_bits_got(x);
    if (std::isnan(x)) {
      CHECK((got & 0x7F80) == 0x7F80);
      CHECK((got & 0x7F) != 0);
    } else if (got != want) {
      FAIL("x = " << x << " (bits " << bits_of(x) << "): bf16 bits " << got << ", expected "
                  << want);
    }
    ++checked;
  }
  CHECK(checked > 200000);
}

TEST_CASE("fp16 and bf16 keep every value within the stated bound, and decode exactly") {
  for (float x : rounding_cases(true)) {
    if (!std::isfinite(x) || std::fabs(x) >= 65520.f) continue;
    Eigen::half h;
    KVStorage<Eigen::half>::encode(&x, 1, &h);
    float back;
    KVStorage<Eigen::half>::decode(&h, 1, &back);
    CHECK(static_cast<double>(back) == half_to_double(Eigen::numext::bit_cast<std::uint16_t>(h)));
    double bound;
    KVStorage<Eigen::half>::error_bounds(&h, 1, &bound);
    CHECK(std::fabs(static_cast<double>(x) - back) <= bound);
  }
  for (float x : rounding_cases(false)) {
    if (!std::isfinite(x) || std::fabs(x) >= std::ldexp(1.f, 127) * (2.f - std::ldexp(1.f, -8)))
      continue;
    Eigen::bfloat16 b;
    KVStorage<Eigen::bfloat16>::encode(&x, 1, &b);
    float back;
    KVStorage<Eigen::bfloat16>::decode(&b, 1, &back);
    double bound;
    KVStorage<Eigen::bfloat16>::error_bounds(&b, 1, &bound);
    CHECK(std::fabs(static_cast<double>(x) - back) <= bound);
  }
}

TEST_CASE("q8_0 keeps every value within d / 2 of its block's stored scale, and the bound is met") {
  static_assert(sizeof(BlockQ8_0) == 34, "34 bytes per 32 values");
  CHECK(kvlab::stored_bits_per_value(kvlab::KVDtype::int8) == 8.5);
  double tightest = 0;  // the largest error / (d / 2) seen: the bound is not loose
  for (const std::vector<float>& row : quantization_rows()) {
    BlockQ8_0 blocks[2];
    KVStorage<BlockQ8_0>::encode(row.data(), 64, blocks);
    float back[64];
    double bound[64];
    KVStorage<BlockQ8_0>::decode(blocks, 64, back);
    KVStorage<BlockQ8_0>::error_bounds(blocks, 64, bound);
    for (int i = 0; i < 64; ++i) {
      const double d = scale_of(blocks[i / 32]);
      const double error =
          std::fabs(static_cast<double>(row[static_cast<std::size_t>(i)]) - back[i]);
      CHECK(bound[i] == d / 2);
      CHECK(error <= d / 2);
      CHECK(blocks[i / 32].q[i % 32] >= -127);
      if (d > 0) tightest = std::max(tightest, error / (d / 2));
    }
    for (int b = 0; b < 2; ++b) {  // d >= max|x| / 127: the scale is rounded up
      double max = 0;
      for (int i = 0; i < 32; ++i)
        max = std::max(max, std::fabs(double(row[static_cast<std::size_t>(32 * b + i)])));
      CHECK(scale_of(blocks[b]) * 127 >= max);
      if (max == 0) CHECK(scale_of(blocks[b]) == 0);
    }
  }
  INFO("largest error / (d / 2): " << tightest);
  CHECK(tightest > 0.95);
}

TEST_CASE("q4_0 keeps every value within |d| / 2, or |d| on the far side of its extreme") {
  static_assert(sizeof(BlockQ4_0) == 18, "18 bytes per 32 values");
  CHECK(kvlab::stored_bits_per_value(kvlab::KVDtype::int4) == 4.5);
  double tightest = 0;
  int clipped = 0;  // values on the far side, read back within |d| but not |d| / 2
  for (const std::vector<float>& row : quantization_rows()) {
    BlockQ4_0 blocks[2];
    KVStorage<BlockQ4_0>::encode(row.data(), 64, blocks);
    float back[64];
    double bound[64];
    KVStorage<BlockQ4_0>::decode(blocks, 64, back);
    KVStorage<BlockQ4_0>::error_bounds(blocks, 64, bound);
    for (int i = 0; i < 64; ++i) {
      const double d = std::fabs(scale_of(blocks[i / 32]));
      const double x = row[static_cast<std::size_t>(i)];
      const double error = std::fabs(x - back[i]);
      CHECK(error <= bound[i]);
      CHECK((bound[i] == d / 2 || bound[i] == d));
      if (error > d / 2) {
        ++clipped;
        CHECK(x / scale_of(blocks[i / 32]) > 7.5);  // only the far side is clipped
      }
      if (d > 0 && bound[i] == d / 2) tightest = std::max(tightest, error / (d / 2));
    }
    // The extreme (first of equals) is exactly level -8 where its scale is an fp16 normal
    // (|m| / 8 >= 2^-14, rounded up by at most a relative 2^-10). Below, fp16's smallest step
    // 2^-24 may exceed |m| / 8 several times over: the levels are then coarser than needed,
    // and the bound above still holds.
    for (int b = 0; b < 2; ++b) {
      int at = 32 * b;
      for (int i = 32 * b; i < 32 * b + 32; ++i)
        if (std::fabs(row[static_cast<std::size_t>(i)]) >
            std::fabs(row[static_cast<std::size_t>(at)]))
          at = i;
      const int j = at % 32;
      const int nibble = j < 16 ? blocks[b].q[j] & 0x0F : blocks[b].q[j - 16] >> 4;
      if (std::fabs(row[static_cast<std::size_t>(at)]) / 8 >= std::ldexp(1.0, -14))
        CHECK(nibble == 0);
    }
  }
  INFO("largest error / (|d| / 2) where the bound is |d| / 2: " << tightest
                                                                << "; clipped: " << clipped);
  CHECK(tightest > 0.95);
  CHECK(clipped > 0);  // the ±m row reaches the far side
}

TEST_CASE("a storage refuses what it cannot hold, and the cache is unchanged") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  kvlab::Rng rng(3);
  const RowMatrix<float> good = kvlab::random_matrix<float>(2, 64, rng);
  SECTION("contiguous, int8: NaN in v") {
    kvlab::ContiguousKVCache<float, BlockQ8_0> cache(1, 2, 32, 4);
    cache.append(0, good.topRows(1), good.topRows(1));
    const auto before = cache.view(0);
    std::vector<BlockQ8_0> k0(before.k, before.k + 2 * 4 * 1);
    RowMatrix<float> v = good;
    v(1, 37) = nan;
    CHECK_THROWS_MATCHES(cache.append(0, good, v), kvlab::InvalidArgument,
                         names("v(1, 37)",
                               "a finite value with |x| <= 127 * 65504 (q8_0's scale) to store "
                               "as int8",
                               "nan"));
    CHECK(cache.length(0) == 1);
    CHECK(std::memcmp(k0.data(), cache.view(0).k, k0.size() * sizeof(BlockQ8_0)) == 0);
  }
  SECTION("contiguous, fp16: a value beyond fp16's range, and one just inside") {
    kvlab::ContiguousKVCache<float, Eigen::half> cache(1, 2, 32, 4);
    RowMatrix<float> k = good;
    k(0, 5) = 65520.f;
    CHECK_THROWS_MATCHES(
        cache.append(0, k, good), kvlab::InvalidArgument,
        names("k(0, 5)", "a finite value with |x| < 65520 (fp16's range) to store as fp16",
              "65520"));
    CHECK(cache.length(0) == 0);
    k(0, 5) = 65519.f;  // rounds to 65504
    CHECK_NOTHROW(cache.append(0, k, good));
  }
  SECTION("paged, int4: Inf in k, written in no layer") {
    kvlab::PagedKVCache<float, BlockQ4_0> pool(2, 2, 32, 4, 4);
    const int s = pool.add_sequence();
    const std::vector<std::int64_t> slots = pool.reserve(s, 2);
    RowMatrix<float> k = good;
    k(0, 0) = -inf;
    CHECK_THROWS_MATCHES(pool.write(0, slots, k, good), kvlab::InvalidArgument,
                         names("k(0, 0)",
                               "a finite value with |x| <= 8 * 65504 (q4_0's scale) to store as "
                               "int4",
                               "-inf"));
    const kvlab::BlockTables tables = pool.tables({s});
    CHECK_THROWS_MATCHES(pool.view(0, tables), kvlab::InvalidArgument,
                         names("tables", "tokens written in layer 0",
                               "token 0 of sequence 0 of the tables reserved but never written"));
  }
  SECTION("a head_dim that is not a multiple of the block") {
    CHECK_THROWS_MATCHES(
        (kvlab::ContiguousKVCache<float, BlockQ8_0>(1, 2, 48, 4)), kvlab::InvalidArgument,
        names("head_dim", "a multiple of 32 (the values of one int8 block)", "48"));
    CHECK_THROWS_MATCHES((kvlab::PagedKVCache<float, BlockQ4_0>(1, 2, 8, 4, 4)),
                         kvlab::InvalidArgument,
                         names("head_dim", "a multiple of 32 (the values of one int4 block)", "8"));
    CHECK_THROWS_MATCHES(
        (kvlab::ContiguousStore<float, BlockQ8_0>(1, 2, 16, 4)), kvlab::InvalidArgument,
        names("head_dim", "a multiple of 32 (the values of one int8 block)", "16"));
  }
}

// The bound on attention over a reduced-precision cache, from the per-value bounds (what each
// stored K and V value may differ from the value appended):
//   scores: s'_j - s_j = scale · Σ_c q_c (k'_jc - k_jc), so |s'_j - s_j| <= δ_j = scale ·
//     Σ_c |q_c| εk_jc; let δ = max_j δ_j over the keys the query sees;
//   weights: p'_j = p_j e^{s'_j - s_j} / Σ_i p_i e^{s'_i - s_i}, the sum in [e^-δ, e^δ], so
//     |p'_j - p_j| <= (e^{2δ} - 1) p_j;
//   output: o'_c - o_c = Σ_j p'_j (v'_jc - v_jc) + Σ_j (p'_j - p_j) v_jc, so
//     |o'_c - o_c| <= max_j εv_jc + (e^{2δ} - 1) · max_j |v_jc|.
// The kernel computes in float: add float's rounding, 1e-5 · max(1, max|v|) (the tolerance of
// every float path, test_support.hpp).
TEMPLATE_TEST_CASE("attention over a reduced-precision cache stays within the derived bound", "",
                   Eigen::half, Eigen::bfloat16, BlockQ8_0, BlockQ4_0) {
  using S = TestType;
  const AttentionShape shape(8, 2, 64);  // GQA: 4 query heads per K/V head
  const int kv_len = 300, hd = shape.head_dim();
  kvlab::Rng rng(21);
  RowMatrix<float> k = kvlab::random_matrix<float>(kv_len, shape.kv_width(), rng, -2, 2);
  RowMatrix<float> v = kvlab::random_matrix<float>(kv_len, shape.kv_width(), rng, -1, 1);
  for (int t = 0; t < kv_len; t += 37) k(t, t % shape.kv_width()) = 9.f;  // outliers
  const RowMatrix<float> q = kvlab::random_matrix<float>(5, shape.q_width(), rng);
  kvlab::ContiguousKVCache<float, S> cache(1, shape.num_kv_heads(), hd, kv_len);
  cache.append(0, k, v);
  const auto view = cache.view(0);
  // The stored rows, decoded, and each value's bound.
  RowMatrix<float> k_back(kv_len, shape.kv_width()), v_back(kv_len, shape.kv_width());
  RowMatrix<double> ek(kv_len, shape.kv_width()), ev(kv_len, shape.kv_width());
  for (int t = 0; t < kv_len; ++t)
    for (int h = 0; h < shape.num_kv_heads(); ++h) {
      KVStorage<S>::decode(view.key(h, t), hd, &k_back(t, h * hd));
      KVStorage<S>::decode(view.value(h, t), hd, &v_back(t, h * hd));
      KVStorage<S>::error_bounds(view.key(h, t), hd, &ek(t, h * hd));
      KVStorage<S>::error_bounds(view.value(h, t), hd, &ev(t, h * hd));
    }
  CHECK(((k - k_back).cast<double>().cwiseAbs().array() <= ek.array()).all());
  CHECK(((v - v_back).cast<double>().cwiseAbs().array() <= ev.array()).all());

  for (int q_len : {1, 5}) {  // a decode step, and a prefill chunk of 5 (causal corner)
    CAPTURE(q_len);
    const auto queries = q.topRows(q_len);
    kvlab::CostCounters counters;
    kvlab::ContiguousKVCache<float, S> part(1, shape.num_kv_heads(), hd, kv_len);
    part.append(0, k.topRows(kv_len - 5 + q_len), v.topRows(kv_len - 5 + q_len));
    const RowMatrix<float> got =
        kvlab::cpu::decode_attention(shape, queries, part.view(0), &counters);
    const int len = kv_len - 5 + q_len, first = len - q_len;
    // The kernel computes the attention over the rows as stored.
    const RowMatrix<float> over_stored = kvlab::cpu::reference_attention(
        shape, queries, k_back.topRows(len), v_back.topRows(len), first);
    CHECK(kvlab_test::max_row_relative_error(got, over_stored) <= 1e-5);
    // ... and it reads the bytes as stored.
    CHECK(counters.kv_bytes_read == 2 * static_cast<std::uint64_t>(len) * shape.num_kv_heads() *
                                        kvlab::storage_row_bytes<S>(hd));
    // Against the exact attention over the values appended, within the derived bound.
    const RowMatrix<double> exact = kvlab::cpu::reference_attention(
        shape, RowMatrix<double>(queries.template cast<double>()),
        RowMatrix<double>(k.topRows(len).template cast<double>()),
        RowMatrix<double>(v.topRows(len).template cast<double>()), first);
    double worst_ratio = 0;
    for (int i = 0; i < q_len; ++i)
      for (int h = 0; h < shape.num_heads(); ++h) {
        const int hk = h / shape.group_size();
        const int seen = first + i + 1;
        double delta = 0, vmax = 0;
        for (int j = 0; j < seen; ++j) {
          double dj = 0;
          for (int c = 0; c < hd; ++c)
            dj += std::fabs(double(queries(i, h * hd + c))) * ek(j, hk * hd + c);
          delta = std::max(delta, shape.scale() * dj);
          for (int c = 0; c < hd; ++c) vmax = std::max(vmax, std::fabs(double(v(j, hk * hd + c))));
        }
        for (int c = 0; c < hd; ++c) {
          double ev_max = 0;
          for (int j = 0; j < seen; ++j) ev_max = std::max(ev_max, ev(j, hk * hd + c));
          const double bound = ev_max + std::expm1(2 * delta) * vmax + 1e-5 * std::max(1.0, vmax);
          const double error = std::fabs(got(i, h * hd + c) - exact(i, h * hd + c));
          CHECK(error <= bound);
          worst_ratio = std::max(worst_ratio, error / bound);
        }
      }
    INFO(KVStorage<S>::name() << ": largest error / bound " << worst_ratio);
    CHECK(worst_ratio > 0);
  }
}

TEMPLATE_TEST_CASE("a paged cache of any storage gives the contiguous cache's attention", "",
                   Eigen::half, Eigen::bfloat16, BlockQ8_0, BlockQ4_0) {
  using S = TestType;
  const AttentionShape shape(6, 3, 32);
  kvlab::Rng rng(2);
  const RowMatrix<float> k = kvlab::random_matrix<float>(41, shape.kv_width(), rng);
  const RowMatrix<float> v = kvlab::random_matrix<float>(41, shape.kv_width(), rng);
  const RowMatrix<float> q = kvlab::random_matrix<float>(3, shape.q_width(), rng);
  kvlab::ContiguousKVCache<float, S> contiguous(1, 3, 32, 41);
  contiguous.append(0, k, v);
  const RowMatrix<float> want = kvlab::cpu::decode_attention(shape, q, contiguous.view(0));
  for (kvlab::KVLayout layout : {kvlab::KVLayout::NHD, kvlab::KVLayout::HND}) {
    kvlab::PagedKVCache<float, S> pool(1, 3, 32, 5, 12, layout);
    const int other = pool.add_sequence();
    pool.append(other, k.topRows(7), v.topRows(7));  // blocks out of order for the sequence
    const int s = pool.add_sequence();
    pool.append(s, k.topRows(20), v.topRows(20));
    pool.free_sequence(other);
    pool.append(s, k.bottomRows(21), v.bottomRows(21));
    const kvlab::BlockTables tables = pool.tables({s});
    const RowMatrix<float> got =
        kvlab::cpu::paged_prefill_attention(shape, q, {0, 3}, pool.view(0, tables));
    CHECK(kvlab_test::max_row_relative_error(got, want) <= 1e-5);
    CHECK(pool.token_bytes() == 3 * kvlab::storage_row_bytes<S>(32));
  }
}
