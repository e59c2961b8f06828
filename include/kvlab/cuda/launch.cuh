/// \file
/// \brief How kvlab launches its kernels.
///
/// `detail::launch_kernel` is the `<<<grid, block, smem, stream>>>` launch followed by the launch
/// check; `detail::dynamic_shared_memory` gives the block's `extern __shared__` bytes. Every kernel
/// launch of include/kvlab/cuda goes through these two, so that the same kernel source also runs
/// under the CPU emulator of the tests (tests/cuda_emulation, `KVLAB_CUDA_EMULATION`), which a host
/// compiler builds: it cannot parse `<<<>>>` nor place `extern __shared__` arrays.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "kvlab/cuda/error.cuh"

namespace kvlab::cuda::detail {

/// Launches `kernel(args...)` over `grid` blocks of `block` threads with `smem_bytes` of dynamic
/// shared memory on `stream` (`kernel<<<grid, block, smem_bytes, stream>>>(args...)`), then
/// throws `CudaError` naming `name` if the launch failed (`KVLAB_CUDA_CHECK_LAUNCH`). Errors
/// inside the running kernel surface at the next synchronising call.
/// \param name        the kernel's name for the error message, e.g.
///                    "kvlab::cuda::detail::attention_kernel"
/// \param kernel      a `__global__` function
/// \param grid        blocks: x, y, z
/// \param block       threads per block: x, y, z
/// \param smem_bytes  dynamic shared memory per block (`dynamic_shared_memory`)
/// \param stream      the stream to queue the kernel on
/// \param args        the kernel's arguments, converted to its parameter types
template <typename... Params, typename... Args>
void launch_kernel(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                   std::size_t smem_bytes, cudaStream_t stream, Args&&... args) {
#if defined(KVLAB_CUDA_EMULATION)
  kvlab_emulation::launch(name, kernel, grid, block, smem_bytes, stream,
                          std::forward<Args>(args)...);
#else
  kernel<<<grid, block, smem_bytes, stream>>>(std::forward<Args>(args)...);
#endif
  KVLAB_CUDA_CHECK_LAUNCH(name);
}

/// The dynamic shared memory of the calling thread's block: the `smem_bytes` given to
/// `launch_kernel`, 16-byte aligned, uninitialised.
__device__ inline unsigned char* dynamic_shared_memory() {
#if defined(KVLAB_CUDA_EMULATION)
  return kvlab_emulation::dynamic_shared_memory();
#else
  extern __shared__ __align__(16) unsigned char kvlab_dynamic_smem[];
  return kvlab_dynamic_smem;
#endif
}

}  // namespace kvlab::cuda::detail
