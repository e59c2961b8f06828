// A Catch2 matcher for kvlab's error messages, shared by the CPU and CUDA tests (it needs
// nothing of kvlab, so the CUDA tests include it without the CPU umbrella header).
#pragma once

#include <catch2/catch.hpp>

#include <exception>
#include <string>
#include <utility>

namespace kvlab_test {

/// Matches a kvlab exception whose message names the argument, the expected and the actual
/// value ("<argument>: expected <expected>, got <actual>").
class Names : public Catch::MatcherBase<std::exception> {
 public:
  Names(std::string argument, std::string expected, std::string actual)
      : argument_(std::move(argument)),
        expected_(std::move(expected)),
        actual_(std::move(actual)) {}
  bool match(const std::exception& e) const override {
    const std::string message = e.what();
    return message.find(argument_ + ": expected " + expected_) != std::string::npos &&
           message.find("got " + actual_) != std::string::npos;
  }
  std::string describe() const override {
    return "names \"" + argument_ + "\", \"expected " + expected_ + "\" and \"got " + actual_ +
           "\"";
  }

 private:
  std::string argument_, expected_, actual_;
};

/// Shorthand for `Names`, for CHECK_THROWS_MATCHES(expr, ExceptionType, names(...)).
inline Names names(const std::string& argument, const std::string& expected,
                   const std::string& actual) {
  return Names(argument, expected, actual);
}

}  // namespace kvlab_test
