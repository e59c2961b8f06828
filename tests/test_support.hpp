// Helpers shared by kvlab's tests: the tolerance rule, and (names_matcher.hpp) a matcher for
// kvlab's error messages. The reference attention is the library's own plain loops,
// kvlab::cpu::reference_attention (tested against hand-computed values in test_attention.cpp).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvlab/core/ggml_matrix.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/matrix.hpp"
#include "names_matcher.hpp"

namespace kvlab_test {

/// Whether this build runs under AddressSanitizer (GCC's `__SANITIZE_ADDRESS__`, Clang's
/// `__has_feature(address_sanitizer)`): scripts/test.sh's second build, at -Og with every access
/// checked, where the longest randomized and grid tests run 10 to 20 times slower. Those tests
/// then run shorter cases through the same code paths (each says which); the Release build runs
/// them whole.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

/// The tolerance of every float/double comparison between two kvlab paths (see
/// `max_row_relative_error`): they compute the same sums in different orders, so they differ by
/// rounding only — double 1e-12 (eps 1.1e-16, a few hundred roundings deep at most), float
/// 1e-5 (eps 6e-8; sums over head_dim up to 256, thousands of keys, and up to 3 layers).
template <typename T>
double tolerance() {
  return std::is_same<T, double>::value ? 1e-12 : 1e-5;
}

/// The tolerance rule used throughout: for every row r and element c,
/// |got(r, c) - want(r, c)| <= rtol * max(1, max_c |want(r, c)|). Every element is compared.
/// Returns the largest ratio |diff| / max(1, row scale), to be compared with rtol.
template <typename A, typename B>
double max_row_relative_error(const A& got, const B& want) {
  REQUIRE(got.rows() == want.rows());
  REQUIRE(got.cols() == want.cols());
  double worst = 0;
  for (Eigen::Index r = 0; r < want.rows(); ++r) {
    double scale = 1.0;
    for (Eigen::Index c = 0; c < want.cols(); ++c)
      scale = std::max(scale, std::abs(double(want(r, c))));
    for (Eigen::Index c = 0; c < want.cols(); ++c) {
      const double diff = std::abs(double(got(r, c)) - double(want(r, c)));
      if (std::isnan(diff)) return std::numeric_limits<double>::infinity();
      worst = std::max(worst, diff / scale);
    }
  }
  return worst;
}

/// The message of the kvlab::InvalidArgument that `f` throws ("" if it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const kvlab::InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// Every row of `w` decoded (GgmlMatrix::decode_row), [rows, cols]: the floats that
// GgufFile::read_matrix gives for the tensor it was read from.
inline kvlab::RowMatrix<float> decoded_rows(const kvlab::GgmlMatrix& w) {
  kvlab::RowMatrix<float> m(static_cast<Eigen::Index>(w.rows()),
                            static_cast<Eigen::Index>(w.cols()));  // [rows, cols]
  for (std::int64_t r = 0; r < w.rows(); ++r) w.decode_row(r, m.data() + r * w.cols());
  return m;
}

}  // namespace kvlab_test
