// kvlab-serve's workload file: JSON lines, one request per line (blank lines skipped), e.g.
//   {"id": "a", "prompt": [1, 403, 9], "max_new_tokens": 32, "arrival": 0.5}
//   {"prompt": [1, 22], "max_new_tokens": 8, "stop_ids": [2], "temperature": 0.8, "seed": 7}
// Keys: "prompt" (required: token ids), "id" (a number or a string, echoed in the output;
// default: the request's index), "max_new_tokens" (default 16), "stop_ids" (default none),
// "temperature" (default 0: greedy), "top_p" (default 1), "seed" (default 0), "arrival" (seconds
// after the start; default 0). Instead of "prompt", a request may give text: "user" (a user's
// message, a JSON string) and optionally "system" (its system prompt; default: the chat
// template's); kvlab-serve puts them in the model's chat template and tokenizes them, which
// needs a GGUF model, e.g.
//   {"id": "paris", "user": "What is the capital of France?", "max_new_tokens": 32} Any other key, a repeated key, a wrong type or trailing text is
// an error naming the file, the line, the key, what was expected and what was found. The ids'
// ranges are checked by the engine when each request is submitted.
#pragma once

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <kvlab/model/unicode_classes.hpp>
#include <kvlab/serving/request.hpp>

namespace kvlab_serve {

/// A bad workload file: the message names the file and line.
struct WorkloadError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A request of the file and the JSON text of its id.
struct WorkloadEntry {
  kvlab::Request request;  ///< its prompt is empty while the request is text (`has_user`)
  std::string id;  ///< JSON text: a number, a quoted string, or empty for "the index"
  bool has_user = false;    ///< given as text: "user" (and maybe "system") instead of "prompt"
  std::string user;         ///< the user's message (UTF-8)
  bool has_system = false;  ///< "system" given (else the chat template's default)
  std::string system;       ///< the system prompt (UTF-8)
  bool has_stop_ids = false;  ///< "stop_ids" given (a text request stops at EOS otherwise)
};

/// Reads one JSON object of the workload format (`line`), naming `where` ("file:line") in
/// errors.
class RequestParser {
 public:
  RequestParser(const std::string& line, std::string where) : text_(line), where_(std::move(where)) {}

  WorkloadEntry parse() {
    WorkloadEntry entry;
    std::vector<std::string> seen;
    bool has_prompt = false;
    skip_space();
    expect('{', "a JSON object");
    skip_space();
    if (peek() == '}') fail("prompt", "a \"prompt\" or \"user\" key", "an empty object");
    while (true) {
      skip_space();
      const std::string key = parse_string("a key in double quotes");
      for (const std::string& k : seen)
        if (k == key) fail(key, "each key once", "it twice");
      seen.push_back(key);
      skip_space();
      expect(':', "':' after the key");
      skip_space();
      kvlab::Request& r = entry.request;
      if (key == "prompt") {
        r.prompt = parse_ids(key);
        has_prompt = true;
      } else if (key == "user") {
        entry.user = parse_string("a string (the user's message)", key);
        entry.has_user = true;
      } else if (key == "system") {
        entry.system = parse_string("a string (the system prompt)", key);
        entry.has_system = true;
      } else if (key == "stop_ids") {
        r.stop_ids = parse_ids(key);
        entry.has_stop_ids = true;
      } else if (key == "max_new_tokens") {
        r.max_new_tokens = static_cast<int>(parse_integer(key, 1, 1 << 30));
      } else if (key == "seed") {
        r.sampling.seed = static_cast<std::uint64_t>(parse_integer(key, 0, INT64_MAX));
      } else if (key == "temperature") {
        r.sampling.temperature = parse_float(key);
      } else if (key == "top_p") {
        r.sampling.top_p = parse_float(key);
      } else if (key == "arrival") {
        r.arrival = parse_number(key);
      } else if (key == "id") {
        const std::size_t begin = at_;
        if (peek() == '"') {
          parse_string("a string");
        } else {
          parse_number(key, "a number or a string");
        }
        entry.id = text_.substr(begin, at_ - begin);
      } else {
        fail(key,
             "one of prompt, user, system, max_new_tokens, stop_ids, temperature, top_p, seed, "
             "arrival, id",
             "an unknown key");
      }
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      expect('}', "',' or '}'");
      break;
    }
    skip_space();
    if (at_ != text_.size()) fail("line", "nothing after the object", "'" + text_.substr(at_) + "'");
    if (has_prompt && entry.has_user) fail("user", "either \"prompt\" or \"user\"", "both");
    if (!has_prompt && !entry.has_user) fail("prompt", "a \"prompt\" or \"user\" key", "none");
    if (entry.has_system && !entry.has_user)
      fail("system", "a \"user\" key with it (a system prompt is text)", "none");
    return entry;
  }

 private:
  [[noreturn]] void fail(const std::string& key, const std::string& expected,
                         const std::string& got) const {
    throw WorkloadError(where_ + ": " + key + ": expected " + expected + ", got " + got);
  }
  char peek() const { return at_ < text_.size() ? text_[at_] : '\0'; }
  std::string found() const {
    return at_ < text_.size() ? "'" + text_.substr(at_, 12) + "'" : "the end of the line";
  }
  void skip_space() {
    while (at_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[at_]))) ++at_;
  }
  void expect(char c, const char* what) {
    if (peek() != c) fail("line", what, found());
    ++at_;
  }
  // A JSON string, its escapes decoded (\uXXXX to UTF-8, a surrogate pair to one character);
  // `key` names it in errors ("line" for keys and ids). Raw bytes are kept as they are.
  std::string parse_string(const char* what, const std::string& key = "line") {
    if (peek() != '"') fail(key, what, found());
    std::string s;
    for (++at_; at_ < text_.size() && text_[at_] != '"'; ++at_) {
      if (static_cast<unsigned char>(text_[at_]) < 0x20)
        fail(key, "no control character in a string (\\n, \\t, \\u00XX)", found());
      if (text_[at_] != '\\') {
        s += text_[at_];
        continue;
      }
      ++at_;
      const char e = peek();
      const char* simple = "\"\\/bfnrt";
      const char* decoded = "\"\\/\b\f\n\r\t";
      if (e != '\0' && std::strchr(simple, e) != nullptr) {
        s += decoded[std::strchr(simple, e) - simple];
      } else if (e == 'u') {
        std::uint32_t code = parse_hex4(key);
        if (code >= 0xD800 && code < 0xDC00) {  // a high surrogate: its low one must follow
          if (text_.compare(at_ + 1, 2, "\\u") != 0)
            fail(key, "a low surrogate (\\uDC00-\\uDFFF) after a high one", found());
          at_ += 2;
          const std::uint32_t low = parse_hex4(key);
          if (low < 0xDC00 || low >= 0xE000)
            fail(key, "a low surrogate (\\uDC00-\\uDFFF) after a high one", found());
          code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        } else if (code >= 0xDC00 && code < 0xE000) {
          fail(key, "a high surrogate before a low one", found());
        }
        s += kvlab::encode_utf8(code);
      } else {
        fail(key, "an escape of JSON (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX) in a string", found());
      }
    }
    expect('"', "a closing '\"'");
    return s;
  }
  // The four hex digits after "\u" (at_ is on the 'u'); leaves at_ on the last digit.
  std::uint32_t parse_hex4(const std::string& key) {
    std::uint32_t code = 0;
    for (int i = 1; i <= 4; ++i) {
      const char c = at_ + i < text_.size() ? text_[at_ + i] : '\0';
      const int digit = c >= '0' && c <= '9'   ? c - '0'
                        : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                               : -1;
      if (digit < 0) fail(key, "four hex digits after \\u", found());
      code = code * 16 + static_cast<std::uint32_t>(digit);
    }
    at_ += 4;
    return code;
  }

  // The length of the JSON number at at_ (-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?), or 0;
  // `integer` is set when it has no fraction or exponent. strtod and strtoll accept more ("+1",
  // ".5", "0x10", "007"), which is not JSON and would be echoed into the output as such.
  std::size_t number_length(bool& integer) const {
    std::size_t i = at_;
    const auto digit = [this](std::size_t j) {
      return j < text_.size() && text_[j] >= '0' && text_[j] <= '9';
    };
    if (i < text_.size() && text_[i] == '-') ++i;
    if (!digit(i)) return 0;
    if (text_[i] == '0') {
      ++i;
    } else {
      while (digit(i)) ++i;
    }
    integer = true;
    if (i < text_.size() && text_[i] == '.') {
      integer = false;
      if (!digit(++i)) return 0;
      while (digit(i)) ++i;
    }
    if (i < text_.size() && (text_[i] == 'e' || text_[i] == 'E')) {
      integer = false;
      ++i;
      if (i < text_.size() && (text_[i] == '+' || text_[i] == '-')) ++i;
      if (!digit(i)) return 0;
      while (digit(i)) ++i;
    }
    return i - at_;
  }
  double parse_number(const std::string& key, const char* expected = "a number") {
    bool integer = false;
    const std::size_t length = number_length(integer);
    if (length == 0) fail(key, expected, found());
    const std::string text = text_.substr(at_, length);
    errno = 0;
    const double value = std::strtod(text.c_str(), nullptr);
    if (errno == ERANGE || !std::isfinite(value)) fail(key, "a finite number", "'" + text + "'");
    at_ += length;
    return value;
  }
  // A float-valued key: a number within float's range (a wider one cannot be converted).
  float parse_float(const std::string& key) {
    const std::size_t begin = at_;
    const double value = parse_number(key);
    if (std::fabs(value) > 3.4e38)
      fail(key, "a number within float's range", "'" + text_.substr(begin, at_ - begin) + "'");
    return static_cast<float>(value);
  }
  long long parse_integer(const std::string& key, long long minimum, long long maximum) {
    const std::string range =
        "an integer in [" + std::to_string(minimum) + ", " + std::to_string(maximum) + "]";
    bool integer = false;
    const std::size_t length = number_length(integer);
    if (length == 0 || !integer) fail(key, range, found());
    const std::string text = text_.substr(at_, length);
    errno = 0;
    const long long value = std::strtoll(text.c_str(), nullptr, 10);
    if (errno == ERANGE || value < minimum || value > maximum) fail(key, range, "'" + text + "'");
    at_ += length;
    return value;
  }
  std::vector<int> parse_ids(const std::string& key) {
    expect('[', ("a list of token ids for " + key).c_str());
    std::vector<int> ids;
    skip_space();
    if (peek() == ']') {
      ++at_;
      return ids;
    }
    while (true) {
      skip_space();
      ids.push_back(static_cast<int>(parse_integer(key, INT32_MIN, INT32_MAX)));
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      expect(']', "',' or ']'");
      return ids;
    }
  }

  const std::string& text_;
  std::string where_;
  std::size_t at_ = 0;
};

/// Every request of the JSON-lines file `path`.
/// \throws WorkloadError for a file that cannot be read, a bad line, or no request at all.
inline std::vector<WorkloadEntry> read_workload(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw WorkloadError(path + ": expected a readable file, got none");
  std::vector<WorkloadEntry> entries;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    bool blank = true;
    for (char c : line) blank = blank && std::isspace(static_cast<unsigned char>(c));
    if (blank) continue;
    entries.push_back(RequestParser(line, path + ":" + std::to_string(number)).parse());
  }
  if (entries.empty()) throw WorkloadError(path + ": expected at least one request, got none");
  return entries;
}

}  // namespace kvlab_serve
