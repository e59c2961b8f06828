// What the stress harnesses share (tests/stress): the error a broken invariant throws, the check
// that throws it, and the process's resident memory.
#pragma once

#include <stdexcept>
#include <string>

#if defined(__linux__)
#include <unistd.h>

#include <fstream>
#endif

namespace kvlab_stress {

/// An invariant that did not hold.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Throws `Failure("<what> (operation <op>)")` unless `ok`.
inline void check(bool ok, long op, const std::string& what) {
  if (!ok) throw Failure(what + " (operation " + std::to_string(op) + ")");
}

/// The process's resident memory in KiB (/proc/self/statm), or -1 where it cannot be read.
inline long resident_kib() {
#if defined(__linux__)
  std::ifstream statm("/proc/self/statm");
  long total_pages = 0, resident_pages = 0;
  if (statm >> total_pages >> resident_pages)
    return resident_pages * (sysconf(_SC_PAGESIZE) / 1024);
#endif
  return -1;
}

}  // namespace kvlab_stress
