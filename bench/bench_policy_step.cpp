// bench_policy_step: what each cache policy costs a decode step's attention, at a context of 4k
// and 8k tokens, on SmolLM2-135M-Instruct's attention shape (30 layers; 9 query heads, 3 K/V heads
// of 64 values). The frontier's time axis (docs: "what a smaller cache costs").
//
// Each policy (kvlab::parse_cache_policy) is the store kvlab::make_policy_store makes of it for one
// sequence of --contexts tokens, fed in steps of 512; the store holds n − 1 tokens of random K/V
// (what a store keeps does not depend on the values; a heavy-hitter policy's choice does, and is
// then by position: no attention is run while filling). The step timed is the decode step of
// token n through the store, every layer: `begin_step`, then per layer `append` of the token's K
// and V and `attend` of its 9 queries, then `abort_step` (the store back to n − 1 tokens, for the
// next call). The weights' part of a step (projections, MLP, classifier) is the same for every
// policy and is not in it.
//
// Method (as bench_kv_dtype): per n, --reps repetitions; in each, every policy (in an order
// rotated from one repetition to the next) runs back to back for at least --min-time seconds and
// its mean time per step is kept. Printed per policy: the KV bytes it holds at n − 1 tokens (the
// store's own count, KVStore::bytes_used) and per token, the median step time, and time / the
// full fp32 cache's, the median over repetitions of the ratio within one repetition. The first
// policy is always the full fp32 cache ("cached"), added when not given.
//
// Which code a policy runs: a precision or a window on its own is kvlab's tuned stores
// (ContiguousStore, PagedStore: cpu::decode_attention, cpu::paged_decode_attention); K and V of two
// types, sinks, heavy hitters, or heads and layers kept whole are kvlab::SelectiveStore, the
// reference (matrix products per head over its decoded rows): its times are the reference's, not
// what a tuned kernel for that policy would take.
//
// Build and run (Release, from the repository root):
//   cmake --build build-bench --target bench_policy_step
//   build-bench/bench/bench_policy_step --policies-from bench/results/cpu-eval-smollm2.json
//     --policies-from bench/results/cpu-eval-smollm2-selective.json
//     --json bench/results/cpu-policy-step.json     (one command line)
// --help lists the options.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <kvlab/kvlab.hpp>

#include "support/cli.hpp"
#include "support/json.hpp"
#include "support/policy_option.hpp"
#include "support/stats.hpp"
#include "timing.hpp"

namespace {

using kvlab::RowMatrix;
using kvlab_support::Json;
using kvlab_support::median;
using kvlab_support::time_per_call;

constexpr int kFillStep = 512;  // tokens per step while a store is filled
constexpr std::uint64_t kSeed = 7;

struct Options {
  std::vector<std::string> policies;
  std::vector<std::string> policy_files;
  std::vector<int> contexts = {4096, 8192};
  int reps = 5;
  double min_time = 0.2;
  int threads = 2;
  std::string json;
};

bool parse(int argc, char** argv, Options& o) {
  using namespace kvlab_support;
  CLI::App app{
      "bench_policy_step: the decode step's attention (every layer) under each cache policy, "
      "on SmolLM2-135M's attention shape, at contexts of 4k and 8k tokens, against the full "
      "fp32 cache."};
  add_policies(app, "--policy", o.policies,
               std::string("a cache policy (repeatable); ") + policy_syntax());
  app.add_option("--policies-from", o.policy_files,
                 "a kvlab-eval JSON file: each of its policies (repeatable)")
      ->check(CLI::ExistingFile)
      ->type_name("FILE");
  add_integer_list(app, "--contexts", o.contexts,
                   "tokens of the sequence once the timed step is done (at most 8192, SmolLM2's "
                   "context)",
                   2, 8192);
  add_integer(app, "--reps", o.reps, "repetitions; medians are printed", 1, 1000);
  add_number(app, "--min-time", o.min_time, "seconds each policy runs per repetition", 0.0, 60.0);
  add_integer(app, "--threads", o.threads, "OpenMP threads", 1, 256);
  add_file(app, "--json", o.json, "also write the results as JSON");
  return kvlab_support::parse(app, argc, argv);
}

// SmolLM2-135M-Instruct's shape (its GGUF file's metadata): what a store's size and its
// attention's work depend on. No weights are read.
kvlab::LlamaConfig smollm2_shape() {
  kvlab::LlamaConfig c;
  c.dim = 576;
  c.hidden_dim = 1536;
  c.n_layers = 30;
  c.n_heads = 9;
  c.n_kv_heads = 3;
  c.vocab_size = 49152;
  c.seq_len = 8192;
  c.rope_theta = 100000.0f;
  return c;
}

// The policies of a kvlab-eval JSON file, in its order.
std::vector<std::string> policies_in(const std::string& path) {
  std::ifstream file(path);
  const Json json = Json::parse(file, nullptr, false);
  if (json.is_discarded() || !json.contains("policies") || !json["policies"].is_array())
    throw std::runtime_error("--policies-from: expected a kvlab-eval JSON file, got '" + path +
                             "'");
  std::vector<std::string> names;
  for (const Json& p : json["policies"]) names.push_back(p.at("policy").get<std::string>());
  return names;
}

// One policy's store, holding one sequence of n − 1 tokens.
struct Subject {
  std::string policy;
  std::shared_ptr<kvlab::KVStore<float>> store;
  int seq = 0;
};

Subject filled(const std::string& text, const kvlab::LlamaConfig& c, int n, kvlab::Rng& rng) {
  Subject s;
  s.policy = text;
  s.store = kvlab::make_policy_store(kvlab::parse_cache_policy(text), c, n, kFillStep);
  s.seq = s.store->add_sequence();
  const int width = c.kv_dim();
  RowMatrix<float> inputs;  // the store's layer-0 inputs (unused here)
  for (int t = 0; t < n - 1;) {
    const int rows = std::min({kFillStep, n - 1 - t, s.store->max_step_tokens()});
    const RowMatrix<float> x = RowMatrix<float>::Zero(rows, 1);  // [rows, 1]
    s.store->begin_step({s.seq}, {0, rows}, x, inputs);
    for (int l = 0; l < c.n_layers; ++l) {
      // [rows, kv_dim] each: random K and V
      const RowMatrix<float> k = kvlab::random_matrix<float>(rows, width, rng);
      const RowMatrix<float> v = kvlab::random_matrix<float>(rows, width, rng);
      s.store->append(l, k, v);
    }
    s.store->end_step();
    t += rows;
  }
  return s;
}

// The timed step: token n through every layer of the store, then the store back to n − 1.
struct Step {
  const kvlab::LlamaConfig& c;
  kvlab::AttentionShape shape;
  std::vector<RowMatrix<float>> k, v, q;  // [layers] of [1, kv_dim], [1, kv_dim], [1, q_width]
  RowMatrix<float> x = RowMatrix<float>::Zero(1, 1);  // [1, 1]
  RowMatrix<float> inputs, out;

  Step(const kvlab::LlamaConfig& config, kvlab::Rng& rng)
      : c(config), shape(config.n_heads, config.n_kv_heads, config.head_dim()) {
    for (int l = 0; l < c.n_layers; ++l) {
      k.push_back(kvlab::random_matrix<float>(1, c.kv_dim(), rng));
      v.push_back(kvlab::random_matrix<float>(1, c.kv_dim(), rng));
      q.push_back(kvlab::random_matrix<float>(1, shape.q_width(), rng));
    }
  }
  void operator()(Subject& s) {
    s.store->begin_step({s.seq}, {0, 1}, x, inputs);
    for (int l = 0; l < c.n_layers; ++l) {
      const auto u = static_cast<std::size_t>(l);
      s.store->append(l, k[u], v[u]);
      s.store->attend(l, shape, q[u], {0, 1}, out, nullptr);
    }
    s.store->abort_step();
  }
};

struct Result {
  std::string policy, store;
  int n = 0;
  std::size_t bytes = 0;
  double us = 0, ratio = 1;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const auto stop = kvlab_support::read_command_line("bench_policy_step", argc, argv, o, parse))
    return *stop;
  if (!kvlab_support::can_write("bench_policy_step", "--json", o.json)) return 2;
  try {
    kvlab_support::set_threads(o.threads);
    std::vector<std::string> names = {"cached"};  // the full fp32 cache first: the reference
    std::vector<std::string> given = o.policies;
    for (const std::string& f : o.policy_files)
      for (const std::string& p : policies_in(f)) given.push_back(p);
    for (const std::string& p : given) {
      const std::string name = kvlab::parse_cache_policy(p).name();
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
    const kvlab::LlamaConfig c = smollm2_shape();
    std::printf(
        "bench_policy_step: SmolLM2-135M's attention (30 layers, 9/3 heads x 64), %zu policies, "
        "%d thread%s, %d repetitions of at least %.2f s\n",
        names.size(), o.threads, o.threads == 1 ? "" : "s", o.reps, o.min_time);
    std::vector<Result> results;
    for (int n : o.contexts) {
      kvlab::Rng rng(kSeed);
      std::vector<Subject> subjects;
      for (const std::string& p : names) {
        std::fprintf(stderr, "\r  n = %d: filling %zu of %zu ", n, subjects.size() + 1,
                     names.size());
        subjects.push_back(filled(p, c, n, rng));
      }
      std::fprintf(stderr, "\n");
      Step step(c, rng);
      const std::size_t count = subjects.size();
      std::vector<std::vector<double>> seconds(count), ratios(count);  // [policy][rep]
      for (Subject& s : subjects) step(s);                             // warm-up
      for (int rep = 0; rep < o.reps; ++rep) {
        std::fprintf(stderr, "\r  n = %d: repetition %d of %d ", n, rep + 1, o.reps);
        std::vector<double> now(count);
        for (std::size_t i = 0; i < count; ++i) {
          const std::size_t p = (i + static_cast<std::size_t>(rep)) % count;
          now[p] = time_per_call([&] { step(subjects[p]); }, o.min_time);
        }
        for (std::size_t p = 0; p < count; ++p) {
          seconds[p].push_back(now[p]);
          ratios[p].push_back(now[p] / now[0]);
        }
      }
      std::fprintf(stderr, "\n");
      for (std::size_t p = 0; p < count; ++p) {
        Result r;
        r.policy = subjects[p].policy;
        r.store = subjects[p].store->name();
        r.n = n;
        r.bytes = subjects[p].store->bytes_used();
        r.us = median(seconds[p]) * 1e6;
        r.ratio = median(ratios[p]);
        results.push_back(r);
      }
    }
    std::printf("%6s %-12s %12s %11s %12s %10s  %s\n", "n", "store", "KV MiB held", "bytes/token",
                "step (us)", "time/full", "policy");
    for (const Result& r : results) {
      std::printf("%6d %-12s %12.1f %11.0f %12.0f %10.3f  %s\n", r.n, r.store.c_str(),
                  static_cast<double>(r.bytes) / (1 << 20),
                  static_cast<double>(r.bytes) / (r.n - 1), r.us, r.ratio, r.policy.c_str());
    }
    std::printf(
        "KV held at n − 1 tokens (KVStore::bytes_used); a step: append + attend in every layer "
        "(no projections, MLP or classifier).\n");
    if (!o.json.empty()) {
      Json json = {{"program", "bench_policy_step"},
                   {"shape", "SmolLM2-135M-Instruct: 30 layers, 9 query heads, 3 K/V heads of 64"},
                   {"threads", o.threads},
                   {"reps", o.reps},
                   {"min_time_s", o.min_time},
                   {"results", Json::array()}};
      for (const Result& r : results) {
        json["results"].push_back({{"policy", r.policy},
                                   {"store", r.store},
                                   {"n", r.n},
                                   {"kv_bytes_held", r.bytes},
                                   {"median_step_us", r.us},
                                   {"time_ratio_to_full", r.ratio}});
      }
      kvlab_support::write_json_file(o.json, json);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_policy_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
