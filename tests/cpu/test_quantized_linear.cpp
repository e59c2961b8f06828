// cpu::reference_linear over weights kept in their GGUF types (GgmlMatrix): on hand-built
// blocks of every type whose products the test knows exactly (its own encoding of the bytes,
// from the format's description), and on random and adversarial blocks (extreme, subnormal and
// zero scales, all-equal values, sums that cancel) within the bound its documentation derives.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kvlab/kvlab.hpp"
#include "test_support.hpp"

using kvlab::GgmlMatrix;
using kvlab::GgmlType;
using kvlab::RowMatrix;

namespace {

// Appends the `n` low bytes of `value`, least significant first (GGUF's byte order).
void qlin_put(std::vector<unsigned char>& out, std::uint32_t value, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<unsigned char>(value >> (8 * i)));
}

// The fp16 bits of `x`, which must be an fp16 value (Eigen's conversion, not kvlab's).
std::uint16_t qlin_half_bits(float x) {
  const Eigen::half h(x);
  REQUIRE(static_cast<float>(h) == x);
  return Eigen::numext::bit_cast<std::uint16_t>(h);
}

// A matrix of `type` whose row o, column c holds level(o, c) times the block's scale; for the
// quantized types each block's scale is `scale` (and Q4_1's minimum `minimum`), the level being
// q (Q8_0, in [-127, 127]) or the nibble (Q4_0: value scale * (n - 8); Q4_1: scale * n + minimum).
// `values` [rows, cols] gets what each stands for, computed here from the format's description.
template <typename Level>
GgmlMatrix qlin_matrix(GgmlType type, int rows, int cols, Level level, float scale, float minimum,
                       std::vector<double>& values) {
  std::vector<unsigned char> bytes;
  values.assign(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols), 0.0);
  for (int o = 0; o < rows; ++o) {
    double* row_values =
        values.data() + static_cast<std::size_t>(o) * static_cast<std::size_t>(cols);
    if (type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16) {
      for (int c = 0; c < cols; ++c) {
        const float v = static_cast<float>(level(o, c)) * scale;
        row_values[c] = v;
        if (type == GgmlType::F32) {
          std::uint32_t bits;
          std::memcpy(&bits, &v, sizeof bits);
          qlin_put(bytes, bits, 4);
        } else if (type == GgmlType::F16) {
          qlin_put(bytes, qlin_half_bits(v), 2);
        } else {
          std::uint32_t bits;
          std::memcpy(&bits, &v, sizeof bits);
          REQUIRE((bits & 0xFFFFu) == 0);  // a bf16 value: the float's top half
          qlin_put(bytes, bits >> 16, 2);
        }
      }
      continue;
    }
    for (int b = 0; b < cols / 32; ++b) {
      qlin_put(bytes, qlin_half_bits(scale), 2);
      if (type == GgmlType::Q4_1) qlin_put(bytes, qlin_half_bits(minimum), 2);
      if (type == GgmlType::Q8_0) {
        for (int i = 0; i < 32; ++i) {
          const int q = level(o, b * 32 + i);
          REQUIRE((q >= -127 && q <= 127));
          bytes.push_back(static_cast<unsigned char>(static_cast<std::int8_t>(q)));
          row_values[b * 32 + i] = static_cast<double>(scale) * q;
        }
        continue;
      }
      // Q4_0, Q4_1: byte j holds value j in its low nibble and value j + 16 in its high one.
      for (int j = 0; j < 16; ++j) {
        const int low = level(o, b * 32 + j), high = level(o, b * 32 + j + 16);
        REQUIRE((low >= 0 && low <= 15 && high >= 0 && high <= 15));
        bytes.push_back(static_cast<unsigned char>(low | (high << 4)));
      }
      for (int i = 0; i < 32; ++i) {
        const int n = level(o, b * 32 + i);
        row_values[b * 32 + i] = type == GgmlType::Q4_0 ? static_cast<double>(scale) * (n - 8)
                                                        : static_cast<double>(scale) * n + minimum;
      }
    }
  }
  return GgmlMatrix(type, rows, cols, std::move(bytes));
}

}  // namespace

TEST_CASE("reference_linear: hand-built blocks of every type, each product known exactly") {
  // Levels and inputs are small integers and the scales powers of two, so every value, product
  // and sum is exact in double and the results fit a float's 24 bits: out must equal the sums
  // the test computes from its own encoding, bit for bit.
  const int rows = 3, cols = 64;  // two blocks per row of the quantized types
  RowMatrix<float> x(2, cols);    // [2, cols]
  for (int c = 0; c < cols; ++c) {
    x(0, c) = static_cast<float>(c % 7 - 3);
    x(1, c) = static_cast<float>((c * 5) % 11 - 5);
  }
  struct Case {
    GgmlType type;
    float scale, minimum;
    int (*level)(int o, int c);
  };
  const Case cases[] = {
      {GgmlType::F32, 0.25f, 0.f, [](int o, int c) { return (o * 37 + c * 11) % 201 - 100; }},
      {GgmlType::F16, 0.5f, 0.f, [](int o, int c) { return (o * 13 + c * 7) % 61 - 30; }},
      {GgmlType::BF16, 2.f, 0.f, [](int o, int c) { return (o * 5 + c * 3) % 41 - 20; }},
      {GgmlType::Q8_0, 0.5f, 0.f, [](int o, int c) { return (o * 29 + c * 17) % 255 - 127; }},
      {GgmlType::Q4_0, 2.f, 0.f, [](int o, int c) { return (o * 3 + c * 5) % 16; }},
      {GgmlType::Q4_1, 0.5f, -3.f, [](int o, int c) { return (o * 7 + c * 9) % 16; }},
  };
  for (const Case& k : cases) {
    const std::string name = kvlab::ggml_type_name(static_cast<std::uint32_t>(k.type));
    CAPTURE(name);
    std::vector<double> values;  // [rows, cols]
    const GgmlMatrix w = qlin_matrix(k.type, rows, cols, k.level, k.scale, k.minimum, values);
    REQUIRE(w.size_bytes() == static_cast<std::size_t>(rows) * kvlab::ggml_row_bytes(k.type, cols));
    RowMatrix<float> out;
    kvlab::cpu::reference_linear(x, w, out);
    REQUIRE(out.rows() == 2);
    REQUIRE(out.cols() == rows);
    for (int r = 0; r < 2; ++r) {
      for (int o = 0; o < rows; ++o) {
        double exact = 0;
        for (int c = 0; c < cols; ++c)
          exact += values[static_cast<std::size_t>(o * cols + c)] * static_cast<double>(x(r, c));
        CAPTURE(r, o);
        CHECK(out(r, o) == static_cast<float>(exact));
      }
    }
  }
  // Partial sums beyond a float's 24 bits: 2^24 + 1 - 2^24 is 1 summed in double, 0 in float.
  std::vector<unsigned char> bytes;
  for (float v : {16777216.f, 1.f, -16777216.f}) {
    std::uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    qlin_put(bytes, bits, 4);
  }
  const GgmlMatrix big(GgmlType::F32, 1, 3, bytes);
  RowMatrix<float> ones = RowMatrix<float>::Ones(1, 3), out;
  kvlab::cpu::reference_linear(ones, big, out);
  CHECK(out(0, 0) == 1.f);
}

TEST_CASE("reference_linear: random and adversarial blocks, within the documented bound") {
  // The bound: |out - exact| <= 2^-24 |out| + cols 2^-53 sum |w x|, exact being the sum of the
  // decoded weights' products (summed here in long double, whose own error, cols 2^-64 sum |w x|
  // at most, is added). Cases where it is tight: scales at fp16's largest (65504) and smallest
  // subnormal (2^-24) values, zero scales, blocks of one repeated value, and inputs whose signs
  // alternate so that the sum cancels to a small fraction of sum |w x|.
  kvlab::Rng rng(41);
  const auto below = [&](int n) {
    return static_cast<int>(rng.next_u64() % static_cast<unsigned>(n));
  };
  const int rows = 5, cols = 96;  // three blocks per row
  struct Scenario {
    const char* name;
    bool random_scale;  // a random scale in [2^-17, 2^-7 * 1024], else `scale`
    float scale;
    bool equal_levels;  // every value of a block the same level
    bool alternating;   // inputs +1, -1, +1, ... (times 1, 2, 3 by row): sums that cancel
  };
  const Scenario scenarios[] = {{"random", true, 0.f, false, false},
                                {"largest scale", false, 65504.f, false, true},
                                {"subnormal scale", false, std::ldexp(1.f, -24), false, false},
                                {"zero scale", false, 0.f, false, false},
                                {"all-equal blocks", true, 0.f, true, true},
                                {"cancelling sums", true, 0.f, false, true}};
  for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1}) {
    for (const Scenario& s : scenarios) {
      const std::string name = kvlab::ggml_type_name(static_cast<std::uint32_t>(type));
      CAPTURE(name, s.name);
      // k 2^-e with k <= 1024 and e in [7, 17]: an fp16 value (11 significant bits)
      const float scale = s.random_scale
                              ? std::ldexp(static_cast<float>(1 + below(1024)), -17 + below(11))
                              : s.scale;
      const int span = type == GgmlType::Q8_0 ? 255 : 16;
      std::vector<int> levels(static_cast<std::size_t>(rows * cols));  // [rows, cols]
      for (int o = 0; o < rows; ++o) {
        for (int c = 0; c < cols; ++c) {
          const int first = o * cols + (c / 32) * 32;  // the block's first value
          levels[static_cast<std::size_t>(o * cols + c)] =
              s.equal_levels && c % 32 != 0 ? levels[static_cast<std::size_t>(first)]
                                            : below(span) - (span == 255 ? 127 : 0);
        }
      }
      std::vector<double> values;                                   // [rows, cols]
      const float minimum = type == GgmlType::Q4_1 ? -scale : 0.f;  // an fp16 value too
      const GgmlMatrix w = qlin_matrix(
          type, rows, cols,
          [&](int o, int c) { return levels[static_cast<std::size_t>(o * cols + c)]; }, scale,
          minimum, values);
      const RowMatrix<float> decoded = kvlab_test::decoded_rows(w);  // [rows, cols]
      for (int o = 0; o < rows; ++o) {
        for (int c = 0; c < cols; ++c) {
          // the value the test encoded, to float's rounding (Q4_1's scale * n + minimum is
          // rounded once, as ggml computes it; the others are exact)
          const double v = values[static_cast<std::size_t>(o * cols + c)];
          CHECK(std::abs(decoded(o, c) - v) <= std::ldexp(std::abs(v), -24));
        }
      }
      RowMatrix<float> x(3, cols);  // [3, cols]
      for (int r = 0; r < 3; ++r) {
        for (int c = 0; c < cols; ++c) {
          x(r, c) = s.alternating ? (c % 2 == 0 ? 1.f : -1.f) * (1.f + static_cast<float>(r))
                                  : static_cast<float>(rng.uniform(-1.0, 1.0));
        }
      }
      RowMatrix<float> out;
      kvlab::cpu::reference_linear(x, w, out);
      for (int r = 0; r < 3; ++r) {
        for (int o = 0; o < rows; ++o) {
          long double exact = 0, magnitude = 0;
          for (int c = 0; c < cols; ++c) {
            const long double p = static_cast<long double>(decoded(o, c)) * x(r, c);
            exact += p;
            magnitude += std::abs(p);
          }
          const long double bound = std::ldexp(std::abs(static_cast<long double>(out(r, o))), -24) +
                                    cols * std::ldexp(magnitude, -53) +
                                    cols * std::ldexp(magnitude, -64);
          CAPTURE(r, o, static_cast<double>(exact), out(r, o));
          CHECK(std::abs(static_cast<long double>(out(r, o)) - exact) <= bound);
        }
      }
    }
  }
}
