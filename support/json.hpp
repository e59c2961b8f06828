/// \file
/// \brief The JSON that kvlab's programs and benchmarks write, with nlohmann/json: keys in the
/// order they are set, numbers in the shortest form that reads back to the same double, strings
/// escaped. Not part of the library.
#pragma once

#include <fstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace kvlab_support {

/// A JSON value whose object keys keep the order they were set in.
using Json = nlohmann::ordered_json;

/// Writes `json` to `path`, indented by two spaces, with a final newline.
/// \throws std::runtime_error naming `path` when it cannot be written.
inline void write_json_file(const std::string& path, const Json& json) {
  std::ofstream file(path);
  file << json.dump(2) << "\n";
  if (!file) throw std::runtime_error("cannot write '" + path + "'");
}

}  // namespace kvlab_support
