// Writes the seed corpora of the fuzz targets, made here rather than downloaded:
//   <dir>/checkpoint: two whole small checkpoints (shared and separate classifier) and a
//                     header alone;
//   <dir>/tokenizer:  inputs of each of fuzz_tokenizer's three kinds (a small tokenizer.bin,
//                     prompts in ASCII, UTF-8 and invalid UTF-8, a run of token ids);
//   <dir>/block_tables: two batches whose tables are accepted (NHD and HND), one with a
//                     released block;
//   <dir>/workload:   kvlab-serve workload files of every key, text requests with every escape;
//   <dir>/cli:        command lines (arguments separated by zero bytes) of the programs;
//   <dir>/gguf:       small GGUF files: a Llama model of every tensor type the reader decodes,
//                     with a byte-level tokenizer and a ChatML template, and a file of every
//                     metadata value type;
//   <dir>/bpe_tokenizer: inputs of each of fuzz_bpe_tokenizer's three kinds.
//
//   make_seeds <dir>
#include <sys/stat.h>
#include <cstdio>
#include <string>
#include <vector>

#include "gguf_writer.hpp"
#include "kvlab/model/llama_config.hpp"
#include "kvlab/model/llama_weights.hpp"
#include "model_writers.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds <dir>\n");
    return 2;
  }
  const std::string dir = argv[1];
  for (const std::string& sub :
       {dir, dir + "/checkpoint", dir + "/tokenizer", dir + "/block_tables", dir + "/workload",
        dir + "/cli", dir + "/gguf", dir + "/bpe_tokenizer"})
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
  kvlab_test::write_bytes(  // text requests, every JSON string escape
      dir + "/workload/text.jsonl",
      "{\"id\": \"t\", \"system\": \"Be brief.\\n\", \"user\": \"caf\\u00e9 \\ud83d\\ude00 "
      "\\\"q\\\" "
      "\\\\ \\/ \\b\\f\\r\\t\", \"max_new_tokens\": 4}\n{\"user\": \"Hi\"}\n");
  // Command lines: options of the programs with good and bad values, arguments separated by
  // zero bytes.
  const std::vector<std::vector<std::string>> command_lines = {
      {"--steps", "64", "--threads", "2", "--quiet"},
      {"--temperature", "0.8", "--top-p", "0.9", "--seed", "7"},
      {"--kv-dtype", "int8", "--backend", "paged", "--block-size", "16"},
      {"--max-n", "4096", "--reps", "3", "--json", "out.json"},
      {"--threads", "1,2", "--window", "-5", "--help"},
      {"--prompt-len", "8:64", "--policy", "static", "--turn", "Hi", "--prefix-caching", "off"},
      {"--models", "tiny,none", "--policies", "static,contiguous", "--max-n=2048", "--", "x"},
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
  // GGUF: a tiny Llama (dim 32, 1 layer) with a tokenizer and a template; its q weights
  // re-stored as Q8_0, Q4_0 and Q4_1 blocks, the norms as F16 and BF16.
  {
    const kvlab::LlamaConfig c = kvlab::LlamaConfig()
                                     .with_dim(32)
                                     .with_hidden_dim(32)
                                     .with_layers(1)
                                     .with_heads(2, 1)
                                     .with_vocab_size(260)
                                     .with_seq_len(16);
    kvlab_test::GgufWriter g = kvlab_test::llama_gguf(kvlab::LlamaWeights::random(c, 1));
    std::vector<std::string> tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<x>"};
    std::vector<std::int32_t> types = {3, 3, 3, 4};
    for (const std::string& ch : kvlab_test::gpt2_byte_chars()) {
      tokens.push_back(ch);
      types.push_back(1);
    }
    g.str("tokenizer.ggml.model", "gpt2");
    g.str("tokenizer.ggml.pre", "smollm");
    g.strings("tokenizer.ggml.tokens", tokens);
    g.i32s("tokenizer.ggml.token_type", types);
    g.strings("tokenizer.ggml.merges", {});
    g.u32("tokenizer.ggml.bos_token_id", 1);
    g.u32("tokenizer.ggml.eos_token_id", 2);
    g.str("tokenizer.chat_template", "{{'<|im_start|>system\nHi<|im_end|>'}}");
    kvlab_test::write_bytes(dir + "/gguf/llama_f32.gguf", g.bytes());
    for (kvlab_test::GgufWriter::Tensor& t : g.tensors) {
      if (t.name == "blk.0.attn_q.weight") {  // [32, 32]: 32 rows of one Q8_0 block
        t.type = 8, t.data.clear();
        for (int r = 0; r < 32; ++r) {
          kvlab_test::put_le(t.data, 0x2C00, 2);  // d = 1/16
          for (int i = 0; i < 32; ++i) t.data.push_back(static_cast<char>(i - r));
        }
      } else if (t.name == "blk.0.attn_output.weight" || t.name == "blk.0.ffn_up.weight") {
        const bool q41 = t.name == "blk.0.ffn_up.weight";
        t.type = q41 ? 3 : 2, t.data.clear();
        for (int r = 0; r < 32; ++r) {
          kvlab_test::put_le(t.data, 0x2C00, 2);
          if (q41) kvlab_test::put_le(t.data, 0xAC00, 2);  // m = -1/16
          for (int i = 0; i < 16; ++i) t.data.push_back(static_cast<char>((i + r) & 0xFF));
        }
      } else if (t.name == "blk.0.attn_norm.weight" || t.name == "output_norm.weight") {
        t.type = t.name == "output_norm.weight" ? 30 : 1, t.data.clear();
        for (int i = 0; i < 32; ++i) kvlab_test::put_le(t.data, t.type == 1 ? 0x3C00 : 0x3F80, 2);
      }
    }
    kvlab_test::write_bytes(dir + "/gguf/llama_quantized.gguf", g.bytes());
    kvlab_test::GgufWriter v;
    v.u8("a", 1), v.i8("b", -1), v.u16("c", 2), v.i16("d", -2), v.u32("e", 3), v.i32("f", -3);
    v.f32("g", 0.5f), v.boolean("h", true), v.str("i", "x"), v.u64("j", 4), v.i64("k", -4);
    v.f64("l", 0.25), v.strings("m", {"p", "q"}), v.i32s("n", {1, 2}), v.set_alignment(64);
    v.tensor("t", {2}, 0, std::string(8, '\0'));
    kvlab_test::write_bytes(dir + "/gguf/every_type.gguf", v.bytes());
  }
  kvlab_test::write_bytes(
      dir + "/bpe_tokenizer/text.bin",
      std::string(1, '\0') + "Hello, it's 2024! the \xC3\xA9t\xC3\xA9  \t\n x <|im_end|>");
  kvlab_test::write_bytes(dir + "/bpe_tokenizer/invalid.bin",
                          std::string("\0\xFF\xC3(\xE2\x82 \xF0\x9F", 9));
  kvlab_test::write_bytes(dir + "/bpe_tokenizer/ids.bin",
                          std::string("\x01\x05\x00\x40\x01\xFF\xFF\x02\x00", 9));
  kvlab_test::write_bytes(
      dir + "/bpe_tokenizer/parts.bin",
      std::string("\x02<|im_start|>user\n", 18) + std::string(1, '\0') + "hi<|im_end|>");
  std::printf(
      "seed corpora written to "
      "%s/{checkpoint,tokenizer,block_tables,workload,cli,gguf,bpe_tokenizer}\n",
      dir.c_str());
  return 0;
}
