/// \file
/// \brief Version numbers, the `KVLAB_HOST_DEVICE` macro, kvlab's exception types and the
/// checks that throw them (including overflow-checked size arithmetic).
///
/// Every check in kvlab throws one of the exception types below, with a message of the form
/// `"<function>: <argument>: expected <expected>, got <actual>"`, before it changes any state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
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

/// A check function (`Scheduler::check_invariants`, `PrefixCache::check`) found one of its
/// rules broken: a bug in kvlab, not in the caller's input. The message names the rule.
class InvariantViolation : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

namespace detail {

/// Builds the standard message and throws `Error`. `argument` is a string literal or a
/// `std::string`: checks that pass build no string (they run in every step of a decoder).
template <typename Error = InvalidArgument, typename Name, typename Expected, typename Actual>
[[noreturn]] void fail(const char* where, const Name& argument, const Expected& expected,
                       const Actual& actual) {
  std::ostringstream message;
  message << where << ": " << argument << ": expected " << expected << ", got " << actual;
  throw Error(message.str());
}

/// Checks `value >= minimum` for a size or count argument.
template <typename Error = InvalidArgument, typename Name, typename Int>
void require_at_least(const char* where, const Name& argument, Int value, Int minimum) {
  if (value < minimum) fail<Error>(where, argument, ">= " + std::to_string(minimum), value);
}

/// Checks that an argument equals the value that the other arguments imply (`why`, a string
/// literal or a `std::string`, says which).
template <typename Error = InvalidArgument, typename Name, typename Int, typename Why = const char*>
void require_equal(const char* where, const Name& argument, Int value, Int expected,
                   const Why& why = "") {
  if (value != expected) {
    const std::string reason(why);
    fail<Error>(where, argument,
                std::to_string(expected) + (reason.empty() ? "" : " (" + reason + ")"), value);
  }
}

/// The number of elements of a tensor of the given sizes (each >= 0, as kvlab's `int` sizes are
/// after their checks): their product as `std::size_t`, the one place an `int` size becomes an
/// element count. Not checked for overflow: the constructors that allocate check their sizes
/// against the address space first.
template <typename... Sizes>
KVLAB_HOST_DEVICE constexpr std::size_t elements(Sizes... sizes) {
  std::size_t product = 1;
  ((product *= static_cast<std::size_t>(sizes)), ...);
  return product;
}

/// The largest size that `checked_size_product` and `checked_size_sum` accept by default.
constexpr std::uint64_t kMaxSize = std::numeric_limits<std::uint64_t>::max();
/// The largest size of a file or a stream offset: sizes that end up as `std::int64_t`.
constexpr std::uint64_t kMaxSignedSize =
    static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());

/// `a * b` for sizes, where `b` is the value of `argument` (a > 0). If the product exceeds
/// `max` (`kMaxSize` or `kMaxSignedSize`), throws InvalidArgument:
/// `"<where>: <argument>: expected at most <max / a><context> (so that the size fits in
/// std::uint64_t), got <b>"` (std::int64_t for kMaxSignedSize).
inline std::uint64_t checked_size_product(const char* where, const std::string& argument,
                                          std::uint64_t a, std::uint64_t b,
                                          const std::string& context = "",
                                          std::uint64_t max = kMaxSize) {
  if (a != 0 && b > max / a) {
    fail(where, argument,
         "at most " + std::to_string(max / a) + context + " (so that the size fits in " +
             (max == kMaxSize ? "std::uint64_t" : "std::int64_t") + ")",
         b);
  }
  return a * b;
}

/// `a + b` for sizes, where `b` is the value of `argument`; throws as `checked_size_product`
/// (expected at most `max - a`) if the sum exceeds `max`.
inline std::uint64_t checked_size_sum(const char* where, const std::string& argument,
                                      std::uint64_t a, std::uint64_t b,
                                      const std::string& context = "",
                                      std::uint64_t max = kMaxSize) {
  if (a > max || b > max - a) {
    fail(where, argument,
         "at most " + std::to_string(a > max ? 0 : max - a) + context +
             " (so that the size fits in " + (max == kMaxSize ? "std::uint64_t" : "std::int64_t") +
             ")",
         b);
  }
  return a + b;
}

}  // namespace detail
}  // namespace kvlab
