/// \file
/// \brief What kvlab's GPU benchmark programs share: timing a kernel with CUDA events after
/// flushing the L2 cache (so that K/V come from HBM, as in a real decode step), the GPU's peak
/// memory bandwidth from its name, a measured device-to-device copy bandwidth, a device-side
/// random fill for pools too large to generate on the host, and the programs' common `main`.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvlab/cuda/device_memory.cuh"
#include "kvlab/cuda/error.cuh"
#include "kvlab/cuda/numeric.cuh"

#include "support/cli.hpp"
#include "support/stats.hpp"

namespace kvlab_bench {

/// Peak HBM bandwidth in TB/s of the GPUs the project measures on, from the device name:
/// H200 4.8, H100 SXM 3.35 (H100 PCIe 2.0); 0 if unknown (pass --peak-tbps).
inline double peak_tbps_for(const std::string& name) {
  if (name.find("H200") != std::string::npos) return 4.8;
  if (name.find("H100") != std::string::npos)
    return name.find("PCIe") != std::string::npos ? 2.0 : 3.35;
  return 0.0;
}

/// Times GPU work: each run is preceded by a write over a buffer twice the size of the L2
/// cache (evicting whatever the previous run left there), and timed alone with CUDA events.
class GpuTimer {
 public:
  GpuTimer() {
    int device = 0, l2 = 0;
    KVLAB_CUDA_CHECK(cudaGetDevice(&device));
    KVLAB_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    flush_ = kvlab::cuda::DeviceBuffer<unsigned char>(
        static_cast<std::size_t>(std::max(l2, 1 << 20)) * 2);
    KVLAB_CUDA_CHECK(cudaEventCreate(&start_));
    KVLAB_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~GpuTimer() {
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(stop_);
  }
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;

  /// Median time of `reps` runs of `work()` (which queues GPU work on the default stream), in
  /// microseconds, after one untimed warm-up run.
  template <typename Work>
  double median_us(Work&& work, int reps) {
    work();
    KVLAB_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<double> times;
    for (int r = 0; r < reps; ++r) {
      KVLAB_CUDA_CHECK(cudaMemsetAsync(flush_.data(), r & 0xFF, flush_.size()));
      KVLAB_CUDA_CHECK(cudaEventRecord(start_));
      work();
      KVLAB_CUDA_CHECK(cudaEventRecord(stop_));
      KVLAB_CUDA_CHECK(cudaEventSynchronize(stop_));
      float ms = 0.f;
      KVLAB_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
      times.push_back(1000.0 * ms);
    }
    return kvlab_support::median(times);
  }

 private:
  kvlab::cuda::DeviceBuffer<unsigned char> flush_;
  cudaEvent_t start_{}, stop_{};
};

/// Measured device-to-device copy bandwidth in TB/s (bytes read + bytes written per second, a
/// 1 GiB copy, median of 5): what a plain streaming kernel reaches on this GPU.
inline double copy_tbps() {
  const std::size_t bytes = std::size_t{1} << 30;
  kvlab::cuda::DeviceBuffer<unsigned char> a(bytes), b(bytes);
  a.fill_bytes(1);
  GpuTimer timer;
  const double us = timer.median_us(
      [&] {
        KVLAB_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice));
      },
      5);
  return 2.0 * static_cast<double>(bytes) / (us * 1e-6) / 1e12;
}

/// Fills `data` [count] with values uniform in [-1, 1) from a hash of (seed, index).
template <typename T>
__global__ void random_fill_kernel(T* data, std::int64_t count, std::uint64_t seed) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    // SplitMix64 of the index
    std::uint64_t z = seed + 0x9E3779B97F4A7C15ULL * static_cast<std::uint64_t>(i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    data[i] = kvlab::cuda::from_float<T>(
        static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-53 * 2.0 - 1.0));
  }
}

/// `random_fill_kernel` over a whole buffer, then waits for it.
template <typename T>
void random_fill(kvlab::cuda::DeviceBuffer<T>& buffer, std::uint64_t seed) {
  random_fill_kernel<T>
      <<<4096, 256>>>(buffer.data(), static_cast<std::int64_t>(buffer.size()), seed);
  KVLAB_CUDA_CHECK_LAUNCH("random_fill_kernel");
  KVLAB_CUDA_CHECK(cudaDeviceSynchronize());
}

/// The name of the current GPU.
inline std::string device_name() {
  int device = 0;
  KVLAB_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  KVLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

/// Checks the attention shape given to a GPU benchmark's --heads, --kv-heads and --head-dim.
/// \throws kvlab_support::UsageError unless heads is a multiple of kv_heads and head_dim of 8.
inline void check_head_options(int heads, int kv_heads, int head_dim) {
  if (heads % kv_heads != 0)
    throw kvlab_support::UsageError("--heads: expected a multiple of --kv-heads (" +
                                    std::to_string(kv_heads) + "), got " + std::to_string(heads));
  if (head_dim % 8 != 0)
    throw kvlab_support::UsageError("--head-dim: expected a multiple of 8, got " +
                                    std::to_string(head_dim));
}

/// The `main` of a GPU benchmark program: its options, defaults `Options{}`, read by
/// `parse(argc, argv, options)` (kvlab_support::read_command_line: --help exits 0, a bad command
/// line 2); without a CUDA device, "SKIPPED: no CUDA device" and exit code 77 (CTest: Skipped);
/// else `run(options)`'s exit code, or 1 with a message after the program's `name` when it
/// throws.
template <typename Options, typename Parse, typename Run>
int gpu_main(const char* name, int argc, char** argv, Parse&& parse, Run&& run) {
  Options options;
  if (const auto stop = kvlab_support::read_command_line(name, argc, argv, options, parse))
    return *stop;
  try {
    if (!kvlab::cuda::has_device()) {
      std::printf("SKIPPED: no CUDA device\n");
      return 77;
    }
    return run(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace kvlab_bench
