/// \file
/// \brief The host side's matrix vocabulary: Eigen's row-major matrices and a portable random fill.
///
/// The matrices are in kvlab's token-major layout. Used by the caches, the CPU kernels, the models
/// and the host side of the CUDA API alike, so it sits beside `config.hpp`, below every folder
/// (`core/` stays free of Eigen: its headers compile for the device too).
#pragma once

#include <Eigen/Dense>

#include "kvlab/config.hpp"
#include "kvlab/core/random.hpp"

namespace kvlab {

/// A row-major dynamic matrix: kvlab's activation layout, one token per row,
/// e.g.\ queries `[tokens, num_heads * head_dim]`.
template <typename T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// One token's activations: `[width]`.
template <typename T>
using RowVector = Eigen::Matrix<T, 1, Eigen::Dynamic, Eigen::RowMajor>;

/// Fills `m` with values drawn uniformly from `[lo, hi)` by `rng`, row by row (rounding to
/// `float` may give `hi` itself); the values are the same on every platform for the same seed.
/// \throws InvalidArgument (`m` and `rng` unchanged) unless `lo` and `hi` are finite and
///         `lo < hi`.
template <typename Derived>
void fill_uniform(Eigen::DenseBase<Derived>& m, Rng& rng, double lo, double hi) {
  detail::require_interval("kvlab::fill_uniform", lo, hi);
  using Scalar = typename Derived::Scalar;
  for (Eigen::Index r = 0; r < m.rows(); ++r)
    for (Eigen::Index c = 0; c < m.cols(); ++c) m(r, c) = static_cast<Scalar>(rng.uniform(lo, hi));
}

/// A `[rows, cols]` matrix of values drawn uniformly from `[lo, hi)`.
/// \throws InvalidArgument (`rng` unchanged) if `rows` or `cols` is negative, or unless `lo`
///         and `hi` are finite and `lo < hi`.
template <typename T>
RowMatrix<T> random_matrix(Eigen::Index rows, Eigen::Index cols, Rng& rng, double lo = -1.0,
                           double hi = 1.0) {
  detail::require_at_least("kvlab::random_matrix", "rows", rows, Eigen::Index{0});
  detail::require_at_least("kvlab::random_matrix", "cols", cols, Eigen::Index{0});
  detail::require_interval("kvlab::random_matrix", lo, hi);
  RowMatrix<T> m(rows, cols);
  fill_uniform(m, rng, lo, hi);
  return m;
}

}  // namespace kvlab
