// Writes the seed corpora of the fuzz targets, made here rather than downloaded:
//   <dir>/checkpoint: two whole small checkpoints (shared and separate classifier) and a
//                     header alone;
//   <dir>/tokenizer:  inputs of each of fuzz_tokenizer's three kinds (a small tokenizer.bin,
//                     prompts in ASCII, UTF-8 and invalid UTF-8, a run of token ids).
//
//   make_seeds <dir>
#include <sys/stat.h>
#include <cstdio>
#include <string>
#include <vector>

#include "kvlab/model/llama_config.hpp"
#include "kvlab/model/llama_weights.hpp"
#include "model_writers.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds <dir>\n");
    return 2;
  }
  const std::string dir = argv[1];
  for (const std::string& sub : {dir, dir + "/checkpoint", dir + "/tokenizer"})
    mkdir(sub.c_str(), 0755);  // an existing folder is fine

  // Checkpoints: 2 query heads over 1 K/V head of 4 values, 1 layer, 8 tokens.
  const kvlab::LlamaConfig shared = kvlab::LlamaConfig()
                                        .with_dim(8)
                                        .with_hidden_dim(16)
                                        .with_layers(1)
                                        .with_heads(2, 1)
                                        .with_vocab_size(8)
                                        .with_seq_len(4)
                                        .with_shared_classifier(true);
  const kvlab::LlamaConfig separate = kvlab::LlamaConfig(shared).with_shared_classifier(false);
  const std::string whole = kvlab_test::checkpoint_bytes(kvlab::LlamaWeights::random(shared, 1));
  kvlab_test::write_bytes(dir + "/checkpoint/shared.bin", whole);
  kvlab_test::write_bytes(dir + "/checkpoint/separate.bin",
                          kvlab_test::checkpoint_bytes(kvlab::LlamaWeights::random(separate, 2)));
  kvlab_test::write_bytes(dir + "/checkpoint/header_only.bin", whole.substr(0, 28));

  // Tokenizer inputs: the first byte is the kind (0 file, 1 prompt, 2 ids).
  std::vector<std::string> pieces = {"<unk>", "\n<s>\n", "\n</s>\n"};
  std::vector<float> scores = {0.0f, 0.0f, 0.0f};
  for (const char* piece : {" ", "a", "b", " a", "ab", "<0x41>"}) {
    pieces.push_back(piece);
    scores.push_back(-1.0f);
  }
  kvlab_test::write_bytes(dir + "/tokenizer/file.bin",
                          std::string(1, '\0') + kvlab_test::tokenizer_bytes(6, pieces, scores));
  kvlab_test::write_bytes(dir + "/tokenizer/prompt_ascii.bin",
                          "\x01"
                          "a bab aab");
  kvlab_test::write_bytes(dir + "/tokenizer/prompt_utf8.bin",
                          "\x01"
                          "\xC3\xA9t\xC3\xA9 \xE2\x82\xAC");
  kvlab_test::write_bytes(dir + "/tokenizer/prompt_invalid.bin",
                          "\x01"
                          "\xFF\xC3 \x80\x80");
  kvlab_test::write_bytes(dir + "/tokenizer/ids.bin",
                          std::string("\x02\x01\x00\x05\x01\x10\x01\x02\x00", 9));
  std::printf("seed corpora written to %s/checkpoint and %s/tokenizer\n", dir.c_str(), dir.c_str());
  return 0;
}
