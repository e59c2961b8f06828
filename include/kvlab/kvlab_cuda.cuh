/// \file
/// \brief Umbrella header of kvlab's CUDA side.
///
/// It includes device memory and errors, the naive, decode and paged attention kernels (with
/// split-K), the device KV caches and their write kernels, the convenience overloads for host data,
/// and the decoders with a CUDA backend. Include it from a `.cu` file compiled by nvcc and link
/// `kvlab::cuda`; it includes the CPU umbrella too, so both sides of every comparison are at hand.
#pragma once

#include "kvlab/cuda/attention_plan.hpp"
#include "kvlab/cuda/contiguous_kv_cache.cuh"
#include "kvlab/cuda/decode_attention.cuh"
#include "kvlab/cuda/device_memory.cuh"
#include "kvlab/cuda/error.cuh"
#include "kvlab/cuda/host_api.cuh"
#include "kvlab/cuda/matmul.cuh"
#include "kvlab/cuda/naive_attention.cuh"
#include "kvlab/cuda/numeric.cuh"
#include "kvlab/cuda/paged_kv_cache.cuh"
#include "kvlab/kvlab.hpp"
#include "kvlab/model/cuda_decoders.cuh"

namespace kvlab {
/// CUDA kernels with the names and argument order of their `cpu::` twins, the device memory
/// they work on, and the decoders with a CUDA backend.
namespace cuda {}
}  // namespace kvlab
