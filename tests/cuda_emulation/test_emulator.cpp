// The CPU emulator itself (include/cuda_runtime.h): that it runs kernels as CUDA would — block
// and thread indices, barriers, shuffles, shared memory — and that the kernel bugs it claims to
// catch are reported as launch failures instead of hanging or passing: a __syncthreads that part
// of the block skips, divergent barriers, shuffles naming exited lanes; plus launch limits and
// copy checks.
#include <cuda_runtime.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kvlab/cuda/device_memory.cuh"
#include "kvlab/cuda/error.cuh"
#include "kvlab/cuda/launch.cuh"

namespace {

namespace kc = kvlab::cuda;

// out[global thread] = its linear block index * 1000 + its linear thread index.
__global__ void indices_kernel(int* out) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  out[block * threads + thread] = static_cast<int>(block * 1000 + thread);
}

// Reverses each block's slice of `data` through shared memory: correct only if the barrier
// between the writes and the reads holds.
__global__ void reverse_kernel(float* data) {
  __shared__ float tile[128];
  const int t = static_cast<int>(threadIdx.x);
  float* slice = data + blockIdx.x * blockDim.x;
  tile[t] = slice[t];
  __syncthreads();
  slice[t] = tile[blockDim.x - 1 - t];
}

// out[t] = the sum over the warp of t, by xor shuffles; and the value of lane t ^ 5.
__global__ void shuffle_kernel(float* sums, float* swapped) {
  const float x = static_cast<float>(threadIdx.x);
  float sum = x;
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  sums[threadIdx.x] = sum;
  swapped[threadIdx.x] = __shfl_xor_sync(0xffffffffu, x, 5);
}

// Dynamic shared memory: each thread writes its index, then reads its neighbour's.
__global__ void dynamic_smem_kernel(int* out) {
  int* shared = reinterpret_cast<int*>(kc::detail::dynamic_shared_memory());
  const int t = static_cast<int>(threadIdx.x);
  shared[t] = t;
  __syncthreads();
  out[t] = shared[(t + 1) % static_cast<int>(blockDim.x)];
}

// Bug: threads past `n` return before a barrier the others wait at.
__global__ void early_exit_kernel(float* data, int n) {
  __shared__ float tile[64];
  const int t = static_cast<int>(threadIdx.x);
  if (t >= n) return;
  tile[t] = data[t];
  __syncthreads();
  data[t] = tile[n - 1 - t];
}

// Bug: odd and even threads wait at different barriers.
__global__ void divergent_barrier_kernel(float* data) {
  if (threadIdx.x % 2 == 0) {
    data[threadIdx.x] = 1.f;
    __syncthreads();
  } else {
    data[threadIdx.x] = 2.f;
    __syncthreads();
  }
}

// Bug: half the warp exits before a full-mask shuffle.
__global__ void shuffle_after_exit_kernel(float* data) {
  if (threadIdx.x >= 16) return;
  data[threadIdx.x] = __shfl_xor_sync(0xffffffffu, data[threadIdx.x], 1);
}

// Bug: a full-mask shuffle in a block of 20 threads (lanes 20-31 do not exist).
__global__ void partial_warp_shuffle_kernel(float* data) {
  data[threadIdx.x] = __shfl_xor_sync(0xffffffffu, data[threadIdx.x], 1);
}

__global__ void empty_kernel() {}

// Bug: reverse_kernel without its barrier — threads read tile entries that threads of other
// warps write in the same barrier interval.
__global__ void unsynchronised_reverse_kernel(float* data) {
  __shared__ float tile[128];
  const int t = static_cast<int>(threadIdx.x);
  float* slice = data + blockIdx.x * blockDim.x;
  tile[t] = slice[t];
  slice[t] = tile[blockDim.x - 1 - t];
}

// Bug: after a correct barrier, each thread overwrites its entry while the thread 32 places on
// (another warp) may still have to read it.
__global__ void write_after_read_kernel(int* out) {
  int* shared = reinterpret_cast<int*>(kc::detail::dynamic_shared_memory());
  const int t = static_cast<int>(threadIdx.x);
  const int n = static_cast<int>(blockDim.x);
  shared[t] = t;
  __syncthreads();
  out[t] = shared[(t + 32) % n];
  shared[t] = -t;
}

// Bug: reads dynamic shared memory that no thread of the block writes.
__global__ void unwritten_read_kernel(float* out) {
  const float* shared = reinterpret_cast<const float*>(kc::detail::dynamic_shared_memory());
  out[threadIdx.x] = shared[threadIdx.x];
}

// out[block] = the maximum over the block of shared[t] = t, taken by warp 0. With `barrier`
// false, the barrier between the writes and warp 0's reads is missing: warp 0 sees whatever
// the schedule let other warps write by then, and the poison elsewhere.
__global__ void block_max_kernel(float* out, bool barrier) {
  float* shared = reinterpret_cast<float*>(kc::detail::dynamic_shared_memory());
  const int t = static_cast<int>(threadIdx.x);
  shared[t] = static_cast<float>(t);
  if (barrier) __syncthreads();
  if (t >= 32) return;
  float m = -INFINITY;
  for (int j = t; j < static_cast<int>(blockDim.x); j += 32) m = fmaxf(m, shared[j]);
  for (int offset = 16; offset > 0; offset /= 2)
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  if (t == 0) out[blockIdx.x] = m;
}

template <typename T>
std::vector<T> download(const kc::DeviceBuffer<T>& buffer) {
  return buffer.to_host();
}

// Launches a buggy kernel and expects the emulator to report it as a failed launch; returns
// the emulator's report.
template <typename... Args>
std::string require_kernel_bug(const char* name, void (*kernel)(Args...), dim3 grid, dim3 block,
                               std::size_t smem_bytes, Args... args) {
  try {
    kc::detail::launch_kernel(name, kernel, grid, block, smem_bytes, nullptr, args...);
    FAIL("the emulator ran " << name << " without reporting its bug");
  } catch (const kvlab::CudaError& e) {
    CHECK(e.code() == cudaErrorLaunchFailure);
  }
  return kvlab_emulation::last_kernel_bug();
}

template <typename... Args>
std::string require_kernel_bug(const char* name, void (*kernel)(Args...), dim3 grid, dim3 block,
                               Args... args) {
  return require_kernel_bug(name, kernel, grid, block, 0, args...);
}

// Sets an environment variable for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// Racecheck on or off for the scope, whatever KVLAB_EMULATION_RACECHECK says (off: to see what
// the schedules catch alone).
class ScopedRacecheck {
 public:
  explicit ScopedRacecheck(bool on) : was_(kvlab_emulation::set_racecheck(on)) {}
  ~ScopedRacecheck() { kvlab_emulation::set_racecheck(was_); }
  ScopedRacecheck(const ScopedRacecheck&) = delete;
  ScopedRacecheck& operator=(const ScopedRacecheck&) = delete;

 private:
  bool was_;
};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("the emulator gives every thread its block and thread indices") {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  kc::DeviceBuffer<int> out(12 * 24);
  kc::detail::launch_kernel("indices_kernel", indices_kernel, grid, block, 0, nullptr, out.data());
  const std::vector<int> got = download(out);
  for (int b = 0; b < 12; ++b)
    for (int t = 0; t < 24; ++t) REQUIRE(got[static_cast<std::size_t>(b * 24 + t)] == b * 1000 + t);
}

TEST_CASE("the emulator's barriers, shuffles and shared memory behave as CUDA's") {
  SECTION("__syncthreads orders shared memory across the block") {
    std::vector<float> host(3 * 128);
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i);
    kc::DeviceBuffer<float> data(host);
    kc::detail::launch_kernel("reverse_kernel", reverse_kernel, dim3(3), dim3(128), 0, nullptr,
                              data.data());
    const std::vector<float> got = download(data);
    for (int b = 0; b < 3; ++b)
      for (int t = 0; t < 128; ++t) {
        REQUIRE(got[static_cast<std::size_t>(b * 128 + t)] ==
                host[static_cast<std::size_t>(b * 128 + 127 - t)]);
      }
  }
  SECTION("__shfl_xor_sync exchanges within the warp") {
    kc::DeviceBuffer<float> sums(64), swapped(64);
    kc::detail::launch_kernel("shuffle_kernel", shuffle_kernel, dim3(1), dim3(64), 0, nullptr,
                              sums.data(), swapped.data());
    const std::vector<float> s = download(sums), w = download(swapped);
    for (int t = 0; t < 64; ++t) {
      const int warp_base = t / 32 * 32;
      REQUIRE(s[static_cast<std::size_t>(t)] == static_cast<float>(32 * warp_base + 31 * 32 / 2));
      REQUIRE(w[static_cast<std::size_t>(t)] == static_cast<float>(warp_base + ((t % 32) ^ 5)));
    }
  }
  SECTION("dynamic shared memory has the launch's size and is shared by the block") {
    kc::DeviceBuffer<int> out(96);
    kc::detail::launch_kernel("dynamic_smem_kernel", dynamic_smem_kernel, dim3(1), dim3(96),
                              96 * sizeof(int), nullptr, out.data());
    const std::vector<int> got = download(out);
    for (int t = 0; t < 96; ++t) REQUIRE(got[static_cast<std::size_t>(t)] == (t + 1) % 96);
  }
}

TEST_CASE(
    "the emulator reports barriers and shuffles that part of a block skips, instead of hanging") {
  kc::DeviceBuffer<float> data(std::vector<float>(64, 1.f));
  require_kernel_bug("early_exit_kernel", early_exit_kernel, dim3(1), dim3(64), data.data(), 40);
  require_kernel_bug("divergent_barrier_kernel", divergent_barrier_kernel, dim3(1), dim3(64),
                     data.data());
  require_kernel_bug("shuffle_after_exit_kernel", shuffle_after_exit_kernel, dim3(1), dim3(32),
                     data.data());
  require_kernel_bug("partial_warp_shuffle_kernel", partial_warp_shuffle_kernel, dim3(1), dim3(20),
                     data.data());
  // The same early-exit kernel is correct when every thread reaches the barrier.
  CHECK_NOTHROW(kc::detail::launch_kernel("early_exit_kernel", early_exit_kernel, dim3(1), dim3(64),
                                          0, nullptr, data.data(), 64));
}

TEST_CASE("the emulator refuses launches and copies that CUDA refuses") {
  CHECK_THROWS_AS(
      kc::detail::launch_kernel("empty_kernel", empty_kernel, dim3(1), dim3(1025), 0, nullptr),
      kvlab::CudaError);
  CHECK_THROWS_AS(
      kc::detail::launch_kernel("empty_kernel", empty_kernel, dim3(1, 65536), dim3(32), 0, nullptr),
      kvlab::CudaError);
  CHECK_THROWS_AS(kc::detail::launch_kernel("empty_kernel", empty_kernel, dim3(1), dim3(32),
                                            48 * 1024 + 1, nullptr),
                  kvlab::CudaError);
  kc::DeviceBuffer<float> device(4);
  std::vector<float> host(8);
  CHECK(cudaMemcpy(device.data(), host.data(), 8 * sizeof(float), cudaMemcpyHostToDevice) ==
        cudaErrorInvalidValue);
  CHECK(cudaMemcpy(host.data(), device.data(), 4 * sizeof(float), cudaMemcpyHostToDevice) ==
        cudaErrorInvalidValue);
  CHECK(cudaMemcpy(device.data(), host.data(), 4 * sizeof(float), cudaMemcpyHostToDevice) ==
        cudaSuccess);
  CHECK(cudaFree(host.data()) == cudaErrorInvalidDevicePointer);
  (void)cudaGetLastError();
}

// The report of write_after_read_kernel, which must fail, on one block of 128 threads.
std::string write_after_read_report(kc::DeviceBuffer<int>& out) {
  return require_kernel_bug("write_after_read_kernel", write_after_read_kernel, dim3(1), dim3(128),
                            128 * sizeof(int), out.data());
}

// unwritten_read_kernel must fail with a report of its unwritten read (a macro: the checks
// report the test case's line).
#define CHECK_UNWRITTEN_READ_REPORTED()                                                       \
  do {                                                                                        \
    kc::DeviceBuffer<float> copied(64);                                                       \
    const std::string unwritten =                                                             \
        require_kernel_bug("unwritten_read_kernel", unwritten_read_kernel, dim3(1), dim3(64), \
                           64 * sizeof(float), copied.data());                                \
    INFO(unwritten);                                                                          \
    CHECK(contains(unwritten,                                                                 \
                   "of dynamic shared memory, which no thread of the block has written"));    \
  } while (false)

TEST_CASE(
    "racecheck reports shared-memory races with the kernel, the block and the barrier interval") {
#if !defined(KVLAB_EMULATION_RACECHECK)
  std::printf("SKIPPED: racecheck is not built in (an AddressSanitizer build, or not GCC)\n");
  std::exit(77);
#endif
  ScopedRacecheck racecheck(true);
  const std::uint64_t checked = kvlab_emulation::checked_shared_accesses();
  kc::DeviceBuffer<float> data(std::vector<float>(2 * 128, 1.f));
  const std::string unsynchronised =
      require_kernel_bug("unsynchronised_reverse_kernel", unsynchronised_reverse_kernel, dim3(2),
                         dim3(128), data.data());
  INFO(unsynchronised);
  CHECK(contains(unsynchronised, "unsynchronised_reverse_kernel, block (0,0,0)"));
  CHECK(contains(unsynchronised, "race on static shared memory"));
  CHECK(contains(
      unsynchronised,
      "in the barrier interval between the start of the kernel and the end of the kernel"));

  kc::DeviceBuffer<int> out(128);
  const std::string overwrite = write_after_read_report(out);
  INFO(overwrite);
  CHECK(contains(overwrite, "write_after_read_kernel, block (0,0,0)"));
  CHECK(contains(overwrite, "race on dynamic shared memory"));
  CHECK(contains(overwrite, "in the barrier interval between __syncthreads (test_emulator.cpp:"));

  CHECK_UNWRITTEN_READ_REPORTED();

  // The same kernels with their barriers are clean, and racecheck saw their accesses.
  CHECK_NOTHROW(kc::detail::launch_kernel("reverse_kernel", reverse_kernel, dim3(2), dim3(128), 0,
                                          nullptr, data.data()));
  kc::DeviceBuffer<float> max(4);
  CHECK_NOTHROW(kc::detail::launch_kernel("block_max_kernel", block_max_kernel, dim3(4), dim3(128),
                                          128 * sizeof(float), nullptr, max.data(), true));
  CHECK(kvlab_emulation::checked_shared_accesses() > checked + 2 * 128 * 2);
  (void)cudaGetLastError();
}

TEST_CASE("racecheck's interval serial wraps without losing what the running block wrote") {
#if !defined(KVLAB_EMULATION_RACECHECK)
  std::printf("SKIPPED: racecheck is not built in (an AddressSanitizer build, or not GCC)\n");
  std::exit(77);
#endif
  ScopedRacecheck racecheck(true);
  // The block opens interval 2^32 - 1; its __syncthreads renumbers every byte's record before
  // the reads, which must still see the block's own writes.
  kvlab_emulation::set_interval_serial(0xFFFFFFFEu);
  kc::DeviceBuffer<int> out(128);
  CHECK_NOTHROW(kc::detail::launch_kernel("dynamic_smem_kernel", dynamic_smem_kernel, dim3(1),
                                          dim3(128), 128 * sizeof(int), nullptr, out.data()));
  const std::vector<int> got = download(out);
  for (int t = 0; t < 128; ++t) CHECK(got[static_cast<std::size_t>(t)] == (t + 1) % 128);
  // After the wrap, races and reads of what only an earlier block wrote are still caught.
  const std::string overwrite = write_after_read_report(out);
  INFO(overwrite);
  CHECK(contains(overwrite, "write-after-read race on dynamic shared memory"));
  CHECK_UNWRITTEN_READ_REPORTED();
  (void)cudaGetLastError();
}

TEST_CASE(
    "blocks take turns in other orders and see other poison, and reruns under other "
    "schedules must agree bit for bit") {
  ScopedRacecheck schedules_alone(false);
  // 12 blocks: each of the four schedules with each of the three poisons (NaN, +1e30, -1e30).
  constexpr int kBlocks = 12;
  kc::DeviceBuffer<float> max(kBlocks);
  const auto run = [&](bool barrier) {
    kc::detail::launch_kernel("block_max_kernel", block_max_kernel, dim3(kBlocks), dim3(128),
                              128 * sizeof(float), nullptr, max.data(), barrier);
    return download(max);
  };
  SECTION("a correct kernel gives the same result in every block and under every schedule") {
    ScopedEnv reruns("KVLAB_EMULATION_SCHEDULES", "4");
    for (const float m : run(true)) CHECK(m == 127.f);
  }
  SECTION("without its barrier, blocks see stale values and poison that fmaxf cannot hide") {
    const std::vector<float> got = run(false);
    const auto seen = [&](float value) {
      for (const float m : got)
        if (m == value) return true;
      return false;
    };
    CHECK(seen(127.f));  // warp 0 came last: every write was done
    CHECK(seen(31.f));   // warp 0 came first under NaN poison: fmaxf dropped the poison
    CHECK(seen(1e30f));  // warp 0 came first under +1e30 poison: the stale read shows
  }
  SECTION("without its barrier, reruns under other schedules differ and the launch fails") {
    ScopedEnv reruns("KVLAB_EMULATION_SCHEDULES", "3");
    const std::string report =
        require_kernel_bug("block_max_kernel", block_max_kernel, dim3(kBlocks), dim3(128),
                           128 * sizeof(float), max.data(), false);
    INFO(report);
    CHECK(contains(report, "race in block_max_kernel: its result depends on the order"));
    CHECK(contains(report, "whose result differs between schedules"));
  }
  (void)cudaGetLastError();
}
