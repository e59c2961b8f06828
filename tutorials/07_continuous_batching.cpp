// Tutorial 07: continuous batching.
//
// What you will learn:
//  1. Serving many requests on one model: every step, one forward pass runs a batch of
//     sequences (kvlab::Engine over kvlab::LlamaModel's batched step, K/V in one paged pool).
//  2. Static batching: a batch is admitted together and runs until its longest member is done;
//     a member that finishes early idles (its slot computes padding), and a request that arrives
//     meanwhile waits for the whole batch.
//  3. Continuous (dynamic) batching, as vLLM schedules it: the batch is re-formed at every step —
//     a request joins as soon as a slot and its memory are free, and leaves the step it finishes.
//     The story: A, B and C run; C finishes; D, which arrived meanwhile, joins in C's place at
//     once instead of waiting for A and B.
//  4. Batching never changes a request's result: each gets the tokens it gets alone.
// It prints each step (who runs, prefill or decode, blocks in use, who joins and leaves), then a
// timeline per policy, and checks itself: it exits non-zero if a request's tokens differ from
// its run alone or continuous batching takes more steps than static batching.
//
// Build and run (from the repository root, with `build/` configured by CMake):
//   cmake --build build --target tutorial_07_continuous_batching
//   build/tutorials/07_continuous_batching [--step-log PREFIX]
// With --step-log it writes each policy's step log as JSON lines to PREFIX.<policy>.jsonl (the
// docs draw the timeline plot from them). Options (the exercises of its page change them):
// --max-running N requests at a time (3), --arrival N the step at which D arrives (2).
//
// Next: kvlab-serve (apps/kvlab_serve.cpp) serves whole workloads under each policy, and
// bench_serving measures throughput, concurrency and prefix caching.

#include <kvlab/kvlab.hpp>

#include "support/command_line.hpp"

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace {

const char* const kNames[] = {"A", "B", "C", "D"};

// [request]: the four requests of the story. Prompts of a few token ids; A and B generate
// longer answers than C; D arrives at step 2 (`arrival`), while the batch of three is running.
std::vector<kvlab::Request> story(int arrival) {
  std::vector<kvlab::Request> requests(4);
  const int prompt_lengths[] = {6, 4, 5, 3};
  const int answer_lengths[] = {10, 8, 3, 4};
  for (int i = 0; i < 4; ++i) {
    for (int t = 0; t < prompt_lengths[i]; ++t) requests[i].prompt.push_back(10 * i + t + 1);
    requests[i].max_new_tokens = answer_lengths[i];
  }
  requests[3].arrival = arrival;  // D arrives at step 2
  return requests;
}

// [name]: who is in the step's batch, e.g. "A prefill 6, B decode 1".
std::string batch_text(const kvlab::StepRecord& step) {
  std::string text;
  for (const kvlab::StepEntry& e : step.batch) {
    if (!text.empty()) text += ", ";
    text += std::string(kNames[e.request]) + " " + kvlab::to_string(e.kind) + " " +
            std::to_string(e.tokens);
  }
  return text;
}

std::string names(const std::vector<int>& ids) {
  std::string text;
  for (int id : ids) text += std::string(text.empty() ? "" : " ") + kNames[id];
  return text.empty() ? "-" : text;
}

// Serves `requests` under `policy`, `max_running` (3) at a time, printing each step; returns the
// engine (its outputs and step log).
std::unique_ptr<kvlab::Engine> serve(kvlab::BatchingPolicy policy,
                                     const std::vector<kvlab::Request>& requests, int max_running) {
  // [policy]
  kvlab::EngineConfig config;
  config.scheduler.policy = policy;
  config.scheduler.max_running = max_running;  // three slots
  config.block_size = 4;             // tokens per block of the pool
  config.num_blocks = 32;
  config.clock = kvlab::EngineClock::Steps;  // time = steps, so the story is the same everywhere
  auto engine = std::make_unique<kvlab::Engine>(
      std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin()), config);
  for (const kvlab::Request& r : requests) engine->submit(r);
  // [policy]
  std::printf("\n%s batching, at most %d running:\n", kvlab::to_string(policy), max_running);
  std::printf("step | %-64s | blocks used | joins | leaves\n", "batch");
  // [run]
  engine->run([](const kvlab::StepRecord& s) {
    std::printf("%4d | %-64s | %11d | %-5s | %s\n", s.step, batch_text(s).c_str(), s.blocks_used,
                names(s.admitted).c_str(), names(s.finished).c_str());
  });
  // [run]
  return engine;
}

// The timeline: one row per request, one column per step; P prefill, d decode, p padding (a
// finished member of a static batch), . arrived and waiting.
void print_timeline(const kvlab::Engine& engine, const std::vector<kvlab::Request>& requests) {
  const std::vector<kvlab::StepRecord>& log = engine.step_log();
  std::printf("timeline (P prefill, d decode, p padding, . waiting):\n");
  for (int id = 0; id < 4; ++id) {
    std::string row;
    for (const kvlab::StepRecord& s : log) {
      char c = ' ';
      for (const kvlab::StepEntry& e : s.batch) {
        if (e.request != id) continue;
        if (e.kind == kvlab::ChunkKind::Prefill) c = 'P';  // a padded prompt: P, not its padding
        if (e.kind == kvlab::ChunkKind::Decode) c = 'd';
        if (e.kind == kvlab::ChunkKind::Padding && c == ' ') c = 'p';
      }
      const kvlab::RequestOutput& out = engine.output(id);
      if (c == ' ' && s.start >= requests[static_cast<std::size_t>(id)].arrival &&
          s.start < out.finished)
        c = '.';
      row += c;
    }
    // Times are step ends: a token drawn in step k has time k + 1.
    std::printf("  %s |%s| last token in step %.0f\n", kNames[id], row.c_str(),
                engine.output(id).finished - 1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string prefix;   // where the step logs go ("": nowhere)
  int max_running = 3;  // requests at a time
  int arrival = 2;      // the step at which D arrives
  kvlab_support::CommandLine command_line{"Tutorial 07: continuous batching"};
  command_line.add_text("--step-log", prefix,
                        "write each policy's step log to PREFIX.<policy>.jsonl");
  command_line.add_integer("--max-running", max_running, "requests at a time", 1, 4);
  command_line.add_integer("--arrival", arrival, "the step at which D arrives", 0, 20);
  if (const auto stop = command_line.parse("07_continuous_batching", argc, argv))
    return *stop;
  const std::vector<kvlab::Request> requests = story(arrival);
  const auto statics = serve(kvlab::BatchingPolicy::Static, requests, max_running);
  print_timeline(*statics, requests);
  const auto continuous = serve(kvlab::BatchingPolicy::Continuous, requests, max_running);
  print_timeline(*continuous, requests);
  if (!prefix.empty()) {
    for (const kvlab::Engine* e : {statics.get(), continuous.get()}) {
      std::ofstream out(prefix + "." + kvlab::to_string(e->scheduler().config().policy) + ".jsonl");
      kvlab::write_step_log(out, *e);
    }
  }

  // Check: every request got, under both policies, the tokens it gets alone.
  bool ok = true;
  for (std::size_t id = 0; id < requests.size(); ++id) {
    kvlab::LlamaModel alone(std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin()),
                            kvlab::LlamaBackend::Cached);
    kvlab::Sampler greedy(alone.config().vocab_size, 0.0f, 1.0f, 0);
    const std::vector<int> want =
        kvlab::generate(alone, greedy, requests[id].prompt, requests[id].max_new_tokens).tokens;
    for (const kvlab::Engine* e : {statics.get(), continuous.get()})
      ok = ok && e->output(static_cast<int>(id)).tokens == want;
  }
  const double static_steps = statics->step_log().back().end;
  const double continuous_steps = continuous->step_log().back().end;
  std::printf("\nevery request's tokens equal its tokens alone: %s\n", ok ? "yes" : "NO");
  std::printf("all four done after %.0f steps (static) and %.0f steps (continuous); D's first "
              "token in step %.0f and in step %.0f\n",
              static_steps, continuous_steps, statics->output(3).token_times.front() - 1,
              continuous->output(3).token_times.front() - 1);
  if (!ok || continuous_steps > static_steps) {
    std::printf("FAILED\n");
    return 1;
  }
  return 0;
}
