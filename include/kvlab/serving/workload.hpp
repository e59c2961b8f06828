/// \file
/// \brief `make_workload`: a reproducible stream of requests for serving experiments.
///
/// Prompt and output lengths are drawn uniformly from stated ranges, arrivals are Poisson at a
/// given rate, and an optional system prompt starts every request. Used by `kvlab-serve`, the
/// serving benchmark and the tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/core/random.hpp"
#include "kvlab/serving/request.hpp"

namespace kvlab {

/// The distributions of a generated workload.
struct WorkloadSpec {
  int requests = 32;       ///< how many, >= 1
  std::uint64_t seed = 1;  ///< the generator's seed: the same spec gives the same requests
  int prompt_min = 8;      ///< fewest own prompt tokens (after the shared prefix), >= 0
  int prompt_max = 64;     ///< most own prompt tokens: uniform in [prompt_min, prompt_max]
  int output_min = 8;      ///< fewest max_new_tokens, >= 1
  int output_max = 128;    ///< most max_new_tokens: uniform in [output_min, output_max]
  /// Arrivals per unit of engine time (a Poisson process: exponential gaps of mean 1 / rate);
  /// 0 means every request arrives at time 0.
  double rate = 0.0;
  /// Tokens of a system prompt that every request starts with (the same random ids), >= 0.
  int shared_prefix = 0;
};

/// `spec.requests` requests for a model of `vocab_size` tokens: prompt ids uniform in
/// [0, vocab_size), greedy sampling, no stop ids (so each generates exactly its max_new_tokens,
/// unless the context ends first), arrival times ascending.
/// \throws InvalidArgument for a bad range, count, rate or vocabulary.
inline std::vector<Request> make_workload(const WorkloadSpec& spec, int vocab_size) {
  constexpr const char* kWhere = "kvlab::make_workload";
  detail::require_at_least(kWhere, "spec.requests", spec.requests, 1);
  detail::require_at_least(kWhere, "spec.prompt_min", spec.prompt_min, 0);
  if (spec.prompt_max < spec.prompt_min)
    detail::fail(kWhere, "spec.prompt_max",
                 ">= spec.prompt_min (" + std::to_string(spec.prompt_min) + ")", spec.prompt_max);
  detail::require_at_least(kWhere, "spec.output_min", spec.output_min, 1);
  if (spec.output_max < spec.output_min)
    detail::fail(kWhere, "spec.output_max",
                 ">= spec.output_min (" + std::to_string(spec.output_min) + ")", spec.output_max);
  detail::require_at_least(kWhere, "spec.shared_prefix", spec.shared_prefix, 0);
  detail::require_at_least(kWhere, "spec.prompt_min + spec.shared_prefix",
                           spec.prompt_min + spec.shared_prefix, 1);
  detail::require_at_least(kWhere, "vocab_size", vocab_size, 1);
  if (!(spec.rate >= 0.0) || !std::isfinite(spec.rate))
    detail::fail(kWhere, "spec.rate", "a finite rate >= 0", spec.rate);
  Rng rng(spec.seed);
  const auto draw = [&rng](int lo, int hi) {  // uniform in [lo, hi]
    return lo + static_cast<int>(rng.next_u64() % static_cast<std::uint64_t>(hi - lo + 1));
  };
  std::vector<int> system(static_cast<std::size_t>(spec.shared_prefix));  // [shared_prefix]
  for (int& t : system) t = draw(0, vocab_size - 1);
  std::vector<Request> requests(static_cast<std::size_t>(spec.requests));
  double time = 0.0;
  for (Request& r : requests) {
    r.prompt = system;
    const int own = draw(spec.prompt_min, spec.prompt_max);
    for (int i = 0; i < own; ++i) r.prompt.push_back(draw(0, vocab_size - 1));
    r.max_new_tokens = draw(spec.output_min, spec.output_max);
    r.sampling.seed = rng.next_u64();
    if (spec.rate > 0.0) time += -std::log(1.0 - rng.uniform()) / spec.rate;  // exponential gap
    r.arrival = time;
  }
  return requests;
}

}  // namespace kvlab
