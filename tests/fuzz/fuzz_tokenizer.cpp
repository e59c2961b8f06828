// Fuzz target: the llama2.c tokenizer. The first byte of an input picks what the rest is:
//  0: a tokenizer.bin file, loaded (`Tokenizer::load`); a file it accepts then encodes and
//     decodes a fixed prompt (its vocabulary may lack the byte pieces: a typed error then);
//  1: a prompt of arbitrary bytes (valid UTF-8 or not), encoded and decoded with a vocabulary
//     of the 256 byte pieces and a few merges: `decode(encode(text)) == text` must hold, since
//     every byte can fall back to its own piece;
//  2: token ids (two bytes each, in [-2, vocab_size + 2)), decoded: ids out of range must be
//     the typed error.
// Anything else than the library's typed errors is a finding: a crash, a sanitizer report, an
// uncaught exception or a broken round trip.
//
//   build-fuzz/tests/fuzz/fuzz_tokenizer build-fuzz/tests/fuzz/corpus/tokenizer -runs=1000000
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "fuzz_support.hpp"
#include "kvlab/model/tokenizer.hpp"

namespace {

// <unk>, BOS, EOS, the 256 byte pieces "<0x00>".."<0xFF>", then pieces that merge.
kvlab::Tokenizer byte_fallback_tokenizer() {
  std::vector<std::string> pieces = {"<unk>", "\n<s>\n", "\n</s>\n"};
  std::vector<float> scores(3, 0.0f);
  for (int b = 0; b < 256; ++b) {
    char text[8];
    std::snprintf(text, sizeof text, "<0x%02X>", b);
    pieces.push_back(text);
    scores.push_back(0.0f);
  }
  const std::vector<std::string> merges = {" ",  "a",  "b", "ab", " a",
                                           "aa", "ba", "é", " é", "\xE2\x82\xAC"};
  for (std::size_t i = 0; i < merges.size(); ++i) {
    pieces.push_back(merges[i]);
    scores.push_back(-static_cast<float>(i));
  }
  return kvlab::Tokenizer(pieces, scores);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  static const kvlab::Tokenizer fixed = byte_fallback_tokenizer();
  switch (data[0] % 3) {
    case 0: {
      const std::string& path = kvlab_fuzz::scratch_path("tokenizer");
      kvlab_fuzz::write_input(path, data + 1, size - 1);
      kvlab_fuzz::expect_typed_errors_only([&] {
        const kvlab::Tokenizer loaded = kvlab::Tokenizer::load(path);
        const std::vector<int> ids =
            loaded.encode("Once upon a time, \xC3\xA9t\xC3\xA9", true, true);
        (void)loaded.decode(ids);
      });
      break;
    }
    case 1: {
      const std::vector<int> ids = fixed.encode(rest, true, true);
      if (fixed.decode(ids) != rest) __builtin_trap();  // the round trip broke
      break;
    }
    default: {
      std::vector<int> ids;  // [rest.size() / 2]
      for (std::size_t i = 0; i + 1 < rest.size(); i += 2) {
        const int raw =
            static_cast<unsigned char>(rest[i]) | static_cast<unsigned char>(rest[i + 1]) << 8;
        ids.push_back(raw % (fixed.vocab_size() + 4) - 2);
      }
      kvlab_fuzz::expect_typed_errors_only([&] { (void)fixed.decode(ids); });
      break;
    }
  }
  return 0;
}
