// What kvlab's fuzz targets share: a scratch file for loaders that read a path, and the rule
// that wrong input may only end in one of the library's typed errors.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "kvlab/config.hpp"

namespace kvlab_fuzz {

/// A file of this process's own (in /tmp, or $TMPDIR) that holds the current input, for the
/// loaders that take a path; written afresh for every input, removed at exit.
inline const std::string& scratch_path(const char* name) {
  static const std::string path = [name] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir != nullptr && dir[0] != '\0' ? dir : "/tmp") + "/kvlab_fuzz_" + name +
           "_" + std::to_string(static_cast<long>(getpid())) + ".bin";
  }();
  static const struct Remover {
    ~Remover() { std::remove(path.c_str()); }
  } remover;
  return path;
}

/// Writes `size` bytes to `path`, replacing it.
inline void write_input(const std::string& path, const std::uint8_t* data, std::size_t size) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) __builtin_trap();  // the fuzzer's own failure, not kvlab's
  if (size > 0 && std::fwrite(data, 1, size, file) != size) __builtin_trap();
  std::fclose(file);
}

/// Runs `f`; kvlab's typed errors (InvalidArgument, CapacityError) are the answer to wrong input
/// and end the run quietly. Anything else escapes: libFuzzer reports an uncaught exception (a
/// std::bad_alloc from a huge allocation, say) as a crash, as it does a sanitizer's finding.
template <typename F>
void expect_typed_errors_only(F&& f) {
  try {
    f();
  } catch (const kvlab::InvalidArgument&) {
  } catch (const kvlab::CapacityError&) {}
}

}  // namespace kvlab_fuzz
