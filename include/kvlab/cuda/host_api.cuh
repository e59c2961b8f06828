/// \file
/// \brief Convenience overloads of the CUDA attention kernels for host data.
///
/// They take the same Eigen matrices and host views as the `cpu::` functions, copy them to the GPU
/// (converted to the storage type `Storage`: float, __half or __nv_bfloat16), run the kernel, and
/// copy the result back as floats — a kernel call in one line, to set beside its CPU twin:
/// \code
/// const kvlab::RowMatrix<float> cpu = kvlab::cpu::decode_attention(shape, q, cache.view(0));
/// const kvlab::RowMatrix<float> gpu = kvlab::cuda::decode_attention(shape, q, cache.view(0));
/// \endcode
/// The only header of `cuda/` that includes Eigen (above it, `model/cuda_decoders.cuh` does too);
/// it compiles under nvcc with `EIGEN_NO_CUDA`, which the `kvlab::cuda` CMake target defines.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/paged_view.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/core/views.hpp"
#include "kvlab/cuda/decode_attention.cuh"
#include "kvlab/cuda/device_memory.cuh"
#include "kvlab/cuda/naive_attention.cuh"
#include "kvlab/cuda/numeric.cuh"
#include "kvlab/matrix.hpp"

namespace kvlab::cuda {
namespace detail {

/// A device copy of the host floats `host` [count], each rounded to `Storage`.
template <typename Storage>
DeviceBuffer<Storage> upload_as(const float* host, std::size_t count) {
  std::vector<Storage> converted(count);
  for (std::size_t i = 0; i < count; ++i) converted[i] = from_float<Storage>(host[i]);
  return DeviceBuffer<Storage>(converted);
}

/// A device copy of `m` ([rows, cols]) rounded to `Storage`.
template <typename Storage>
DeviceBuffer<Storage> upload_matrix(const char* where, const char* name,
                                    const RowMatrix<float>& m) {
  if (m.rows() > INT_MAX || m.cols() > INT_MAX) {
    kvlab::detail::fail(where, std::string(name) + " shape", "rows and cols that fit in an int",
                        std::to_string(m.rows()) + " x " + std::to_string(m.cols()));
  }
  return upload_as<Storage>(m.data(), static_cast<std::size_t>(m.size()));
}

/// `buffer` ([rows, cols] of Storage) copied back to the host as floats, after waiting for
/// `stream`.
template <typename Storage>
RowMatrix<float> download_matrix(const DeviceBuffer<Storage>& buffer, int rows, int cols,
                                 cudaStream_t stream) {
  KVLAB_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<Storage> host = buffer.to_host();
  RowMatrix<float> out(rows, cols);
  for (Eigen::Index i = 0; i < out.size(); ++i)
    out.data()[i] = to_float(host[static_cast<std::size_t>(i)]);
  return out;
}

/// What the host-data functions store on the device for a host cache of `S`: its floats
/// rounded to `Storage`, or its quantized blocks as they are (then `Storage` is float: the
/// queries' type).
template <typename Storage, typename S>
using DeviceStored = std::conditional_t<is_quantized_storage<S>, S, Storage>;

/// A device copy of `count` elements of a host cache of `S` (`DeviceStored`).
template <typename Storage, typename S>
DeviceBuffer<DeviceStored<Storage, S>> upload_cache(const S* host, std::size_t count) {
  static_assert(std::is_same<S, float>::value ||
                    (is_quantized_storage<S> && std::is_same<Storage, float>::value),
                "a host cache of floats (stored on the device as Storage), or of quantized blocks "
                "(read with float queries)");
  if constexpr (is_quantized_storage<S>) {
    return DeviceBuffer<S>(host, count);
  } else {
    return upload_as<Storage>(host, count);
  }
}

/// A host paged view's pool and block tables copied to the device, with the device view.
template <typename Storage, typename S = float>
struct DevicePagedCopy {
  DeviceBuffer<DeviceStored<Storage, S>> k, v;       ///< the pool (`upload_cache`)
  DeviceBuffer<std::int32_t> indptr, indices, last;  ///< the block tables
  PagedKVView<DeviceStored<Storage, S>> view;        ///< the same view with device pointers

  /// Copies `cache` (host pointers, checked by the caller).
  explicit DevicePagedCopy(const PagedKVView<S>& cache) {
    const std::size_t pool = kvlab::detail::elements(cache.num_blocks, cache.block_size,
                                                     cache.num_kv_heads, cache.row_units());
    const auto batch = static_cast<std::size_t>(cache.batch);
    k = upload_cache<Storage>(cache.k, pool);
    v = upload_cache<Storage>(cache.v, pool);
    indptr = DeviceBuffer<std::int32_t>(cache.indptr, batch + 1);
    indices = DeviceBuffer<std::int32_t>(cache.indices,
                                         static_cast<std::size_t>(cache.indptr[cache.batch]));
    last = DeviceBuffer<std::int32_t>(cache.last_page_len, batch);
    view.k = k.data();
    view.v = v.data();
    view.num_blocks = cache.num_blocks;
    view.block_size = cache.block_size;
    view.num_kv_heads = cache.num_kv_heads;
    view.head_dim = cache.head_dim;
    view.batch = cache.batch;
    view.indptr = indptr.data();
    view.indices = indices.data();
    view.last_page_len = last.data();
    view.layout = cache.layout;
    view.window = cache.window;
    view.sinks = cache.sinks;
  }
};

}  // namespace detail

/// A device copy of the host matrix `m` ([rows, cols], row-major), each value rounded to
/// `Storage` (float, __half or __nv_bfloat16).
/// \throws CudaError if the allocation or the copy fails.
template <typename Storage = float>
DeviceBuffer<Storage> to_device(const RowMatrix<float>& m) {
  return detail::upload_as<Storage>(m.data(), static_cast<std::size_t>(m.size()));
}

/// The first rows * cols values of `buffer` as a host matrix of floats, `[rows, cols]`
/// (`cudaMemcpy`: waits for the work queued before it on the default stream).
/// \throws InvalidArgument if the buffer holds fewer values; CudaError if the copy fails.
template <typename Storage>
RowMatrix<float> to_host(const DeviceBuffer<Storage>& buffer, int rows, int cols) {
  if (rows < 0 || cols < 0 || kvlab::detail::elements(rows, cols) > buffer.size()) {
    kvlab::detail::fail("kvlab::cuda::to_host", "rows * cols",
                        "at most buffer.size() (" + std::to_string(buffer.size()) + ")",
                        std::to_string(rows) + " * " + std::to_string(cols));
  }
  std::vector<Storage> host(kvlab::detail::elements(rows, cols));
  buffer.download(host.data(), host.size());
  RowMatrix<float> out(rows, cols);
  for (Eigen::Index i = 0; i < out.size(); ++i)
    out.data()[i] = to_float(host[static_cast<std::size_t>(i)]);
  return out;
}

/// `naive_attention` on host data: copies q, k, v to the GPU as `Storage`, runs the three
/// launches, and returns the output as floats.
/// \param shape     the head layout
/// \param q         queries, [q_len, num_heads * head_dim]
/// \param k         keys,    [kv_len, num_kv_heads * head_dim], kv_len >= q_len
/// \param v         values,  [kv_len, num_kv_heads * head_dim]
/// \param counters  if not null, receives the work done (as `cpu::naive_attention`)
/// \param window    W >= 1: each query sees its last W keys; 0 (default): all up to itself
/// \return          [q_len, num_heads * head_dim]
/// \throws InvalidArgument as the device overload; CudaError if a CUDA call fails (also when
///         there is no GPU).
template <typename Storage = float>
RowMatrix<float> naive_attention(const AttentionShape& shape, const RowMatrix<float>& q,
                                 const RowMatrix<float>& k, const RowMatrix<float>& v,
                                 CostCounters* counters = nullptr, int window = 0) {
  constexpr const char* kWhere = "kvlab::cuda::naive_attention";
  const auto d_q = detail::upload_matrix<Storage>(kWhere, "q", q);
  const auto d_k = detail::upload_matrix<Storage>(kWhere, "k", k);
  const auto d_v = detail::upload_matrix<Storage>(kWhere, "v", v);
  const int rows = static_cast<int>(q.rows());
  DeviceBuffer<Storage> d_out(kvlab::detail::elements(rows, shape.q_width()));
  naive_attention<Storage>(
      shape, DeviceMatrix<const Storage>(d_q.data(), rows, static_cast<int>(q.cols())),
      DeviceMatrix<const Storage>(d_k.data(), static_cast<int>(k.rows()),
                                  static_cast<int>(k.cols())),
      DeviceMatrix<const Storage>(d_v.data(), static_cast<int>(v.rows()),
                                  static_cast<int>(v.cols())),
      DeviceMatrix<Storage>(d_out.data(), rows, shape.q_width()), counters, window);
  return detail::download_matrix(d_out, rows, shape.q_width(), nullptr);
}

/// `decode_attention` on host data: copies q and the cache's filled rows (host pointers, as
/// `ContiguousKVCache::view` gives) to the GPU — a cache of floats as `Storage`, an int8/int4
/// cache as its blocks (with float queries) — runs the kernel, and returns the output as floats.
/// \param shape     the head layout; head_dim a multiple of 8 in [8, 256] (of 32 for int8/int4)
/// \param q         queries, [q_len, num_heads * head_dim], 1 <= q_len <= cache.length
/// \param cache     one layer of a contiguous cache in host memory, of float, `BlockQ8_0` or
///                  `BlockQ4_0`
/// \param counters  if not null, receives the work done
/// \param options   split-K partitions, stream, scratch
/// \return          [q_len, num_heads * head_dim]
/// \throws InvalidArgument as the device overload; CudaError if a CUDA call fails.
template <typename Storage = float, typename S>
RowMatrix<float> decode_attention(const AttentionShape& shape, const RowMatrix<float>& q,
                                  const ContiguousKVView<S>& cache,
                                  CostCounters* counters = nullptr,
                                  const LaunchOptions& options = {}) {
  constexpr const char* kWhere = "kvlab::cuda::decode_attention";
  if (cache.k == nullptr || cache.v == nullptr)
    kvlab::detail::fail(kWhere, "cache.k / cache.v", "host pointers", "a null pointer");
  kvlab::detail::check_contiguous_length(kWhere, "q.rows()", q.rows(), cache);
  // The filled slots only: without a window rows [0, length), a device cache with capacity =
  // length; with one, the ring's written slots, each in its place.
  const int slots = cache.window > 0 ? std::min(cache.length, cache.capacity) : cache.length;
  const std::size_t rows = kvlab::detail::elements(cache.num_kv_heads, slots);
  const auto units = static_cast<std::size_t>(cache.row_units());  // elements per row
  std::vector<S> k(rows * units), v(k.size());
  for (int h = 0; h < cache.num_kv_heads; ++h)
    for (int slot = 0; slot < slots; ++slot)
      for (std::size_t u = 0; u < units; ++u) {
        const std::size_t at = (static_cast<std::size_t>(h) * slots + slot) * units + u;
        k[at] = cache.k[(static_cast<std::size_t>(h) * cache.capacity + slot) * units + u];
        v[at] = cache.v[(static_cast<std::size_t>(h) * cache.capacity + slot) * units + u];
      }
  const auto d_k = detail::upload_cache<Storage>(k.data(), k.size());
  const auto d_v = detail::upload_cache<Storage>(v.data(), v.size());
  const ContiguousKVView<detail::DeviceStored<Storage, S>> device{
      d_k.data(), d_v.data(),   cache.num_kv_heads, cache.head_dim,
      slots,      cache.length, cache.window,       cache.sinks};
  const auto d_q = detail::upload_matrix<Storage>(kWhere, "q", q);
  const int q_rows = static_cast<int>(q.rows());
  DeviceBuffer<Storage> d_out(kvlab::detail::elements(q_rows, shape.q_width()));
  decode_attention<Storage>(
      shape, DeviceMatrix<const Storage>(d_q.data(), q_rows, static_cast<int>(q.cols())), device,
      DeviceMatrix<Storage>(d_out.data(), q_rows, shape.q_width()), counters, options);
  return detail::download_matrix(d_out, q_rows, shape.q_width(), options.stream);
}

/// `paged_decode_attention` on host data: checks the block tables as `cpu::paged_decode_attention`
/// does, copies q, the pool and the tables (host pointers, as `PagedKVCache::view` gives) to the
/// GPU, a pool of floats as `Storage` (an int8/int4 pool as its blocks, with float queries),
/// runs the kernel, and returns the output as floats.
/// \param shape     the head layout; head_dim a multiple of 8 in [8, 256] (of 32 for int8/int4)
/// \param q         queries, [batch, num_heads * head_dim]: row s for sequence s
/// \param cache     one layer's pool (float, `BlockQ8_0`, `BlockQ4_0`) and the batch's block
///                  tables, in host memory
/// \param counters  if not null, receives the work done
/// \param options   split-K partitions, stream, scratch
/// \return          [batch, num_heads * head_dim]
/// \throws InvalidArgument for bad arguments or tables; CudaError if a CUDA call fails.
template <typename Storage = float, typename S>
RowMatrix<float> paged_decode_attention(const AttentionShape& shape, const RowMatrix<float>& q,
                                        const PagedKVView<S>& cache,
                                        CostCounters* counters = nullptr,
                                        const LaunchOptions& options = {}) {
  constexpr const char* kWhere = "kvlab::cuda::paged_decode_attention";
  kvlab::detail::check_paged_view(kWhere, shape, cache);
  // [batch + 1]: 0, 1, ..., batch (one query per sequence)
  std::vector<std::int32_t> one_each(static_cast<std::size_t>(cache.batch) + 1);
  for (int s = 0; s <= cache.batch; ++s) one_each[static_cast<std::size_t>(s)] = s;
  kvlab::detail::check_window_pages(kWhere, one_each.data(), cache);
  const detail::DevicePagedCopy<Storage, S> device(cache);
  const auto d_q = detail::upload_matrix<Storage>(kWhere, "q", q);
  const int q_rows = static_cast<int>(q.rows());
  DeviceBuffer<Storage> d_out(kvlab::detail::elements(q_rows, shape.q_width()));
  paged_decode_attention<Storage>(
      shape, DeviceMatrix<const Storage>(d_q.data(), q_rows, static_cast<int>(q.cols())),
      device.view, DeviceMatrix<Storage>(d_out.data(), q_rows, shape.q_width()), counters, options);
  return detail::download_matrix(d_out, q_rows, shape.q_width(), options.stream);
}

/// `paged_prefill_attention` on host data: checks `qo_indptr` and the block tables as
/// `cpu::paged_prefill_attention` does, copies everything to the GPU (a pool of floats as
/// `Storage`, an int8/int4 pool as its blocks), runs the kernel, and returns the output as
/// floats.
/// \param shape      the head layout; head_dim a multiple of 8 in [8, 256]
/// \param q          queries, [qo_indptr[batch], num_heads * head_dim], sequence by sequence
/// \param qo_indptr  [batch + 1]: 0 = qo_indptr[0] <= ... = q.rows(), each count at most the
///                   sequence's length
/// \param cache      one layer's pool and the batch's block tables, in host memory
/// \param counters   if not null, receives the work done
/// \param options    split-K partitions, stream, scratch
/// \return           [q.rows(), num_heads * head_dim]
/// \throws InvalidArgument for bad arguments or tables; CudaError if a CUDA call fails.
template <typename Storage = float, typename S>
RowMatrix<float> paged_prefill_attention(const AttentionShape& shape, const RowMatrix<float>& q,
                                         const std::vector<std::int32_t>& qo_indptr,
                                         const PagedKVView<S>& cache,
                                         CostCounters* counters = nullptr,
                                         const LaunchOptions& options = {}) {
  constexpr const char* kWhere = "kvlab::cuda::paged_prefill_attention";
  kvlab::detail::check_paged_view(kWhere, shape, cache);
  kvlab::detail::check_qo_indptr(kWhere, qo_indptr, cache);
  kvlab::detail::check_window_pages(kWhere, qo_indptr.data(), cache);
  kvlab::detail::require_equal(kWhere, "qo_indptr[batch]", static_cast<long>(qo_indptr.back()),
                               static_cast<long>(q.rows()), "q.rows()");
  const detail::DevicePagedCopy<Storage, S> device(cache);
  const DeviceBuffer<std::int32_t> d_qo_indptr(qo_indptr);
  const auto d_q = detail::upload_matrix<Storage>(kWhere, "q", q);
  const int q_rows = static_cast<int>(q.rows());
  DeviceBuffer<Storage> d_out(kvlab::detail::elements(q_rows, shape.q_width()));
  paged_prefill_attention<Storage>(
      shape, DeviceMatrix<const Storage>(d_q.data(), q_rows, static_cast<int>(q.cols())),
      d_qo_indptr.data(), device.view, DeviceMatrix<Storage>(d_out.data(), q_rows, shape.q_width()),
      counters, options);
  return detail::download_matrix(d_out, q_rows, shape.q_width(), options.stream);
}

}  // namespace kvlab::cuda
