/// \file
/// \brief The command line of kvlab's programs and benchmarks, declared with CLI11.
///
/// Each program declares its options once on a `CLI::App` (the help text is generated from
/// them) with the checked adders below, whose errors name the option, the expected value and the
/// text given ("--max-n: expected an integer in [1024, 1048576], got '5'"), and reads them with
/// `parse`. `read_command_line` turns a bad command line into "program: message (try --help)" and
/// exit status 2. Not part of the library: the headers under include/ stay Eigen-only.
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
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

namespace kvlab_support {

/// A bad command line; `read_command_line` prints it with "(try --help)" and exits 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {

// "expected <expected>, got '<text>'": the message every check below gives (CLI11 puts the
// option's name and ": " before it).
inline std::string expected_got(const std::string& expected, const std::string& text) {
  return "expected " + expected + ", got '" + text + "'";
}

inline std::string integer_range(long long minimum, long long maximum) {
  return "an integer in [" + std::to_string(minimum) + ", " + std::to_string(maximum) + "]";
}

inline std::string number_range(double minimum, double maximum) {
  char range[64];
  std::snprintf(range, sizeof range, "a number in [%g, %g]", minimum, maximum);
  return range;
}

// "a, b or c"
inline std::string alternatives(const std::vector<std::string>& choices) {
  std::string text;
  for (std::size_t i = 0; i < choices.size(); ++i)
    text += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  return text;
}

// Accepts a whole decimal integer in [minimum, maximum] ("12"; not "1e3", "2.5" or "12x").
inline CLI::Validator integer_in(long long minimum, long long maximum) {
  return CLI::Validator(
      [minimum, maximum](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long value = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0' || errno == ERANGE || value < minimum || value > maximum)
          return expected_got(integer_range(minimum, maximum), text);
        return "";
      },
      "");
}

// Accepts a finite number in [minimum, maximum] (not "nan").
inline CLI::Validator number_in(double minimum, double maximum) {
  return CLI::Validator(
      [minimum, maximum](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double value = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || errno == ERANGE ||
            !(value >= minimum && value <= maximum))
          return expected_got(number_range(minimum, maximum), text);
        return "";
      },
      "");
}

// Accepts one of `choices` ("expected a, b or c, got 'x'").
inline CLI::Validator one_of(const std::vector<std::string>& choices) {
  return CLI::Validator(
      [choices](std::string& text) -> std::string {
        for (const std::string& c : choices)
          if (text == c) return "";
        return expected_got(alternatives(choices), text);
      },
      "");
}

}  // namespace detail

/// The integer `text`, an item inside the value of `option` (a token id of a list), in
/// [minimum, maximum]: the check `add_integer` declares, for values CLI11 does not split.
/// \throws UsageError naming the option, the range and the text.
inline long long parse_integer(const std::string& option, std::string text, long long minimum,
                               long long maximum) {
  const std::string error = detail::integer_in(minimum, maximum)(text);
  if (!error.empty()) throw UsageError(option + ": " + error);
  return std::stoll(text);
}

/// Declares the integer option `name`, which sets `value`, in [minimum, maximum].
template <class Int>
CLI::Option* add_integer(CLI::App& app, const std::string& name, Int& value,
                         const std::string& help, long long minimum, long long maximum) {
  return app.add_option(name, value, help)
      ->check(detail::integer_in(minimum, maximum))
      ->type_name("INT in [" + std::to_string(minimum) + ", " + std::to_string(maximum) + "]")
      ->capture_default_str();
}

/// Declares the number option `name`, which sets `value`, in [minimum, maximum].
template <class Real>
CLI::Option* add_number(CLI::App& app, const std::string& name, Real& value,
                        const std::string& help, double minimum, double maximum) {
  char type[64];
  std::snprintf(type, sizeof type, "NUMBER in [%g, %g]", minimum, maximum);
  return app.add_option(name, value, help)
      ->check(detail::number_in(minimum, maximum))
      ->type_name(type)
      ->capture_default_str();
}

/// Declares the comma-separated integer list `name` ("1,2"), which sets `values`, each item in
/// [minimum, maximum].
template <class Int>
CLI::Option* add_integer_list(CLI::App& app, const std::string& name, std::vector<Int>& values,
                              const std::string& help, long long minimum, long long maximum) {
  return app.add_option(name, values, help)
      ->delimiter(',')
      ->check(detail::integer_in(minimum, maximum))
      ->type_name("INT,... in [" + std::to_string(minimum) + ", " + std::to_string(maximum) + "]")
      ->capture_default_str();
}

/// Declares the option `name` written MIN:MAX ("8:64"), which sets `low` and `high`: integers
/// in [minimum, maximum], MIN <= MAX.
inline CLI::Option* add_integer_interval(CLI::App& app, const std::string& name, int& low,
                                         int& high, const std::string& help, long long minimum,
                                         long long maximum) {
  const std::string range = "[" + std::to_string(minimum) + ", " + std::to_string(maximum) + "]";
  return app
      .add_option_function<std::string>(
          name,
          [&low, &high](const std::string& text) {
            const std::size_t colon = text.find(':');
            low = std::stoi(text.substr(0, colon));
            high = std::stoi(text.substr(colon + 1));
          },
          help)
      ->check(CLI::Validator(
          [minimum, maximum, range](std::string& text) -> std::string {
            const std::string expected = "MIN:MAX, integers in " + range + " with MIN <= MAX";
            const std::size_t colon = text.find(':');
            if (colon == std::string::npos) return detail::expected_got(expected, text);
            std::string low_text = text.substr(0, colon), high_text = text.substr(colon + 1);
            const CLI::Validator in_range = detail::integer_in(minimum, maximum);
            if (!in_range(low_text).empty() || !in_range(high_text).empty() ||
                std::stoll(low_text) > std::stoll(high_text))
              return detail::expected_got(expected, text);
            return "";
          },
          ""))
      ->type_name("MIN:MAX in " + range)
      ->default_str(std::to_string(low) + ":" + std::to_string(high));
}

/// Declares the option `name`, which sets `value` to one of `choices`.
inline CLI::Option* add_choice(CLI::App& app, const std::string& name, std::string& value,
                               const std::string& help, const std::vector<std::string>& choices) {
  return app.add_option(name, value, help)
      ->check(detail::one_of(choices))
      ->type_name(CLI::detail::join(choices, "|"))
      ->capture_default_str();
}

/// Declares the comma-separated list `name` ("a,b"), which sets `values`, each item one of
/// `choices`.
inline CLI::Option* add_choice_list(CLI::App& app, const std::string& name,
                                    std::vector<std::string>& values, const std::string& help,
                                    const std::vector<std::string>& choices) {
  return app.add_option(name, values, help)
      ->delimiter(',')
      ->check(detail::one_of(choices))
      ->type_name(CLI::detail::join(choices, "|") + ",...")
      ->capture_default_str();
}

/// Declares the file-name option `name`, which sets `path` (not empty).
inline CLI::Option* add_file(CLI::App& app, const std::string& name, std::string& path,
                             const std::string& help) {
  return app.add_option(name, path, help)
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            return text.empty() ? "expected a file name, got nothing" : "";
          },
          ""))
      ->type_name("FILE");
}

/// Reads the command line into the options declared on `app`. Returns false when it printed the
/// help text (--help), true when the program should run.
/// \throws UsageError with CLI11's message ("--x: expected ..., got '...'", "The following
/// argument was not expected: --y", ...) for a bad command line.
inline bool parse(CLI::App& app, int argc, const char* const* argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return false;
  } catch (const CLI::CallForAllHelp&) {
    std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return false;
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  return true;
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

/// Reads the command line into the options declared on `app`, for a program whose options are
/// all on `app` (the tutorials). Returns the exit code when the program should stop there: 0
/// after --help, 2 after a bad command line (printed as "program: message (try --help)");
/// nothing when it should run.
inline std::optional<int> parse_command_line(const char* program, CLI::App& app, int argc,
                                             char** argv) {
  return read_command_line(program, argc, argv, app, [](int count, char** values, CLI::App& a) {
    return parse(a, count, values);
  });
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

}  // namespace kvlab_support
