/// \file
/// \brief The vocabulary of a serving step, used by `Scheduler` and `Engine`.
///
/// It names the batching policies (`BatchingPolicy`), the scheduler's settings (`SchedulerConfig`),
/// what one step runs (`ScheduledChunk`, `StepPlan`) and what the engine logs of it (`StepRecord`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/config.hpp"

namespace kvlab {

/// How requests are batched; all three run the same model and kernels over the same paged pool
/// and differ only in the scheduler's decisions.
enum class BatchingPolicy {
  /// vLLM's rule: every step, running requests first, then waiting ones in arrival order, as
  /// many tokens as the budget allows; requests join and leave at every step; memory is taken
  /// block by block as sequences grow; chunked prefill, preemption by recompute, prefix caching.
  Continuous,
  /// A fixed batch admitted together when the engine is idle, padded to the longest: every
  /// prompt is padded to the batch's longest (the pad rows are computed, on scratch sequences),
  /// and a member that has finished keeps computing a pad row each step until the last member
  /// finishes; nobody joins before then. Each member reserves the padded rectangle's memory up
  /// front. No token budget: the batch's prompts run in one step.
  Static,
  /// Continuous scheduling, but each admitted request reserves `max_len` tokens of memory up
  /// front (a contiguous cache sized for the longest possible sequence, as in Orca and
  /// FasterTransformer); the K/V live in the pool's blocks, so the kernels are the same and the
  /// difference is the reserved memory.
  Contiguous,
};

/// "continuous", "static" or "contiguous".
inline const char* to_string(BatchingPolicy policy) {
  switch (policy) {
    case BatchingPolicy::Static:
      return "static";
    case BatchingPolicy::Contiguous:
      return "contiguous";
    case BatchingPolicy::Continuous:
      break;
  }
  return "continuous";
}

/// The policy named `name` ("continuous", "static" or "contiguous", as `to_string` names them).
/// \throws InvalidArgument for any other name.
inline BatchingPolicy parse_batching_policy(const std::string& name) {
  for (BatchingPolicy p :
       {BatchingPolicy::Continuous, BatchingPolicy::Static, BatchingPolicy::Contiguous}) {
    if (name == to_string(p)) return p;
  }
  detail::fail("kvlab::parse_batching_policy", "name", "continuous, static or contiguous",
               "'" + name + "'");
}

/// The scheduler's settings.
struct SchedulerConfig {
  BatchingPolicy policy = BatchingPolicy::Continuous;  ///< how requests are batched
  /// Tokens per step, all requests together (prefill chunks and decode tokens), >= 1.
  int max_batched_tokens = 256;
  /// Requests running at once (in a static batch: its size), >= 1.
  int max_running = 16;
  /// Free blocks that admitting a request must leave (so running requests can grow a little
  /// before anyone is preempted), >= 0.
  int watermark_blocks = 1;
  /// Reuse cached prefix blocks (continuous policy only; the baselines never share).
  bool prefix_caching = true;
  /// Tokens a request reserves under the contiguous policy; 0 means the model's context.
  int max_len = 0;
};

/// What a chunk of a step computes.
enum class ChunkKind {
  Prefill,  ///< prompt tokens (or, after a preemption, its prompt and output computed again)
  Decode,   ///< the request's last generated token, fed back
  Padding,  ///< pad rows of a static batch: computed, then thrown away
};

/// "prefill", "decode" or "padding".
inline const char* to_string(ChunkKind kind) {
  switch (kind) {
    case ChunkKind::Decode:
      return "decode";
    case ChunkKind::Padding:
      return "padding";
    case ChunkKind::Prefill:
      break;
  }
  return "prefill";
}

/// The new tokens of one sequence in a step.
struct ScheduledChunk {
  int request = -1;         ///< the request (pad rows: the static batch member they pad)
  int seq = -1;             ///< its sequence in the pool (a prompt's pad rows: a scratch one)
  int first_position = 0;   ///< position of its first new token
  std::vector<int> tokens;  ///< [n] the tokens to feed, n >= 1
  ChunkKind kind = ChunkKind::Prefill;  ///< what they are
  /// True when the chunk ends the request's known tokens: its last logits give the next token.
  bool samples = false;
};

/// One step's decisions.
struct StepPlan {
  std::vector<ScheduledChunk> chunks;  ///< [sequences] what runs, running requests first
  std::vector<int> admitted;           ///< requests that started running this step
  std::vector<int> preempted;          ///< requests preempted this step (back to waiting)
  int prefix_hit_tokens = 0;           ///< prompt tokens the admitted requests took from the cache
  int evicted_blocks = 0;              ///< cached blocks evicted to make room

  /// Tokens the step feeds, pad rows included.
  int tokens() const {
    int n = 0;
    for (const ScheduledChunk& c : chunks) n += static_cast<int>(c.tokens.size());
    return n;
  }
};

/// One request's part in a logged step.
struct StepEntry {
  int request = -1;  ///< the request (pad rows: the member of a static batch they pad)
  int tokens = 0;    ///< tokens it fed
  ChunkKind kind = ChunkKind::Prefill;  ///< prefill, decode or padding
};

/// What the engine records of one step (`Engine::step_log`): who ran, how much memory was in
/// use, what changed. Tests, tutorials and plots read it.
struct StepRecord {
  int step = 0;                  ///< index, from 0
  double start = 0.0;            ///< engine time at its start
  double end = 0.0;              ///< engine time at its end (when its tokens were drawn)
  std::vector<StepEntry> batch;  ///< [sequences] who ran
  std::vector<int> admitted;     ///< requests that started running
  std::vector<int> preempted;    ///< requests preempted
  std::vector<int> finished;     ///< requests that ended
  int waiting = 0;               ///< requests arrived and waiting, after the step
  int running = 0;               ///< requests running, after the step
  int blocks_used = 0;           ///< pool blocks held by sequences, after the step
  int blocks_free = 0;           ///< pool blocks on the free list
  int blocks_cached = 0;         ///< blocks held only by the prefix cache (evictable)
  int blocks_reserved = 0;       ///< blocks promised to requests and not yet taken
  int prefix_hit_tokens = 0;     ///< prompt tokens taken from the prefix cache
  int evicted_blocks = 0;        ///< cached blocks evicted

  /// Tokens fed, all sequences together.
  int tokens() const {
    int n = 0;
    for (const StepEntry& e : batch) n += e.tokens;
    return n;
  }
};

}  // namespace kvlab
