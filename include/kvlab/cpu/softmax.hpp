/// \file
/// \brief Numerically stable softmax of one row, shared by every CPU attention path.
///
/// It is written with Eigen and vectorised. Checked in tests for rows that sum to 1 and for logits
/// of ±1e4.
#pragma once

#include <Eigen/Dense>

#include "kvlab/config.hpp"

namespace kvlab::cpu {

/// Replaces `row[0, n)` by its softmax, `exp(x_i - max) / sum_j exp(x_j - max)`.
///
/// Subtracting the maximum first keeps every exponent <= 0, so logits of any magnitude
/// (±1e4 included) give no overflow, and the largest term is exactly 1, so the sum is >= 1.
/// \param row  [n] logits in, probabilities out
/// \param n    number of logits, >= 1
/// \throws InvalidArgument if `n < 1`.
template <typename T>
void softmax_inplace(T* row, Eigen::Index n) {
  kvlab::detail::require_at_least("kvlab::cpu::softmax_inplace", "n", n, Eigen::Index{1});
  Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>> x(row, n);  // [n]
  const T max = x.maxCoeff();
  x = (x - max).exp();
  x /= x.sum();
}

}  // namespace kvlab::cpu
