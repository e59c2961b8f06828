// A long-lived serving engine under a stream of random requests: the scheduler's and the prefix
// cache's invariants after every step, finished requests rerun alone, resident memory sampled.
// Run short by tests/serving/test_engine.cpp, long by kvlab_stress.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvlab/kvlab.hpp"
#include "stress_support.hpp"

namespace kvlab_stress {

/// The settings of an engine run.
struct EngineStress {
  long steps = 2000;       ///< engine steps to run, then drain
  std::uint64_t seed = 1;  ///< the workload's generator
  kvlab::BatchingPolicy policy =
      kvlab::BatchingPolicy::Continuous;  ///< prefix caching on if continuous
  int verify_every = 10;  ///< rerun every n-th finished greedy request alone (0: none)
  long sample_every = 0;  ///< call `on_sample` every n steps (0: never)
  /// Take every finished request's output (`Engine::take_output`), as a long-running server
  /// does; off, the engine keeps every request's record.
  bool take_outputs = true;
};

/// A resident-memory sample of an engine run.
struct EngineSample {
  long step = 0;      ///< steps run
  long requests = 0;  ///< requests submitted
  long records = 0;   ///< request records the scheduler keeps (`Scheduler::kept_records`)
  long rss_kib = 0;   ///< the process's resident memory (-1: unknown)
};

/// What an engine run did.
struct EngineRun {
  long steps = 0;              ///< steps that ran, the drain included
  long submitted = 0;          ///< requests accepted
  long refused = 0;            ///< malformed requests refused at submission (as they must be)
  long finished = 0;           ///< requests that ended
  long preemptions = 0;        ///< requests preempted (their K/V recomputed later)
  long prefix_hit_tokens = 0;  ///< prompt tokens taken from the prefix cache
  long evicted_blocks = 0;     ///< cached blocks evicted for room
  long verified = 0;           ///< greedy requests whose tokens equal their run alone
  long near_ties = 0;  ///< verified requests that differed after a near-tie draw (not failures)
  std::vector<EngineSample> samples;  ///< every `sample_every` steps
};

/// The weights every engine run serves: kvlab's built-in tiny model (vocab 256, 3 layers).
inline std::shared_ptr<const kvlab::LlamaWeights> stress_weights() {
  static const auto weights =
      std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin());
  return weights;
}

namespace detail {

// The first relative lead of the winning logit below which a greedy draw is a near-tie: a
// request's rows share products with other requests' rows in the engine (another row count
// changes the GEMM's blocking), so its logits differ from its alone run by rounding only —
// test_engine.cpp measured at most 6.2e-7 (relative), and its tolerance is 3e-5.
constexpr double kNearTie = 2 * 3e-5;

// Reruns finished greedy request `id` alone (`generate`'s loop on a cached model of its own)
// and compares its tokens with the engine's. Returns false for a difference after a near-tie
// draw of the alone run.
// \throws Failure for any other difference.
inline bool verify_alone(const kvlab::Engine& engine, int id, long step) {
  const kvlab::Request& r = engine.scheduler().request(id).request;
  const std::vector<int>& got = engine.output(id).tokens;
  kvlab::LlamaModel model(stress_weights(), kvlab::LlamaBackend::Cached, 16,
                          engine.model().max_tokens(), engine.config().kv_dtype,
                          engine.config().window);
  kvlab::Sampler sampler(stress_weights()->config.vocab_size, 0.0f, 1.0f, r.sampling.seed);
  kvlab::RowVector<float> logits = model.prefill(r.prompt);  // [vocab_size]
  std::vector<int> alone;                                    // [generated]
  while (true) {
    const int t = sampler.sample(logits);
    const bool stop = std::find(r.stop_ids.begin(), r.stop_ids.end(), t) != r.stop_ids.end();
    const std::size_t k = alone.size();
    if (stop || k >= got.size() || got[k] != t) {
      if (stop && k == got.size()) return true;  // both stopped here
      std::vector<float> sorted(logits.data(), logits.data() + logits.size());
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      const double scale = std::max(1.0f, logits.cwiseAbs().maxCoeff());
      if ((sorted[0] - sorted[1]) / scale <= kNearTie) return false;
      check(false, step,
            "request " + std::to_string(id) + " drew other tokens than alone, from draw " +
                std::to_string(k) + " on (" + std::to_string(got.size()) + " drawn, alone " +
                std::to_string(t) + " at draw " + std::to_string(k) + ")");
    }
    alone.push_back(t);
    if (static_cast<int>(alone.size()) == r.max_new_tokens) break;
    if (static_cast<int>(r.prompt.size() + alone.size()) - 1 == engine.model().max_tokens()) break;
    logits = model.decode(t);
  }
  check(alone.size() == got.size(), step,
        "request " + std::to_string(id) + " drew " + std::to_string(got.size()) +
            " tokens, alone " + std::to_string(alone.size()));
  return true;
}

}  // namespace detail

/// A long-lived engine (`settings.policy`, prefix caching on under the continuous policy) over a
/// pool small enough to preempt and evict, fed a stream of random requests for `settings.steps`
/// steps and then drained: prompts of 1..30 tokens after one of four shared prefixes of 0..16
/// tokens, 1..24 new tokens, greedy or sampled, some with a stop id, some arriving a few steps
/// later, some running into the context (64 tokens); the number outstanding changes every 500
/// steps (1..12). One submission in 50 is malformed and must be refused with the engine
/// unchanged. The scheduler's invariants (reference counts, promised blocks, budgets, FCFS, the
/// prefix cache's own check) are checked after every step; every `verify_every`-th finished
/// greedy request is rerun alone and must draw the same tokens; every finished request's output
/// is taken (with `settings.take_outputs`) and must be what `output` gave; after the drain no
/// sequence and no record is left and every block is free or held by the prefix cache alone.
/// The engine keeps no step log (`EngineConfig::keep_step_log`), so with its outputs taken its
/// memory is bounded by the requests in flight.
inline EngineRun engine(const EngineStress& settings,
                        const std::function<void(const EngineSample&)>& on_sample = nullptr) {
  const auto weights = stress_weights();
  const int vocab = weights->config.vocab_size;
  kvlab::EngineConfig c;
  c.block_size = 4;
  c.num_blocks = 40;  // 160 tokens: a few requests at a time
  c.max_tokens = 64;
  c.clock = kvlab::EngineClock::Steps;
  c.check_invariants = true;
  c.keep_step_log = false;
  c.scheduler.policy = settings.policy;
  c.scheduler.max_batched_tokens = 32;  // prompts of up to 46 tokens are split into chunks
  c.scheduler.max_running = 8;
  c.scheduler.watermark_blocks = 1;
  c.scheduler.prefix_caching = settings.policy == kvlab::BatchingPolicy::Continuous;
  c.scheduler.max_len = settings.policy == kvlab::BatchingPolicy::Contiguous ? 64 : 0;
  kvlab::Engine engine(weights, c);

  kvlab::Rng rng(settings.seed);
  std::vector<std::vector<int>> prefixes;  // [4][0..16] shared prompt beginnings
  for (int p = 0; p < 4; ++p) {
    prefixes.emplace_back();
    const int n = 4 * static_cast<int>(rng.next_u64() % 5);
    for (int i = 0; i < n; ++i) prefixes.back().push_back(static_cast<int>(rng.next_u64() % 256));
  }
  const auto random_request = [&] {
    kvlab::Request r;
    r.prompt = prefixes[rng.next_u64() % prefixes.size()];
    const int tail = 1 + static_cast<int>(rng.next_u64() % 30);
    for (int i = 0; i < tail; ++i) r.prompt.push_back(static_cast<int>(rng.next_u64() % 256));
    r.max_new_tokens = 1 + static_cast<int>(rng.next_u64() % 24);
    if (rng.uniform() < 0.3) r.stop_ids = {static_cast<int>(rng.next_u64() % 256)};
    if (rng.uniform() >= 0.6) {
      r.sampling.temperature = static_cast<float>(rng.uniform(0.5, 1.5));
      r.sampling.top_p = rng.uniform() < 0.5 ? 1.0f : 0.9f;
    }
    r.sampling.seed = rng.next_u64();
    r.arrival =
        engine.now() + (rng.uniform() < 0.2 ? static_cast<double>(rng.next_u64() % 5) : 0.0);
    return r;
  };
  // A malformed request: each kind breaks one rule of `Scheduler::submit`.
  const auto malformed = [&] {
    kvlab::Request r = random_request();
    switch (rng.next_u64() % 5) {
      case 0:
        r.prompt.clear();
        break;
      case 1:
        r.prompt[rng.next_u64() % r.prompt.size()] = vocab;
        break;
      case 2:
        r.max_new_tokens = 0;
        break;
      case 3:
        r.sampling.temperature = std::nanf("");
        break;
      default:
        r.prompt.assign(65, 1);
        break;  // longer than the context
    }
    return r;
  };

  EngineRun run;
  std::vector<int> open;  // [unfinished] request ids, in submission order
  long greedy_finished = 0;
  int outstanding = 4;
  long next_change = 0, next_sample = settings.sample_every;
  const auto collect = [&](long step) {  // requests that ended in the last step
    for (std::size_t i = 0; i < open.size();) {
      const int id = open[i];
      const kvlab::RequestOutput& out = engine.output(id);
      if (out.finish == kvlab::FinishReason::None) {
        ++i;
        continue;
      }
      ++run.finished;
      const kvlab::Request& r = engine.scheduler().request(id).request;
      if (r.sampling.temperature == 0.0f && settings.verify_every > 0 &&
          ++greedy_finished % settings.verify_every == 0) {
        if (detail::verify_alone(engine, id, step))
          ++run.verified;
        else
          ++run.near_ties;
      }
      if (settings.take_outputs) {
        const std::vector<int> tokens = out.tokens;  // `out` goes with the record
        const kvlab::RequestOutput taken = engine.take_output(id);
        check(taken.tokens == tokens && taken.finish != kvlab::FinishReason::None, step,
              "take_output handed over another output than output(" + std::to_string(id) + ")");
        bool refused = false;
        try {
          (void)engine.output(id);
        } catch (const kvlab::InvalidArgument&) {
          refused = true;
        }
        check(refused, step, "request " + std::to_string(id) + "'s output is readable once taken");
      }
      open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
    }
  };
  const auto step = [&] {
    if (engine.step()) {
      const kvlab::StepRecord& s = engine.last_step();
      run.prefix_hit_tokens += s.prefix_hit_tokens;
      run.evicted_blocks += s.evicted_blocks;
    }
  };
  while (engine.steps() < settings.steps) {
    const long op = engine.steps();
    if (op >= next_change) {
      outstanding = 1 + static_cast<int>(rng.next_u64() % 12);
      next_change += 500;
    }
    while (static_cast<int>(open.size()) < outstanding) {
      if (rng.next_u64() % 50 == 0) {  // malformed: refused, and the engine unchanged
        const int requests = engine.scheduler().num_requests();
        const int unfinished = engine.scheduler().unfinished();
        bool refused = false;
        try {
          engine.submit(malformed());
        } catch (const kvlab::InvalidArgument&) {
          refused = true;
        }
        check(refused && engine.scheduler().num_requests() == requests &&
                  engine.scheduler().unfinished() == unfinished,
              op, "a malformed request was accepted, or its refusal changed the engine");
        ++run.refused;
        continue;
      }
      open.push_back(engine.submit(random_request()));
      ++run.submitted;
    }
    step();
    collect(op);
    if (settings.sample_every > 0 && engine.steps() >= next_sample) {
      const EngineSample s{engine.steps(), run.submitted, engine.scheduler().kept_records(),
                           resident_kib()};
      run.samples.push_back(s);
      if (on_sample) on_sample(s);
      next_sample += settings.sample_every;
    }
  }
  while (!engine.done()) {  // drain
    step();
    collect(engine.steps());
  }
  run.steps = engine.steps();
  run.preemptions = engine.scheduler().preemptions();
  const long end = run.steps;
  check(open.empty() && run.finished == run.submitted, end, "requests left unfinished");
  check(engine.scheduler().pool().sequences().empty(), end, "sequences left in the pool");
  const kvlab::BlockAllocator& alloc = engine.scheduler().pool().allocator();
  check(alloc.num_free() + engine.scheduler().prefix_cache().cached_blocks() == alloc.num_blocks(),
        end, "blocks held after the drain by someone other than the prefix cache");
  if (settings.take_outputs)
    check(engine.scheduler().kept_records() == 0, end, "records kept after every output was taken");
  return run;
}

}  // namespace kvlab_stress
