/// \file
/// \brief The tutorials' command line: the options of support/cli.hpp behind a small class, so
/// that a tutorial does not compile CLI11.
///
/// A tutorial declares a handful of options and reads them once. support/cli.hpp's checked
/// adders do that on a `CLI::App`, whose header-only library costs each program that includes it
/// about 6 s of compile time at -O3 (its parse and the code of `CLI::App`); the 13 tutorials
/// would pay it in every build of them. `CommandLine` holds the `CLI::App` out of sight and is
/// compiled once (command_line.cpp, the library kvlab_command_line): the same options, the same
/// generated --help, the same errors ("--steps: expected an integer in [1, 64], got '0'") and exit
/// statuses as support/cli.hpp's `parse_command_line`. Not part of the library: the headers under
/// include/ stay Eigen-only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace CLI {
class App;
}

namespace kvlab_support {

/// A program's options, declared one by one, then read from its command line by `parse`.
/// Each `add_*` binds a variable, whose value before `parse` is the default (shown by --help).
class CommandLine {
 public:
  /// `description`: the first line of --help.
  explicit CommandLine(const std::string& description);
  ~CommandLine();
  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;

  /// The integer option `name` ("--steps"), which sets `value`, in [minimum, maximum].
  void add_integer(const std::string& name, int& value, const std::string& help,
                   long long minimum, long long maximum);
  /// The same for a 64-bit `value`.
  void add_integer(const std::string& name, std::int64_t& value, const std::string& help,
                   long long minimum, long long maximum);
  /// The number option `name`, which sets `value`, a finite number in [minimum, maximum].
  void add_number(const std::string& name, double& value, const std::string& help,
                  double minimum, double maximum);
  /// The text option `name`, which sets `value` (any text; --help shows a default that is not
  /// empty). A positional argument where `name` has no leading '-' ("model").
  void add_text(const std::string& name, std::string& value, const std::string& help);
  /// The flag `name` ("--no-real-model"), which sets `value` to true when it is given.
  void add_flag(const std::string& name, bool& value, const std::string& help);

  /// Reads the command line into the declared options. Returns the exit code when the program
  /// should stop there: 0 after printing --help, 2 after a bad command line (printed on standard
  /// error as "program: message (try --help)"); nothing when it should run. `program`: the name
  /// the messages start with.
  std::optional<int> parse(const char* program, int argc, char** argv);

 private:
  std::unique_ptr<CLI::App> app_;
};

}  // namespace kvlab_support
