// A CUDA runtime that runs kernels on the CPU, for kvlab's tests only: tests/cuda/*.cu compiled
// by a host compiler (g++) with -DKVLAB_CUDA_EMULATION, this directory searched before the CUDA
// toolkit's include directory. It implements the part of CUDA that kvlab and its CUDA tests use;
// the toolkit's own headers give the types (cudaError_t, dim3, float4, ...) and the fp16/bf16
// arithmetic (cuda_fp16.h, cuda_bf16.h have host implementations).
//
// Execution model (emulation.cpp):
//  - A launch runs to completion before it returns (every stream is synchronous); its blocks run
//    one after another, in order.
//  - The threads of a block are cooperative fibers on the calling thread, each with its own
//    stack: a thread runs until it reaches __syncthreads or a warp shuffle, then another one
//    runs. __syncthreads releases the block once every thread waits at the same call;
//    __shfl_xor_sync exchanges values through a per-warp buffer once every lane of the mask
//    has arrived at the same call.
//  - Schedules: which thread runs next differs from block to block, cycling through four
//    schedules: in thread order; in reverse order; "warp ahead" (the lowest ready thread, so a
//    warp released by its shuffle runs on before later warps have started); a new seeded random
//    order at every pass. A shuffle synchronises only its warp: between two barriers, warps
//    interleave differently under each schedule.
//  - __shared__ variables are static (one block runs at a time); dynamic shared memory is a
//    fresh heap allocation of exactly the launch's size per block, poisoned when the block
//    starts with NaN (all bits set), 1e30 or -1e30 (as floats), cycling with the schedules so
//    that within 12 blocks every schedule meets every poison: fmaxf/fminf ignore NaN, but not a
//    huge finite value.
//  - KVLAB_EMULATION_SCHEDULES=N (N > 1) runs every launch N times from the same device memory,
//    each run giving every block another schedule and poison, and fails the launch unless all
//    runs leave device memory bit for bit the same; the report names the first differing byte
//    and the first block whose result alone differs between two schedules. N-fold slower; off by
//    default (the emulator's own test sets it; set it for any run of the tests).
//  - Racecheck (on in builds with GCC, off under AddressSanitizer, see CMakeLists.txt): the
//    test's code is compiled with -fsanitize=kernel-address and out-of-line checks, so every
//    load and store calls the emulator (the __asan_*_noabort functions of emulation.cpp). Each
//    byte of shared memory (dynamic, and the executable's statics, where __shared__ variables
//    are) has a shadow cell: last writer, warps that read it, barrier interval. It reports, as
//    a launch failure naming the kernel, the block, the two threads and their warps, the byte
//    and the two __syncthreads around the interval: two accesses to one byte by threads of
//    different warps in one barrier interval, at least one a write (read-after-write,
//    write-after-read, write-after-write), and a read of dynamic shared memory that no thread
//    of the block has written. Whatever the order the emulator ran them in, such accesses race
//    on a GPU. Cost: about 2.2x the run time of the emulated tests (136 s of CPU without it,
//    296 s with it, `ctest -L emulated -j2` on 2 cores): a call per load and store of the test
//    program, host code included. KVLAB_EMULATION_RACECHECK=0 turns the checks off (237 s).
//  - Device memory is host memory (256-byte aligned, exactly the requested size, so that
//    AddressSanitizer sees a read past an allocation); cudaMemcpy/cudaMemset check their
//    device-side ranges against the live allocations and that host-side pointers are not
//    device memory.
//
// What it checks: index math, tiling, split-K partitions and their merge, GQA head mapping,
// causal masks, that NaN-filled unused cache slots are never read; launch configuration limits
// (threads per block, grid sizes, 48 KiB of dynamic shared memory); and kernel bugs that it
// reports as a launch failure with a message: a __syncthreads that some threads of the block
// never reach (they exited or wait elsewhere), threads waiting at different __syncthreads, a
// shuffle whose mask names exited, absent or non-arriving lanes, any deadlock; shared-memory
// races between warps and reads of unwritten dynamic shared memory (racecheck); results that
// depend on the order of the threads (schedules and poison; bit for bit with
// KVLAB_EMULATION_SCHEDULES). With AddressSanitizer: out-of-bounds reads and writes of device
// and dynamic shared memory (a CPU-side stand-in for compute-sanitizer memcheck).
//
// What only a GPU can check: timing and performance; races between blocks (they run one after
// another here) and through global memory within a block (racecheck watches shared memory
// only; the schedules catch those whose result depends on the order); races between lanes of
// one warp (racecheck treats a warp as one, as code written for lockstep execution assumes:
// on Volta and later that needs __syncwarp, which the emulator does not provide); memory
// ordering and fences beyond barriers, atomics; occupancy, register and static shared memory
// limits, __launch_bounds__; fp32 results bit for bit (the host compiler may contract or
// order floating-point operations differently from nvcc, and expf/fp16 conversions are the
// host's); device pointers that are really host pointers, inside a kernel.
#pragma once

#if defined(__CUDACC__)
#error \
    "emulator/include/cuda_runtime.h emulates CUDA on the CPU: compile with a host compiler"
#endif
#if !defined(KVLAB_CUDA_EMULATION)
#error "emulator/include/cuda_runtime.h is for builds with -DKVLAB_CUDA_EMULATION"
#endif

// Shared variables are static: one block runs at a time (defined before the toolkit's
// host_defines.h, which keeps a definition it finds; redefined below in case it came first).
#define __shared__ static
// The runtime functions (emulation.cpp defines those kvlab uses); through crt/host_defines.h,
// __host__, __device__, __global__ (empty), __forceinline__ and __align__ (GCC attributes).
#include <cuda_runtime_api.h>
#undef __shared__
#define __shared__ static
#define __launch_bounds__(...)

#include <driver_types.h>      // cudaError_t, cudaMemcpyKind, cudaDeviceAttr, cudaStream_t
#include <vector_functions.h>  // make_float4, make_uint4, ...
#include <vector_types.h>      // dim3, uint3, float4, uint4

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

// --- built-in variables: set by the emulator for the running thread --------------------------
inline uint3 threadIdx;  // NOLINT: CUDA's names
inline uint3 blockIdx;   // NOLINT
inline dim3 blockDim;    // NOLINT
inline dim3 gridDim;     // NOLINT

// --- device functions the kernels call that the host has not -----------------------------------
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

// --- the templates of the real cuda_runtime.h
// -----------------------------------------------------
template <typename T>
cudaError_t cudaMalloc(T** pointer, std::size_t bytes) {
  return ::cudaMalloc(reinterpret_cast<void**>(pointer), bytes);
}
template <typename T>
cudaError_t cudaMallocAsync(T** pointer, std::size_t bytes, cudaStream_t stream) {
  return ::cudaMallocAsync(reinterpret_cast<void**>(pointer), bytes, stream);
}

namespace kvlab_emulation {
namespace detail {

/// Runs `body(closure)` as the code of every thread of every block of a launch; returns the
/// launch's error (cudaErrorLaunchFailure, with a message on stderr, for a kernel bug).
cudaError_t run_launch(const char* name, dim3 grid, dim3 block, std::size_t smem_bytes,
                       cudaStream_t stream, void (*body)(void*), void* closure);
/// __syncthreads at `file`:`line`.
void sync_block(const char* file, int line);
/// The value of lane `lane ^ lane_mask` (8 bytes) after every lane of `mask` arrived.
std::uint64_t exchange_xor(const char* file, int line, unsigned mask, std::uint64_t value,
                           int lane_mask, int width);

}  // namespace detail

/// Launches `kernel(args...)` as `kernel<<<grid, block, smem_bytes, stream>>>(args...)` would,
/// running it to completion. Errors go to cudaGetLastError, as for a real launch.
template <typename... Params, typename... Args>
void launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
            std::size_t smem_bytes, cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args),
                "a kernel launch takes one argument per parameter");
  struct Closure {
    void (*kernel)(Params...);
    std::tuple<std::decay_t<Params>...> params;  // copied by every thread: kernels take values
  };
  Closure closure{kernel, std::tuple<std::decay_t<Params>...>(std::forward<Args>(args)...)};
  detail::run_launch(
      name, grid, block, smem_bytes, stream,
      [](void* p) {
        auto* c = static_cast<Closure*>(p);
        std::apply(c->kernel, c->params);
      },
      &closure);
}

/// The running block's dynamic shared memory (the launch's smem_bytes; null when 0).
unsigned char* dynamic_shared_memory();

/// How many shared-memory accesses racecheck has checked since the program started (0 unless
/// the kernels' code was built with KVLAB_EMULATION_RACECHECK's instrumentation).
std::uint64_t checked_shared_accesses();

/// Turns racecheck on or off for the launches that follow (on by default); returns the previous
/// setting. For the emulator's own tests of what the schedules alone catch.
bool set_racecheck(bool on);

/// Sets racecheck's barrier-interval serial (unique over all launches, 32 bits) to `serial`; the
/// next interval is `serial + 1`, or, after 2^32 - 1, a renumbering of every byte's record. For
/// the emulator's own test of that wrap.
void set_interval_serial(std::uint32_t serial);

/// The message of the last kernel bug the emulator reported (also printed on stderr).
const char* last_kernel_bug();

/// __shfl_xor_sync: `var` of lane `lane ^ lane_mask` within segments of `width` lanes.
template <typename T>
T shfl_xor_sync(const char* file, int line, unsigned mask, T var, int lane_mask, int width = 32) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8,
                "shuffles move values of up to 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = detail::exchange_xor(file, line, mask, bits, lane_mask, width);
  std::memcpy(&var, &bits, sizeof(T));
  return var;
}

}  // namespace kvlab_emulation

// The call site goes with every barrier, so that threads waiting at different ones are caught.
#define __syncthreads() ::kvlab_emulation::detail::sync_block(__FILE__, __LINE__)
#define __shfl_xor_sync(...) ::kvlab_emulation::shfl_xor_sync(__FILE__, __LINE__, __VA_ARGS__)
