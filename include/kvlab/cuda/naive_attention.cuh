/// \file
/// \brief Naive causal attention on the GPU, the teaching baseline.
///
/// The whole `[q_len, kv_len]` score matrix of every head is computed and stored in device memory,
/// then masked and softmaxed, then multiplied by V: the same three steps as `cpu::naive_attention`,
/// one launch each. Checked against `cpu::naive_attention` in tests/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/core/views.hpp"
#include "kvlab/cuda/device_memory.cuh"
#include "kvlab/cuda/error.cuh"
#include "kvlab/cuda/launch.cuh"
#include "kvlab/cuda/matmul.cuh"
#include "kvlab/cuda/numeric.cuh"

namespace kvlab::cuda {
namespace detail {

/// Threads per block of `masked_softmax_kernel`.
constexpr int kSoftmaxThreads = 128;

/// max(a, b), for `block_reduce`.
struct MaxOp {
  /// The larger of a and b.
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
/// a + b, for `block_reduce`.
struct SumOp {
  /// The sum of a and b.
  __device__ float operator()(float a, float b) const { return a + b; }
};

/// Reduces `x` over a block of `kSoftmaxThreads` threads with `op` (max or sum); every thread
/// gets the result. `shared` holds one float per warp.
template <typename Op>
__device__ float block_reduce(float x, Op op, float* shared) {
  for (int offset = 16; offset > 0; offset /= 2) x = op(x, __shfl_xor_sync(0xffffffffu, x, offset));
  const int warp = static_cast<int>(threadIdx.x) / 32;
  __syncthreads();  // `shared` may still be read by a previous reduction
  if (threadIdx.x % 32 == 0) shared[warp] = x;
  __syncthreads();
  x = shared[0];
  for (int w = 1; w < kSoftmaxThreads / 32; ++w) x = op(x, shared[w]);
  return x;
}

/// Step 2 of naive attention, one block per score row (blockIdx.x = query row i, blockIdx.y =
/// head h): the row's visible scores (keys [start, p], p = kv_len − q_len + i, start 0 or with
/// a window `first_visible_key(p, window)`) become their softmax, the masked rest becomes 0.
/// \param scores  [num_heads, q_len, kv_len], in place
/// \param window  W >= 1: each row sees its last W keys; 0: every key up to itself
template <int kThreads = kSoftmaxThreads>
__global__ void masked_softmax_kernel(float* scores, int q_len, int kv_len, int window) {
  static_assert(kThreads == kSoftmaxThreads, "block_reduce assumes kSoftmaxThreads threads");
  __shared__ float partial[kThreads / 32];
  const int i = static_cast<int>(blockIdx.x);
  float* row = scores + (static_cast<std::ptrdiff_t>(blockIdx.y) * q_len + i) * kv_len;  // [kv_len]
  const int visible = kv_len - q_len + i + 1;  // one past the row's last key
  const int start = first_visible_key(visible - 1, window);
  float max = -INFINITY;
  for (int j = start + static_cast<int>(threadIdx.x); j < visible; j += kThreads)
    max = fmaxf(max, row[j]);
  max = block_reduce(max, MaxOp{}, partial);
  float sum = 0.f;
  for (int j = start + static_cast<int>(threadIdx.x); j < visible; j += kThreads) {
    row[j] = expf(row[j] - max);
    sum += row[j];
  }
  sum = block_reduce(sum, SumOp{}, partial);
  for (int j = static_cast<int>(threadIdx.x); j < kv_len; j += kThreads)
    row[j] = j >= start && j < visible ? row[j] / sum : 0.f;
}

}  // namespace detail

/// Causal attention over a whole sequence on the GPU, materialising the score matrix of every
/// head: the device counterpart of `cpu::naive_attention`, same arguments in the same order.
///
/// Query row `i` is the token at position `p = kv_len - q_len + i` and sees keys `[0, p]`, or
/// with a sliding window of W keys its last W, `(p − W, p]` (see `cpu::reference_attention`).
/// Three launches:
///  1. `S_h = scale · Q_h K_hᵀ` for every head h (K/V head h / group_size), all `[q_len, kv_len]`
///     entries, masked ones included, into a scratch buffer of num_heads · q_len · kv_len floats
///     (`matmul_kernel`: one 16 × 16 tile of S per block, one score per thread);
///  2. each row's visible part softmaxed, the rest set to 0 (`masked_softmax_kernel`: one block
///     of 128 threads per row);
///  3. `O_h = P_h V_h` (`matmul_kernel` again), written to `out` in T.
/// Inputs are read in their storage type and everything is computed in fp32.
///
/// \param shape     the head layout (any head_dim >= 1)
/// \param q         queries, [q_len, num_heads * head_dim], q_len >= 1, device memory
/// \param k         keys,    [kv_len, num_kv_heads * head_dim], kv_len >= q_len
/// \param v         values,  [kv_len, num_kv_heads * head_dim]
/// \param out       output,  [q_len, num_heads * head_dim]; must not overlap the inputs
/// \param counters  if not null, receives the work done: the counts of `cpu::naive_attention`
/// \param window    W >= 1: each query sees its last W keys; 0 (default): all up to itself
/// \param options   stream and scratch memory (the score matrix); partitions are not used
/// \throws InvalidArgument for any shape that does not fit the above, or a negative window;
///         CudaError if a CUDA call fails.
template <typename T>
void naive_attention(const AttentionShape& shape, DeviceInput<T> q, DeviceInput<T> k,
                     DeviceInput<T> v, DeviceMatrix<T> out, CostCounters* counters = nullptr,
                     int window = 0, const LaunchOptions& options = {}) {
  static_assert(is_storage_type<T>,
                "kvlab::cuda::naive_attention stores float, __half or __nv_bfloat16");
  constexpr const char* kWhere = "kvlab::cuda::naive_attention";
  using kvlab::detail::fail;
  using kvlab::detail::require_equal;
  kvlab::detail::require_at_least(kWhere, "q.rows", q.rows, 1);
  kvlab::detail::require_at_least(kWhere, "window", window, 0);
  require_equal(kWhere, "q.cols", q.cols, shape.q_width(), "num_heads * head_dim");
  require_equal(kWhere, "k.cols", k.cols, shape.kv_width(), "num_kv_heads * head_dim");
  require_equal(kWhere, "v.rows", v.rows, k.rows, "k.rows");
  require_equal(kWhere, "v.cols", v.cols, shape.kv_width(), "num_kv_heads * head_dim");
  if (k.rows < q.rows) fail(kWhere, "k.rows", ">= q.rows (" + std::to_string(q.rows) + ")", k.rows);
  require_equal(kWhere, "out.rows", out.rows, q.rows, "q.rows");
  require_equal(kWhere, "out.cols", out.cols, shape.q_width(), "num_heads * head_dim");
  if (q.data == nullptr || k.data == nullptr || v.data == nullptr || out.data == nullptr) {
    fail(kWhere, "q.data / k.data / v.data / out.data", "device pointers", "a null pointer");
  }

  const int q_len = q.rows;
  const int kv_len = k.rows;
  const int hd = shape.head_dim();
  const int heads = shape.num_heads();
  const std::size_t scores_per_head = kvlab::detail::elements(q_len, kv_len);
  detail::Scratch scratch(static_cast<std::size_t>(heads) * scores_per_head * sizeof(float),
                          options.workspace, options.stream);
  float* scores = scratch.as<float>();  // [num_heads, q_len, kv_len]

  // 1. Every score: S_h(i, j) = scale · q_h(i) · k_{h / group}(j).
  detail::MatmulArgs<T, T, float> qk{};
  qk.a = q.data;  // Q_h(i, c) = q[i * q_width + h * head_dim + c]
  qk.a_row = shape.q_width();
  qk.a_batch = hd;
  qk.b = k.data;  // B_h(c, j) = K_h(j, c) = k[j * kv_width + (h / group) * head_dim + c]
  qk.b_k = 1;
  qk.b_n = shape.kv_width();
  qk.b_batch = hd;
  qk.b_group = shape.group_size();
  qk.c = scores;
  qk.c_row = kv_len;
  qk.c_batch = static_cast<std::ptrdiff_t>(scores_per_head);
  qk.m = q_len;
  qk.n = kv_len;
  qk.k = hd;
  qk.alpha = static_cast<float>(shape.scale());
  detail::matmul(qk, heads, options.stream);

  // 2. Softmax of each row's visible scores (its band with a window); the masked ones become 0.
  if (heads > 65535) fail(kWhere, "shape.num_heads()", "at most 65535", heads);
  detail::launch_kernel(
      "kvlab::cuda::detail::masked_softmax_kernel", detail::masked_softmax_kernel<>,
      dim3(static_cast<unsigned>(q_len), static_cast<unsigned>(heads)),
      dim3(detail::kSoftmaxThreads), 0, options.stream, scores, q_len, kv_len, window);

  // 3. O_h = P_h V_{h / group}.
  detail::MatmulArgs<float, T, T> pv{};
  pv.a = scores;
  pv.a_row = kv_len;
  pv.a_batch = static_cast<std::ptrdiff_t>(scores_per_head);
  pv.b = v.data;  // B_h(j, c) = v[j * kv_width + (h / group) * head_dim + c]
  pv.b_k = shape.kv_width();
  pv.b_n = 1;
  pv.b_batch = hd;
  pv.b_group = shape.group_size();
  pv.c = out.data;  // O_h(i, c) = out[i * q_width + h * head_dim + c]
  pv.c_row = shape.q_width();
  pv.c_batch = hd;
  pv.m = q_len;
  pv.n = hd;
  pv.k = kv_len;
  pv.alpha = 1.f;
  detail::matmul(pv, heads, options.stream);

  if (counters != nullptr) {  // the counts of cpu::naive_attention
    const auto kv = static_cast<std::uint64_t>(kv_len);
    add_attention_counts(shape, sizeof(T) * static_cast<std::size_t>(hd),
                         static_cast<std::uint64_t>(scores_per_head),
                         kv * static_cast<std::uint64_t>(shape.group_size()), *counters);
  }
}

}  // namespace kvlab::cuda
