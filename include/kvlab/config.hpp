/// \file
/// \brief Version numbers, the `KVLAB_HOST_DEVICE` macro and kvlab's exception types.
///
/// Every check in kvlab throws one of the exception types below, with a message of the form
/// `"<function>: <argument>: expected <expected>, got <actual>"`, before it changes any state.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

/// Major version of kvlab.
#define KVLAB_VERSION_MAJOR 0
/// Minor version of kvlab.
#define KVLAB_VERSION_MINOR 1
/// Patch version of kvlab.
#define KVLAB_VERSION_PATCH 0

#if defined(__CUDACC__) || defined(KVLAB_DOXYGEN)
/// Marks a function usable from host and device code: `__host__ __device__` under nvcc, empty
/// under a plain C++ compiler, so the vocabulary headers in `core/` compile with both.
#define KVLAB_HOST_DEVICE __host__ __device__
#else
#define KVLAB_HOST_DEVICE
#endif

namespace kvlab {

/// An argument has the wrong shape, size or value (a wrong matrix shape, a zero head count,
/// num_heads not a multiple of num_kv_heads, ...). Nothing was changed.
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// An append would overflow a cache's capacity. Nothing was appended.
class CapacityError : public std::length_error {
 public:
  using std::length_error::length_error;
};

/// A block pool has fewer free blocks than an operation needs. Nothing was allocated.
class OutOfBlocks : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

/// Builds the standard message and throws `Error`.
template <typename Error = InvalidArgument, typename Expected, typename Actual>
[[noreturn]] void fail(const char* where, const std::string& argument, const Expected& expected,
                       const Actual& actual) {
  std::ostringstream message;
  message << where << ": " << argument << ": expected " << expected << ", got " << actual;
  throw Error(message.str());
}

/// Checks `value >= minimum` for a size or count argument.
template <typename Error = InvalidArgument, typename Int>
void require_at_least(const char* where, const std::string& argument, Int value, Int minimum) {
  if (value < minimum) fail<Error>(where, argument, ">= " + std::to_string(minimum), value);
}

/// Checks that an argument equals the value that the other arguments imply.
template <typename Error = InvalidArgument, typename Int>
void require_equal(const char* where, const std::string& argument, Int value, Int expected,
                   const std::string& why = "") {
  if (value != expected) {
    fail<Error>(where, argument, std::to_string(expected) + (why.empty() ? "" : " (" + why + ")"),
                value);
  }
}

}  // namespace detail
}  // namespace kvlab
