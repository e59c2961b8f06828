// Writes the seed corpora of the fuzz targets, made here rather than downloaded:
//   <dir>/checkpoint: two whole small checkpoints (shared and separate classifier) and a
//                     header alone;
//   <dir>/tokenizer:  inputs of each of fuzz_tokenizer's three kinds (a small tokenizer.bin,
//                     prompts in ASCII, UTF-8 and invalid UTF-8, a run of token ids);
//   <dir>/block_tables: two batches whose tables are accepted (NHD and HND), one with a
//                     released block;
//   <dir>/workload:   kvlab-serve workload files of every key;
//   <dir>/cli:        command lines (arguments separated by zero bytes) of the programs.
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
  for (const std::string& sub : {dir, dir + "/checkpoint", dir + "/tokenizer",
                                 dir + "/block_tables", dir + "/workload", dir + "/cli"})
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
  // Block tables (fuzz_block_tables' byte order): block_size 4 (byte 5), 6 blocks (byte 7), the
  // layout, 3 indptr values and 3 indices, then indptr (0 1 3: byte = value + 2), indices (5 0
  // 2 or a released block, -1), last_page_len (4 1: byte = value + 1).
  const auto tables = [](char layout, char second_index) {
    return std::string{5, 7, layout, 3, 3, 2, 3, 5, 7, 2, second_index, 5, 2};
  };
  kvlab_test::write_bytes(dir + "/block_tables/nhd.bin", tables(0, 4));
  kvlab_test::write_bytes(dir + "/block_tables/hnd.bin", tables(1, 4));
  kvlab_test::write_bytes(dir + "/block_tables/released.bin", tables(0, 1));

  // Workloads.
  kvlab_test::write_bytes(
      dir + "/workload/every_key.jsonl",
      "{\"id\": \"a\", \"prompt\": [1, 403, 9], \"max_new_tokens\": 32, \"arrival\": 0.5}\n"
      "\n"
      "{\"prompt\": [1, 22], \"max_new_tokens\": 8, \"stop_ids\": [2], \"temperature\": 0.8, "
      "\"top_p\": 0.9, \"seed\": 7, \"id\": 3}\n");
  kvlab_test::write_bytes(dir + "/workload/one.jsonl", "{\"prompt\": [1]}");
  // Command lines: options of the programs with good and bad values, arguments separated by
  // zero bytes.
  const std::vector<std::vector<std::string>> command_lines = {
      {"--steps", "64", "--threads", "2", "--quiet"},
      {"--temperature", "0.8", "--top-p", "0.9", "--seed", "7"},
      {"--kv-dtype", "int8", "--backend", "paged", "--block-size", "16"},
      {"--max-n", "4096", "--reps", "3", "--json", "out.json"},
      {"--threads", "1,2", "--window", "-5", "--help"},
  };
  const auto joined = [](const std::vector<std::string>& args) {
    std::string out;
    for (std::size_t i = 0; i < args.size(); ++i)
      out += (i == 0 ? "" : std::string(1, '\0')) + args[i];
    return out;
  };
  for (std::size_t i = 0; i < command_lines.size(); ++i)
    kvlab_test::write_bytes(dir + "/cli/line" + std::to_string(i) + ".bin",
                            joined(command_lines[i]));
  std::printf("seed corpora written to %s/{checkpoint,tokenizer,block_tables,workload,cli}\n",
              dir.c_str());
  return 0;
}
