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
//   build/apps/kvlab-serve --model SmolLM2-135M-Instruct.Q4_1.gguf --workload apps/examples/chat_workload.jsonl
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
#include <kvlab/serving/state_dot.hpp>

#include "builtin_model.hpp"
#include "cli.hpp"
#include "serve_workload.hpp"

namespace {

using kvlab_bench::need_value;
using kvlab_bench::parse_double;
using kvlab_bench::parse_file_name;
using kvlab_bench::parse_int;
using kvlab_bench::UsageError;

struct Options {
  std::string model;  // empty: the built-in model
  std::string builtin = "tiny";
  kvlab::BatchingPolicy policy = kvlab::BatchingPolicy::Continuous;
  int block_size = 16;
  kvlab::KVDtype kv_dtype = kvlab::KVDtype::fp32;
  int window = 0;  // 0: every query sees every past token
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
  std::string dot;    // empty: no diagrams
  int dot_step = -1;  // the step --dot draws (-1: not given, step 0)
  std::string command;  // the command line, for the diagrams' titles
  bool quiet = false;
  std::string generated_option;  // a generated-workload option given (refused with --workload)
  bool max_len_given = false, prefix_caching_given = false;
};

const char* const kUsage =
    "usage: kvlab-serve [--model FILE | --builtin tiny|stories15M] "
    "[--policy continuous|static|contiguous]\n"
    "                   [--block-size N] [--kv-dtype D] [--window W] [--pool-tokens N] [--max-batched-tokens N] "
    "[--max-running N]\n"
    "                   [--max-len N] [--watermark N] [--prefix-caching on|off]\n"
    "                   [--workload FILE | --requests N --seed S --prompt-len MIN:MAX "
    "--output-len MIN:MAX\n"
    "                    --rate R --shared-prefix N] [--clock wall|steps] [--threads T]\n"
    "                   [--json FILE] [--step-log FILE] [--dot PREFIX [--dot-step N]] [--quiet] "
    "[--help]\n"
    "  --model FILE            llama2.c checkpoint (legacy version-0 .bin) or GGUF file (.gguf:\n"
    "                          its workload may be text); without it a built-in model with\n"
    "                          random weights (--builtin)\n"
    "  --builtin NAME          tiny (dim 48, 3 layers, vocab 256; default) or stories15M (its\n"
    "                          shape: dim 288, 6 layers, vocab 32000, separate classifier)\n"
    "  --policy P              continuous (default): every step, running requests first, then\n"
    "                          waiting ones FCFS, up to the token budget; static: a batch admitted\n"
    "                          together, padded to the longest, nobody joins until it ends;\n"
    "                          contiguous: continuous, but each request reserves --max-len tokens\n"
    "  --block-size N          tokens per block of the pool (default 16)\n"
    "  --kv-dtype D            how the pool stores K and V: fp32 (default), fp16, bf16, int8 "
    "(q8_0,\n"
    "                          8.5 bits per value) or int4 (q4_0, 4.5 bits per value)\n"
    "  --window W              sliding window: each token attends to its last W tokens; the pool\n"
    "                          gives back the blocks before each window (prefix caching is then\n"
    "                          off: kvlab does not combine the two)\n"
    "  --pool-tokens N         KV memory, in tokens: a multiple of the block size (default 4096);\n"
    "                          the same for every policy\n"
    "  --max-batched-tokens N  token budget per step (default 256; static batches have none)\n"
    "  --max-running N         requests running at once (static: the batch size; default 16)\n"
    "  --max-len N             tokens each request reserves under contiguous (default: the\n"
    "                          model's context)\n"
    "  --watermark N           free blocks admission leaves for running requests (default 1)\n"
    "  --prefix-caching on|off share cached prompt blocks (continuous only; default on)\n"
    "  --workload FILE         requests as JSON lines: {\"prompt\": [ids], \"max_new_tokens\": N,\n"
    "                          \"arrival\": seconds, \"stop_ids\": [...], \"temperature\": T,\n"
    "                          \"top_p\": P, \"seed\": S, \"id\": ...}; with a GGUF model\n"
    "                          \"user\": \"text\" (and \"system\": \"text\") instead of \"prompt\"\n"
    "  --requests N            generated workload: N requests (default 32)\n"
    "  --seed S                its seed (default 1)\n"
    "  --prompt-len MIN:MAX    each prompt's own tokens, uniform (default 8:64), random ids\n"
    "  --output-len MIN:MAX    max new tokens, uniform (default 8:128); greedy, no stop ids\n"
    "  --rate R                Poisson arrivals, R requests per second (per step with --clock\n"
    "                          steps); 0 (default): all at once\n"
    "  --shared-prefix N       a system prompt of N tokens that every prompt starts with\n"
    "  --clock wall|steps      time in seconds (default) or in steps (deterministic logs)\n"
    "  --threads T             OpenMP threads (default 1)\n"
    "  --json FILE             the run as JSON: settings, figures, every request's output ids\n"
    "  --step-log FILE         one JSON line per step: who ran, tokens, prefill or decode, blocks\n"
    "  --dot PREFIX            Graphviz graphs of one step (PREFIX.step.dot: who waited, the\n"
    "                          batch, the token budget) and of the pool after it (PREFIX.pool.dot:\n"
    "                          block tables, holders, prefix-cache blocks); dot -Tsvg draws them\n"
    "  --dot-step N            the step --dot draws, from 0 (default 0)\n"
    "  --quiet                 no progress lines\n";

// MIN:MAX of `option`, each in [minimum, maximum], MIN <= MAX.
void parse_range(const std::string& option, const char* text, int minimum, int maximum, int& lo,
                 int& hi) {
  const std::string value = need_value(option, text);
  const std::size_t colon = value.find(':');
  if (colon == std::string::npos)
    throw UsageError(option + ": expected MIN:MAX, got '" + value + "'");
  lo = parse_int(option, value.substr(0, colon).c_str(), minimum, maximum);
  hi = parse_int(option, value.substr(colon + 1).c_str(), lo, maximum);
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    bool takes_value = true;
    if (arg == "--help" || arg == "-h") {
      std::printf("%s", kUsage);
      return false;
    } else if (arg == "--model") {
      o.model = parse_file_name(arg, value);
    } else if (arg == "--builtin") {
      o.builtin = need_value(arg, value);
      if (o.builtin != "tiny" && o.builtin != "stories15M")
        throw UsageError(arg + ": expected tiny or stories15M, got '" + o.builtin + "'");
    } else if (arg == "--policy") {
      o.policy = kvlab::parse_batching_policy(
          kvlab_bench::parse_choice(arg, value, {"continuous", "static", "contiguous"}));
    } else if (arg == "--block-size") {
      o.block_size = parse_int(arg, value, 1, 1 << 16);
    } else if (arg == "--kv-dtype") {
      o.kv_dtype = kvlab::parse_kv_dtype(
          kvlab_bench::parse_choice(arg, value, {"fp32", "fp16", "bf16", "int8", "int4"}));
    } else if (arg == "--window") {
      o.window = parse_int(arg, value, 1, 1 << 30);
    } else if (arg == "--pool-tokens") {
      o.pool_tokens = parse_int(arg, value, 1, 1 << 26);
    } else if (arg == "--max-batched-tokens") {
      o.max_batched_tokens = parse_int(arg, value, 1, 1 << 20);
    } else if (arg == "--max-running") {
      o.max_running = parse_int(arg, value, 1, 1 << 16);
    } else if (arg == "--max-len") {
      o.max_len_given = true;
      o.max_len = parse_int(arg, value, 1, 1 << 20);
    } else if (arg == "--watermark") {
      o.watermark = parse_int(arg, value, 0, 1 << 20);
    } else if (arg == "--prefix-caching") {
      o.prefix_caching_given = true;
      const std::string p = need_value(arg, value);
      if (p != "on" && p != "off") throw UsageError(arg + ": expected on or off, got '" + p + "'");
      o.prefix_caching = p == "on";
    } else if (arg == "--workload") {
      o.workload = parse_file_name(arg, value);
    } else if (arg == "--requests") {
      o.generated_option = arg;
      o.spec.requests = parse_int(arg, value, 1, 1 << 20);
    } else if (arg == "--seed") {
      o.generated_option = arg;
      o.spec.seed = static_cast<std::uint64_t>(kvlab_bench::parse_long(arg, value, 0, 1L << 62));
    } else if (arg == "--prompt-len") {
      o.generated_option = arg;
      parse_range(arg, value, 0, 1 << 20, o.spec.prompt_min, o.spec.prompt_max);
    } else if (arg == "--output-len") {
      o.generated_option = arg;
      parse_range(arg, value, 1, 1 << 20, o.spec.output_min, o.spec.output_max);
    } else if (arg == "--rate") {
      o.generated_option = arg;
      o.spec.rate = parse_double(arg, value, 0.0, 1e9);
    } else if (arg == "--shared-prefix") {
      o.generated_option = arg;
      o.spec.shared_prefix = parse_int(arg, value, 0, 1 << 20);
    } else if (arg == "--clock") {
      const std::string c = need_value(arg, value);
      if (c != "wall" && c != "steps") throw UsageError(arg + ": expected wall or steps, got '" + c + "'");
      o.clock_steps = c == "steps";
    } else if (arg == "--threads") {
      o.threads = parse_int(arg, value, 1, 256);
    } else if (arg == "--json") {
      o.json = parse_file_name(arg, value);
    } else if (arg == "--step-log") {
      o.step_log = parse_file_name(arg, value);
    } else if (arg == "--dot") {
      o.dot = parse_file_name(arg, value);
    } else if (arg == "--dot-step") {
      o.dot_step = parse_int(arg, value, 0, 1 << 30);
    } else if (arg == "--quiet") {
      o.quiet = true;
      takes_value = false;
    } else {
      throw UsageError("unknown option '" + arg + "'");
    }
    if (takes_value) ++i;
  }
  if (o.pool_tokens % o.block_size != 0 || o.pool_tokens < o.block_size) {
    throw UsageError("--pool-tokens: expected a multiple of --block-size (" +
                     std::to_string(o.block_size) + "), got " + std::to_string(o.pool_tokens));
  }
  if (!o.workload.empty() && !o.generated_option.empty()) {
    throw UsageError(o.generated_option + ": expected no generated-workload option with --workload, "
                     "got both");
  }
  if (o.max_len_given && o.policy != kvlab::BatchingPolicy::Contiguous) {
    throw UsageError(std::string("--max-len: expected --policy contiguous (the only policy that "
                                 "reserves it), got --policy ") + kvlab::to_string(o.policy));
  }
  if (o.prefix_caching_given && o.prefix_caching && o.policy != kvlab::BatchingPolicy::Continuous) {
    throw UsageError(std::string("--prefix-caching on: expected --policy continuous (the baselines "
                                 "never share), got --policy ") + kvlab::to_string(o.policy));
  }
  if (o.window > 0 && o.prefix_caching_given && o.prefix_caching) {
    throw UsageError("--prefix-caching on: expected off with --window (the pool gives back the "
                     "blocks before each window; kvlab does not combine the two), got on");
  }
  if (o.dot_step >= 0 && o.dot.empty()) throw UsageError("--dot-step: expected --dot too, got none");
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
  if (!kvlab_bench::can_write(kProgram, "--json", o.json) ||
      !kvlab_bench::can_write(kProgram, "--step-log", o.step_log) ||
      !kvlab_bench::can_write(kProgram, "--dot", o.dot.empty() ? "" : o.dot + ".step.dot") ||
      !kvlab_bench::can_write(kProgram, "--dot", o.dot.empty() ? "" : o.dot + ".pool.dot")) {
    return 2;
  }
  kvlab_bench::set_threads(kvlab_bench::usable_threads(kProgram, {o.threads}).front());
  const kvlab_bench::ChosenModel chosen = kvlab_bench::choose_model(o.model, o.builtin);
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
  std::vector<bool> is_text;     // [accepted] given as text: its reply is printed
  std::vector<int> engine_ids;  // [accepted] the engine's id of each
  const auto text_request = std::find_if(entries.begin(), entries.end(),
                                         [](const kvlab_serve::WorkloadEntry& e) { return e.has_user; });
  if (text_request != entries.end()) {
    if (!kvlab_bench::is_gguf(o.model)) {
      std::fprintf(stderr,
                   "%s: %s: request %zu: user: expected a GGUF model (--model FILE.gguf), whose "
                   "tokenizer and chat template turn text into ids, got %s\n",
                   kProgram, o.workload.c_str(), static_cast<std::size_t>(text_request - entries.begin()),
                   description.c_str());
      return 2;
    }
    const kvlab::GgufFile file(o.model);
    tokenizer = std::make_unique<kvlab::BpeTokenizer>(kvlab::BpeTokenizer::from_gguf(file));
    const kvlab::ChatTemplate chat = kvlab::ChatTemplate::from_gguf(file);
    for (kvlab_serve::WorkloadEntry& e : entries) {
      if (!e.has_user) continue;
      e.request.prompt =
          tokenizer->encode_parts(chat.prompt(e.has_system ? e.system : chat.default_system(), e.user));
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
  std::fprintf(stderr,
               "%s: %s, %s policy, %zu requests, pool %d tokens (%d blocks of %d), K/V stored as "
               "%s, %zu bytes per token\n",
               kProgram, description.c_str(), kvlab::to_string(o.policy), ids.size(),
               o.pool_tokens, config.num_blocks, o.block_size, engine.model().store().storage_name(),
               engine.model().store().bytes_per_token());

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
    std::fprintf(stderr, "  step %d: %d of %d requests done, %d running, %d waiting, %d blocks free\n",
                 s.step, total - engine.scheduler().unfinished(), total, s.running, s.waiting,
                 s.blocks_free);
  });

  const kvlab::ServingSummary s = kvlab::summarize(engine);
  const char* unit = o.clock_steps ? "steps" : "s";
  std::printf("kvlab-serve: %s policy, %s\n", kvlab::to_string(o.policy), description.c_str());
  std::printf("  requests             %d served, %d refused\n", s.requests, refused);
  std::printf("  throughput           %.1f generated tokens/%s (%lld tokens in %.3f %s, %d steps)\n",
              s.throughput_tok_s, o.clock_steps ? "step" : "s",
              static_cast<long long>(s.generated_tokens), s.wall_s, unit, s.steps);
  std::printf("  time to first token  p50 %.4f %s, p99 %.4f %s\n", s.ttft_s.p50, unit,
              s.ttft_s.p99, unit);
  std::printf("  time per output tok  p50 %.4f %s, p99 %.4f %s\n", s.tpot_s.p50, unit,
              s.tpot_s.p99, unit);
  std::printf("  concurrency          peak %d requests per step, mean %.1f (%.1f while others "
              "waited)\n",
              s.peak_running, s.mean_running, s.mean_running_loaded);
  std::printf("  KV memory            peak %d of %d blocks held or reserved; %.1f%% of those "
              "held tokens (mean over steps)\n",
              s.peak_blocks, config.num_blocks, 100.0 * s.kv_utilisation);
  std::printf("  computed tokens      %lld (prompts %lld, recompute and padding included)\n",
              static_cast<long long>(s.computed_tokens), static_cast<long long>(s.prompt_tokens));
  std::printf("  preemptions          %d\n", s.preemptions);
  std::printf("  prefix cache         %lld tokens hit, %.1f%% of those looked up\n",
              static_cast<long long>(s.prefix_hit_tokens), 100.0 * s.prefix_hit_rate);
  if (tokenizer != nullptr) {
    std::printf("  replies (text requests; stop: the model's end of turn, length: max_new_tokens)\n");
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
  if (const auto code = kvlab_bench::read_command_line("kvlab-serve", argc, argv, options, parse))
    return *code;
  try {
    return serve(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvlab-serve: %s\n", e.what());
    return 1;
  }
}
