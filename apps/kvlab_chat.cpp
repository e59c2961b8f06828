// kvlab-chat: a multi-turn chat with a real model (SmolLM2-135M-Instruct, from its GGUF file)
// through one of kvlab's attention backends. The conversation's KV cache is kept across turns,
// so each turn prefills only its new message; after each turn it says how many tokens came from
// the cache, how many were prefilled, the KV bytes held and the speed of both phases.
//
//   scripts/get-model.sh                       # once: fetches the model file (about 98 MB)
//   build/apps/kvlab-chat                      # interactive; /reset starts over, /quit leaves
//   build/apps/kvlab-chat --turn "What is the capital of France?" --turn "And of Italy?"
//   build/apps/kvlab-chat --backend naive      # no cache: every token recomputes the whole chat
//   build/apps/kvlab-chat < questions.txt      # one message per line
// --help lists the options.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#define KVLAB_HAS_ISATTY 1
#endif

#include <kvlab/kvlab.hpp>
#include <kvlab/model/bpe_tokenizer.hpp>
#include <kvlab/model/chat.hpp>

#include "support/builtin_model.hpp"
#include "support/cli.hpp"
#include "support/policy_option.hpp"

namespace {

std::string mib(std::size_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return s;
}

double per_second(int tokens, double seconds) { return seconds > 0 ? tokens / seconds : 0.0; }

struct Options {
  std::string model_path = kvlab_support::default_chat_model();
  std::string backend = "cached", kv_dtype = "fp32";
  std::string policy;  // a cache policy instead of --backend, --kv-dtype, --window, --block-size
  std::string system;
  bool system_given = false;
  std::vector<std::string> turns;
  int window = 0, threads = 1, block_size = 16, context = 2048, max_new_tokens = 256;
  float temperature = 0.0f, top_p = 0.9f;
  std::uint64_t seed = 42;
  bool quiet = false;
};

// Returns false when --help was given (and printed).
bool parse_options(int argc, char** argv, Options& o) {
  using namespace kvlab_support;
  CLI::App app{
      "kvlab-chat: chat with a GGUF model (SmolLM2-135M-Instruct by default) on kvlab's naive, "
      "cached or paged attention; the KV cache is kept across turns.\n"
      "Messages come from --turn, else from standard input, one per line (interactive on a "
      "terminal: /reset starts a new conversation, /quit leaves)."};
  add_file(app, "--model", o.model_path,
           "the GGUF file (default: where scripts/get-model.sh puts SmolLM2-135M-Instruct)")
      ->capture_default_str();
  CLI::Option* backend = add_choice(app, "--backend", o.backend,
                                    "naive (recompute the whole chat every token), cached or paged",
                                    {"naive", "cached", "paged"});
  CLI::Option* dtype = add_choice(app, "--kv-dtype", o.kv_dtype, "how K and V are stored",
                                  {"fp32", "fp16", "bf16", "int8", "int4"});
  CLI::Option* window = add_integer(app, "--window", o.window,
                                    "attend to the last W tokens only (0: all)", 0, 1 << 20);
  add_integer(app, "--threads", o.threads, "OpenMP threads", 1, 1024);
  CLI::Option* block = add_integer(app, "--block-size", o.block_size,
                                   "tokens per block of the paged cache", 1, 1 << 16);
  add_policy(app, "--policy", o.policy,
             std::string("what the cache keeps, instead of --backend, --kv-dtype, --window and "
                         "--block-size: ") +
                 policy_syntax())
      ->excludes(backend)
      ->excludes(dtype)
      ->excludes(window)
      ->excludes(block);
  add_integer(app, "--context", o.context,
              "the longest conversation, in tokens (at most the model's own)", 2, 1 << 20);
  add_integer(app, "--max-new-tokens", o.max_new_tokens, "the longest reply", 1, 1 << 20);
  add_number(app, "--temperature", o.temperature, "0: greedy; higher: more varied", 0.0, 100.0);
  add_number(app, "--top-p", o.top_p,
             "sample from the smallest set of tokens whose probability reaches P", 1e-6, 1.0);
  add_integer(app, "--seed", o.seed, "the sampler's seed", 0, 2147483647L);
  CLI::Option* system =
      app.add_option("--system", o.system, "the system prompt (default: the template's own)")
          ->type_name("TEXT");
  app.add_option("--turn", o.turns,
                 "a user message (repeat for several turns; none: read standard input)")
      ->type_name("TEXT");
  app.add_flag("--quiet", o.quiet, "no statistics after each turn");
  if (!kvlab_support::parse(app, argc, argv)) return false;
  o.system_given = system->count() > 0;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const auto stop =
          kvlab_support::read_command_line("kvlab-chat", argc, argv, o, parse_options))
    return *stop;
  const std::string& model_path = o.model_path;
  const std::string &backend_name = o.backend, &dtype_name = o.kv_dtype;
  const std::vector<std::string>& turns = o.turns;
  const int context = o.context, block_size = o.block_size, window = o.window,
            max_new_tokens = o.max_new_tokens;
  const bool quiet = o.quiet;
  try {
    kvlab_support::set_threads(o.threads);
    const kvlab::GgufFile file(model_path);
    auto weights = std::make_shared<const kvlab::LlamaWeights>(kvlab::load_gguf_weights(file));
    const kvlab::BpeTokenizer tokenizer = kvlab::BpeTokenizer::from_gguf(file);
    const kvlab::ChatTemplate chat_template = kvlab::ChatTemplate::from_gguf(file);
    if (context > weights->config.seq_len) {
      std::fprintf(stderr,
                   "kvlab-chat: --context: expected at most the model's %d tokens, got %d\n",
                   weights->config.seq_len, context);
      return 2;
    }
    const kvlab::CachePolicy policy =
        o.policy.empty() ? kvlab::CachePolicy{} : kvlab::parse_cache_policy(o.policy);
    const kvlab::LlamaBackend backend =
        o.policy.empty() ? kvlab::parse_llama_backend(backend_name) : policy.backend;
    std::unique_ptr<kvlab::LlamaModel> own =
        o.policy.empty()
            ? std::make_unique<kvlab::LlamaModel>(weights, backend, block_size, context,
                                                  kvlab::parse_kv_dtype(dtype_name), window)
            : std::make_unique<kvlab::LlamaModel>(weights, policy, context);
    kvlab::LlamaModel& model = *own;
    kvlab::ChatSession chat(model, tokenizer, chat_template,
                            kvlab::Sampler(tokenizer.vocab_size(), o.temperature, o.top_p, o.seed),
                            o.system_given ? o.system : chat_template.default_system());
    if (!quiet) {
      const std::string how =
          o.policy.empty() ? backend_name + " backend, K/V as " + dtype_name
                           : "policy " + policy.name() + " (" + model.store().name() + " store)";
      std::fprintf(stderr, "kvlab-chat: %s (%s)\n  %s: %zu bytes per token; context %d tokens\n",
                   file.path().c_str(), kvlab::to_string(weights->config).c_str(), how.c_str(),
                   model.store().bytes_per_token(), context);
    }
#if defined(KVLAB_HAS_ISATTY)
    const bool interactive = turns.empty() && isatty(0) != 0;
#else
    const bool interactive = false;
#endif
    std::size_t next_turn = 0;
    const auto next_message = [&](std::string& message) -> bool {
      if (!turns.empty()) {
        if (next_turn == turns.size()) return false;
        message = turns[next_turn++];
        return true;
      }
      if (interactive) {
        std::printf("\nyou> ");
        std::fflush(stdout);
      }
      return static_cast<bool>(std::getline(std::cin, message));
    };
    std::string message;
    int turn_number = 0;
    bool refused = false;
    while (next_message(message)) {
      if (message == "/quit") break;
      if (message == "/reset") {
        chat.reset();
        turn_number = 0;
        std::fprintf(stderr, "[a new conversation: the cache is empty]\n");
        continue;
      }
      if (message.empty()) continue;
      if (!interactive) std::printf("you> %s\n", message.c_str());
      std::printf("assistant> ");
      std::fflush(stdout);
      kvlab::ChatTurn t;
      try {
        t = chat.turn(message, max_new_tokens, [](const std::string& text) {
          std::fwrite(text.data(), 1, text.size(), stdout);
          std::fflush(stdout);
        });
      } catch (const kvlab::CapacityError& e) {
        std::printf("\n");
        std::fprintf(stderr,
                     "[not sent: %s; /reset starts a new conversation, --context %d allows more]\n",
                     e.what(), weights->config.seq_len);
        refused = true;
        if (!interactive) break;
        continue;
      }
      ++turn_number;
      std::printf("%s\n", t.context_full ? " [the context is full]"
                          : t.ended      ? ""
                                         : " [--max-new-tokens reached]");
      std::fflush(stdout);
      if (!quiet) {
        std::fprintf(
            stderr,
            "[turn %d: %d tokens from the cache%s, %d prefilled (%.0f tokens/s), %d decoded "
            "(%.1f tokens/s); the conversation holds %d tokens, K/V %s]\n",
            turn_number, t.reused,
            backend == kvlab::LlamaBackend::Naive ? " (naive: recomputed at every step)" : "",
            t.prefilled, per_second(t.prefilled, t.prefill_seconds), t.generated,
            per_second(t.generated + 1, t.decode_seconds), chat.tokens(), mib(t.kv_bytes).c_str());
      }
    }
    return refused ? 1 : 0;
  } catch (const kvlab::InvalidArgument& e) {
    std::fprintf(stderr, "kvlab-chat: %s\n", e.what());
    return 1;
  }
}
