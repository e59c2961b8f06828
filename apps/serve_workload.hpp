/// \file
/// \brief kvlab-serve's workload file, read with nlohmann/json; checked by
/// tests/apps/test_serve_workload.cpp, the program's CTests and tests/fuzz/fuzz_workload.cpp.
///
/// JSON lines, one request per line (blank lines skipped), e.g.
///   {"id": "a", "prompt": [1, 403, 9], "max_new_tokens": 32, "arrival": 0.5}
///   {"prompt": [1, 22], "max_new_tokens": 8, "stop_ids": [2], "temperature": 0.8, "seed": 7}
/// Keys: "prompt" (required: token ids), "id" (a number or a string, echoed in the output as
/// JSON text; default: the request's index), "max_new_tokens" (default 16), "stop_ids" (default
/// none), "temperature" (default 0: greedy), "top_p" (default 1), "seed" (default 0), "arrival"
/// (seconds after the start; default 0). Instead of "prompt", a request may give text: "user" (a
/// user's message, a JSON string) and optionally "system" (its system prompt; default: the chat
/// template's); kvlab-serve puts them in the model's chat template and tokenizes them, which
/// needs a GGUF model, e.g.
///   {"id": "paris", "user": "What is the capital of France?", "max_new_tokens": 32}
/// A line is any JSON text (RFC 8259): strings in UTF-8 with every escape, numbers in any JSON
/// form. An integer key (ids, "max_new_tokens", "seed") takes a number with no fractional part
/// however it is written (16, 16.0 and 1.6e1 alike: JSON has one number type, and JSON Schema's
/// "integer" is such a number); one written with a fraction or exponent must lie within 2^53,
/// where a double holds every integer.
///
/// Errors name the file and line. A wrong type or range, an unknown key, a repeated key, a line
/// that is not an object or text after the object: "file:line: key: expected <what>, got
/// <found>" ("line" for the last two). Malformed JSON: "file:line: [key: ]malformed JSON at
/// byte N: <nlohmann/json's reason, with what it expected>", the key being the one whose value
/// was being read. A bad line refuses the whole file before anything runs. The ids' ranges are
/// checked by the engine when each request is submitted.
#pragma once

#include <cctype>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <kvlab/serving/request.hpp>

namespace kvlab_serve {

/// A bad workload file: the message names the file and line.
struct WorkloadError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A request of the file and the JSON text of its id.
struct WorkloadEntry {
  kvlab::Request request;     ///< its prompt is empty while the request is text (`has_user`)
  std::string id;             ///< JSON text: a number, a quoted string, or empty for "the index"
  bool has_user = false;      ///< given as text: "user" (and maybe "system") instead of "prompt"
  std::string user;           ///< the user's message (UTF-8)
  bool has_system = false;    ///< "system" given (else the chat template's default)
  std::string system;         ///< the system prompt (UTF-8)
  bool has_stop_ids = false;  ///< "stop_ids" given (a text request stops at EOS otherwise)
};

namespace detail {

/// A line's value, its keys in the line's order (so that the first bad key is the one named).
using Json = nlohmann::ordered_json;

/// Throws "<where>: <key>: expected <expected>, got <got>".
[[noreturn]] inline void fail(const std::string& where, const std::string& key,
                              const std::string& expected, const std::string& got) {
  throw WorkloadError(where + ": " + key + ": expected " + expected + ", got " + got);
}

/// `value` as an error shows it: its JSON text, non-ASCII escaped, cut after 40 bytes; an array
/// or object by its kind alone (its text may be long, and a line may nest it thousands deep).
inline std::string shown(const Json& value) {
  if (value.is_array()) return "an array";
  if (value.is_object()) return "an object";
  const std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true);
  return text.size() > 40 ? text.substr(0, 40) + "..." : text;
}

/// nlohmann/json's reason without its prefix ("[json.exception.parse_error.101] parse error at
/// line 1, column 8: "), which names the exception's kind and repeats the position.
inline std::string reason(const nlohmann::json::exception& e) {
  std::string message = e.what();
  const std::size_t kind_end = message.find("] ");
  if (kind_end != std::string::npos) message.erase(0, kind_end + 2);
  const std::size_t position_end = message.find(": ");
  if (message.rfind("parse error", 0) == 0 && position_end != std::string::npos)
    message.erase(0, position_end + 2);
  return message;
}

/// The JSON object of one line. Refused: malformed JSON, a repeated key (nlohmann/json would keep
/// the last), a value that is not an object, text after the object.
inline Json parse_object(const std::string& line, const std::string& where) {
  using Event = Json::parse_event_t;
  std::vector<std::string> keys;  // the object's keys so far
  std::string reading;            // the key whose value is being read, named if it is malformed
  bool complete = false;          // the object is read: a syntax error now is trailing text
  const Json::parser_callback_t check = [&](int depth, Event event, Json& parsed) {
    if (depth == 0 && event == Event::array_start) fail(where, "line", "a JSON object", "an array");
    if (depth == 0 && event == Event::value) fail(where, "line", "a JSON object", shown(parsed));
    if (depth == 0 && event == Event::object_end) complete = true;
    if (depth == 1 && event == Event::key) {
      reading = parsed.get<std::string>();
      for (const std::string& key : keys)
        if (key == reading) fail(where, reading, "each key once", "it twice");
      keys.push_back(reading);
    }
    // A key's value is read: a scalar, or the end of an array or object.
    if (depth == 1 &&
        (event == Event::value || event == Event::array_end || event == Event::object_end))
      reading.clear();
    return true;
  };
  try {
    return Json::parse(line, check);
  } catch (const Json::parse_error& e) {
    if (complete) {
      // The text after the object: a stream is read as far as one value only.
      std::istringstream in(line);
      Json object;
      in >> object;
      std::string rest;
      std::getline(in >> std::ws, rest);
      fail(where, "line", "nothing after the object",
           "'" + (rest.size() > 20 ? rest.substr(0, 20) + "..." : rest) + "'");
    }
    throw WorkloadError(where + ": " + (reading.empty() ? "" : reading + ": ") +
                        "malformed JSON at byte " + std::to_string(e.byte) + ": " + reason(e));
  } catch (const Json::exception& e) {  // a number beyond double's range: no byte position
    throw WorkloadError(where + ": " + (reading.empty() ? "" : reading + ": ") + reason(e));
  }
}

/// An integer key's value in [minimum, maximum]: a JSON number with no fractional part, in any
/// form (16, 16.0, 1.6e1); written with a fraction or exponent, within 2^53 (above it a double
/// skips integers, and the digits may not be the value it holds).
inline long long integer(const Json& value, const std::string& where, const std::string& key,
                         long long minimum, long long maximum) {
  const std::string range =
      "an integer in [" + std::to_string(minimum) + ", " + std::to_string(maximum) + "]";
  long long n = 0;
  if (value.is_number_unsigned()) {  // a non-negative integer, up to 2^64 - 1
    if (value.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
      fail(where, key, range, shown(value));
    n = static_cast<long long>(value.get<std::uint64_t>());
  } else if (value.is_number_integer()) {  // a negative one
    n = value.get<std::int64_t>();
  } else if (value.is_number_float()) {
    const double d = value.get<double>();
    if (std::trunc(d) != d || d < static_cast<double>(minimum) || d > static_cast<double>(maximum))
      fail(where, key, range, shown(value));
    if (std::fabs(d) > 9007199254740992.0)  // 2^53
      fail(where, key, range + ", above 2^53 in digits alone (no fraction or exponent)",
           shown(value));
    n = static_cast<long long>(d);
  } else {
    fail(where, key, range, shown(value));
  }
  if (n < minimum || n > maximum) fail(where, key, range, shown(value));
  return n;
}

/// A number key's value (finite: nlohmann/json refuses a number beyond double's range).
inline double number(const Json& value, const std::string& where, const std::string& key) {
  if (!value.is_number()) fail(where, key, "a number", shown(value));
  return value.get<double>();
}

/// A float key's value: a number within float's range (a wider one cannot be converted).
inline float float_number(const Json& value, const std::string& where, const std::string& key) {
  const double d = number(value, where, key);
  if (std::fabs(d) > std::numeric_limits<float>::max())
    fail(where, key, "a number within float's range", shown(value));
  return static_cast<float>(d);
}

/// A list of token ids; an element is named by its index ("prompt[2]").
inline std::vector<int> token_ids(const Json& value, const std::string& where,
                                  const std::string& key) {
  if (!value.is_array()) fail(where, key, "a list of token ids", shown(value));
  std::vector<int> ids;
  ids.reserve(value.size());
  for (std::size_t i = 0; i < value.size(); ++i)
    ids.push_back(static_cast<int>(
        integer(value[i], where, key + "[" + std::to_string(i) + "]", INT32_MIN, INT32_MAX)));
  return ids;
}

/// A string key's value (UTF-8: nlohmann/json refuses ill-formed bytes and lone surrogates).
inline std::string text(const Json& value, const std::string& where, const std::string& key,
                        const char* what) {
  if (!value.is_string()) fail(where, key, what, shown(value));
  return value.get<std::string>();
}

/// The request of one line of the workload format, naming `where` ("file:line") in errors.
inline WorkloadEntry parse_request(const std::string& line, const std::string& where) {
  const Json object = parse_object(line, where);
  WorkloadEntry entry;
  kvlab::Request& r = entry.request;
  bool has_prompt = false;
  for (auto it = object.begin(); it != object.end(); ++it) {
    const std::string& key = it.key();
    const Json& value = it.value();
    if (key == "prompt") {
      r.prompt = token_ids(value, where, key);
      has_prompt = true;
    } else if (key == "user") {
      entry.user = text(value, where, key, "a string (the user's message)");
      entry.has_user = true;
    } else if (key == "system") {
      entry.system = text(value, where, key, "a string (the system prompt)");
      entry.has_system = true;
    } else if (key == "stop_ids") {
      r.stop_ids = token_ids(value, where, key);
      entry.has_stop_ids = true;
    } else if (key == "max_new_tokens") {
      r.max_new_tokens = static_cast<int>(integer(value, where, key, 1, 1 << 30));
    } else if (key == "seed") {
      r.sampling.seed = static_cast<std::uint64_t>(integer(value, where, key, 0, INT64_MAX));
    } else if (key == "temperature") {
      r.sampling.temperature = float_number(value, where, key);
    } else if (key == "top_p") {
      r.sampling.top_p = float_number(value, where, key);
    } else if (key == "arrival") {
      r.arrival = number(value, where, key);
    } else if (key == "id") {
      if (!value.is_number() && !value.is_string())
        fail(where, key, "a number or a string", shown(value));
      entry.id = value.dump();  // valid JSON text: strings escaped, numbers in their shortest form
    } else {
      fail(where, key,
           "one of prompt, user, system, max_new_tokens, stop_ids, temperature, top_p, seed, "
           "arrival, id",
           "an unknown key");
    }
  }
  if (has_prompt && entry.has_user) fail(where, "user", "either \"prompt\" or \"user\"", "both");
  if (!has_prompt && !entry.has_user) fail(where, "prompt", "a \"prompt\" or \"user\" key", "none");
  if (entry.has_system && !entry.has_user)
    fail(where, "system", "a \"user\" key with it (a system prompt is text)", "none");
  return entry;
}

}  // namespace detail

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
    entries.push_back(detail::parse_request(line, path + ":" + std::to_string(number)));
  }
  if (entries.empty()) throw WorkloadError(path + ": expected at least one request, got none");
  return entries;
}

}  // namespace kvlab_serve
