/// \file
/// \brief Device memory for kvlab's CUDA side: owning buffers, views, scratch and device queries.
///
/// `DeviceBuffer` owns its memory (RAII); `DeviceMatrix` is a non-owning row-major view, what the
/// kernels take; `Workspace` is reusable scratch. The device queries are the ones the tests and
/// kernels need.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/cuda/error.cuh"

namespace kvlab::cuda {

/// Number of CUDA devices, 0 when there is none or no driver (never throws).
inline int device_count() {
  int count = 0;  // left unwritten by cudaGetDeviceCount when there is no driver
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error, so that it is not reported by a later call
    return 0;
  }
  return count;
}

/// True when at least one CUDA device can be used.
inline bool has_device() { return device_count() > 0; }

/// Streaming multiprocessors of the current device.
/// \throws CudaError if there is no device.
inline int multiprocessor_count() {
  int device = 0;
  KVLAB_CUDA_CHECK(cudaGetDevice(&device));
  int count = 0;
  KVLAB_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

/// A non-owning view of a row-major `[rows, cols]` matrix in device memory: element (r, c) at
/// `data[r * cols + c]`. This is what kvlab's kernels take for activations (queries, keys,
/// values, outputs), as `cpu::` takes a `RowMatrix`. `DeviceMatrix<T>` converts to
/// `DeviceMatrix<const T>`.
template <typename T>
struct DeviceMatrix {
  T* data = nullptr;  ///< device pointer to [rows, cols] values, row-major
  int rows = 0;       ///< rows (tokens)
  int cols = 0;       ///< values per row

  /// An empty view.
  DeviceMatrix() = default;
  /// The view of `count_rows` rows of `count_cols` values at device pointer `pointer`.
  KVLAB_HOST_DEVICE DeviceMatrix(T* pointer, int count_rows, int count_cols)
      : data(pointer), rows(count_rows), cols(count_cols) {}
  /// A read-only view of a writable one.
  template <typename U, typename = std::enable_if_t<std::is_same<const U, T>::value &&
                                                    !std::is_same<U, T>::value>>
  // NOLINT: implicit, like T* -> const T*
  KVLAB_HOST_DEVICE DeviceMatrix(const DeviceMatrix<U>& other)
      : data(other.data), rows(other.rows), cols(other.cols) {}

  /// Row `r`: `cols` values.
  KVLAB_HOST_DEVICE T* row(int r) const { return data + static_cast<std::ptrdiff_t>(r) * cols; }
  /// rows * cols.
  KVLAB_HOST_DEVICE std::size_t size() const { return kvlab::detail::elements(rows, cols); }
};

namespace detail {
/// Makes a template argument non-deduced: `NonDeduced<T>::type` is `T`.
template <typename T>
struct NonDeduced {
  using type = T;  ///< T itself
};
}  // namespace detail

/// A read-only device matrix argument whose element type comes from the other arguments, so
/// that a `DeviceMatrix<T>` may be passed where a `DeviceMatrix<const T>` is expected.
template <typename T>
using DeviceInput = DeviceMatrix<const typename detail::NonDeduced<T>::type>;

/// An owning array of `size()` values of `T` in device memory (cudaMalloc / cudaFree),
/// move-only. Values are uninitialised until written.
template <typename T>
class DeviceBuffer {
  static_assert(std::is_trivially_copyable<T>::value,
                "DeviceBuffer holds trivially copyable values");

 public:
  /// An empty buffer (no allocation).
  DeviceBuffer() = default;
  /// `count` uninitialised values.
  /// \throws CudaError if the allocation fails.
  explicit DeviceBuffer(std::size_t count) : size_(count) {
    if (count > 0)
      KVLAB_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), count * sizeof(T)));
  }
  /// A copy of the host array `host` [count].
  /// \throws CudaError if the allocation or the copy fails.
  DeviceBuffer(const T* host, std::size_t count) : DeviceBuffer(count) { upload(host, count); }
  /// A copy of the host vector `host`.
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.data(), host.size()) {}

  ~DeviceBuffer() {
    if (data_ != nullptr) (void)cudaFree(data_);  // a destructor must not throw
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  /// Takes `other`'s memory; `other` becomes empty.
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  /// Frees this buffer's memory and takes `other`'s; `other` becomes empty.
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      if (data_ != nullptr) (void)cudaFree(data_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }

  /// Device pointer to the values (null when empty).
  T* data() { return data_; }
  /// Device pointer to the values (null when empty).
  const T* data() const { return data_; }
  /// Number of values.
  std::size_t size() const { return size_; }
  /// Bytes allocated: size() * sizeof(T).
  std::size_t bytes() const { return size_ * sizeof(T); }

  /// Copies `count` values from host memory into the buffer, starting at value `offset`.
  /// \throws InvalidArgument if the range does not fit; CudaError if the copy fails.
  void upload(const T* host, std::size_t count, std::size_t offset = 0) {
    check_range("kvlab::cuda::DeviceBuffer::upload", count, offset);
    if (count > 0)
      KVLAB_CUDA_CHECK(cudaMemcpy(data_ + offset, host, count * sizeof(T), cudaMemcpyHostToDevice));
  }
  /// Copies `count` values, from value `offset` on, into host memory.
  /// \throws InvalidArgument if the range does not fit; CudaError if the copy fails.
  void download(T* host, std::size_t count, std::size_t offset = 0) const {
    check_range("kvlab::cuda::DeviceBuffer::download", count, offset);
    if (count > 0)
      KVLAB_CUDA_CHECK(cudaMemcpy(host, data_ + offset, count * sizeof(T), cudaMemcpyDeviceToHost));
  }
  /// All values, copied to the host.
  std::vector<T> to_host() const {
    std::vector<T> host(size_);
    download(host.data(), size_);
    return host;
  }
  /// Sets every byte to `byte` (0: zeros; 0xFF: NaN for floating-point types).
  void fill_bytes(int byte) {
    if (size_ > 0) KVLAB_CUDA_CHECK(cudaMemset(data_, byte, bytes()));
  }

  /// The first rows * cols values as a `[rows, cols]` matrix.
  /// \throws InvalidArgument if they do not fit.
  DeviceMatrix<T> matrix(int rows, int cols) {
    check_matrix(rows, cols);
    return DeviceMatrix<T>(data_, rows, cols);
  }
  /// The first rows * cols values as a read-only `[rows, cols]` matrix.
  /// \throws InvalidArgument if they do not fit.
  DeviceMatrix<const T> matrix(int rows, int cols) const {
    check_matrix(rows, cols);
    return DeviceMatrix<const T>(data_, rows, cols);
  }

 private:
  void check_range(const char* where, std::size_t count, std::size_t offset) const {
    if (offset > size_ || count > size_ - offset) {
      kvlab::detail::fail(where, "offset + count", "at most size() (" + std::to_string(size_) + ")",
                          std::to_string(offset) + " + " + std::to_string(count));
    }
  }
  void check_matrix(int rows, int cols) const {
    if (rows < 0 || cols < 0 || kvlab::detail::elements(rows, cols) > size_) {
      kvlab::detail::fail("kvlab::cuda::DeviceBuffer::matrix", "rows * cols",
                          "in [0, size() (" + std::to_string(size_) + ")]",
                          std::to_string(rows) + " * " + std::to_string(cols));
    }
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Reusable device scratch memory for kernels that need it (split-K partial results, the naive
/// path's score matrix). Pass one through `LaunchOptions::workspace` to avoid an allocation per
/// call; it grows when a call needs more and never shrinks.
class Workspace {
 public:
  /// At least `bytes` of device memory, valid until the next call of `get` (which may replace
  /// it: the old memory is freed once the device is idle, since cudaFree waits for it).
  /// \throws CudaError if an allocation fails.
  void* get(std::size_t bytes) {
    if (bytes > buffer_.size()) buffer_ = DeviceBuffer<unsigned char>(bytes);
    return buffer_.data();
  }
  /// Bytes held.
  std::size_t capacity() const { return buffer_.size(); }

 private:
  DeviceBuffer<unsigned char> buffer_;
};

/// How a kernel call runs: its stream, its scratch memory and (attention kernels) its split-K
/// partitions. The defaults suit a first call: the default stream, scratch allocated per call,
/// partitions chosen from the GPU and the batch.
struct LaunchOptions {
  /// Stream the kernels are queued on (calls return before they finish; the convenience
  /// overloads that return host data wait for them).
  cudaStream_t stream = nullptr;
  /// Split-K partitions per query row of the decode kernels: 0 chooses from the number of
  /// multiprocessors and the work in the batch (`plan_attention`); 1 forces a single pass (one
  /// block walks a row's whole context); n > 1 allows up to n (at most `kMaxPartitions`).
  int partitions = 0;
  /// Scratch memory to reuse across calls; null allocates (stream-ordered) per call.
  Workspace* workspace = nullptr;
};

namespace detail {

/// Scratch for one call: from `workspace` if given, else stream-ordered memory
/// (cudaMallocAsync) freed on the same stream when this object goes out of scope.
class Scratch {
 public:
  Scratch(std::size_t bytes, Workspace* workspace, cudaStream_t stream) : stream_(stream) {
    if (bytes == 0) return;
    if (workspace != nullptr) {
      data_ = workspace->get(bytes);
    } else {
      KVLAB_CUDA_CHECK(cudaMallocAsync(&data_, bytes, stream));
      owned_ = true;
    }
  }
  ~Scratch() {
    if (owned_) (void)cudaFreeAsync(data_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  /// The memory, as `U*`.
  template <typename U>
  U* as(std::size_t byte_offset = 0) const {
    return reinterpret_cast<U*>(static_cast<unsigned char*>(data_) + byte_offset);
  }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_;
  bool owned_ = false;
};

}  // namespace detail
}  // namespace kvlab::cuda
