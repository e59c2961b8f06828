// Tutorial 11: the same attention on the GPU.
//
// What you will learn:
//  1. That a kvlab CUDA kernel has the name and the arguments of its CPU twin:
//     kvlab::cuda::decode_attention(shape, q, cache) beside kvlab::cpu::decode_attention(shape,
//     q, cache), and that the two agree element by element.
//  2. How the decode kernel spreads the work over the GPU (kvlab::cuda::plan_attention): one
//     block of 128 threads per (query row, K/V head, split-K partition); `lanes` threads share a
//     K/V row; the query heads of a GQA group share every row a block reads.
//  3. Split-K ("flash-decoding"): a long context cut into partitions that run in parallel and
//     are merged by the log-sum-exp rule, with the same result as one pass.
//  4. Paged attention on the GPU: a ragged batch through its block tables, in one launch, in
//     both pool layouts; and the device-pointer API with fp16 storage.
// Every GPU result is compared with the CPU reference: |gpu - cpu| <= atol + rtol |cpu| for every
// element (fp32: rtol 1e-5, atol 1e-6; fp16: rtol 1e-2, atol 1e-4).
//
// Build and run (from the repository root, with `build/` configured by CMake and nvcc found):
//   cmake --build build --target tutorial_11_cuda_attention && build/tutorials/11_cuda_attention
// Without a GPU it prints "SKIPPED: no CUDA device" and exits with 77 (CTest: Skipped). The
// build also makes build/tutorials/11_cuda_attention_emulated: this same program compiled by the
// host compiler against the CPU emulator of CUDA in emulator/, which runs everywhere
// (its kernels run on the CPU, one block after another; it checks results, not speed).
// Option (the exercises of its page change it): --keys N cached tokens of the decode (3000).
//
// Next: bench/cuda/attention_lab.cu — the kernel versions side by side, validated, then timed.

#include <kvlab/cache/contiguous_kv_cache.hpp>
#include <kvlab/cache/paged_kv_cache.hpp>
#include <kvlab/cpu/decode_attention.hpp>
#include <kvlab/cpu/paged_attention.hpp>
#include <kvlab/cuda/contiguous_kv_cache.cuh>
#include <kvlab/cuda/host_api.cuh>        // kvlab::cuda:: attention on host data
#include <kvlab/cuda/paged_kv_cache.cuh>  // kvlab::cuda::ContiguousKVCache: a cache in device memory

#include "support/command_line.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

using kvlab::RowMatrix;

namespace {

// How many elements break |got - want| <= atol + rtol |want|; prints the largest difference.
long report(const char* what, const RowMatrix<float>& got, const RowMatrix<float>& want,
            double rtol, double atol) {
  long bad = 0;
  double max_diff = 0;
  for (Eigen::Index i = 0; i < want.size(); ++i) {
    const double diff = std::abs(double(got.data()[i]) - double(want.data()[i]));
    if (!(diff <= atol + rtol * std::abs(double(want.data()[i])))) ++bad;
    max_diff = std::max(max_diff, diff);
  }
  std::printf("  %-44s max |cuda - cpu| = %.1e  %s\n", what, max_diff,
              bad == 0 ? "ok" : "MISMATCH");
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  int keys = 3000;  // cached tokens of the decode
  kvlab_support::CommandLine command_line{"Tutorial 11: the same attention on the GPU"};
  command_line.add_integer("--keys", keys, "cached tokens of the decode", 1, 4096);
  if (const auto stop = command_line.parse("11_cuda_attention", argc, argv))
    return *stop;
  // [device]
  if (!kvlab::cuda::has_device()) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  KVLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("Device: %s, %d multiprocessors\n\n", prop.name, prop.multiProcessorCount);
  // [device]
  long bad = 0;

  // [decode]
  // Llama-style GQA: 32 query heads share 8 K/V heads of 128 values. One sequence, 3000 cached
  // tokens (a kvlab::ContiguousKVCache in host memory, tutorial 02), and the query of the next.
  const kvlab::AttentionShape shape(/*num_heads=*/32, /*num_kv_heads=*/8, /*head_dim=*/128);
  kvlab::Rng rng(11);
  kvlab::ContiguousKVCache<float> cache(/*num_layers=*/1, shape.num_kv_heads(), shape.head_dim(),
                                        4096);
  cache.append(0, kvlab::random_matrix<float>(keys, shape.kv_width(), rng),
               kvlab::random_matrix<float>(keys, shape.kv_width(), rng));
  const RowMatrix<float> q = kvlab::random_matrix<float>(1, shape.q_width(), rng);  // [1, 32 * 128]

  const RowMatrix<float> cpu = kvlab::cpu::decode_attention(shape, q, cache.view(0));
  // copy, run, copy back
  const RowMatrix<float> gpu = kvlab::cuda::decode_attention(shape, q, cache.view(0));
  // [decode]
  std::printf("Decode, %d cached tokens:\n", keys);
  bad += report("cuda::decode_attention vs cpu::", gpu, cpu, 1e-5, 1e-6);

  // [plan]
  // How that call was launched on this GPU (partitions: 0 = chosen automatically).
  const kvlab::cuda::AttentionPlan plan = kvlab::cuda::plan_attention(
      shape, /*rows=*/1, /*block_size=*/1, prop.multiProcessorCount, /*partitions=*/0);
  std::printf(
      "\nThe launch: grid (%d rows, %d K/V heads x %d GQA tiles, up to %d partitions) x %d "
      "threads\n",
      1, shape.num_kv_heads(), plan.group_tiles, plan.partitions, kvlab::cuda::kAttentionThreads);
  std::printf(
      "  %d threads per K/V row (8 values each), %d query heads per block, %zu bytes of shared "
      "memory\n",
      plan.lanes, plan.group_tile, plan.smem_bytes);
  const int count = kvlab::partition_count(keys, plan.partitions, plan.unit);
  std::printf("  %d keys in %d partition%s of %d (multiples of %d keys)\n", keys, count,
              count == 1 ? "" : "s", kvlab::partition_size(keys, plan.partitions, plan.unit),
              plan.unit);
  // [plan]

  // [split]
  std::printf("\nSplit-K: the same keys, cut differently, merged by the log-sum-exp rule:\n");
  for (int partitions : {1, 4, 0}) {
    kvlab::cuda::LaunchOptions options;
    options.partitions = partitions;  // 1: one pass per (row, K/V head); 0: automatic
    const RowMatrix<float> split =
        kvlab::cuda::decode_attention(shape, q, cache.view(0), nullptr, options);
    char what[64];
    std::snprintf(what, sizeof what, "partitions = %d%s", partitions,
                  partitions == 0 ? " (automatic)" : "");
    bad += report(what, split, cpu, 1e-5, 1e-6);
  }
  // [split]

  // [paged]
  // A ragged batch of three sequences in a pool of 16-token blocks (tutorial 03), one launch.
  std::printf("\nPaged decode, a batch of 3 sequences (700, 1 and 2500 tokens), blocks of 16:\n");
  for (kvlab::KVLayout layout : {kvlab::KVLayout::NHD, kvlab::KVLayout::HND}) {
    kvlab::PagedKVCache<float> pool(1, shape.num_kv_heads(), shape.head_dim(), /*block_size=*/16,
                                    /*num_blocks=*/256, layout);
    std::vector<int> seqs;
    for (int len : {700, 1, 2500}) {
      seqs.push_back(pool.add_sequence());
      pool.write(0, pool.reserve(seqs.back(), len),
                 kvlab::random_matrix<float>(len, shape.kv_width(), rng),
                 kvlab::random_matrix<float>(len, shape.kv_width(), rng));
    }
    const kvlab::BlockTables tables = pool.tables(seqs);
    // one query per sequence
    const RowMatrix<float> qs = kvlab::random_matrix<float>(3, shape.q_width(), rng);
    const RowMatrix<float> want =
        kvlab::cpu::paged_decode_attention(shape, qs, pool.view(0, tables));
    const RowMatrix<float> got =
        kvlab::cuda::paged_decode_attention(shape, qs, pool.view(0, tables));
    bad += report(layout == kvlab::KVLayout::NHD ? "NHD pool" : "HND pool", got, want, 1e-5, 1e-6);
  }
  // [paged]

  // [device_api]
  // The device-pointer API, fp16 storage: a cache on the GPU, rows appended by a kernel, and the
  // output left on the GPU. The CPU reference runs in float on the same fp16-rounded values.
  const auto rounded = [](RowMatrix<float> m) {  // the same values, as floats
    for (Eigen::Index i = 0; i < m.size(); ++i)
      m.data()[i] = __half2float(__float2half(m.data()[i]));
    return m;
  };
  const RowMatrix<float> k = rounded(kvlab::random_matrix<float>(1000, shape.kv_width(), rng));
  const RowMatrix<float> v = rounded(kvlab::random_matrix<float>(1000, shape.kv_width(), rng));
  const RowMatrix<float> q16 = rounded(kvlab::random_matrix<float>(1, shape.q_width(), rng));
  kvlab::cuda::ContiguousKVCache<__half> device_cache(1, shape.num_kv_heads(), shape.head_dim(),
                                                      1024);
  // fp16 on the GPU
  const auto d_k = kvlab::cuda::to_device<__half>(k), d_v = kvlab::cuda::to_device<__half>(v),
             d_q = kvlab::cuda::to_device<__half>(q16);
  device_cache.append(0, d_k.matrix(1000, shape.kv_width()), d_v.matrix(1000, shape.kv_width()));
  kvlab::cuda::DeviceBuffer<__half> d_out(static_cast<std::size_t>(shape.q_width()));
  kvlab::cuda::decode_attention(shape, d_q.matrix(1, shape.q_width()), device_cache.view(0),
                                d_out.matrix(1, shape.q_width()));
  // [device_api]
  const RowMatrix<float> got16 = kvlab::cuda::to_host(d_out, 1, shape.q_width());
  kvlab::ContiguousKVCache<float> host_cache(1, shape.num_kv_heads(), shape.head_dim(), 1024);
  host_cache.append(0, k, v);
  std::printf("\nDevice API, fp16 storage, fp32 arithmetic:\n");
  bad += report("fp16 cache vs cpu:: on the same values", got16,
                kvlab::cpu::decode_attention(shape, q16, host_cache.view(0)), 1e-2, 1e-4);

  std::printf("\n%s\n", bad == 0 ? "All checks passed." : "MISMATCH: see above.");
  return bad == 0 ? 0 : 1;
}
