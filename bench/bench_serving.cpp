// bench_serving: continuous batching against its baselines, on the same model, kernels and KV
// memory — stories260K.bin (when present) and a model of the stories15M shape (dim 288, 6
// layers, vocab 32000, random weights) — on 1 and 2 threads. Four measurements:
//
//  1. throughput (generated tokens/s) of continuous vs static batching on a mixed-length
//     workload (--requests requests arriving together, own prompts of 4..64 tokens, outputs of
//     4..192 tokens, uniform), every policy with the same pool (--pool-tokens) and a cap of
//     --max-running requests;
//  2. concurrency on that workload, paging vs contiguous preallocation: requests per step of the
//     continuous policy and of the contiguous one (each request reserves the model's context),
//     averaged over the steps after which requests were still waiting (how many fit when demand
//     exceeds them), and over all steps, with the peak;
//  3. decode throughput of a batch of 16 running requests vs one (prompt 8 tokens, 128 decode
//     steps): tokens/s over the steps in which every sequence decodes;
//  4. prefix caching on a shared-system-prompt workload (a 128-token prefix, own prompts of
//     4..32 tokens, outputs of 4..32, at most 8 running): prefill tokens computed and time to
//     first token (p50, p99), on vs off.
//
// Method: --reps repetitions; in each, the runs of a measurement one after another (policies in
// an order rotated from one repetition to the next); printed: medians over repetitions, and
// ratios as the median of the within-repetition ratios. Concurrency and token counts are exact
// (the step log), not timed. Before any figure is printed, every run's outputs are checked
// against the first policy's, request by request (greedy decoding: they must be identical); a
// mismatch exits non-zero.
//
// Build and run (Release, from the repository root):
//   cmake --build build-bench --target bench_serving
//   build-bench/bench/bench_serving --json bench/results/cpu-serving.json
// --help lists the options.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <kvlab/kvlab.hpp>

#include "support/builtin_model.hpp"
#include "support/cli.hpp"
#include "support/json.hpp"
#include "support/stats.hpp"

namespace {

using kvlab::BatchingPolicy;
using kvlab_support::median;
using kvlab_support::UsageError;

struct Options {
  int reps = 3;
  std::vector<int> threads = {1, 2};
  std::vector<std::string> models = {"stories260K", "stories15M-shape"};
  std::string models_dir;  // empty: kvlab_support::models_dir's default
  int requests = 64;
  int pool_tokens = 4096;
  int max_running = 64;
  int block_size = 16;
  std::string json;
};

bool parse(int argc, char** argv, Options& o) {
  using namespace kvlab_support;
  CLI::App app{
      "bench_serving: continuous batching against static batching and contiguous "
      "preallocation on the same model, kernels and KV memory: throughput, concurrency, batched "
      "decode, prefix caching (medians of repetitions)."};
  add_choice_list(app, "--models", o.models,
                  "stories260K (the checkpoint, skipped when absent), stories15M-shape (random "
                  "weights), tiny (the built-in test model)",
                  {"stories260K", "stories15M-shape", "tiny"});
  add_file(app, "--models-dir", o.models_dir, kvlab_support::kModelsDirHelp)->type_name("DIR");
  add_integer_list(app, "--threads", o.threads, "OpenMP thread counts", 1, 256);
  add_integer(app, "--reps", o.reps, "repetitions, medians reported", 1, 1000);
  add_integer(app, "--requests", o.requests, "requests of the mixed workload", 1, 1 << 16);
  add_integer(app, "--pool-tokens", o.pool_tokens, "KV memory of every policy, in tokens", 1,
              1 << 24);
  add_integer(app, "--max-running", o.max_running, "requests running at once, every policy", 1,
              1 << 16);
  add_integer(app, "--block-size", o.block_size, "tokens per block", 1, 1 << 12);
  add_file(app, "--json", o.json, "write the figures as JSON");
  if (!kvlab_support::parse(app, argc, argv)) return false;
  if (o.pool_tokens % o.block_size != 0)
    throw UsageError("--pool-tokens: expected a multiple of --block-size, got " +
                     std::to_string(o.pool_tokens));
  return true;
}

struct Run {
  kvlab::ServingSummary summary;
  std::vector<std::vector<int>> outputs;  // [requests] generated ids
  double decode_tok_s = 0;                // measurement 3: over all-decode steps
  std::int64_t prefill_tokens = 0;        // prompt tokens computed (recompute included)
};

Run serve(const std::shared_ptr<const kvlab::LlamaWeights>& weights,
          const std::vector<kvlab::Request>& requests, const kvlab::EngineConfig& config) {
  kvlab::Engine engine(weights, config);
  for (const kvlab::Request& r : requests) engine.submit(r);
  engine.run();
  Run run;
  run.summary = kvlab::summarize(engine);
  double decode_s = 0;
  std::int64_t decode_tokens = 0;
  for (const kvlab::StepRecord& s : engine.step_log()) {
    bool all_decode = !s.batch.empty();
    for (const kvlab::StepEntry& e : s.batch) {
      all_decode = all_decode && e.kind == kvlab::ChunkKind::Decode;
      if (e.kind == kvlab::ChunkKind::Prefill) run.prefill_tokens += e.tokens;
    }
    if (all_decode) {
      decode_s += s.end - s.start;
      decode_tokens += s.tokens();
    }
  }
  run.decode_tok_s = decode_s > 0 ? static_cast<double>(decode_tokens) / decode_s : 0;
  for (int id = 0; id < engine.scheduler().num_requests(); ++id)
    run.outputs.push_back(engine.output(id).tokens);
  return run;
}

kvlab::EngineConfig engine_config(const Options& o, BatchingPolicy policy, int max_running,
                                  bool prefix_caching) {
  kvlab::EngineConfig c;
  c.block_size = o.block_size;
  c.num_blocks = o.pool_tokens / o.block_size;
  c.scheduler.policy = policy;
  c.scheduler.max_running = max_running;
  c.scheduler.max_batched_tokens = 512;
  c.scheduler.prefix_caching = prefix_caching;
  return c;
}

struct Figures {  // one model and thread count: medians over repetitions
  std::string model;
  int threads = 0;
  double continuous_tok_s = 0, static_tok_s = 0, contiguous_tok_s = 0, continuous_over_static = 0;
  double mean_running_paged = 0, mean_running_contiguous = 0, peak_running_paged = 0,
         peak_running_contiguous = 0, static_mean_running = 0, loaded_running_paged = 0,
         loaded_running_contiguous = 0, loaded_running_static = 0;
  int preemptions = 0;
  double batch16_tok_s = 0, batch1_tok_s = 0, batch16_over_1 = 0;
  double prefix_on_prefill = 0, prefix_off_prefill = 0, prefix_on_ttft_p50 = 0,
         prefix_off_ttft_p50 = 0, prefix_on_ttft_p99 = 0, prefix_off_ttft_p99 = 0,
         prefix_hit_rate = 0;
};

bool same_outputs(const char* what, const Run& a, const Run& b) {
  for (std::size_t i = 0; i < a.outputs.size(); ++i) {
    if (a.outputs[i] != b.outputs[i]) {
      std::fprintf(stderr, "bench_serving: %s: request %zu's output differs between policies\n",
                   what, i);
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const auto code = kvlab_support::read_command_line("bench_serving", argc, argv, o, parse))
    return *code;
  if (!kvlab_support::can_write("bench_serving", "--json", o.json)) return 2;
  const std::string dir = kvlab_support::models_dir(o.models_dir);
  std::vector<Figures> all;
  for (const std::string& name : o.models) {
    std::shared_ptr<const kvlab::LlamaWeights> weights;
    try {
      if (name == "stories260K") {
        weights = std::make_shared<const kvlab::LlamaWeights>(
            kvlab::load_llama_checkpoint(dir + "/stories260K.bin"));
      } else {
        weights = kvlab_support::choose_model("", name == "tiny" ? "tiny" : "stories15M").weights;
      }
    } catch (const std::exception& e) {
      std::printf("%s: skipped (%s)\n", name.c_str(), e.what());
      continue;
    }
    const int vocab = weights->config.vocab_size;
    kvlab::WorkloadSpec mixed;
    mixed.requests = o.requests;
    mixed.prompt_min = 4;
    mixed.prompt_max = 64;
    mixed.output_min = 4;
    mixed.output_max = 192;
    const std::vector<kvlab::Request> mixed_requests = kvlab::make_workload(mixed, vocab);
    kvlab::WorkloadSpec shared = mixed;
    shared.shared_prefix = 128;
    shared.prompt_max = 32;
    shared.output_max = 32;
    const std::vector<kvlab::Request> shared_requests = kvlab::make_workload(shared, vocab);
    std::vector<kvlab::Request> batch16, batch1;
    for (int i = 0; i < 16; ++i) {
      kvlab::Request r;
      for (int t = 0; t < 8; ++t) r.prompt.push_back((31 * i + 7 * t + 1) % vocab);
      r.max_new_tokens = 129;  // one token from the prefill, then 128 decode steps
      batch16.push_back(r);
    }
    batch1.push_back(batch16.front());

    for (int threads : kvlab_support::usable_threads("bench_serving", o.threads)) {
      kvlab_support::set_threads(threads);
      std::vector<double> cont, stat, contig, ratio, b16, b1, b_ratio, on_ttft50, off_ttft50,
          on_ttft99, off_ttft99;
      Figures f;
      f.model = name;
      f.threads = threads;
      for (int rep = 0; rep < o.reps; ++rep) {
        std::fprintf(stderr, "bench_serving: %s, %d thread%s, repetition %d of %d\n", name.c_str(),
                     threads, threads == 1 ? "" : "s", rep + 1, o.reps);
        // 1 and 2: the three policies, in a rotated order.
        const BatchingPolicy order[3] = {BatchingPolicy::Continuous, BatchingPolicy::Static,
                                         BatchingPolicy::Contiguous};
        Run runs[3];
        for (int k = 0; k < 3; ++k) {
          const int p = (k + rep) % 3;
          runs[p] = serve(weights, mixed_requests, engine_config(o, order[p], o.max_running, true));
        }
        if (!same_outputs("mixed workload, static", runs[0], runs[1]) ||
            !same_outputs("mixed workload, contiguous", runs[0], runs[2]))
          return 1;
        cont.push_back(runs[0].summary.throughput_tok_s);
        stat.push_back(runs[1].summary.throughput_tok_s);
        contig.push_back(runs[2].summary.throughput_tok_s);
        ratio.push_back(runs[0].summary.throughput_tok_s / runs[1].summary.throughput_tok_s);
        f.mean_running_paged = runs[0].summary.mean_running;  // exact: the same every repetition
        f.peak_running_paged = runs[0].summary.peak_running;
        f.mean_running_contiguous = runs[2].summary.mean_running;
        f.peak_running_contiguous = runs[2].summary.peak_running;
        f.static_mean_running = runs[1].summary.mean_running;
        f.loaded_running_paged = runs[0].summary.mean_running_loaded;
        f.loaded_running_contiguous = runs[2].summary.mean_running_loaded;
        f.loaded_running_static = runs[1].summary.mean_running_loaded;
        f.preemptions = runs[0].summary.preemptions;
        // 3: a batch of 16 decoding together vs one alone.
        const Run one =
            serve(weights, batch1, engine_config(o, BatchingPolicy::Continuous, 16, false));
        const Run sixteen =
            serve(weights, batch16, engine_config(o, BatchingPolicy::Continuous, 16, false));
        if (one.outputs[0] != sixteen.outputs[0]) {
          std::fprintf(stderr,
                       "bench_serving: batch of 16: request 0 differs from its run alone\n");
          return 1;
        }
        b16.push_back(sixteen.decode_tok_s);
        b1.push_back(one.decode_tok_s);
        b_ratio.push_back(sixteen.decode_tok_s / one.decode_tok_s);
        // 4: prefix caching on and off, at most 8 running.
        const Run on =
            serve(weights, shared_requests, engine_config(o, BatchingPolicy::Continuous, 8, true));
        const Run off =
            serve(weights, shared_requests, engine_config(o, BatchingPolicy::Continuous, 8, false));
        if (!same_outputs("shared prefix, caching on vs off", on, off)) return 1;
        f.prefix_on_prefill = static_cast<double>(on.prefill_tokens);
        f.prefix_off_prefill = static_cast<double>(off.prefill_tokens);
        f.prefix_hit_rate = on.summary.prefix_hit_rate;
        on_ttft50.push_back(on.summary.ttft_s.p50);
        off_ttft50.push_back(off.summary.ttft_s.p50);
        on_ttft99.push_back(on.summary.ttft_s.p99);
        off_ttft99.push_back(off.summary.ttft_s.p99);
      }
      f.continuous_tok_s = median(cont);
      f.static_tok_s = median(stat);
      f.contiguous_tok_s = median(contig);
      f.continuous_over_static = median(ratio);
      f.batch16_tok_s = median(b16);
      f.batch1_tok_s = median(b1);
      f.batch16_over_1 = median(b_ratio);
      f.prefix_on_ttft_p50 = median(on_ttft50);
      f.prefix_off_ttft_p50 = median(off_ttft50);
      f.prefix_on_ttft_p99 = median(on_ttft99);
      f.prefix_off_ttft_p99 = median(off_ttft99);
      std::printf(
          "\n%s, %d thread%s (%d requests, pool %d tokens in blocks of %d, max running %d; "
          "medians of %d)\n",
          name.c_str(), threads, threads == 1 ? "" : "s", o.requests, o.pool_tokens, o.block_size,
          o.max_running, o.reps);
      std::printf(
          "  1. throughput    continuous %.1f tok/s, static %.1f, contiguous %.1f; "
          "continuous / static %.2fx\n",
          f.continuous_tok_s, f.static_tok_s, f.contiguous_tok_s, f.continuous_over_static);
      std::printf(
          "  2. concurrency   while requests wait: paged %.1f, contiguous %.1f: %.2fx "
          "(static %.1f); over all steps: paged mean %.1f (peak %.0f), contiguous %.1f "
          "(peak %.0f), static %.1f; preemptions %d\n",
          f.loaded_running_paged, f.loaded_running_contiguous,
          f.loaded_running_paged / f.loaded_running_contiguous, f.loaded_running_static,
          f.mean_running_paged, f.peak_running_paged, f.mean_running_contiguous,
          f.peak_running_contiguous, f.static_mean_running, f.preemptions);
      std::printf("  3. decode        batch of 16 %.1f tok/s, one %.1f tok/s: %.2fx\n",
                  f.batch16_tok_s, f.batch1_tok_s, f.batch16_over_1);
      std::printf(
          "  4. prefix cache  prefill tokens on %.0f / off %.0f (hit rate %.1f%%); TTFT p50 "
          "%.4f / %.4f s, p99 %.4f / %.4f s\n",
          f.prefix_on_prefill, f.prefix_off_prefill, 100 * f.prefix_hit_rate, f.prefix_on_ttft_p50,
          f.prefix_off_ttft_p50, f.prefix_on_ttft_p99, f.prefix_off_ttft_p99);
      std::fflush(stdout);
      all.push_back(f);
    }
  }
  if (!o.json.empty()) {
    using kvlab_support::Json;
    Json json = {{"reps", o.reps},
                 {"requests", o.requests},
                 {"pool_tokens", o.pool_tokens},
                 {"block_size", o.block_size},
                 {"max_running", o.max_running},
                 {"results", Json::array()}};
    for (const Figures& f : all) {
      json["results"].push_back({{"model", f.model},
                                 {"threads", f.threads},
                                 {"continuous_tok_s", f.continuous_tok_s},
                                 {"static_tok_s", f.static_tok_s},
                                 {"contiguous_tok_s", f.contiguous_tok_s},
                                 {"continuous_over_static", f.continuous_over_static},
                                 {"mean_running_paged", f.mean_running_paged},
                                 {"peak_running_paged", f.peak_running_paged},
                                 {"mean_running_contiguous", f.mean_running_contiguous},
                                 {"peak_running_contiguous", f.peak_running_contiguous},
                                 {"static_mean_running", f.static_mean_running},
                                 {"loaded_running_paged", f.loaded_running_paged},
                                 {"loaded_running_contiguous", f.loaded_running_contiguous},
                                 {"loaded_running_static", f.loaded_running_static},
                                 {"preemptions", f.preemptions},
                                 {"batch16_tok_s", f.batch16_tok_s},
                                 {"batch1_tok_s", f.batch1_tok_s},
                                 {"batch16_over_1", f.batch16_over_1},
                                 {"prefix_on_prefill_tokens", f.prefix_on_prefill},
                                 {"prefix_off_prefill_tokens", f.prefix_off_prefill},
                                 {"prefix_hit_rate", f.prefix_hit_rate},
                                 {"prefix_on_ttft_p50_s", f.prefix_on_ttft_p50},
                                 {"prefix_off_ttft_p50_s", f.prefix_off_ttft_p50},
                                 {"prefix_on_ttft_p99_s", f.prefix_on_ttft_p99},
                                 {"prefix_off_ttft_p99_s", f.prefix_off_ttft_p99}});
    }
    try {
      kvlab_support::write_json_file(o.json, json);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_serving: --json: %s\n", e.what());
      return 1;
    }
  }
  return 0;
}
