// kvlab-generate: text generation with a Llama-style model through one of kvlab's attention
// backends, as llama2.c's `run` does it: prefill the prompt, then decode one token a step.
//
// It reads a llama2.c checkpoint (legacy version-0 .bin: stories260K.bin, stories15M.bin, ...)
// and optionally its tokenizer.bin; without --model it runs a built-in model with random
// weights from a fixed seed, so it works with no file at all. It prints the text as it is
// generated (token ids when no tokenizer is given) on standard output, then on standard error
// the timing of each phase (prefill, decode), tokens per second and the work counted by the
// backend (K/V projections: Θ(n²) naive, Θ(n) cached and paged).
//
// Build and run (Release, from the repository root):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build --target kvlab-generate
//   build/apps/kvlab-generate                       # built-in model, token ids
//   build/apps/kvlab-generate --model stories15M.bin --tokenizer tokenizer.bin --prompt "Hello"
//   build/apps/kvlab-generate --model stories260K.bin --backend naive --temperature 0
// --help lists the options.
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#define KVLAB_HAS_ISATTY 1
#endif

#include <kvlab/kvlab.hpp>
#include <kvlab/model/bpe_tokenizer.hpp>

#include "support/builtin_model.hpp"
#include "support/cli.hpp"
#include "support/policy_option.hpp"

namespace {

using kvlab_support::UsageError;

struct Options {
  std::string model;  // empty: the built-in model
  std::string builtin = "tiny";
  std::string tokenizer;  // empty: print token ids
  kvlab::LlamaBackend backend = kvlab::LlamaBackend::Cached;
  int steps = 256;
  bool steps_given = false;
  std::string prompt;
  bool prompt_given = false;
  double temperature = 1.0;
  double top_p = 0.9;
  std::uint64_t seed = 42;
  int block_size = 16;
  kvlab::KVDtype kv_dtype = kvlab::KVDtype::fp32;
  int window = 0;      // 0: every query sees every past token
  std::string policy;  // a cache policy instead of --backend, --kv-dtype, --window, --block-size
  int threads = 1;
  bool quiet = false;
  bool phases = false;  // time each step's phases and print where the time went
};

// Returns false when --help was given (and printed).
bool parse_options(int argc, char** argv, Options& o) {
  using namespace kvlab_support;
  CLI::App app{
      "kvlab-generate: text generation from a llama2.c checkpoint, a GGUF file or a built-in "
      "model through the naive, cached or paged backend, as llama2.c's run does it."};
  app.footer("Generation stops early when the model draws BOS (id 1), as llama2.c's run does.");
  std::string backend = "cached", kv_dtype = "fp32";
  add_file(app, "--model", o.model,
           "llama2.c checkpoint, legacy version-0 .bin (stories15M.bin, stories260K.bin), or a "
           "GGUF file (.gguf: SmolLM2-135M-Instruct, with its own tokenizer); without it: a "
           "built-in model with random weights (see --builtin)");
  add_file(app, "--tokenizer", o.tokenizer,
           "llama2.c tokenizer.bin with the model's vocabulary; without it, token ids are printed "
           "and --prompt is a list of ids");
  CLI::Option* backend_option =
      add_choice(app, "--backend", backend,
                 "naive (recompute the prefix every step), cached (contiguous KV cache) or paged "
                 "(KV cache in blocks)",
                 {"naive", "cached", "paged"});
  CLI::Option* steps =
      add_integer(app, "--steps", o.steps,
                  "tokens to generate (at most what the model's seq_len leaves)", 1, 1 << 30);
  CLI::Option* prompt =
      app.add_option("--prompt", o.prompt,
                     "the prompt: text with --tokenizer (BOS is put first), else token ids "
                     "separated by spaces or commas (default: BOS alone, id 1)")
          ->type_name("TEXT");
  add_number(app, "--temperature", o.temperature, "0 is greedy", 0.0, 1e6);
  add_number(app, "--top-p", o.top_p, "nucleus sampling threshold, 1 = off", 1e-9, 1.0);
  add_integer(app, "--seed", o.seed, "seed of the sampler (runs are reproducible)", 0, 2147483647L);
  CLI::Option* block = add_integer(app, "--block-size", o.block_size,
                                   "tokens per block of the paged backend", 1, 1 << 20);
  CLI::Option* dtype =
      add_choice(app, "--kv-dtype", kv_dtype,
                 "how the cached and paged backends store K and V: fp32, fp16, bf16, int8 (q8_0: "
                 "8.5 bits per value) or int4 (q4_0: 4.5 bits per value)",
                 {"fp32", "fp16", "bf16", "int8", "int4"});
  CLI::Option* window = add_integer(
      app, "--window", o.window,
      "sliding window: each token attends to its last W tokens, itself included "
      "(cached keeps a ring of 2W - 1 positions, paged gives blocks back); 0: no window",
      0, 1 << 30);
  add_policy(app, "--policy", o.policy,
             std::string("what the cache keeps, instead of --backend, --kv-dtype, --window and "
                         "--block-size: ") +
                 policy_syntax())
      ->excludes(backend_option)
      ->excludes(dtype)
      ->excludes(window)
      ->excludes(block);
  add_integer(app, "--threads", o.threads, "OpenMP threads", 1, 256);
  add_choice(app, "--builtin", o.builtin,
             "the model used without --model: tiny (dim 48, 3 layers, vocab 256) or stories15M "
             "(the stories15M shape: dim 288, 6 layers, vocab 32000, but a separate classifier), "
             "random weights",
             {"tiny", "stories15M"});
  app.add_flag("--phases", o.phases,
               "also print where the time went: the layers' products, the classifier, attention, "
               "RoPE, the norms, sampling, the rest (a clock read ~20 times a layer)");
  app.add_flag("--quiet", o.quiet, "no progress lines on standard error");
  if (!kvlab_support::parse(app, argc, argv)) return false;
  o.backend = kvlab::parse_llama_backend(backend);
  o.kv_dtype = kvlab::parse_kv_dtype(kv_dtype);
  if (!o.policy.empty()) {  // the policy's store, types and window
    const kvlab::CachePolicy policy = kvlab::parse_cache_policy(o.policy);
    o.backend = policy.backend;
    o.kv_dtype = policy.key_dtype;
    o.window = policy.window;
    o.block_size = policy.block_size;
  }
  o.steps_given = steps->count() > 0;
  o.prompt_given = prompt->count() > 0;
  return true;
}

// Token ids of a prompt written as numbers separated by spaces or commas.
std::vector<int> parse_ids(const std::string& text, int vocab_size) {
  std::string spaced = text;
  for (char& c : spaced) {
    if (c == ',') c = ' ';
  }
  std::istringstream in(spaced);
  std::vector<int> ids;
  std::string word;
  while (in >> word) {
    const int id =
        static_cast<int>(kvlab_support::parse_integer("--prompt", word, 0, vocab_size - 1));
    ids.push_back(id);
  }
  if (ids.empty())
    throw UsageError("--prompt: expected token ids (no --tokenizer was given), got '" + text + "'");
  return ids;
}

// Prints a piece as llama2.c's safe_printf: a lone byte that is neither printable nor space
// (a control code from a byte token) is skipped.
void print_piece(const std::string& piece) {
  if (piece.size() == 1) {
    const unsigned char byte = static_cast<unsigned char>(piece[0]);
    if (!(std::isprint(byte) || std::isspace(byte))) return;
  }
  std::fputs(piece.c_str(), stdout);
}

bool stdout_is_terminal() {
#if defined(KVLAB_HAS_ISATTY)
  return isatty(fileno(stdout)) != 0;
#else
  return false;
#endif
}

int run(const Options& o) {
  kvlab_support::set_threads(kvlab_support::usable_threads("kvlab-generate", {o.threads}).front());

  // The model.
  const bool gguf = kvlab_support::is_gguf(o.model);
  if (gguf && !o.tokenizer.empty()) {
    throw UsageError(
        "--tokenizer: expected none with a GGUF model (the file holds its own), got '" +
        o.tokenizer + "'");
  }
  const kvlab_support::ChosenModel chosen = kvlab_support::choose_model(o.model, o.builtin);
  const std::shared_ptr<const kvlab::LlamaWeights>& weights = chosen.weights;
  const std::string& description = chosen.description;
  const kvlab::LlamaConfig& config = weights->config;

  // The tokenizer: it must have the model's vocabulary. A GGUF file holds its own.
  std::unique_ptr<kvlab::TextTokenizer> tokenizer;
  if (gguf) {
    tokenizer = std::make_unique<kvlab::BpeTokenizer>(
        kvlab::BpeTokenizer::from_gguf(kvlab::GgufFile(o.model)));
    if (o.prompt.empty()) throw UsageError("--prompt: expected text for a GGUF model, got none");
  } else if (!o.tokenizer.empty()) {
    tokenizer = std::make_unique<kvlab::Tokenizer>(kvlab::Tokenizer::load(o.tokenizer));
    if (tokenizer->vocab_size() != config.vocab_size) {
      throw std::runtime_error(
          "--tokenizer: expected a tokenizer of " + std::to_string(config.vocab_size) +
          " pieces (the model's vocab_size), got " + std::to_string(tokenizer->vocab_size()) +
          " in '" + o.tokenizer + "' (this model was trained with another tokenizer)");
    }
  }
  // llama2.c's tokenizer puts BOS first; a GGUF file's (SmolLM2's) text goes in as it is.
  const auto* llama2c = dynamic_cast<const kvlab::Tokenizer*>(tokenizer.get());
  const std::vector<int> prompt =
      llama2c != nullptr ? llama2c->encode(o.prompt, /*bos=*/true, /*eos=*/false)
      : tokenizer        ? tokenizer->encode_text(o.prompt, /*parse_special=*/false)
                         : (o.prompt_given ? parse_ids(o.prompt, config.vocab_size)
                                           : std::vector<int>{kvlab::Tokenizer::kBos});
  // What ends a generation: BOS for llama2.c's stories, the file's EOS for a GGUF model.
  const int stop_token = gguf ? tokenizer->eos_id() : kvlab::Tokenizer::kBos;
  kvlab::Utf8Stream text_stream;  // a GGUF token may end inside a character

  if (o.backend == kvlab::LlamaBackend::Naive && o.kv_dtype != kvlab::KVDtype::fp32) {
    throw UsageError(std::string("--kv-dtype: expected fp32 with --backend naive (it keeps no K/V "
                                 "to store), got ") +
                     kvlab::dtype_name(o.kv_dtype));
  }
  const std::unique_ptr<kvlab::LlamaModel> own =
      o.policy.empty()
          ? std::make_unique<kvlab::LlamaModel>(weights, o.backend, o.block_size, 0, o.kv_dtype,
                                                o.window)
          : std::make_unique<kvlab::LlamaModel>(weights, kvlab::parse_cache_policy(o.policy), 0);
  kvlab::LlamaModel& model = *own;
  // tokens generate() can make
  const int room = model.max_tokens() - static_cast<int>(prompt.size()) + 1;
  if (room < 1) {
    throw std::runtime_error("--prompt: expected at most " + std::to_string(model.max_tokens()) +
                             " tokens (seq_len), got " + std::to_string(prompt.size()));
  }
  int steps = o.steps;
  if (steps > room) {
    if (o.steps_given) {
      std::fprintf(
          stderr,
          "kvlab-generate: --steps %d is more than seq_len %d leaves after a prompt of %zu tokens; "
          "generating %d\n",
          steps, config.seq_len, prompt.size(), room);
    }
    steps = room;
  }
  kvlab::Sampler sampler(config.vocab_size, static_cast<float>(o.temperature),
                         static_cast<float>(o.top_p), o.seed);

  std::fprintf(stderr,
               "kvlab-generate: %s\n  %s\n  backend %s%s, %s, %zu prompt tokens, up to %d new, "
               "temperature %g, top-p %g, seed %llu, %d thread%s\n",
               description.c_str(), kvlab::to_string(config).c_str(), kvlab::to_string(o.backend),
               o.backend == kvlab::LlamaBackend::Paged
                   ? (" (block size " + std::to_string(o.block_size) + ")").c_str()
                   : "",
               o.backend == kvlab::LlamaBackend::Naive
                   ? (o.window > 0 ? "no K/V kept, window " + std::to_string(o.window)
                                   : std::string("no K/V kept"))
                         .c_str()
                   : (std::string("K/V stored as ") + model.store().storage_name() + ", " +
                      std::to_string(model.store().bytes_per_token()) + " bytes per token")
                         .c_str(),
               prompt.size(), steps, o.temperature, o.top_p,
               static_cast<unsigned long long>(o.seed), o.threads, o.threads == 1 ? "" : "s");

  // The prompt as it goes in, then each token as it comes out.
  if (gguf) {
    std::fputs(text_stream.push(tokenizer->decode(prompt)).c_str(), stdout);
  } else if (tokenizer) {
    for (std::size_t i = 1; i < prompt.size(); ++i)
      print_piece(tokenizer->token_bytes(prompt[i], prompt[i - 1]));
  } else {
    for (int id : prompt) std::printf("%d ", id);
    std::printf("| ");
  }
  std::fflush(stdout);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto last_note = start;
  // on a terminal the text itself shows progress
  const bool progress = !o.quiet && !stdout_is_terminal();
  int previous = prompt.back();
  int generated = 0;
  const auto on_token = [&](int token) {
    if (gguf) {
      if (token != stop_token)
        std::fputs(text_stream.push(tokenizer->token_bytes(token)).c_str(), stdout);
    } else if (tokenizer) {
      print_piece(tokenizer->token_bytes(token, previous));
    } else {
      std::printf("%d ", token);
    }
    std::fflush(stdout);
    previous = token;
    ++generated;
    const auto now = Clock::now();
    if (progress && std::chrono::duration<double>(now - last_note).count() >= 2.0) {
      const double seconds = std::chrono::duration<double>(now - start).count();
      std::fprintf(stderr, "kvlab-generate: %d/%d tokens, %.1f tok/s so far\n", generated, steps,
                   generated / seconds);
      last_note = now;
    }
  };
  model.time_phases(o.phases);
  const kvlab::Generation g = kvlab::generate(model, sampler, prompt, steps, on_token, stop_token);
  std::printf("%s\n", text_stream.finish().c_str());
  std::fflush(stdout);

  // The summary.
  const kvlab::LlamaCounters& work = model.total();
  std::fprintf(stderr, "\nkvlab-generate: %zu tokens generated%s\n", g.tokens.size(),
               g.stopped ? (gguf ? " (stopped: the model drew its end-of-text token)"
                                 : " (stopped: the model drew BOS, the end of a story)")
                         : "");
  std::fprintf(stderr, "  prefill: %4d token%s in %9.3f ms  %10.1f tok/s\n", g.prompt_tokens,
               g.prompt_tokens == 1 ? " " : "s", g.prefill_seconds * 1e3,
               g.prefill_tokens_per_second());
  std::fprintf(stderr, "  decode:  %4d step%s  in %9.3f ms  %10.1f tok/s\n", g.decode_steps,
               g.decode_steps == 1 ? " " : "s", g.decode_seconds * 1e3,
               g.decode_tokens_per_second());
  const double total_seconds = g.prefill_seconds + g.decode_seconds;
  std::fprintf(stderr,
               "  total:   %4zu token%s in %9.3f ms  %10.1f tok/s (generated tokens / prefill + "
               "decode time)\n",
               g.tokens.size(), g.tokens.size() == 1 ? " " : "s", total_seconds * 1e3,
               total_seconds > 0 ? static_cast<double>(g.tokens.size()) / total_seconds : 0.0);
  std::fprintf(stderr,
               "  work (%s): %llu K/V projections, %llu q.k dot products, %.4g multiply-adds "
               "(attention %.3g, MLP %.3g, classifier %.3g)\n",
               kvlab::to_string(o.backend),
               static_cast<unsigned long long>(work.attention.kv_projections),
               static_cast<unsigned long long>(work.attention.qk_dots),
               static_cast<double>(work.macs()), static_cast<double>(work.attention.macs),
               static_cast<double>(work.mlp_macs), static_cast<double>(work.classifier_macs));
  if (o.phases) {
    // The model's steps, phase by phase, and the samples: their sum is the prefill and decode
    // time above, less the clock reads between them.
    const kvlab::PhaseTimes& p = model.phase_times();
    const double all = p.total + g.sampling_seconds;
    std::fprintf(stderr, "  phases (ms, share):");
    const std::pair<const char*, double> parts[] = {{"layers' products", p.matmuls},
                                                    {"classifier", p.classifier},
                                                    {"attention", p.attention},
                                                    {"RoPE", p.rope},
                                                    {"norms", p.norms},
                                                    {"sampling", g.sampling_seconds},
                                                    {"other", p.other()}};
    const std::size_t count = sizeof parts / sizeof parts[0];
    for (std::size_t i = 0; i < count; ++i)
      std::fprintf(stderr, " %s %.3f (%.1f%%)%s", parts[i].first, parts[i].second * 1e3,
                   all > 0 ? 100 * parts[i].second / all : 0.0, i + 1 < count ? "," : "\n");
  }
  const kvlab::KVStore<float>& store = model.store();
  if (const auto* selective = dynamic_cast<const kvlab::SelectiveStore<float>*>(&store)) {
    std::fprintf(stderr,
                 "  KV cache: a policy per head (%s), %s, %d positions, %.1f KiB held (%zu bytes "
                 "per token where every head keeps it)\n",
                 o.policy.c_str(), selective->storage_name(), model.position(),
                 static_cast<double>(store.bytes_reserved()) / 1024, store.bytes_per_token());
  } else if (o.backend == kvlab::LlamaBackend::Cached) {
    std::fprintf(
        stderr,
        "  KV cache: contiguous, %s, %d positions%s, %zu bytes per token, %.1f KiB "
        "reserved\n",
        store.storage_name(), model.position(),
        store.window() > 0
            ? (" in a ring of " + std::to_string(store.max_step_tokens() + store.window() - 1) +
               " (window " + std::to_string(store.window()) + ")")
                  .c_str()
            : (" of " + std::to_string(model.max_tokens())).c_str(),
        store.bytes_per_token(), static_cast<double>(store.bytes_reserved()) / 1024);
  } else if (const kvlab::PagedKVCacheBase* pool = model.paged_cache()) {
    std::fprintf(stderr,
                 "  KV cache: paged, %s, %d positions in %d blocks of %d held%s (%d blocks in the "
                 "pool), %zu bytes per token\n",
                 store.storage_name(), pool->length(model.sequence()),
                 pool->held_blocks(model.sequence()), pool->block_size(),
                 pool->window() > 0 ? (" (window " + std::to_string(pool->window()) +
                                       ": the blocks before it "
                                       "are back in the pool)")
                                          .c_str()
                                    : "",
                 pool->allocator().num_blocks(), store.bytes_per_token());
  } else {
    std::fprintf(stderr,
                 "  KV cache: none (naive: every step re-projects K and V of all %d positions)\n",
                 model.position());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (const auto stop =
          kvlab_support::read_command_line("kvlab-generate", argc, argv, options, parse_options))
    return *stop;
  try {
    return run(options);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kvlab-generate: %s\n", e.what());
    return 1;
  }
}
