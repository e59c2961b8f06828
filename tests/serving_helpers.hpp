// Helpers shared by the serving tests (test_engine.cpp, test_engine_faults.cpp): a workload of
// requests arriving one after another, and an engine configuration on the step clock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvlab/serving/engine.hpp"
#include "kvlab/serving/request.hpp"
#include "kvlab/serving/workload.hpp"

namespace kvlab_test {

// `n` requests (`kvlab::make_workload` over a vocabulary of 256): prompts of 3..`prompt_max`
// tokens, the first `shared` common to all, outputs of `output_min`..`output_max` tokens,
// request i arriving at i * `gap`.
inline std::vector<kvlab::Request> arriving_workload(int n, int shared, int prompt_max,
                                                     int output_min, int output_max, double gap,
                                                     std::uint64_t seed) {
  kvlab::WorkloadSpec spec;
  spec.requests = n;
  spec.seed = seed;
  spec.prompt_min = 3;
  spec.prompt_max = prompt_max;
  spec.output_min = output_min;
  spec.output_max = output_max;
  spec.shared_prefix = shared;
  std::vector<kvlab::Request> requests = kvlab::make_workload(spec, 256);
  for (std::size_t i = 0; i < requests.size(); ++i)
    requests[i].arrival = gap * static_cast<double>(i);
  return requests;
}

// An engine of `num_blocks` blocks of `block_size` tokens on the step clock (deterministic),
// keeping every draw's logits and checking the scheduler's invariants after every step.
inline kvlab::EngineConfig step_clock_config(int block_size, int num_blocks) {
  kvlab::EngineConfig c;
  c.block_size = block_size;
  c.num_blocks = num_blocks;
  c.clock = kvlab::EngineClock::Steps;
  c.keep_logits = true;
  c.check_invariants = true;
  return c;
}

}  // namespace kvlab_test
