/// \file
/// \brief The matrix products and norms of a decoder layer on the CPU.
///
/// They are `cpu::linear`, a batch of rows times a weight matrix stored `[out, in]` (llama2.c's
/// `matmul`; the CPU twin of `cuda::linear`), and `cpu::rmsnorm`. Checked in the model tests
/// against one thread and against llama2.c's forward pass.
///
/// \par Measured
/// `bench/results/README.md`, "the baseline for the whole-model targets" (bench_generate: one row
/// of `cpu::linear` read in order, `detail::linear_one_row`, against Eigen's matrix-vector
/// product) and "small heads without Eigen's overhead, and fewer parallel regions" (the threads of
/// `linear`).
#pragma once

#include <cmath>
#include <initializer_list>
#include <string>
#include <type_traits>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kvlab/cpu/simd_avx2.hpp"  // KVLAB_ROW_RUNS_AVX2, detail::avx2::dot

#if KVLAB_ROW_RUNS_AVX2
/// 1: `cpu::linear` of one float row reads W with AVX2 and FMA (`detail::linear_one_row`).
#define KVLAB_LINEAR_AVX2 1
#else
/// 0: `cpu::linear` of one row is Eigen's matrix-vector product.
#define KVLAB_LINEAR_AVX2 0
#endif

#include "kvlab/config.hpp"
#include "kvlab/cpu/parallel.hpp"
#include "kvlab/matrix.hpp"

namespace kvlab::cpu {

/// Multiply-adds (rows times weight elements) below which `linear` runs on one thread.
constexpr long long kLinearParallelMinMacs = 1 << 16;

/// Whether this build computes `linear` of one float row with its own AVX2 loop
/// (`detail::linear_one_row`) instead of Eigen's matrix-vector product.
constexpr bool kLinearOneRowAvx2 = KVLAB_LINEAR_AVX2 != 0;

namespace detail {

#if KVLAB_LINEAR_AVX2
/// y[o] = W.row(o) · x for o in [0, rows): the decode step's product of one row by a weight
/// matrix stored [rows, in] (row-major, `w`), W read strictly in order, one row after the other,
/// each with four independent chains of multiply-adds. It computes what `x * w.transpose()`
/// computes, summed in another order. Eigen's product reads four rows of W side by side, which
/// streamed the weights more slowly than this in-order read.
inline void linear_one_row(const float* w, const float* x, Eigen::Index rows, Eigen::Index in,
                           float* y) {
  for (Eigen::Index o = 0; o < rows; ++o) y[o] = avx2::dot(w + o * in, x, in);  // row o: [in]
}
#endif

/// `out.middleCols(r0, r1 - r0) = x · W.middleRows(r0, r1 - r0)ᵀ`: W's rows [r0, r1).
template <typename T>
void linear_rows(const RowMatrix<T>& x, const RowMatrix<T>& w, Eigen::Index r0, Eigen::Index r1,
                 RowMatrix<T>& out) {
#if KVLAB_LINEAR_AVX2
  if constexpr (std::is_same<T, float>::value) {
    if (x.rows() == 1) {
      linear_one_row(w.data() + r0 * w.cols(), x.data(), r1 - r0, w.cols(), out.data() + r0);
      return;
    }
  }
#endif
  out.middleCols(r0, r1 - r0).noalias() = x * w.middleRows(r0, r1 - r0).transpose();
}

}  // namespace detail

/// One product of a `linear` call: `out = x · wᵀ`.
template <typename T>
struct LinearProduct {
  const RowMatrix<T>& w;  ///< [out, in]
  RowMatrix<T>& out;      ///< [rows, out] (resized); must not be x, w or another product's out
};

/// `products[i].out = x · products[i].wᵀ` for each i: the same rows through several weight
/// matrices stored `[out, in]` (a layer's K and V projections, its gate and up projections) in
/// one call. With OpenMP and enough work (all the products' multiply-adds, at least
/// `kLinearParallelMinMacs`), one parallel region computes them all: each thread takes its
/// share of every matrix's rows (as run.c splits them), so the threads meet once per call, not
/// once per matrix. An exception in a thread is passed on after the region. One float row (a
/// decode step) goes through `detail::linear_one_row` where the build has AVX2
/// (`kLinearOneRowAvx2`).
/// \param x         [rows, in]
/// \param products  the matrices, each with the matrix its product goes to
/// \throws InvalidArgument if a `w.cols() != x.cols()`, or an `out` is `x`, a `w` or another
///         product's `out`. Nothing is resized then.
template <typename T>
void linear(const RowMatrix<T>& x, std::initializer_list<LinearProduct<T>> products) {
  constexpr const char* kWhere = "kvlab::cpu::linear";
  long long macs = 0;  // of all the products
  int i = 0;
  for (const LinearProduct<T>& p : products) {
    const std::string name = products.size() == 1 ? "" : "products[" + std::to_string(i) + "].";
    kvlab::detail::require_equal(kWhere, "x.cols()", static_cast<long>(x.cols()),
                                 static_cast<long>(p.w.cols()), name + "w.cols()");
    if (&p.out == &x || &p.out == &p.w)
      kvlab::detail::fail(kWhere, name + "out", "a matrix other than x and w", "one of them");
    int j = 0;
    for (const LinearProduct<T>& other : products) {
      if (j != i && (&p.out == &other.out || &p.out == &other.w))
        kvlab::detail::fail(kWhere, name + "out", "a matrix of its own",
                            "product " + std::to_string(j) + "'s");
      ++j;
    }
    macs += 1LL * x.rows() * p.w.size();
    ++i;
  }
  Eigen::Index fewest_rows = -1;  // of the matrices
  for (const LinearProduct<T>& p : products) {
    p.out.resize(x.rows(), p.w.rows());
    if (fewest_rows < 0 || p.w.rows() < fewest_rows) fewest_rows = p.w.rows();
  }
  int threads = 1;
#if defined(_OPENMP)
  if (macs >= kLinearParallelMinMacs) threads = omp_get_max_threads();
#endif
  if (threads <= 1 || fewest_rows < threads) {
    for (const LinearProduct<T>& p : products) detail::linear_rows(x, p.w, 0, p.w.rows(), p.out);
    return;
  }
  // Chunk c of `threads` computes each W's rows [r0, r1) — its columns of that product's out.
  detail::parallel_for(threads, true, [&](int c) {
    for (const LinearProduct<T>& p : products) {
      const Eigen::Index r0 = p.w.rows() * c / threads, r1 = p.w.rows() * (c + 1) / threads;
      detail::linear_rows(x, p.w, r0, r1, p.out);
    }
  });
}

/// `out = x · Wᵀ`: every row of `x` through the weight matrix `w`, stored `[out, in]` as
/// PyTorch's `Linear` and llama2.c store it: `linear(x, {{w, out}})`. All rows of a step go
/// through in one product, so the weights are read once per step whatever the batch.
/// \param x    [rows, in]
/// \param w    [out, in]
/// \param out  [rows, out] (resized); must not be `x` or `w`
/// \throws InvalidArgument if `x.cols() != w.cols()` or `out` is `x` or `w`.
template <typename T>
void linear(const RowMatrix<T>& x, const RowMatrix<T>& w, RowMatrix<T>& out) {
  linear(x, {LinearProduct<T>{w, out}});
}

/// RMSNorm of every row, as run.c computes it: `out = weight ⊙ x / sqrt(mean(x²) + eps)`.
/// \param x       [rows, dim]
/// \param weight  [dim]
/// \param out     [rows, dim] (resized); must not be `x`
/// \param eps     added to the mean square (`LlamaConfig::norm_eps`; run.c's 1e-5)
/// \throws InvalidArgument if `weight.size() != x.cols()` or `out` is `x`.
template <typename T>
void rmsnorm(const RowMatrix<T>& x, const RowVector<T>& weight, RowMatrix<T>& out,
             T eps = T(1e-5f)) {
  constexpr const char* kWhere = "kvlab::cpu::rmsnorm";
  kvlab::detail::require_equal(kWhere, "weight.size()", static_cast<long>(weight.size()),
                               static_cast<long>(x.cols()), "x.cols()");
  if (&out == &x) kvlab::detail::fail(kWhere, "out", "a matrix other than x", "x");
  out.resize(x.rows(), x.cols());
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    const T mean_square = x.row(r).squaredNorm() / static_cast<T>(x.cols()) + eps;
    out.row(r) = (x.row(r) * (T(1) / std::sqrt(mean_square))).cwiseProduct(weight);
  }
}

}  // namespace kvlab::cpu
