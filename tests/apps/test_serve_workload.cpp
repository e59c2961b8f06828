// kvlab-serve's workload reader (apps/serve_workload.hpp, with nlohmann/json): what it decodes
// (text requests, every JSON string escape, numbers in any JSON form) and each refusal's message
// (file, line, key, expected, found). The program's own refusals are tested in apps/CMakeLists.txt;
// arbitrary bytes are fuzzed (tests/fuzz/fuzz_workload.cpp).
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "model_writers.hpp"
#include "serve_workload.hpp"

namespace {

// `text` as a workload file (a TempFile: one name shared by the cases, which CTest runs side by
// side, let two cases read each other's file), read back.
std::vector<kvlab_serve::WorkloadEntry> read(const std::string& text) {
  const kvlab_test::TempFile file("serve_workload.jsonl");
  kvlab_test::write_bytes(file.path, text);
  return kvlab_serve::read_workload(file.path);
}

std::string workload_error_of(const std::string& text) {
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
  CHECK(workload_error_of("{\"user\": \"a\", \"prompt\": [1]}")
            .find(":1: user: expected either \"prompt\" or \"user\", got both") !=
        std::string::npos);
  CHECK(workload_error_of("{\"system\": \"s\", \"prompt\": [1]}")
            .find(":1: system: expected a \"user\" key with it") != std::string::npos);
  CHECK(workload_error_of("{\"max_new_tokens\": 2}")
            .find(":1: prompt: expected a \"prompt\" or \"user\" key, got none") !=
        std::string::npos);
  // A bad escape: malformed JSON, named by the key whose value it is in, nlohmann/json's byte
  // position in the line and its reason.
  CHECK(workload_error_of("{\"user\": \"\\x\"}")
            .find(":1: user: malformed JSON at byte 12: syntax error while parsing value - invalid "
                  "string: forbidden character after backslash") != std::string::npos);
  CHECK(workload_error_of("{\"user\": \"\\u12g4\"}")
            .find(":1: user: malformed JSON at byte 15: syntax error while parsing value - invalid "
                  "string: '\\u' must be followed by 4 hex digits") != std::string::npos);
  CHECK(workload_error_of("{\"user\": \"\\ud83d x\"}")
            .find(":1: user: malformed JSON at byte 17: syntax error while parsing value - invalid "
                  "string: surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF") !=
        std::string::npos);
  CHECK(workload_error_of("{\"user\": \"\\ude00\"}")
            .find(":1: user: malformed JSON at byte 16: syntax error while parsing value - invalid "
                  "string: surrogate U+DC00..U+DFFF must follow U+D800..U+DBFF") !=
        std::string::npos);
  CHECK(workload_error_of("{\"user\": 5}")
            .find(":1: user: expected a string (the user's message), got 5") != std::string::npos);
  // A raw newline ends the line inside the string (JSON wants \n there).
  CHECK(workload_error_of("{\"user\": \"a\nb\"}")
            .find(":1: user: malformed JSON at byte 12: syntax error while parsing value - invalid "
                  "string: missing closing quote") != std::string::npos);
  // Ill-formed UTF-8 is not JSON text (RFC 8259 8.1): refused, not passed to the tokenizer.
  CHECK(workload_error_of("{\"user\": \"\xFF\"}")
            .find(":1: user: malformed JSON at byte 11: syntax error while parsing value - invalid "
                  "string: ill-formed UTF-8 byte") != std::string::npos);
}

TEST_CASE("workload: unicode escapes of 1 to 4 UTF-8 bytes and a surrogate pair decoded in user") {
  const std::vector<kvlab_serve::WorkloadEntry> e =
      read("{\"user\": \"\\u0041\\u00E9\\u4e2d\\ud83d\\ude00\\u0000!\"}");
  REQUIRE(e.size() == 1);
  CHECK(e[0].user == std::string("A\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80") + '\0' + "!");
}

TEST_CASE(
    "workload: numbers in any JSON form, an integer key taking a whole number however written") {
  const std::vector<kvlab_serve::WorkloadEntry> e = read(
      "{\"prompt\": [1, 2e0, 3.0, -4], \"max_new_tokens\": 1.6e1, \"seed\": 7E2, "
      "\"temperature\": 5e-1, \"top_p\": 0.9, \"arrival\": 2.5E-3, \"id\": 1e2}\n"
      "{\"prompt\": [1], \"stop_ids\": [2.0], \"id\": \"caf\\u00e9\", \"seed\": "
      "9223372036854775807}\n"
      "{\"prompt\": [1], \"id\": -7}\n");
  REQUIRE(e.size() == 3);
  CHECK(e[0].request.prompt == std::vector<int>{1, 2, 3, -4});
  CHECK(e[0].request.max_new_tokens == 16);
  CHECK(e[0].request.sampling.seed == 700);
  CHECK(e[0].request.sampling.temperature == 0.5f);
  CHECK(e[0].request.sampling.top_p == 0.9f);
  CHECK(e[0].request.arrival == 2.5e-3);
  // An id is echoed as JSON text (nlohmann/json's: numbers in their shortest form, strings with
  // their escapes decoded and the ones JSON needs written back).
  CHECK(e[0].id == "100.0");
  CHECK(e[1].request.stop_ids == std::vector<int>{2});
  CHECK(e[1].id == "\"caf\xC3\xA9\"");
  CHECK(e[1].request.sampling.seed == 9223372036854775807ull);  // INT64_MAX, in digits alone
  CHECK(e[2].id == "-7");
  // A fraction, or a whole number beyond the key's range, is refused; so is one above 2^53
  // written with an exponent (a double skips integers there: its digits may not be its value).
  CHECK(workload_error_of("{\"prompt\": [1], \"max_new_tokens\": 1.65e1}")
            .find(":1: max_new_tokens: expected an integer in [1, 1073741824], got 16.5") !=
        std::string::npos);
  CHECK(workload_error_of("{\"prompt\": [1], \"max_new_tokens\": 0e5}")
            .find(":1: max_new_tokens: expected an integer in [1, 1073741824], got 0.0") !=
        std::string::npos);
  CHECK(
      workload_error_of("{\"prompt\": [1, 2147483648]}")
          .find(
              ":1: prompt[1]: expected an integer in [-2147483648, 2147483647], got 2147483648") !=
      std::string::npos);
  CHECK(workload_error_of("{\"prompt\": [1], \"seed\": 9e18}")
            .find(":1: seed: expected an integer in [0, 9223372036854775807], above 2^53 in digits "
                  "alone (no fraction or exponent), got 9e+18") != std::string::npos);
  CHECK(workload_error_of("{\"prompt\": [1], \"seed\": 9223372036854775808}")
            .find(":1: seed: expected an integer in [0, 9223372036854775807], got "
                  "9223372036854775808") != std::string::npos);
  CHECK(workload_error_of("{\"prompt\": [1], \"temperature\": 1e39}")
            .find(":1: temperature: expected a number within float's range, got 1e+39") !=
        std::string::npos);
  CHECK(workload_error_of("{\"prompt\": [1], \"arrival\": 1e400}")
            .find(":1: arrival: number overflow parsing '1e400'") != std::string::npos);
  CHECK(workload_error_of("{\"prompt\": [1], \"id\": +1}")
            .find(":1: id: malformed JSON at byte 23: syntax error while parsing value - invalid "
                  "literal") != std::string::npos);
}

TEST_CASE(
    "workload: a repeated key, an unknown key, text after the object and a non-object line "
    "refused") {
  // nlohmann/json alone would keep the last of two equal keys: the reader refuses the line.
  CHECK(workload_error_of("{\"prompt\": [1], \"max_new_tokens\": 4, \"prompt\": [2]}")
            .find(":1: prompt: expected each key once, got it twice") != std::string::npos);
  CHECK(workload_error_of("{\"prompt\": [1], \"colour\": 1}")
            .find(":1: colour: expected one of prompt, user, system, max_new_tokens, stop_ids, "
                  "temperature, top_p, seed, arrival, id, got an unknown key") !=
        std::string::npos);
  CHECK(workload_error_of("{\"prompt\": [1]} x")
            .find(":1: line: expected nothing after the object, got 'x'") != std::string::npos);
  CHECK(workload_error_of("{\"prompt\": [1]}{\"prompt\": [2]}")
            .find(":1: line: expected nothing after the object, got '{\"prompt\": [2]}'") !=
        std::string::npos);
  CHECK(workload_error_of("[1, 2]").find(":1: line: expected a JSON object, got an array") !=
        std::string::npos);
  CHECK(workload_error_of("\"prompt\"").find(":1: line: expected a JSON object, got \"prompt\"") !=
        std::string::npos);
  CHECK(workload_error_of("{\"prompt\": \"1 2\"}")
            .find(":1: prompt: expected a list of token ids, got \"1 2\"") != std::string::npos);
  CHECK(workload_error_of("{\"prompt\": [1] \"seed\": 3}")
            .find(":1: malformed JSON at byte 21: syntax error while parsing object - unexpected "
                  "string literal; expected '}'") != std::string::npos);
  // The line named is the bad one's, and nothing of the file is returned.
  CHECK(workload_error_of("{\"prompt\": [1]}\n\n{\"prompt\": [2], \"prompt\": [3]}\n")
            .find("serve_workload.jsonl:3: prompt: expected each key once, got it twice") !=
        std::string::npos);
}
