// Fuzz target: kvlab-serve's workload parser (`apps/serve_workload.hpp`: JSON lines, one request
// per line) on arbitrary bytes. A file it accepts must give at least one request; anything else
// must be its WorkloadError, whose message starts with the file's name. (The requests' values are
// the engine's to check when they are submitted: an empty prompt is refused there.)
//
//   build-fuzz/tests/fuzz/fuzz_workload build-fuzz/tests/fuzz/corpus/workload -runs=1000000
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_support.hpp"
#include "serve_workload.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = kvlab_fuzz::scratch_path("workload");
  kvlab_fuzz::write_input(path, data, size);
  try {
    const std::vector<kvlab_serve::WorkloadEntry> entries = kvlab_serve::read_workload(path);
    if (entries.empty()) __builtin_trap();
  } catch (const kvlab_serve::WorkloadError& e) {
    if (std::string(e.what()).rfind(path, 0) != 0) __builtin_trap();  // names the file first
  }
  return 0;
}
