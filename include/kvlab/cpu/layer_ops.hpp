/// \file
/// \brief The matrix products and norms of a decoder layer on the CPU: `cpu::linear` (a batch of
/// rows times a weight matrix stored `[out, in]`, llama2.c's `matmul`; the CPU twin of
/// `cuda::linear`) and `cpu::rmsnorm`. Checked in the model tests against one thread and
/// against llama2.c's forward pass.
#pragma once

#include <cmath>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kvlab/config.hpp"
#include "kvlab/cpu/parallel.hpp"
#include "kvlab/matrix.hpp"

namespace kvlab::cpu {

/// Multiply-adds (rows times weight elements) below which `linear` runs on one thread.
constexpr long long kLinearParallelMinMacs = 1 << 17;

/// `out = x · Wᵀ`: every row of `x` through the weight matrix `w`, stored `[out, in]` as
/// PyTorch's `Linear` and llama2.c store it. All rows of a step go through in one product, so
/// the weights are read once per step whatever the batch. With OpenMP and enough work, W's rows
/// are split between the threads (as run.c splits them), each thread computing its columns of
/// `out`; an exception in a thread is passed on after the loop.
/// \param x    [rows, in]
/// \param w    [out, in]
/// \param out  [rows, out] (resized); must not be `x` or `w`
/// \throws InvalidArgument if `x.cols() != w.cols()` or `out` is `x` or `w`.
template <typename T>
void linear(const RowMatrix<T>& x, const RowMatrix<T>& w, RowMatrix<T>& out) {
  constexpr const char* kWhere = "kvlab::cpu::linear";
  kvlab::detail::require_equal(kWhere, "x.cols()", static_cast<long>(x.cols()),
                               static_cast<long>(w.cols()), "w.cols()");
  if (&out == &x || &out == &w)
    kvlab::detail::fail(kWhere, "out", "a matrix other than x and w", "one of them");
  out.resize(x.rows(), w.rows());
  int threads = 1;
#if defined(_OPENMP)
  if (1LL * x.rows() * w.size() >= kLinearParallelMinMacs) threads = omp_get_max_threads();
#endif
  if (threads <= 1 || w.rows() < threads) {
    out.noalias() = x * w.transpose();
    return;
  }
  // Chunk c of `threads` computes W's rows [r0, r1) — its columns of out.
  detail::parallel_for(threads, true, [&](int c) {
    const Eigen::Index r0 = w.rows() * c / threads, r1 = w.rows() * (c + 1) / threads;
    out.middleCols(r0, r1 - r0).noalias() = x * w.middleRows(r0, r1 - r0).transpose();
  });
}

/// RMSNorm of every row, as run.c computes it: `out = weight ⊙ x / sqrt(mean(x²) + 1e-5)`.
/// \param x       [rows, dim]
/// \param weight  [dim]
/// \param out     [rows, dim] (resized); must not be `x`
/// \throws InvalidArgument if `weight.size() != x.cols()` or `out` is `x`.
template <typename T>
void rmsnorm(const RowMatrix<T>& x, const RowVector<T>& weight, RowMatrix<T>& out) {
  constexpr const char* kWhere = "kvlab::cpu::rmsnorm";
  kvlab::detail::require_equal(kWhere, "weight.size()", static_cast<long>(weight.size()),
                               static_cast<long>(x.cols()), "x.cols()");
  if (&out == &x) kvlab::detail::fail(kWhere, "out", "a matrix other than x", "x");
  out.resize(x.rows(), x.cols());
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    const T mean_square = x.row(r).squaredNorm() / static_cast<T>(x.cols()) + T(1e-5f);
    out.row(r) = (x.row(r) * (T(1) / std::sqrt(mean_square))).cwiseProduct(weight);
  }
}

}  // namespace kvlab::cpu
