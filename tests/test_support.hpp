// Helpers shared by kvlab's tests: a plain triple-loop attention (the independent reference),
// the tolerance rule, and (names_matcher.hpp) a matcher for kvlab's error messages.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvlab/core/shape.hpp"
#include "kvlab/cpu/types.hpp"
#include "names_matcher.hpp"

namespace kvlab_test {

/// The tolerance of every float/double comparison between two kvlab paths (see
/// `max_row_relative_error`): they compute the same sums in different orders, so they differ by
/// rounding only — double 1e-12 (eps 1.1e-16, a few hundred roundings deep at most), float
/// 1e-5 (eps 6e-8; sums over head_dim up to 256, thousands of keys, and up to 3 layers).
template <typename T>
double tolerance() {
  return std::is_same<T, double>::value ? 1e-12 : 1e-5;
}

/// Causal attention written as plainly as possible, in long double, for checking the kernels:
/// query row i sits at position kv_len - q_len + i and sees keys [0, that position].
/// q [q_len, H * d], k and v [kv_len, Hkv * d] -> [q_len, H * d].
template <typename T>
kvlab::RowMatrix<T> reference_attention(const kvlab::AttentionShape& shape,
                                        const kvlab::RowMatrix<T>& q, const kvlab::RowMatrix<T>& k,
                                        const kvlab::RowMatrix<T>& v) {
  using Wide = long double;
  const int q_len = static_cast<int>(q.rows());
  const int kv_len = static_cast<int>(k.rows());
  const int d = shape.head_dim();
  kvlab::RowMatrix<T> out(q_len, shape.q_width());
  for (int h = 0; h < shape.num_heads(); ++h) {
    const int hk = h / (shape.num_heads() / shape.num_kv_heads());
    for (int i = 0; i < q_len; ++i) {
      const int last = kv_len - q_len + i;
      std::vector<Wide> score(static_cast<std::size_t>(last + 1));
      Wide max = -std::numeric_limits<Wide>::infinity();
      for (int j = 0; j <= last; ++j) {
        Wide dot = 0;
        for (int c = 0; c < d; ++c) dot += Wide(q(i, h * d + c)) * Wide(k(j, hk * d + c));
        score[static_cast<std::size_t>(j)] = dot * Wide(shape.scale());
        max = std::max(max, score[static_cast<std::size_t>(j)]);
      }
      Wide sum = 0;
      for (Wide& s : score) sum += (s = std::exp(s - max));
      for (int c = 0; c < d; ++c) {
        Wide acc = 0;
        for (int j = 0; j <= last; ++j)
          acc += score[static_cast<std::size_t>(j)] * Wide(v(j, hk * d + c));
        out(i, h * d + c) = static_cast<T>(acc / sum);
      }
    }
  }
  return out;
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

}  // namespace kvlab_test
