// Tutorial 10: a real model.
//
// What you will learn:
//  1. A GGUF file, the format most published models use, holds the model's shape (metadata),
//     its tensors (here in 4- and 8-bit blocks) and its tokenizer; kvlab::GgufFile reads it.
//  2. Text becomes ids through the file's own byte-level BPE: words and pieces of words, a
//     space written "Ġ", and the chat template's markers as special tokens.
//  3. A chat keeps its KV cache across turns: the second turn prefills only its new message,
//     and the cache grows by 46,080 bytes (fp32) per token. Without a cache every new token
//     would re-project K and V of the whole conversation: the counts are printed side by side.
//  4. What the cache costs at the model's full context, for each way of storing K and V.
// It needs SmolLM2-135M-Instruct (scripts/get-model.sh fetches it) and checks itself: the
// naive backend must give the same replies with more K/V projections, the cached one exactly
// one per token, layer and K/V head.
//
// Build and run (from the repository root, with `build/` configured by CMake):
//   scripts/get-model.sh && cmake --build build --target tutorial_10_real_model
//   build/tutorials/10_real_model [MODEL.gguf]
// Without an argument it reads $KVLAB_REAL_MODEL, else where scripts/get-model.sh puts it.
// Options (the exercises of its page change them): --first TEXT and --second TEXT, the two
// questions of the chat ("What is the capital of France?", "And of Italy?").
//
// Next: tutorial 11 runs the attention kernels on the GPU.

#include <kvlab/kvlab.hpp>
#include <kvlab/model/bpe_tokenizer.hpp>
#include <kvlab/model/chat.hpp>

#include "support/builtin_model.hpp"
#include "support/command_line.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>

namespace {

// One chat of two turns on `backend`; returns the replies and the model's counts.
struct Run {
  std::string replies[2];
  kvlab::LlamaCounters total;
  int tokens[2] = {0, 0};
};

Run chat(const kvlab::GgufFile& file, std::shared_ptr<const kvlab::LlamaWeights> w,
         const kvlab::BpeTokenizer& tok, kvlab::LlamaBackend backend,
         const std::string (&questions)[2], bool print) {
  const kvlab::ChatTemplate tmpl = kvlab::ChatTemplate::from_gguf(file);
  kvlab::LlamaModel model(w, backend, 16, 256);
  kvlab::ChatSession session(model, tok, tmpl, kvlab::Sampler(tok.vocab_size(), 0.f, 1.f, 1),
                             tmpl.default_system());
  Run run;
  for (int i = 0; i < 2; ++i) {
    // [chat]
    const kvlab::ChatTurn t = session.turn(questions[i], 24);
    // [chat]
    run.replies[i] = t.text;
    run.tokens[i] = session.tokens();
    if (print) {
      std::printf("you> %s\nassistant> %s\n", questions[i].c_str(), t.text.c_str());
      std::printf("  from the cache %d tokens, prefilled %d, decoded %d; the cache holds %d tokens"
                  " = %zu bytes\n",
                  t.reused, t.prefilled, t.generated + 1, session.tokens(), t.kv_bytes);
    }
  }
  run.total = model.total();
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_file;  // the GGUF file, if given
  std::string questions[2] = {"What is the capital of France?", "And of Italy?"};
  kvlab_support::CommandLine command_line{"Tutorial 10: a real model"};
  command_line.add_text("model", model_file,
                        "the GGUF file (default: $KVLAB_REAL_MODEL, see the source)");
  command_line.add_text("--first", questions[0], "the chat's first question");
  command_line.add_text("--second", questions[1], "its second question");
  if (const auto stop = command_line.parse("10_real_model", argc, argv))
    return *stop;
  const std::string path = kvlab_support::real_model_path(model_file);
  if (!std::ifstream(path)) {
    std::printf("Not run: %s is not there (scripts/get-model.sh fetches it).\n", path.c_str());
    return 77;
  }
  // [file]
  const kvlab::GgufFile file(path);
  auto weights = std::make_shared<const kvlab::LlamaWeights>(kvlab::load_gguf_weights(file));
  const kvlab::LlamaConfig& c = weights->config;
  std::map<std::string, int> types;  // tensor type -> how many tensors
  for (const kvlab::GgufTensorInfo& t : file.tensors())
    ++types[kvlab::ggml_type_name(static_cast<std::uint32_t>(t.type))];
  // [file]
  std::printf("1. The file: GGUF version %u, %zu metadata keys, %zu tensors (", file.version(),
              file.metadata().size(), file.tensors().size());
  for (const auto& [type, n] : types) std::printf("%d %s ", n, type.c_str());
  std::printf("), %llu bytes\n   %s: %s\n", static_cast<unsigned long long>(file.file_size()),
              file.get_string("general.name").c_str(), kvlab::to_string(c).c_str());
  std::printf("   in memory as float: %.1f MB of weights (the file: %.1f MB)\n\n",
              static_cast<double>(c.num_parameters()) * 4 / 1e6,
              static_cast<double>(file.file_size()) / 1e6);

  // [tokens]
  const kvlab::BpeTokenizer tok = kvlab::BpeTokenizer::from_gguf(file);
  const std::string text = "<|im_start|>user\nWhat is the capital of France?<|im_end|>";
  const std::vector<int> ids = tok.encode_text(text, /*parse_special=*/true);
  // [tokens]
  std::printf("2. Tokens of \"%s\":\n   ", "<|im_start|>user\\nWhat is the capital of France?<|im_end|>");
  for (int id : ids) std::printf("%d:%s ", id, tok.token(id).c_str());
  std::printf("\n   (Ġ is a space, Ċ a newline; %d and %d are special tokens)\n\n", tok.bos_id(),
              tok.eos_id());

  std::printf("3. Two turns, cached backend (greedy):\n");
  const Run cached = chat(file, weights, tok, kvlab::LlamaBackend::Cached, questions, true);
  const Run naive = chat(file, weights, tok, kvlab::LlamaBackend::Naive, questions, false);
  const auto kv_per_token = static_cast<std::uint64_t>(c.n_layers) * static_cast<std::uint64_t>(c.n_kv_heads);
  std::printf("\n   K/V projections (per token, layer and K/V head) over the whole chat of %d tokens:\n"
              "   cached %llu (= %d tokens x %llu), naive %llu: %.1fx as many\n",
              cached.tokens[1], static_cast<unsigned long long>(cached.total.attention.kv_projections),
              cached.tokens[1], static_cast<unsigned long long>(kv_per_token),
              static_cast<unsigned long long>(naive.total.attention.kv_projections),
              static_cast<double>(naive.total.attention.kv_projections) /
                  static_cast<double>(cached.total.attention.kv_projections));

  // [size]
  const kvlab::ModelConfig sizes = kvlab::to_model_config(c, "SmolLM2-135M-Instruct");
  std::printf("\n4. Its KV cache, from the file's shape (%d layers, %d K/V heads of %d values, K and V):\n",
              sizes.num_layers, sizes.num_kv_heads, sizes.head_dim);
  for (kvlab::KVDtype d : {kvlab::KVDtype::fp32, kvlab::KVDtype::fp16, kvlab::KVDtype::bf16,
                           kvlab::KVDtype::int8, kvlab::KVDtype::int4}) {
    const std::uint64_t per_token = kvlab::stored_bytes_per_token(sizes, d);
    std::printf("   %-4s %6llu bytes per token, %s at its context of %d tokens\n",
                kvlab::dtype_name(d).c_str(), static_cast<unsigned long long>(per_token),
                kvlab::format_bytes(per_token * static_cast<std::uint64_t>(c.seq_len)).c_str(),
                c.seq_len);
  }
  // [size]

  // Checks: the same replies; the cached backend projects each token once per layer and head.
  const bool same = cached.replies[0] == naive.replies[0] && cached.replies[1] == naive.replies[1];
  const bool exact = cached.total.attention.kv_projections ==
                     static_cast<std::uint64_t>(cached.tokens[1]) * kv_per_token;
  std::printf("   naive and cached replies %s; cached projections %s\n", same ? "equal" : "DIFFER",
              exact ? "exact" : "OFF");
  return same && exact ? 0 : 1;
}
