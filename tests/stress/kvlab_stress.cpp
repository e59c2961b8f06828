// kvlab_stress: long random operation sequences against models of what must hold (the
// harnesses beside it),
// the long form of the unit tests' short runs. The block allocator, the paged cache (block sizes
// 1, 3 and 16, both layouts) and a long-lived serving engine under each batching policy (prefix
// caching on under the continuous one), every invariant checked after every operation; the
// engine's resident memory sampled as it runs. Exits 1 at the first broken invariant, or when a
// path the run is meant to exercise did not run (a pool that never ran dry, no preemption, no
// prefix hit, ...).
//
//   kvlab_stress --allocator-ops 10000000 --cache-ops 10000000 --engine-steps 100000
//       --sample-every 1000 --rss-csv rss.csv
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "allocator_stress.hpp"
#include "engine_stress.hpp"
#include "paged_cache_stress.hpp"
#include "support/cli.hpp"

namespace {

struct Options {
  long allocator_ops = 1000000;
  long cache_ops = 600000;
  long engine_steps = 3000;
  std::vector<kvlab::BatchingPolicy> policies = {kvlab::BatchingPolicy::Continuous,
                                                 kvlab::BatchingPolicy::Static,
                                                 kvlab::BatchingPolicy::Contiguous};
  long seed = 1;
  long sample_every = 1000;
  bool keep_records = false;
  std::string rss_csv;
};

bool parse_options(int argc, char** argv, Options& options) {
  using namespace kvlab_support;
  constexpr long long kMax = 1LL << 40;
  CLI::App app{
      "kvlab_stress: long random operation sequences against the block allocator, the paged "
      "cache and a serving engine under each batching policy, every invariant checked after "
      "every operation."};
  std::vector<std::string> policies = {"continuous", "static", "contiguous"};
  add_integer(app, "--allocator-ops", options.allocator_ops, "block allocator operations (0 skips)",
              0, kMax);
  add_integer(app, "--cache-ops", options.cache_ops,
              "paged-cache operations, shared by 6 runs: block sizes 1, 3 and 16, NHD and HND (0 "
              "skips)",
              0, kMax);
  add_integer(app, "--engine-steps", options.engine_steps,
              "engine steps per batching policy (continuous with prefix caching, static, "
              "contiguous), then a drain (0 skips)",
              0, 1LL << 30);
  add_choice_list(app, "--policies", policies,
                  "the engines' batching policies (one per process measures each one's memory)",
                  {"continuous", "static", "contiguous"});
  add_integer(app, "--seed", options.seed, "the generators' seed", 0, kMax);
  add_integer(app, "--sample-every", options.sample_every,
              "sample the resident memory every N engine steps", 1, 1LL << 30);
  app.add_flag("--keep-records", options.keep_records,
               "take no request's output: the engine keeps every request's record");
  add_file(app, "--rss-csv", options.rss_csv,
           "write the samples: policy,step,requests,records,rss_kib");
  if (!kvlab_support::parse(app, argc, argv)) return false;
  options.policies.clear();
  for (const std::string& p : policies) options.policies.push_back(kvlab::parse_batching_policy(p));
  return true;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Prints "kvlab_stress: <what> did not run" and returns false unless `ran`: a run meant to
// exercise a path that never took it proves nothing about that path.
bool exercised(bool ran, const std::string& what) {
  if (!ran) std::fprintf(stderr, "kvlab_stress: %s did not run\n", what.c_str());
  return ran;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (const auto stop =
          kvlab_support::read_command_line("kvlab_stress", argc, argv, options, parse_options))
    return *stop;
  if (!kvlab_support::can_write("kvlab_stress", "--rss-csv", options.rss_csv)) return 2;
  const auto seed = static_cast<std::uint64_t>(options.seed);
  bool ok = true;
  try {
    if (options.allocator_ops > 0) {
      const auto start = std::chrono::steady_clock::now();
      std::fprintf(stderr, "kvlab_stress: allocator, %ld operations ...\n", options.allocator_ops);
      const kvlab_stress::AllocatorRun r = kvlab_stress::allocator(options.allocator_ops, seed);
      std::printf(
          "allocator: %ld operations, %ld refused for want of blocks, %ld forks, %ld ends: "
          "every invariant held (%.1f s)\n",
          r.operations, r.exhausted, r.forks, r.ends, seconds_since(start));
      ok &= exercised(r.operations < 1000 || r.exhausted > 0, "allocator: running out of blocks");
    }
    if (options.cache_ops > 0) {
      const long each = (options.cache_ops + 5) / 6;
      for (kvlab::KVLayout layout : {kvlab::KVLayout::NHD, kvlab::KVLayout::HND}) {
        for (int block_size : {1, 3, 16}) {
          const auto start = std::chrono::steady_clock::now();
          const std::string name = std::string("paged cache, ") + kvlab::to_string(layout) +
                                   ", block size " + std::to_string(block_size);
          std::fprintf(stderr, "kvlab_stress: %s, %ld operations ...\n", name.c_str(), each);
          const kvlab_stress::PagedCacheRun r = kvlab_stress::paged_cache(
              each, seed * 7919 + static_cast<std::uint64_t>(block_size), layout, block_size);
          std::printf(
              "%s: %ld operations, %ld appends refused for want of blocks, %ld forks, %ld "
              "truncations, %ld sequences read back whole: every invariant held (%.1f s)\n",
              name.c_str(), r.operations, r.out_of_blocks, r.forks, r.truncations,
              r.contents_checked, seconds_since(start));
          ok &= exercised(r.operations < 1000 || (r.out_of_blocks > 0 && r.contents_checked > 0),
                          name + ": running out of blocks and reading back");
        }
      }
    }
    if (options.engine_steps > 0) {
      std::ofstream csv;
      if (!options.rss_csv.empty()) {
        csv.open(options.rss_csv);
        csv << "policy,step,requests,records,rss_kib\n";
      }
      for (kvlab::BatchingPolicy policy : options.policies) {
        const auto start = std::chrono::steady_clock::now();
        const std::string name = std::string("engine, ") + kvlab::to_string(policy) + " policy";
        std::fprintf(stderr, "kvlab_stress: %s, %ld steps ...\n", name.c_str(),
                     options.engine_steps);
        kvlab_stress::EngineStress settings;
        settings.steps = options.engine_steps;
        settings.seed = seed;
        settings.policy = policy;
        settings.sample_every = options.sample_every;
        settings.take_outputs = !options.keep_records;
        const kvlab_stress::EngineRun r =
            kvlab_stress::engine(settings, [&](const kvlab_stress::EngineSample& s) {
              std::fprintf(stderr,
                           "kvlab_stress: %s: step %ld, %ld requests, %ld records kept, resident "
                           "%ld KiB\n",
                           name.c_str(), s.step, s.requests, s.records, s.rss_kib);
              if (csv.is_open())
                csv << kvlab::to_string(policy) << ',' << s.step << ',' << s.requests << ','
                    << s.records << ',' << s.rss_kib << '\n';
            });
        std::printf(
            "%s: %ld steps, %ld requests served, %ld malformed refused, %ld preemptions, "
            "%ld prompt tokens from the prefix cache, %ld blocks evicted, %ld greedy "
            "requests equal to their run alone (%ld near-ties): every invariant held "
            "(%.1f s)\n",
            name.c_str(), r.steps, r.finished, r.refused, r.preemptions, r.prefix_hit_tokens,
            r.evicted_blocks, r.verified, r.near_ties, seconds_since(start));
        if (r.samples.size() >= 2) {
          const kvlab_stress::EngineSample& first = r.samples.front();
          const kvlab_stress::EngineSample& last = r.samples.back();
          const double per_request =
              1024.0 * static_cast<double>(last.rss_kib - first.rss_kib) /
              static_cast<double>(std::max(1L, last.requests - first.requests));
          std::printf(
              "%s: resident memory %ld KiB at step %ld (%ld requests, %ld records kept), %ld KiB "
              "at step %ld (%ld requests, %ld records kept): %+.0f bytes per request between\n",
              name.c_str(), first.rss_kib, first.step, first.requests, first.records, last.rss_kib,
              last.step, last.requests, last.records, per_request);
        }
        if (options.engine_steps >= 1000) {
          ok &= exercised(r.refused > 0 && r.verified > 0, name + ": refusals and alone reruns");
          if (policy == kvlab::BatchingPolicy::Continuous)
            ok &= exercised(r.preemptions > 0 && r.prefix_hit_tokens > 0 && r.evicted_blocks > 0,
                            name + ": preemption, prefix hits and eviction");
        }
      }
    }
  } catch (const kvlab_stress::Failure& e) {
    std::fprintf(stderr, "kvlab_stress: invariant broken: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvlab_stress: %s\n", e.what());
    return 1;
  }
  return ok ? 0 : 1;
}
