// kvlab_support::CommandLine (command_line.hpp): support/cli.hpp's options and parse, compiled
// once for the tutorials.
#include "support/command_line.hpp"

#include "support/cli.hpp"

namespace kvlab_support {

CommandLine::CommandLine(const std::string& description)
    : app_(std::make_unique<CLI::App>(description)) {}

CommandLine::~CommandLine() = default;

void CommandLine::add_integer(const std::string& name, int& value, const std::string& help,
                              long long minimum, long long maximum) {
  kvlab_support::add_integer(*app_, name, value, help, minimum, maximum);
}

void CommandLine::add_integer(const std::string& name, std::int64_t& value,
                              const std::string& help, long long minimum, long long maximum) {
  kvlab_support::add_integer(*app_, name, value, help, minimum, maximum);
}

void CommandLine::add_number(const std::string& name, double& value, const std::string& help,
                             double minimum, double maximum) {
  kvlab_support::add_number(*app_, name, value, help, minimum, maximum);
}

void CommandLine::add_text(const std::string& name, std::string& value, const std::string& help) {
  CLI::Option* option = app_->add_option(name, value, help);
  if (!value.empty()) option->capture_default_str();
}

void CommandLine::add_flag(const std::string& name, bool& value, const std::string& help) {
  app_->add_flag(name, value, help);
}

std::optional<int> CommandLine::parse(const char* program, int argc, char** argv) {
  return parse_command_line(program, *app_, argc, argv);
}

}  // namespace kvlab_support
