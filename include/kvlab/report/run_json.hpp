/// \file
/// \brief The serving run as JSON, for scripts and plots.
///
/// `write_step_log` writes the step log as JSON lines, one object per step; `write_run_json` writes
/// the run's summary with every request's prompt and output ids, so that runs under different
/// policies can be compared request by request. Written by `kvlab-serve`; read by the docs' plot of
/// tutorial 07.
#pragma once

#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "kvlab/serving/engine.hpp"
#include "kvlab/serving/summary.hpp"

namespace kvlab {

namespace detail {

// `x` as a JSON number (17 significant digits; non-finite values, which JSON lacks, as null).
inline std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", x);
  return text;
}

// `values` as a JSON array.
template <typename Int>
std::string json_array(const std::vector<Int>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i)
    out += (i == 0 ? "" : ",") + std::to_string(values[i]);
  return out + "]";
}

}  // namespace detail

/// One step of the log as a JSON object on one line:
/// `{"step":0,"start":0,"end":1,"batch":[{"request":0,"tokens":5,"kind":"prefill"}],
/// "admitted":[0],"preempted":[],"finished":[],"waiting":0,"running":1,"blocks_used":1,
/// "blocks_free":63,"blocks_cached":0,"blocks_reserved":0,"prefix_hit_tokens":0,
/// "evicted_blocks":0}`.
inline std::string to_json(const StepRecord& s) {
  std::string batch = "[";
  for (std::size_t i = 0; i < s.batch.size(); ++i) {
    const StepEntry& e = s.batch[i];
    batch += std::string(i == 0 ? "" : ",") + "{\"request\":" + std::to_string(e.request) +
             ",\"tokens\":" + std::to_string(e.tokens) + ",\"kind\":\"" + to_string(e.kind) + "\"}";
  }
  batch += "]";
  return "{\"step\":" + std::to_string(s.step) + ",\"start\":" + detail::json_number(s.start) +
         ",\"end\":" + detail::json_number(s.end) + ",\"batch\":" + batch +
         ",\"admitted\":" + detail::json_array(s.admitted) +
         ",\"preempted\":" + detail::json_array(s.preempted) +
         ",\"finished\":" + detail::json_array(s.finished) +
         ",\"waiting\":" + std::to_string(s.waiting) + ",\"running\":" + std::to_string(s.running) +
         ",\"blocks_used\":" + std::to_string(s.blocks_used) +
         ",\"blocks_free\":" + std::to_string(s.blocks_free) +
         ",\"blocks_cached\":" + std::to_string(s.blocks_cached) +
         ",\"blocks_reserved\":" + std::to_string(s.blocks_reserved) +
         ",\"prefix_hit_tokens\":" + std::to_string(s.prefix_hit_tokens) +
         ",\"evicted_blocks\":" + std::to_string(s.evicted_blocks) + "}";
}

/// Writes `engine`'s step log as JSON lines: one `to_json(record)` per line.
inline void write_step_log(std::ostream& out, const Engine& engine) {
  for (const StepRecord& s : engine.step_log()) out << to_json(s) << '\n';
}

/// Writes `engine`'s run as one JSON object: the policy and settings, the figures of
/// `summarize(engine)` (latencies as `{"p50": ..., "p99": ...}` in seconds of the engine's
/// clock) and `outputs`, one `{"id": i, "prompt": [ids], "output": [ids], "finish": "..."}` per
/// request in submission order (those whose output was taken left out). `ids[i]`, when given, is
/// request i's id in the output (a workload file's own ids, written as they are: JSON values);
/// otherwise i.
/// \throws InvalidArgument (writing nothing) if `ids` is neither empty nor one per request.
inline void write_run_json(std::ostream& out, const Engine& engine,
                           const std::vector<std::string>& ids = {}) {
  if (!ids.empty() && ids.size() != static_cast<std::size_t>(engine.scheduler().num_requests())) {
    detail::fail("kvlab::write_run_json", "ids.size()",
                 "0 or " + std::to_string(engine.scheduler().num_requests()) + " (the requests)",
                 ids.size());
  }
  const ServingSummary s = summarize(engine);
  const SchedulerConfig& c = engine.scheduler().config();
  const auto pct = [](const Percentiles& p) {
    return "{\"p50\":" + detail::json_number(p.p50) + ",\"p99\":" + detail::json_number(p.p99) +
           "}";
  };
  out << "{\"policy\":\"" << to_string(c.policy) << "\""
      << ",\"block_size\":" << engine.config().block_size
      << ",\"num_blocks\":" << engine.config().num_blocks
      << ",\"max_batched_tokens\":" << c.max_batched_tokens << ",\"max_running\":" << c.max_running
      << ",\"prefix_caching\":" << (c.prefix_caching ? "true" : "false")
      << ",\"requests\":" << s.requests << ",\"prompt_tokens\":" << s.prompt_tokens
      << ",\"generated_tokens\":" << s.generated_tokens
      << ",\"computed_tokens\":" << s.computed_tokens << ",\"steps\":" << s.steps
      << ",\"wall_s\":" << detail::json_number(s.wall_s)
      << ",\"throughput_tok_s\":" << detail::json_number(s.throughput_tok_s)
      << ",\"ttft_s\":" << pct(s.ttft_s) << ",\"tpot_s\":" << pct(s.tpot_s)
      << ",\"peak_running\":" << s.peak_running
      << ",\"mean_running\":" << detail::json_number(s.mean_running)
      << ",\"mean_running_loaded\":" << detail::json_number(s.mean_running_loaded)
      << ",\"kv_utilisation\":" << detail::json_number(s.kv_utilisation)
      << ",\"peak_blocks\":" << s.peak_blocks << ",\"preemptions\":" << s.preemptions
      << ",\"prefix_hit_tokens\":" << s.prefix_hit_tokens
      << ",\"prefix_hit_rate\":" << detail::json_number(s.prefix_hit_rate) << ",\"outputs\":[";
  const Scheduler& sched = engine.scheduler();
  bool first = true;
  for (int id = 0; id < sched.num_requests(); ++id) {
    if (sched.forgotten(id)) continue;  // its output was taken
    const RequestState& r = sched.request(id);
    const std::string name = static_cast<std::size_t>(id) < ids.size()
                                 ? ids[static_cast<std::size_t>(id)]
                                 : std::to_string(id);
    out << (first ? "" : ",") << "\n{\"id\":" << name
        << ",\"prompt\":" << detail::json_array(r.request.prompt)
        << ",\"output\":" << detail::json_array(r.output.tokens) << ",\"finish\":\""
        << to_string(r.output.finish) << "\"}";
    first = false;
  }
  out << "]}\n";
}

}  // namespace kvlab
