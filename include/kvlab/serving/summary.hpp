/// \file
/// \brief `ServingSummary`: the figures of a finished serving run.
///
/// They are computed from the engine's requests and step log: throughput, time to first token and
/// per output token (p50, p99), concurrency, memory use, preemptions, prefix-cache hits. Used by
/// `kvlab-serve`, the serving benchmark and tutorial 07; checked in
/// `tests/serving/test_engine.cpp`.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/serving/engine.hpp"

namespace kvlab {

/// The `q`-quantile (q in [0, 1]) of `values` by linear interpolation between the closest ranks
/// (numpy's default): the value at rank q * (n - 1). 0 for no values.
/// \throws InvalidArgument if `q` is not in [0, 1] (NaN included).
inline double quantile(std::vector<double> values, double q) {
  if (!(q >= 0.0 && q <= 1.0)) detail::fail("kvlab::quantile", "q", "in [0, 1]", q);
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double rank = q * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(rank));
  const std::size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (rank - static_cast<double>(lo)) * (values[hi] - values[lo]);
}

/// The median and the 99th percentile of a latency.
struct Percentiles {
  double p50 = 0.0;  ///< median
  double p99 = 0.0;  ///< 99th percentile
};

/// The figures of a serving run.
struct ServingSummary {
  int requests = 0;                   ///< requests finished
  std::int64_t prompt_tokens = 0;     ///< their prompt tokens
  std::int64_t generated_tokens = 0;  ///< tokens generated (stop ids not counted)
  std::int64_t computed_tokens = 0;   ///< rows fed to the model, pad rows and recompute included
  int steps = 0;                      ///< steps run
  double wall_s = 0.0;                ///< engine time from 0 to the end of the last step
  double throughput_tok_s = 0.0;      ///< generated tokens / wall_s
  Percentiles ttft_s;                 ///< time to first token, over requests
  Percentiles tpot_s;                 ///< time per output token after the first, over requests
  int peak_running = 0;               ///< most requests in one step's batch
  double mean_running = 0.0;          ///< requests per step's batch, on average
  /// Requests per step's batch, on average over the steps after which requests were still
  /// waiting: how many run at once when demand exceeds what fits (0 if none waited).
  double mean_running_loaded = 0.0;
  /// Blocks holding tokens / blocks held or reserved, averaged over steps: the share of the
  /// memory a policy set aside that holds K/V.
  double kv_utilisation = 0.0;
  int peak_blocks = 0;                 ///< most blocks held or reserved at the end of a step
  int preemptions = 0;                 ///< preemptions (each followed by a recompute)
  std::int64_t prefix_hit_tokens = 0;  ///< prompt tokens taken from the prefix cache
  /// prefix_hit_tokens / tokens looked up in the cache (every admission's known tokens).
  double prefix_hit_rate = 0.0;
};

/// The figures of `engine`'s run so far (finished requests only for the latencies; requests
/// whose output was taken, `Engine::take_output`, are left out of the per-request figures).
inline ServingSummary summarize(const Engine& engine) {
  ServingSummary s;
  const Scheduler& sched = engine.scheduler();
  std::vector<double> ttft, tpot;  // [finished requests]
  std::int64_t looked_up = 0;      // tokens looked up in the prefix cache
  for (int id = 0; id < sched.num_requests(); ++id) {
    if (sched.forgotten(id)) continue;
    const RequestState& r = sched.request(id);
    s.computed_tokens += r.output.computed_tokens;
    s.prefix_hit_tokens += r.output.prefix_hit_tokens;
    looked_up += r.output.prefix_lookup_tokens;
    if (r.status != RequestStatus::Finished) continue;
    ++s.requests;
    s.prompt_tokens += static_cast<std::int64_t>(r.request.prompt.size());
    s.generated_tokens += static_cast<std::int64_t>(r.output.tokens.size());
    if (r.output.ttft() >= 0) ttft.push_back(r.output.ttft());
    if (r.output.tokens.size() >= 2) tpot.push_back(r.output.tpot());
    s.preemptions += r.output.preemptions;
  }
  const std::vector<StepRecord>& log = engine.step_log();
  s.steps = static_cast<int>(log.size());
  double utilisation = 0.0;
  std::int64_t running = 0, loaded_running = 0, loaded_steps = 0;
  for (const StepRecord& step : log) {
    int requests = 0;  // distinct requests in the batch (a padded prompt has two chunks)
    for (std::size_t i = 0; i < step.batch.size(); ++i) {
      bool first = true;
      for (std::size_t j = 0; j < i; ++j)
        first = first && step.batch[j].request != step.batch[i].request;
      requests += first ? 1 : 0;
    }
    s.peak_running = std::max(s.peak_running, requests);
    running += requests;
    if (step.waiting > 0) {
      loaded_running += requests;
      ++loaded_steps;
    }
    const int set_aside = step.blocks_used + step.blocks_reserved;
    s.peak_blocks = std::max(s.peak_blocks, set_aside);
    if (set_aside > 0) utilisation += static_cast<double>(step.blocks_used) / set_aside;
  }
  if (!log.empty()) {
    s.wall_s = log.back().end;
    s.mean_running = static_cast<double>(running) / static_cast<double>(log.size());
    s.kv_utilisation = utilisation / static_cast<double>(log.size());
    if (loaded_steps > 0)
      s.mean_running_loaded =
          static_cast<double>(loaded_running) / static_cast<double>(loaded_steps);
  }
  s.throughput_tok_s = s.wall_s > 0 ? static_cast<double>(s.generated_tokens) / s.wall_s : 0.0;
  s.ttft_s = Percentiles{quantile(ttft, 0.5), quantile(ttft, 0.99)};
  s.tpot_s = Percentiles{quantile(tpot, 0.5), quantile(tpot, 0.99)};
  s.prefix_hit_rate =
      looked_up > 0 ? static_cast<double>(s.prefix_hit_tokens) / static_cast<double>(looked_up)
                    : 0.0;
  return s;
}

}  // namespace kvlab
