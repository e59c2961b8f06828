/// \file
/// \brief `CudaError`: a failed CUDA runtime call as a kvlab exception naming the call, the
/// error and where it was made; `KVLAB_CUDA_CHECK` turns a call's status into one.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kvlab/config.hpp"

namespace kvlab {

/// A CUDA runtime call failed. The message names the call as written in the source, CUDA's
/// name and description of the error, and the file and line, e.g.
/// `cudaMalloc(&data, bytes): cudaErrorMemoryAllocation (out of memory) at device_memory.cuh:42`.
class CudaError : public std::runtime_error {
 public:
  /// The error `code` returned by `call` (its source text) at `file`:`line`.
  CudaError(const std::string& call, cudaError_t code, const char* file, int line)
      : std::runtime_error(call + ": " + cudaGetErrorName(code) + " (" + cudaGetErrorString(code) +
                           ") at " + file + ":" + std::to_string(line)),
        code_(code) {}

  /// The CUDA error code.
  cudaError_t code() const { return code_; }

 private:
  cudaError_t code_;
};

namespace cuda {

/// Throws `CudaError` for `call` (its source text) if `status` is not `cudaSuccess`.
inline void check(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) {
    // The failed call also left `status` as the runtime's last error: clear it, or the next
    // launch check (cudaGetLastError) would report it again, as a failed launch of an unrelated
    // kernel, after the caller has handled this exception. (A sticky error stays anyway.)
    (void)cudaGetLastError();
    throw CudaError(call, status, file, line);
  }
}

/// Throws `CudaError` naming `kernel` if its launch failed (a bad grid, too much shared memory,
/// no device). Errors inside the running kernel surface at the next synchronising call.
inline void check_launch(const char* kernel, const char* file, int line) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw CudaError(std::string("launch of ") + kernel, status, file, line);
}

}  // namespace cuda
}  // namespace kvlab

/// Runs a CUDA runtime call and throws `kvlab::CudaError` naming it if it fails:
/// `KVLAB_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));`
#define KVLAB_CUDA_CHECK(call) ::kvlab::cuda::check((call), #call, __FILE__, __LINE__)

/// Throws `kvlab::CudaError` if the launch of `kernel` (a name for the message) just failed.
#define KVLAB_CUDA_CHECK_LAUNCH(kernel) ::kvlab::cuda::check_launch(kernel, __FILE__, __LINE__)
