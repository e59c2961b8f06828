// Fuzz target: the GGUF reader and what reads a model from it. An input is a GGUF file: it is
// opened (`GgufFile`: header, every metadata value, tensor infos, alignment, offsets); a file
// it accepts has each of its tensors read (`read_matrix`: every type, every row), then the Llama
// config, the weights, the byte-level tokenizer and the chat template are read from it, and the
// tokenizer encodes and decodes a fixed prompt. Anything else than the library's typed errors is
// a finding: a crash, a sanitizer report, an allocation over the limit, an uncaught exception.
//
//   build-fuzz/tests/fuzz/fuzz_gguf build-fuzz/tests/fuzz/corpus/gguf -runs=1000000
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_support.hpp"
#include "kvlab/model/bpe_tokenizer.hpp"
#include "kvlab/model/chat.hpp"
#include "kvlab/model/gguf.hpp"
#include "kvlab/model/gguf_model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = kvlab_fuzz::scratch_path("gguf");
  kvlab_fuzz::write_input(path, data, size);
  kvlab_fuzz::expect_typed_errors_only([&] {
    const kvlab::GgufFile file(path);
    for (const kvlab::GgufTensorInfo& t : file.tensors()) {
      kvlab_fuzz::expect_typed_errors_only([&] { (void)file.read_matrix(t.name); });
    }
    kvlab_fuzz::expect_typed_errors_only([&] { (void)kvlab::load_gguf_weights(file); });
    kvlab_fuzz::expect_typed_errors_only([&] { (void)kvlab::ChatTemplate::from_gguf(file); });
    const kvlab::BpeTokenizer tok = kvlab::BpeTokenizer::from_gguf(file);
    const std::string text = "<|im_start|>user\nHello, 12 w\xC3\xB6rlds!<|im_end|>";
    const std::vector<int> ids = tok.encode_text(text, true);
    if (tok.decode(ids) != text) __builtin_trap();  // a vocabulary that encodes must round-trip
  });
  return 0;
}
