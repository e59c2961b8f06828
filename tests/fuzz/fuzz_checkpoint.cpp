// Fuzz target: the llama2.c checkpoint loader on arbitrary bytes (`read_llama_config`, then
// `load_llama_checkpoint` of the same file). A file it accepts must make a whole model: weights
// of the header's shapes that `LlamaWeights::check` passes. Anything else must be the library's
// typed error: never a crash, a hang, an out-of-bounds read or a huge allocation (CI runs it
// with -malloc_limit_mb=256: a 2 GB allocation for a small file is a bug).
//
//   build-fuzz/tests/fuzz/fuzz_checkpoint build-fuzz/tests/fuzz/corpus/checkpoint
//       -malloc_limit_mb=256 -runs=1000000
#include <cstddef>
#include <cstdint>

#include "fuzz_support.hpp"
#include "kvlab/model/llama_checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = kvlab_fuzz::scratch_path("checkpoint");
  kvlab_fuzz::write_input(path, data, size);
  kvlab_fuzz::expect_typed_errors_only([&] {
    const kvlab::LlamaConfig config = kvlab::read_llama_config(path);
    const kvlab::LlamaWeights weights = kvlab::load_llama_checkpoint(path);
    if (!(weights.config == config)) __builtin_trap();  // the header read twice alike
    try {
      weights.check("fuzz_checkpoint");  // an accepted file that is not a whole model: a bug
    } catch (...) {
      __builtin_trap();
    }
  });
  return 0;
}
