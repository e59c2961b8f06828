/// \file
/// \brief A request to a serving engine, what it gets back, and how a scheduler tracks it.
///
/// `Request` is what a user asks a serving engine for (a prompt, how many tokens, when to stop, how
/// to sample, when it arrives); `RequestOutput` is what it gets back (the generated ids, why
/// generation ended, when each token came); `RequestState` is the request as a scheduler tracks it.
/// Used by `Scheduler` and `Engine`; checked in `tests/serving/test_engine.cpp`.
#pragma once

#include <cstdint>
#include <vector>

namespace kvlab {

/// How the next token of a request is drawn (`Sampler`'s parameters): temperature 0 is greedy
/// (argmax), otherwise softmax(logits / temperature), restricted to the top-p nucleus when
/// top_p < 1, with a generator seeded per request, so a request draws the same tokens whatever
/// else runs beside it (up to the rounding of its logits).
struct SamplingParams {
  float temperature = 0.0f;  ///< 0: greedy; > 0: sample
  float top_p = 1.0f;        ///< nucleus in (0, 1]; 1 samples from the whole distribution
  std::uint64_t seed = 0;    ///< the request's own generator
};

/// One request to a serving engine.
struct Request {
  std::vector<int> prompt;    ///< [P] token ids, P >= 1
  int max_new_tokens = 16;    ///< tokens to generate at most, >= 1
  std::vector<int> stop_ids;  ///< drawing one of these ends generation (it is not output)
  SamplingParams sampling;    ///< how tokens are drawn
  /// When the request arrives, in the engine's time (seconds of its clock, or steps): the
  /// scheduler does not see it before.
  double arrival = 0.0;
};

/// Why a request's generation ended.
enum class FinishReason {
  None,     ///< not finished
  Stop,     ///< a stop id was drawn
  Length,   ///< max_new_tokens were generated
  Context,  ///< the sequence reached the model's context (the last token drawn is not fed)
};

/// "none", "stop", "length" or "context".
inline const char* to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::Context:
      return "context";
    case FinishReason::None:
      break;
  }
  return "none";
}

/// What a request got, filled in as it runs.
struct RequestOutput {
  std::vector<int> tokens;                   ///< [generated] the generated ids (no stop id)
  FinishReason finish = FinishReason::None;  ///< why it ended (None while it runs)
  std::vector<double> token_times;  ///< [generated] when each token was drawn (engine time)
  double arrival = 0.0;             ///< when it arrived
  double first_scheduled = -1.0;    ///< when it first ran (-1: not yet)
  double finished = -1.0;           ///< when it ended (-1: not yet)
  int preemptions = 0;              ///< times it was preempted (and recomputed)
  int prefix_hit_tokens = 0;        ///< tokens taken from the prefix cache, all admissions
  int prefix_lookup_tokens = 0;     ///< tokens looked up in the prefix cache, all admissions
  /// Rows it ran through the model: recomputation and, in a static batch, its pad rows included.
  int computed_tokens = 0;

  /// Time to first token: first token time - arrival (-1 before the first token).
  double ttft() const { return token_times.empty() ? -1.0 : token_times.front() - arrival; }
  /// Time per output token after the first: (last - first) / (generated - 1); 0 with fewer than 2.
  double tpot() const {
    return token_times.size() < 2 ? 0.0
                                  : (token_times.back() - token_times.front()) /
                                        static_cast<double>(token_times.size() - 1);
  }
};

/// Where a request is.
enum class RequestStatus {
  Pending,   ///< submitted, its arrival time not reached
  Waiting,   ///< arrived (or preempted), in the queue
  Running,   ///< holds a sequence in the pool
  Finished,  ///< done; its output is final
};

/// A request as the scheduler tracks it.
struct RequestState {
  int id = -1;                                    ///< its id (the order of submission)
  Request request;                                ///< what was asked
  RequestOutput output;                           ///< what it got so far
  RequestStatus status = RequestStatus::Pending;  ///< where it is
  std::vector<int> tokens;                        ///< [P + generated] prompt, then generated ids
  int computed = 0;          ///< tokens whose K/V are in its sequence (its length in the pool)
  int seq = -1;              ///< its sequence in the pool, or -1
  int promised = 0;          ///< blocks reserved for it and not yet taken
  bool recomputing = false;  ///< preempted, and not yet back where it was
  std::vector<std::int64_t> chain;  ///< [full blocks cached] its prefix-cache entries, in order
  long queue_order = -1;            ///< when it first entered the waiting queue (FCFS order)
  /// `Scheduler::forget` was called: the record is no longer readable, and its vectors are
  /// freed once no static batch needs it.
  bool forgotten = false;

  /// Tokens known and not yet in the sequence.
  int remaining() const { return static_cast<int>(tokens.size()) - computed; }
};

}  // namespace kvlab
