// kvlab-serve's workload reader (apps/serve_workload.hpp): text requests and JSON string escapes.
// The reader's errors for malformed lines are tested through the program (apps/CMakeLists.txt)
// and fuzzed (tests/fuzz/fuzz_workload.cpp); here, what it decodes.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "model_writers.hpp"
#include "serve_workload.hpp"

namespace {

std::vector<kvlab_serve::WorkloadEntry> read(const std::string& text) {
  const std::string path = "test_serve_workload.jsonl";
  kvlab_test::write_bytes(path, text);
  std::vector<kvlab_serve::WorkloadEntry> entries = kvlab_serve::read_workload(path);
  std::remove(path.c_str());
  return entries;
}

std::string error_of(const std::string& text) {
  try {
    read(text);
  } catch (const kvlab_serve::WorkloadError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("workload: a text request's strings, every JSON escape decoded to UTF-8") {
  const std::vector<kvlab_serve::WorkloadEntry> e = read(
      "{\"id\": \"t\", \"system\": \"Be brief.\\n\", \"user\": \"caf\\u00e9 \\ud83d\\ude00 "
      "\\\"q\\\" \\\\ \\/ \\b\\f\\r\\t\", \"max_new_tokens\": 4}\n"
      "{\"user\": \"raw \xC3\xA9\", \"stop_ids\": [5]}\n");
  REQUIRE(e.size() == 2);
  CHECK(e[0].has_user);
  CHECK(e[0].user == "caf\xC3\xA9 \xF0\x9F\x98\x80 \"q\" \\ / \b\f\r\t");
  CHECK(e[0].has_system);
  CHECK(e[0].system == "Be brief.\n");
  CHECK(e[0].request.prompt.empty());  // tokenized by kvlab-serve, with the model's tokenizer
  CHECK(e[0].request.max_new_tokens == 4);
  CHECK(!e[0].has_stop_ids);
  CHECK(e[1].user == "raw \xC3\xA9");  // raw UTF-8 kept as it is
  CHECK(!e[1].has_system);
  CHECK(e[1].has_stop_ids);
}

TEST_CASE("workload: text requests' mistakes named by line and key") {
  CHECK(error_of("{\"user\": \"a\", \"prompt\": [1]}").find(":1: user: expected either \"prompt\" or \"user\", got both") != std::string::npos);
  CHECK(error_of("{\"system\": \"s\", \"prompt\": [1]}").find(":1: system: expected a \"user\" key with it") != std::string::npos);
  CHECK(error_of("{\"max_new_tokens\": 2}").find(":1: prompt: expected a \"prompt\" or \"user\" key, got none") != std::string::npos);
  CHECK(error_of("{\"user\": \"\\x\"}").find(":1: user: expected an escape of JSON") != std::string::npos);
  CHECK(error_of("{\"user\": \"\\u12g4\"}").find(":1: user: expected four hex digits after \\u") != std::string::npos);
  CHECK(error_of("{\"user\": \"\\ud83d x\"}").find(":1: user: expected a low surrogate") != std::string::npos);
  CHECK(error_of("{\"user\": \"\\ude00\"}").find(":1: user: expected a high surrogate before a low one") != std::string::npos);
  CHECK(error_of("{\"user\": 5}").find(":1: user: expected a string (the user's message)") != std::string::npos);
  // A raw newline ends the line inside the string (JSON wants \n there).
  CHECK(error_of("{\"user\": \"a\nb\"}").find(":1: line: expected a closing '\"', got the end of the line") != std::string::npos);
}
