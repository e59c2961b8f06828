/// \file
/// \brief What kvlab's plain benchmark programs share on the command line: the usage error,
/// checked number parsing that names the option, the expected range and the text given, and
/// the OpenMP thread count.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace kvlab_bench {

/// A bad command line; `main` prints it with "(try --help)" and exits 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The integer `text` of `option`, in [minimum, maximum].
/// \throws UsageError naming the option, the range and the text (or "nothing").
inline long parse_long(const std::string& option, const char* text, long minimum, long maximum) {
  const std::string expected =
      "an integer in [" + std::to_string(minimum) + ", " + std::to_string(maximum) + "]";
  if (text == nullptr) throw UsageError(option + ": expected " + expected + ", got nothing");
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno == ERANGE || value < minimum || value > maximum) {
    throw UsageError(option + ": expected " + expected + ", got '" + text + "'");
  }
  return value;
}

/// The number `text` of `option`, in [minimum, maximum].
/// \throws UsageError naming the option, the range and the text (or "nothing").
inline double parse_double(const std::string& option, const char* text, double minimum,
                           double maximum) {
  char range[64];
  std::snprintf(range, sizeof range, "a number in [%g, %g]", minimum, maximum);
  if (text == nullptr) throw UsageError(option + ": expected " + range + ", got nothing");
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || errno == ERANGE || !(value >= minimum && value <= maximum)) {
    throw UsageError(option + ": expected " + range + ", got '" + text + "'");
  }
  return value;
}

/// Sets the OpenMP thread count of the following parallel regions (nothing without OpenMP).
inline void set_threads(int threads) {
#if defined(_OPENMP)
  omp_set_num_threads(threads);
#else
  (void)threads;
#endif
}

}  // namespace kvlab_bench
