/// \file
/// \brief A plain tiled matrix product on the GPU, and `linear` for the GPU decoders' projections.
///
/// The product works on 16 × 16 tiles in shared memory with fp32 accumulation; the naive attention
/// path uses it for `Q Kᵀ` and `P V`. `linear` computes `y = x Wᵀ`. A teaching kernel, not a tuned
/// GEMM: the decoders use it on both sides of every comparison. Checked against Eigen in the tests.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "kvlab/config.hpp"
#include "kvlab/cuda/device_memory.cuh"
#include "kvlab/cuda/error.cuh"
#include "kvlab/cuda/launch.cuh"
#include "kvlab/cuda/numeric.cuh"

namespace kvlab::cuda {
namespace detail {

/// Side of the square tiles of `matmul_kernel`.
constexpr int kMatmulTile = 16;

/// A batch of products `C_b(m, n) = alpha · Σ_k A_b(m, k) · B_b(k, n)` (+ the old `C_b(m, n)`
/// when `accumulate`), every operand given by strides so that heads, transposes and GQA
/// groups need no copies.
template <typename TA, typename TB, typename TC>
struct MatmulArgs {
  const TA* a;             ///< A_b(m, k) = a[b · a_batch + m · a_row + k]
  std::ptrdiff_t a_row;    ///< elements between rows of A
  std::ptrdiff_t a_batch;  ///< elements between A_b and A_{b+1}
  const TB* b;             ///< B_b(k, n) = b[(b / b_group) · b_batch + k · b_k + n · b_n]
  std::ptrdiff_t b_k;      ///< elements between B(k, n) and B(k + 1, n)
  std::ptrdiff_t b_n;      ///< elements between B(k, n) and B(k, n + 1)
  std::ptrdiff_t b_batch;  ///< elements between B for batch b_group · i and b_group · (i + 1)
  int b_group;             ///< consecutive batches sharing one B (a GQA group)
  TC* c;                   ///< C_b(m, n) = c[b · c_batch + m · c_row + n]
  std::ptrdiff_t c_row;    ///< elements between rows of C
  std::ptrdiff_t c_batch;  ///< elements between C_b and C_{b+1}
  int m, n, k;             ///< sizes
  float alpha;             ///< factor applied to the product
  bool accumulate;         ///< add to C instead of overwriting it
};

/// One 16 × 16 tile of C_b per block (blockIdx.z = b), one element per thread. Each step loads
/// a 16 × 16 tile of A and of B into shared memory (each read by consecutive threads along the
/// index that is contiguous in memory) and adds their product.
template <typename TA, typename TB, typename TC>
__global__ void matmul_kernel(const MatmulArgs<TA, TB, TC> p) {
  __shared__ float a_tile[kMatmulTile][kMatmulTile + 1];  // [m, k], padded against bank conflicts
  __shared__ float b_tile[kMatmulTile][kMatmulTile + 1];  // [k, n]
  const int tx = static_cast<int>(threadIdx.x);
  const int ty = static_cast<int>(threadIdx.y);
  const int m0 = static_cast<int>(blockIdx.y) * kMatmulTile;
  const int n0 = static_cast<int>(blockIdx.x) * kMatmulTile;
  const int batch = static_cast<int>(blockIdx.z);
  const TA* a = p.a + batch * p.a_batch;
  const TB* b = p.b + (batch / p.b_group) * p.b_batch;
  // B is read along n when n is its contiguous index, else along k.
  const int b_kk = p.b_n == 1 ? ty : tx;
  const int b_nn = p.b_n == 1 ? tx : ty;
  float sum = 0.f;
  for (int k0 = 0; k0 < p.k; k0 += kMatmulTile) {
    const int ma = m0 + ty, ka = k0 + tx;
    a_tile[ty][tx] = ma < p.m && ka < p.k ? to_float(a[ma * p.a_row + ka]) : 0.f;
    const int kb = k0 + b_kk, nb = n0 + b_nn;
    b_tile[b_kk][b_nn] = kb < p.k && nb < p.n ? to_float(b[kb * p.b_k + nb * p.b_n]) : 0.f;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kMatmulTile; ++i) sum += a_tile[ty][i] * b_tile[i][tx];
    __syncthreads();
  }
  const int row = m0 + ty, col = n0 + tx;
  if (row < p.m && col < p.n) {
    TC* out = p.c + batch * p.c_batch + row * p.c_row + col;
    float result = p.alpha * sum;
    if (p.accumulate) result += to_float(*out);
    *out = from_float<TC>(result);
  }
}

/// Launches `matmul_kernel` over `batches` products.
template <typename TA, typename TB, typename TC>
void matmul(const MatmulArgs<TA, TB, TC>& args, int batches, cudaStream_t stream) {
  if (args.m == 0 || args.n == 0 || batches == 0) return;
  const dim3 grid(static_cast<unsigned>((args.n + kMatmulTile - 1) / kMatmulTile),
                  static_cast<unsigned>((args.m + kMatmulTile - 1) / kMatmulTile),
                  static_cast<unsigned>(batches));
  if (grid.y > 65535u || grid.z > 65535u) {
    kvlab::detail::fail("kvlab::cuda::matmul", "m or batches",
                        "at most 65535 tiles of rows and 65535 batches",
                        std::to_string(args.m) + " rows, " + std::to_string(batches) + " batches");
  }
  launch_kernel("kvlab::cuda::detail::matmul_kernel", matmul_kernel<TA, TB, TC>, grid,
                dim3(kMatmulTile, kMatmulTile), 0, stream, args);
}

}  // namespace detail

/// A linear layer without bias on the GPU: `y = x Wᵀ`, or `y += x Wᵀ` when `accumulate` (a
/// residual connection), as `AttentionLayer` computes its projections. fp32.
/// \param x           [n, in]
/// \param w           [out, in] (PyTorch's `Linear` layout)
/// \param y           [n, out]; must not overlap x or w
/// \param accumulate  add to y instead of overwriting it
/// \param stream      the stream to run on
/// \throws InvalidArgument if the shapes disagree; CudaError if the launch fails.
inline void linear(DeviceMatrix<const float> x, DeviceMatrix<const float> w, DeviceMatrix<float> y,
                   bool accumulate = false, cudaStream_t stream = nullptr) {
  constexpr const char* kWhere = "kvlab::cuda::linear";
  kvlab::detail::require_equal(kWhere, "w.cols", w.cols, x.cols, "x.cols");
  kvlab::detail::require_equal(kWhere, "y.rows", y.rows, x.rows, "x.rows");
  kvlab::detail::require_equal(kWhere, "y.cols", y.cols, w.rows, "w.rows");
  detail::MatmulArgs<float, float, float> args{};
  args.a = x.data;
  args.a_row = x.cols;
  args.b = w.data;  // B(k, n) = W[n][k]
  args.b_k = 1;
  args.b_n = w.cols;
  args.b_group = 1;
  args.c = y.data;
  args.c_row = y.cols;
  args.m = x.rows;
  args.n = w.rows;
  args.k = x.cols;
  args.alpha = 1.f;
  args.accumulate = accumulate;
  detail::matmul(args, 1, stream);
}

}  // namespace kvlab::cuda
