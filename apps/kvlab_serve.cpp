// kvlab-serve: serves a workload of requests with a Llama-style model under one batching
// policy — continuous batching (vLLM's scheduler: a token budget per step, chunked prefill,
// preemption by recompute, prefix caching), static batching, or continuous scheduling with
// contiguous preallocation — and reports what a serving system is judged by: throughput, time to
// first token and per output token (p50, p99), concurrency, KV-memory use, preemptions and
// prefix-cache hits.
//
// The workload comes from a JSON-lines file (--workload; format in apps/serve_workload.hpp) or
// is generated (--requests, --seed, --prompt-len, --output-len, --rate, --shared-prefix). With a
// GGUF model (SmolLM2-135M-Instruct) a request can be text: a user's message, put in the file's
// chat template with its default system prompt and tokenized by the file's tokenizer; it stops
// at the model's end-of-turn token, and its reply is printed after the summary. Requests with
// the same system prompt share its blocks through the prefix cache. It
// shows progress on standard error while it runs, then the summary on standard output;
// --json and --step-log write the run and its step log for scripts; --dot draws one step and
// the pool after it as Graphviz graphs (kvlab::step_dot, kvlab::scheduler_pool_dot). Runs of
// different policies on the same workload can be compared request by request: the outputs are
// in the JSON.
//
// Build and run (Release, from the repository root):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build --target kvlab-serve
//   build/apps/kvlab-serve                                   # built-in model, 32 requests
//   build/apps/kvlab-serve --policy static --json static.json
//   build/apps/kvlab-serve --model stories260K.bin --requests 64 --rate 50 --shared-prefix 32
//   build/apps/kvlab-serve --model SmolLM2-135M-Instruct.Q4_1.gguf --workload
//   apps/examples/chat_workload.jsonl
// --help lists the options.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <kvlab/kvlab.hpp>
#include <kvlab/model/bpe_tokenizer.hpp>
#include <kvlab/model/chat.hpp>
#include <kvlab/report/state_dot.hpp>

#include "serve_workload.hpp"
#include "support/builtin_model.hpp"
#include "support/cli.hpp"
#include "support/policy_option.hpp"

namespace {

using kvlab_support::UsageError;

struct Options {
  std::string model;  // empty: the built-in model
  std::string builtin = "tiny";
  kvlab::BatchingPolicy policy = kvlab::BatchingPolicy::Continuous;
  int block_size = 16;
  kvlab::KVDtype kv_dtype = kvlab::KVDtype::fp32;
  int window = 0;            // 0: every query sees every past token
  int sinks = 0;             // with a window (from --cache-policy): the first tokens kept
  std::string cache_policy;  // a paged cache policy instead of --block-size, --kv-dtype, --window
  int pool_tokens = 4096;
  int max_batched_tokens = 256;
  int max_running = 16;
  int max_len = 0;
  int watermark = 1;
  bool prefix_caching = true;
  std::string workload;  // empty: generated
  kvlab::WorkloadSpec spec;
  bool clock_steps = false;
  int threads = 1;
  std::string json, step_log;
  std::string dot;      // empty: no diagrams
  int dot_step = -1;    // the step --dot draws (-1: not given, step 0)
  std::string command;  // the command line, for the diagrams' titles
  bool quiet = false;
  std::string generated_option;  // a generated-workload option given (refused with --workload)
  bool max_len_given = false, prefix_caching_given = false;
};

bool parse(int argc, char** argv, Options& o) {
  using namespace kvlab_support;
  CLI::App app{
      "kvlab-serve: a continuous-batching engine (vLLM-style scheduling over a paged KV pool) "
      "serving a workload of requests, against static batching and contiguous preallocation; "
      "prints throughput, latency, batch sizes and KV memory."};
  std::string policy = "continuous", kv_dtype = "fp32", prefix_caching = "on", clock = "wall";
  add_file(app, "--model", o.model,
           "llama2.c checkpoint (legacy version-0 .bin) or GGUF file (.gguf: its workload may be "
           "text); without it a built-in model with random weights (--builtin)");
  add_choice(app, "--builtin", o.builtin,
             "tiny (dim 48, 3 layers, vocab 256) or stories15M (its shape: dim 288, 6 layers, "
             "vocab 32000, separate classifier)",
             {"tiny", "stories15M"});
  add_choice(app, "--policy", policy,
             "continuous: every step, running requests first, then waiting ones FCFS, up to the "
             "token budget; static: a batch admitted together, padded to the longest, nobody joins "
             "until it ends; contiguous: continuous, but each request reserves --max-len tokens",
             {"continuous", "static", "contiguous"});
  CLI::Option* block =
      add_integer(app, "--block-size", o.block_size, "tokens per block of the pool", 1, 1 << 16);
  CLI::Option* dtype =
      add_choice(app, "--kv-dtype", kv_dtype,
                 "how the pool stores K and V: fp32, fp16, bf16, int8 (q8_0, 8.5 bits per value) "
                 "or int4 (q4_0, 4.5 bits per value)",
                 {"fp32", "fp16", "bf16", "int8", "int4"});
  CLI::Option* window =
      add_integer(app, "--window", o.window,
                  "sliding window: each token attends to its last W tokens; the pool gives back "
                  "the blocks before each window (prefix caching is then off: kvlab does not "
                  "combine the two); 0: no window",
                  0, 1 << 30);
  add_policy(app, "--cache-policy", o.cache_policy,
             std::string("what the pool keeps, instead of --block-size, --kv-dtype and --window: "
                         "a paged policy with one type for K and V and no h2o or full "
                         "layers and heads (a sequence's block table serves every layer and head); "
                         "a policy is ") +
                 policy_syntax())
      ->excludes(block)
      ->excludes(dtype)
      ->excludes(window);
  add_integer(app, "--pool-tokens", o.pool_tokens,
              "KV memory, in tokens: a multiple of the block size; the same for every policy", 1,
              1 << 26);
  add_integer(app, "--max-batched-tokens", o.max_batched_tokens,
              "token budget per step (static batches have none)", 1, 1 << 20);
  add_integer(app, "--max-running", o.max_running,
              "requests running at once (static: the batch size)", 1, 1 << 16);
  CLI::Option* max_len = add_integer(app, "--max-len", o.max_len,
                                     "tokens each request reserves under contiguous", 1, 1 << 20)
                             ->default_str("the model's context");
  add_integer(app, "--watermark", o.watermark, "free blocks admission leaves for running requests",
              0, 1 << 20);
  CLI::Option* prefix = add_choice(app, "--prefix-caching", prefix_caching,
                                   "share cached prompt blocks (continuous only)", {"on", "off"});
  add_file(app, "--workload", o.workload,
           "requests as JSON lines: {\"prompt\": [ids], \"max_new_tokens\": N, \"arrival\": "
           "seconds, \"stop_ids\": [...], \"temperature\": T, \"top_p\": P, \"seed\": S, "
           "\"id\": ...}; with a GGUF model \"user\": \"text\" (and \"system\": \"text\") "
           "instead of \"prompt\"");
  const std::vector<CLI::Option*> generated = {
      add_integer(app, "--requests", o.spec.requests, "generated workload: N requests", 1, 1 << 20),
      add_integer(app, "--seed", o.spec.seed, "its seed", 0, 1LL << 62),
      add_integer_interval(app, "--prompt-len", o.spec.prompt_min, o.spec.prompt_max,
                           "each prompt's own tokens, uniform, random ids", 0, 1 << 20),
      add_integer_interval(app, "--output-len", o.spec.output_min, o.spec.output_max,
                           "max new tokens, uniform; greedy, no stop ids", 1, 1 << 20),
      add_number(app, "--rate", o.spec.rate,
                 "Poisson arrivals, R requests per second (per step with --clock steps); 0: all at "
                 "once",
                 0.0, 1e9),
      add_integer(app, "--shared-prefix", o.spec.shared_prefix,
                  "a system prompt of N tokens that every prompt starts with", 0, 1 << 20)};
  add_choice(app, "--clock", clock, "time in seconds (wall) or in steps (deterministic logs)",
             {"wall", "steps"});
  add_integer(app, "--threads", o.threads, "OpenMP threads", 1, 256);
  add_file(app, "--json", o.json, "the run as JSON: settings, figures, every request's output ids");
  add_file(app, "--step-log", o.step_log,
           "one JSON line per step: who ran, tokens, prefill or decode, blocks");
  add_file(app, "--dot", o.dot,
           "Graphviz graphs of one step (PREFIX.step.dot: who waited, the batch, the token budget) "
           "and of the pool after it (PREFIX.pool.dot: block tables, holders, prefix-cache "
           "blocks); dot -Tsvg draws them")
      ->type_name("PREFIX");
  CLI::Option* dot_step =
      add_integer(app, "--dot-step", o.dot_step, "the step --dot draws, from 0", 0, 1 << 30)
          ->default_str("0");
  app.add_flag("--quiet", o.quiet, "no progress lines");
  if (!kvlab_support::parse(app, argc, argv)) return false;
  o.policy = kvlab::parse_batching_policy(policy);
  o.kv_dtype = kvlab::parse_kv_dtype(kv_dtype);
  if (!o.cache_policy.empty()) {
    const kvlab::CachePolicy cache = kvlab::parse_cache_policy(o.cache_policy);
    if (cache.backend != kvlab::LlamaBackend::Paged) {
      throw UsageError(
          "--cache-policy: expected a paged policy (the engine keeps K and V in its "
          "pool of blocks), got '" +
          o.cache_policy + "'");
    }
    o.block_size = cache.block_size;  // the parser refused a paged policy that is not uniform
    o.kv_dtype = cache.key_dtype;
    o.window = cache.window;
    o.sinks = cache.sinks;
  }
  o.prefix_caching = prefix_caching == "on";
  o.prefix_caching_given = prefix->count() > 0;
  o.max_len_given = max_len->count() > 0;
  o.clock_steps = clock == "steps";
  if (dot_step->count() == 0) o.dot_step = -1;
  for (const CLI::Option* option : generated)
    if (option->count() > 0) o.generated_option = option->get_name();
  if (o.pool_tokens % o.block_size != 0 || o.pool_tokens < o.block_size) {
    throw UsageError("--pool-tokens: expected a multiple of --block-size (" +
                     std::to_string(o.block_size) + "), got " + std::to_string(o.pool_tokens));
  }
  if (!o.workload.empty() && !o.generated_option.empty()) {
    throw UsageError(o.generated_option +
                     ": expected no generated-workload option with --workload, "
                     "got both");
  }
  if (o.max_len_given && o.policy != kvlab::BatchingPolicy::Contiguous) {
    throw UsageError(std::string("--max-len: expected --policy contiguous (the only policy that "
                                 "reserves it), got --policy ") +
                     kvlab::to_string(o.policy));
  }
  if (o.prefix_caching_given && o.prefix_caching && o.policy != kvlab::BatchingPolicy::Continuous) {
    throw UsageError(std::string("--prefix-caching on: expected --policy continuous (the baselines "
                                 "never share), got --policy ") +
                     kvlab::to_string(o.policy));
  }
  if (o.window > 0 && o.prefix_caching_given && o.prefix_caching) {
    throw UsageError(
        "--prefix-caching on: expected off with --window (the pool gives back the "
        "blocks before each window; kvlab does not combine the two), got on");
  }
  if (o.dot_step >= 0 && o.dot.empty())
    throw UsageError("--dot-step: expected --dot too, got none");
  if (o.window > 0) o.prefix_caching = false;  // off by default with a window
  // The command for the diagrams' titles: the program as users type it, without --dot's path
  // (a path of the machine that drew them).
  o.command = "kvlab-serve";
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--dot")
      ++i;
    else
      o.command += std::string(" ") + argv[i];
  }
  return true;
}

int serve(const Options& o) {
  constexpr const char* kProgram = "kvlab-serve";
  if (!kvlab_support::can_write(kProgram, "--json", o.json) ||
      !kvlab_support::can_write(kProgram, "--step-log", o.step_log) ||
      !kvlab_support::can_write(kProgram, "--dot", o.dot.empty() ? "" : o.dot + ".step.dot") ||
      !kvlab_support::can_write(kProgram, "--dot", o.dot.empty() ? "" : o.dot + ".pool.dot")) {
    return 2;
  }
  kvlab_support::set_threads(kvlab_support::usable_threads(kProgram, {o.threads}).front());
  const kvlab_support::ChosenModel chosen = kvlab_support::choose_model(o.model, o.builtin);
  const std::shared_ptr<const kvlab::LlamaWeights>& weights = chosen.weights;
  const std::string& description = chosen.description;
  if (o.max_len > weights->config.seq_len) {
    std::fprintf(stderr, "%s: --max-len: expected at most the model's context (%d), got %d\n",
                 kProgram, weights->config.seq_len, o.max_len);
    return 2;
  }
  kvlab::EngineConfig config;
  config.block_size = o.block_size;
  config.num_blocks = o.pool_tokens / o.block_size;
  config.kv_dtype = o.kv_dtype;
  config.window = o.window;
  config.sinks = o.sinks;
  config.clock = o.clock_steps ? kvlab::EngineClock::Steps : kvlab::EngineClock::Wall;
  config.scheduler.policy = o.policy;
  config.scheduler.max_batched_tokens = o.max_batched_tokens;
  config.scheduler.max_running = o.max_running;
  config.scheduler.watermark_blocks = o.watermark;
  config.scheduler.prefix_caching = o.prefix_caching;
  config.scheduler.max_len = o.max_len;
  kvlab::Engine engine(weights, config);

  // The workload: every request submitted up front, each seen from its arrival time on.
  std::vector<kvlab_serve::WorkloadEntry> entries;
  if (o.workload.empty()) {
    for (const kvlab::Request& r : kvlab::make_workload(o.spec, weights->config.vocab_size)) {
      kvlab_serve::WorkloadEntry entry;
      entry.request = r;
      entries.push_back(entry);
    }
  } else {
    entries = kvlab_serve::read_workload(o.workload);
  }
  // Text requests: the chat template and tokenizer of the GGUF file.
  std::unique_ptr<kvlab::BpeTokenizer> tokenizer;
  std::vector<bool> is_text;    // [accepted] given as text: its reply is printed
  std::vector<int> engine_ids;  // [accepted] the engine's id of each
  const auto text_request =
      std::find_if(entries.begin(), entries.end(),
                   [](const kvlab_serve::WorkloadEntry& e) { return e.has_user; });
  if (text_request != entries.end()) {
    if (!kvlab_support::is_gguf(o.model)) {
      std::fprintf(stderr,
                   "%s: %s: request %zu: user: expected a GGUF model (--model FILE.gguf), whose "
                   "tokenizer and chat template turn text into ids, got %s\n",
                   kProgram, o.workload.c_str(),
                   static_cast<std::size_t>(text_request - entries.begin()), description.c_str());
      return 2;
    }
    const kvlab::GgufFile file(o.model);
    tokenizer = std::make_unique<kvlab::BpeTokenizer>(kvlab::BpeTokenizer::from_gguf(file));
    const kvlab::ChatTemplate chat = kvlab::ChatTemplate::from_gguf(file);
    for (kvlab_serve::WorkloadEntry& e : entries) {
      if (!e.has_user) continue;
      e.request.prompt = tokenizer->encode_parts(
          chat.prompt(e.has_system ? e.system : chat.default_system(), e.user));
      if (!e.has_stop_ids) e.request.stop_ids = {tokenizer->eos_id()};
    }
  }
  std::vector<std::string> ids;  // [accepted] their ids in the output
  int refused = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    try {
      engine_ids.push_back(engine.submit(entries[i].request));
      ids.push_back(entries[i].id.empty() ? std::to_string(i) : entries[i].id);
      is_text.push_back(entries[i].has_user);
    } catch (const kvlab::InvalidArgument& e) {  // the others are still served
      std::fprintf(stderr, "%s: request %zu refused: %s\n", kProgram, i, e.what());
      ++refused;
    }
  }
  if (ids.empty()) {
    std::fprintf(stderr, "%s: every request was refused\n", kProgram);
    return 1;
  }
  const std::string window =
      o.window == 0 ? ""
                    : ", a window of " + std::to_string(o.window) + " keys" +
                          (o.sinks > 0 ? " and " + std::to_string(o.sinks) + " sinks" : "");
  std::fprintf(stderr,
               "%s: %s, %s policy, %zu requests, pool %d tokens (%d blocks of %d), K/V stored as "
               "%s, %zu bytes per token%s\n",
               kProgram, description.c_str(), kvlab::to_string(o.policy), ids.size(), o.pool_tokens,
               config.num_blocks, o.block_size, engine.model().store().storage_name(),
               engine.model().store().bytes_per_token(), window.c_str());

  // --dot: the step and the pool after it, named as the output names the requests.
  kvlab::ServingDotOptions dot;
  for (const std::string& id : ids) dot.request_names.push_back("request " + id);
  const int dot_step = std::max(o.dot_step, 0);
  bool drawn = false;
  // Progress: a line at most every second of wall time.
  auto last = std::chrono::steady_clock::now();
  engine.run([&](const kvlab::StepRecord& s) {
    if (!o.dot.empty() && s.step == dot_step) {
      dot.title = o.command;
      std::ofstream(o.dot + ".step.dot") << kvlab::step_dot(engine, dot);
      std::ofstream(o.dot + ".pool.dot") << kvlab::scheduler_pool_dot(engine.scheduler(), dot);
      drawn = true;
    }
    const auto now = std::chrono::steady_clock::now();
    if (o.quiet || now - last < std::chrono::seconds(1)) return;
    last = now;
    const int total = engine.scheduler().num_requests();
    std::fprintf(stderr,
                 "  step %d: %d of %d requests done, %d running, %d waiting, %d blocks free\n",
                 s.step, total - engine.scheduler().unfinished(), total, s.running, s.waiting,
                 s.blocks_free);
  });

  const kvlab::ServingSummary s = kvlab::summarize(engine);
  const char* unit = o.clock_steps ? "steps" : "s";
  std::printf("kvlab-serve: %s policy, %s\n", kvlab::to_string(o.policy), description.c_str());
  std::printf("  requests             %d served, %d refused\n", s.requests, refused);
  std::printf(
      "  throughput           %.1f generated tokens/%s (%lld tokens in %.3f %s, %d steps)\n",
      s.throughput_tok_s, o.clock_steps ? "step" : "s", static_cast<long long>(s.generated_tokens),
      s.wall_s, unit, s.steps);
  std::printf("  time to first token  p50 %.4f %s, p99 %.4f %s\n", s.ttft_s.p50, unit, s.ttft_s.p99,
              unit);
  std::printf("  time per output tok  p50 %.4f %s, p99 %.4f %s\n", s.tpot_s.p50, unit, s.tpot_s.p99,
              unit);
  std::printf(
      "  concurrency          peak %d requests per step, mean %.1f (%.1f while others "
      "waited)\n",
      s.peak_running, s.mean_running, s.mean_running_loaded);
  std::printf(
      "  KV memory            peak %d of %d blocks held or reserved; %.1f%% of those "
      "held tokens (mean over steps)\n",
      s.peak_blocks, config.num_blocks, 100.0 * s.kv_utilisation);
  std::printf("  computed tokens      %lld (prompts %lld, recompute and padding included)\n",
              static_cast<long long>(s.computed_tokens), static_cast<long long>(s.prompt_tokens));
  std::printf("  preemptions          %d\n", s.preemptions);
  std::printf("  prefix cache         %lld tokens hit, %.1f%% of those looked up\n",
              static_cast<long long>(s.prefix_hit_tokens), 100.0 * s.prefix_hit_rate);
  if (tokenizer != nullptr) {
    std::printf(
        "  replies (text requests; stop: the model's end of turn, length: max_new_tokens)\n");
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (!is_text[i]) continue;
      const kvlab::RequestOutput& out = engine.output(engine_ids[i]);
      std::string text = tokenizer->decode(out.tokens);
      for (std::size_t at = text.find('\n'); at != std::string::npos; at = text.find('\n', at + 1))
        text.insert(at + 1, "      ");  // continuation lines indented under the reply
      std::printf("    %s (%s): %s\n", ids[i].c_str(), kvlab::to_string(out.finish), text.c_str());
    }
  }
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    kvlab::write_run_json(out, engine, ids);
  }
  if (!o.step_log.empty()) {
    std::ofstream out(o.step_log);
    kvlab::write_step_log(out, engine);
  }
  if (!o.dot.empty() && !drawn) {
    std::remove((o.dot + ".step.dot").c_str());  // the empty files can_write made
    std::remove((o.dot + ".pool.dot").c_str());
    std::fprintf(stderr, "%s: --dot-step: expected a step the run reaches (below %d), got %d\n",
                 kProgram, engine.steps(), dot_step);
    return 1;
  }
  if (refused > 0) {
    std::fprintf(stderr, "%s: %d request%s refused (see above)\n", kProgram, refused,
                 refused == 1 ? " was" : "s were");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (const auto code = kvlab_support::read_command_line("kvlab-serve", argc, argv, options, parse))
    return *code;
  try {
    return serve(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvlab-serve: %s\n", e.what());
    return 1;
  }
}
