/// \file
/// \brief What kvlab's programs and plain benchmarks share on the command line: reading it (a
/// usage error exits 2 with "(try --help)"), checked parsing of numbers, lists and file names
/// that names the option, the expected value and the text given, an early check that an output
/// file can be written, and the OpenMP thread count.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

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

/// The integer `text` of `option` as an int, in [minimum, maximum].
/// \throws UsageError naming the option, the range and the text (or "nothing").
inline int parse_int(const std::string& option, const char* text, int minimum, int maximum) {
  return static_cast<int>(parse_long(option, text, minimum, maximum));
}

/// `text` given to `option`, which must be there.
/// \throws UsageError when `text` is missing.
inline const char* need_value(const std::string& option, const char* text) {
  if (text == nullptr) throw UsageError(option + ": expected a value, got nothing");
  return text;
}

/// The file name `text` given to `option`.
/// \throws UsageError when `text` is missing or empty.
inline std::string parse_file_name(const std::string& option, const char* text) {
  if (text == nullptr || text[0] == '\0') {
    throw UsageError(option + ": expected a file name, got nothing");
  }
  return text;
}

/// `text`, given to `option`, if it is one of `choices`.
/// \throws UsageError naming the choices ("expected a, b or c, got 'x'") otherwise.
inline std::string parse_choice(const std::string& option, const char* text,
                                const std::vector<std::string>& choices) {
  const std::string value = need_value(option, text);
  if (std::find(choices.begin(), choices.end(), value) != choices.end()) return value;
  std::string expected;
  for (std::size_t i = 0; i < choices.size(); ++i)
    expected += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  throw UsageError(option + ": expected " + expected + ", got '" + value + "'");
}

/// The items of the comma-separated list `text` given to `option` ("a,b" gives {"a", "b"}; an
/// empty item stays, for the caller's check to name).
/// \throws UsageError when `text` is missing.
inline std::vector<std::string> parse_list(const std::string& option, const char* text) {
  const std::string list = need_value(option, text);
  std::vector<std::string> items;
  for (std::size_t at = 0; at <= list.size();) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    items.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return items;
}

/// The comma-separated integers `text` given to `option`, each in [minimum, maximum].
/// \throws UsageError naming the option, the range and the bad item.
inline std::vector<int> parse_int_list(const std::string& option, const char* text, int minimum,
                                       int maximum) {
  std::vector<int> values;
  for (const std::string& item : parse_list(option, text))
    values.push_back(parse_int(option, item.c_str(), minimum, maximum));
  return values;
}

/// Reads the command line into `options` with `parse(argc, argv, options)`, which returns false
/// when it printed --help. Returns the exit code when the program should stop there: 0 after
/// --help, 2 after a bad command line (printed as "program: message (try --help)"); nothing
/// when it should run.
template <class Options, class Parse>
std::optional<int> read_command_line(const char* program, int argc, char** argv, Options& options,
                                     Parse parse) {
  try {
    if (!parse(argc, argv, options)) return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s (try --help)\n", program, e.what());
    return 2;
  }
  return std::nullopt;
}

/// Checks before a long run that the output file `path` given to `option` can be written (an
/// empty path means no file). Prints "program: option: expected a writable file, got 'path'"
/// and returns false when it cannot.
inline bool can_write(const char* program, const char* option, const std::string& path) {
  if (path.empty() || std::ofstream(path)) return true;
  std::fprintf(stderr, "%s: %s: expected a writable file, got '%s'\n", program, option,
               path.c_str());
  return false;
}

/// The thread counts this build can run: `threads` with OpenMP; without it {1}, with a note on
/// standard error when more were asked for.
inline std::vector<int> usable_threads(const char* program, const std::vector<int>& threads) {
#if defined(_OPENMP)
  (void)program;
  return threads;
#else
  if (threads != std::vector<int>{1})
    std::fprintf(stderr, "%s: built without OpenMP; using 1 thread\n", program);
  return {1};
#endif
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
