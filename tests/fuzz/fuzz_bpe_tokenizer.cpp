// Fuzz target: the byte-level BPE tokenizer (encode and decode) on a fixed vocabulary of the 256
// byte characters, a few merges and three special tokens. The first byte of an input picks what
// the rest is:
//  0: text of arbitrary bytes (valid UTF-8 or not), encoded with special tokens parsed and not:
//     decoding must give the text back, pre-tokenization's words must concatenate to it, and
//     with specials not parsed no control token may appear;
//  1: token ids (two bytes each, in [-2, vocab_size + 2)), decoded: ids out of range must be
//     the typed error; the bytes of valid ids then go through a Utf8Stream in chunks, which must
//     never emit a malformed character;
//  2: two texts split at the first zero byte, encoded as parts (the first parsing specials, the
//     second not): the ids must decode to the concatenation.
// Anything else than the library's typed errors is a finding.
//
//   build-fuzz/tests/fuzz/fuzz_bpe_tokenizer build-fuzz/tests/fuzz/corpus/bpe_tokenizer
//   -runs=1000000
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_support.hpp"
#include "gguf_writer.hpp"
#include "kvlab/model/bpe_tokenizer.hpp"

namespace {

kvlab::BpeTokenizer fixed_tokenizer() {
  std::vector<std::string> tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool>"};
  std::vector<std::int64_t> types = {3, 3, 3, 4};
  for (const std::string& ch : kvlab_test::gpt2_byte_chars()) {  // GPT-2's byte alphabet
    tokens.push_back(ch);
    types.push_back(1);
  }
  const std::vector<std::string> merges = {"Ġ t", "h e", "Ġt he", "i n", "Ġ a",
                                           "e r", "Ã ©", "1 2",   "Ċ Ċ", "Ġ Ġ"};
  for (const std::string& m : merges) {
    std::string merged = m;
    merged.erase(merged.find(' '), 1);
    if (std::find(tokens.begin(), tokens.end(), merged) == tokens.end()) {
      tokens.push_back(merged);
      types.push_back(1);
    }
  }
  return kvlab::BpeTokenizer(tokens, types, merges, "smollm", 1, 2);
}

bool well_formed(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const kvlab::Utf8Char c = kvlab::decode_utf8(s, i);
    if (!c.valid) return false;
    i += static_cast<std::size_t>(c.length);
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  static const kvlab::BpeTokenizer tok = fixed_tokenizer();
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: {
      for (bool parse : {false, true}) {
        const std::vector<int> ids = tok.encode_text(rest, parse);
        if (tok.decode(ids) != rest) __builtin_trap();
        if (!parse)
          for (int id : ids)
            if (tok.is_special(id)) __builtin_trap();
      }
      std::string joined;
      for (const std::string& w : tok.pre_tokenize(rest)) {
        if (w.empty()) __builtin_trap();
        joined += w;
      }
      if (joined != rest) __builtin_trap();
      break;
    }
    case 1: {
      std::vector<int> ids;
      for (std::size_t i = 0; i + 1 < rest.size(); i += 2) {
        const int raw =
            static_cast<unsigned char>(rest[i]) | (static_cast<unsigned char>(rest[i + 1]) << 8);
        ids.push_back(raw % (tok.vocab_size() + 4) - 2);
      }
      kvlab_fuzz::expect_typed_errors_only([&] {
        kvlab::Utf8Stream stream;
        std::string out;
        for (int id : ids) out += stream.push(tok.token_bytes(id));
        out += stream.finish();
        if (!well_formed(out)) __builtin_trap();
      });
      break;
    }
    default: {
      const std::size_t cut = std::min(rest.find('\0'), rest.size());
      const std::string a = rest.substr(0, cut), b = cut < rest.size() ? rest.substr(cut + 1) : "";
      const std::vector<int> ids = tok.encode_parts({{a, true}, {b, false}});
      if (tok.decode(ids) != a + b) __builtin_trap();
      break;
    }
  }
  return 0;
}
