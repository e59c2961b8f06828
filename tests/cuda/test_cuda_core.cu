// The vocabulary headers (core/) under nvcc: the same KVLAB_HOST_DEVICE functions give the
// same answers on the device as on the host. Runs on a GPU machine (skipped without one) and on
// the CPU emulator (emulator/).
#include <cuda_runtime.h>
#include <catch2/catch.hpp>

#include <vector>

#include "kvlab/core/counters.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/core/views.hpp"
#include "kvlab/cuda/launch.cuh"

namespace {

#define CHECK_CUDA(call) REQUIRE((call) == cudaSuccess)

// One thread per (head, pos): the element offset of that K row, and the K/V head of each
// query head, computed on the device.
__global__ void offsets_kernel(kvlab::ContiguousKVView<float> view, kvlab::AttentionShape shape,
                               long long* offsets, int* kv_heads) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < view.num_kv_heads * view.capacity) {
    offsets[i] = view.offset(i / view.capacity, i % view.capacity);
  }
  if (i < shape.num_heads()) kv_heads[i] = shape.kv_head_of(i);
}

__global__ void counters_kernel(kvlab::CostCounters* c) {
  kvlab::CostCounters step;
  step.kv_projections = 3;
  step.qk_dots = 5;
  *c += step;
}

}  // namespace

TEST_CASE("ContiguousKVView offsets and AttentionShape grouping agree on host and device") {
  const kvlab::AttentionShape shape(32, 8, 128);
  kvlab::ContiguousKVView<float> view;
  view.num_kv_heads = 8;
  view.head_dim = 128;
  view.capacity = 37;
  const int n = view.num_kv_heads * view.capacity;
  long long* d_offsets = nullptr;
  int* d_kv_heads = nullptr;
  CHECK_CUDA(cudaMalloc(&d_offsets, n * sizeof(long long)));
  CHECK_CUDA(cudaMalloc(&d_kv_heads, shape.num_heads() * sizeof(int)));
  kvlab::cuda::detail::launch_kernel("offsets_kernel", offsets_kernel, dim3((n + 127) / 128),
                                     dim3(128), 0, nullptr, view, shape, d_offsets, d_kv_heads);
  std::vector<long long> offsets(n);
  std::vector<int> kv_heads(shape.num_heads());
  CHECK_CUDA(cudaMemcpy(offsets.data(), d_offsets, n * sizeof(long long), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(kv_heads.data(), d_kv_heads, kv_heads.size() * sizeof(int),
                        cudaMemcpyDeviceToHost));
  cudaFree(d_offsets);
  cudaFree(d_kv_heads);
  for (int i = 0; i < n; ++i)
    REQUIRE(offsets[i] == view.offset(i / view.capacity, i % view.capacity));
  for (int h = 0; h < shape.num_heads(); ++h) REQUIRE(kv_heads[h] == shape.kv_head_of(h));
}

TEST_CASE("CostCounters accumulate on the device") {
  kvlab::CostCounters* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, sizeof(kvlab::CostCounters)));
  kvlab::CostCounters start;
  start.kv_projections = 10;
  CHECK_CUDA(cudaMemcpy(d, &start, sizeof start, cudaMemcpyHostToDevice));
  kvlab::cuda::detail::launch_kernel("counters_kernel", counters_kernel, dim3(1), dim3(1), 0,
                                     nullptr, d);
  kvlab::CostCounters got;
  CHECK_CUDA(cudaMemcpy(&got, d, sizeof got, cudaMemcpyDeviceToHost));
  cudaFree(d);
  REQUIRE(got.kv_projections == 13);
  REQUIRE(got.qk_dots == 5);
}
