// The bad-input table's cases (tests/<folder>/test_<folder>_bad_input.cpp): one call with one
// bad argument must throw kvlab's exception type with a message naming the argument, the
// expected and the actual value, and leave the object's observable state as it was. Every case
// is counted by entry point and input class; with KVLAB_BAD_INPUT_TABLE set, the counts are
// written to that file at exit (check_table.py reads them, and makes the docs page from them).
#pragma once

#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <utility>

#include "../names_matcher.hpp"

namespace kvlab_test {

/// The input classes of the table, as the docs page names them.
namespace input {
constexpr const char* kShape = "wrong shape";
constexpr const char* kSize = "zero or negative size";
constexpr const char* kEmpty = "null or empty";
constexpr const char* kRange = "index or id out of range";
constexpr const char* kState = "not allowed in this state";
constexpr const char* kOverflow = "overflow-sized";
constexpr const char* kValue = "NaN, Inf or a value out of range";
}  // namespace input

/// Cases run, by entry point and input class; written at exit when KVLAB_BAD_INPUT_TABLE names
/// a file (tab-separated: entry point, input class, cases).
class CaseTable {
 public:
  void add(const std::string& entry, const std::string& input_class) {
    ++counts_[{entry, input_class}];
  }
  ~CaseTable() {
    const char* path = std::getenv("KVLAB_BAD_INPUT_TABLE");
    if (path == nullptr) return;
    std::ofstream out(path);
    for (const auto& c : counts_)
      out << c.first.first << '\t' << c.first.second << '\t' << c.second << '\n';
  }

 private:
  std::map<std::pair<std::string, std::string>, int> counts_;
};

inline CaseTable& case_table() {
  static CaseTable table;
  return table;
}

/// One case of entry point `entry` (its signature as the table writes it): `call()` must throw
/// `E` whose message matches `message` (names(argument, expected, actual)), and `state()` must
/// give the same before and after.
template <typename E, typename State, typename Call>
void refuses(const std::string& entry, const char* input_class, State state, Call call,
             const Names& message) {
  INFO(entry << ": " << input_class);
  const auto before = state();
  CHECK_THROWS_MATCHES(call(), E, message);
  CHECK(state() == before);
  case_table().add(entry, input_class);
}

}  // namespace kvlab_test
