/// \file
/// \brief `generate`: the generation loop of llama2.c's `run.c` on a `LlamaModel`.
///
/// It prefills the prompt at once, then decodes one token a step, each token drawn by a `Sampler`,
/// and times the two phases. Used by `kvlab-generate`, the generation benchmark and tutorial 06.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/matrix.hpp"
#include "kvlab/model/llama_model.hpp"
#include "kvlab/model/sampler.hpp"

namespace kvlab {

/// What `generate` produced and how long each phase took.
struct Generation {
  /// the generated ids, in order (not the prompt; not the stop token)
  std::vector<int> tokens;
  int prompt_tokens = 0;       ///< tokens fed by the prefill
  int decode_steps = 0;        ///< decode calls (one token each) after the prefill
  double prefill_seconds = 0;  ///< the prefill's forward pass and the first sample
  double decode_seconds = 0;   ///< every decode step's forward pass and sample
  /// the samples alone (in the two phases above): drawing each token from its logits
  double sampling_seconds = 0;
  bool stopped = false;  ///< true if the stop token was drawn (and generation ended there)

  /// Prompt tokens per second of the prefill.
  double prefill_tokens_per_second() const {
    return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0.0;
  }
  /// Tokens per second of the decode phase.
  double decode_tokens_per_second() const {
    return decode_seconds > 0 ? decode_steps / decode_seconds : 0.0;
  }
};

/// Generates up to `steps` tokens after `prompt`, as llama2.c's `generate()`:
///  1. prefill: the whole prompt in one `LlamaModel::prefill` (run.c feeds it one token at a
///     time; the result is the same up to rounding), and the first token sampled from the
///     logits after it;
///  2. decode: each later token is fed back with `LlamaModel::decode` and the next one sampled
///     from its logits.
/// The last token drawn is not fed (nothing would read its logits), so the model ends at
/// position `prompt.size() + steps - 1`. Generation stops early when `stop_token` is drawn
/// (llama2.c stops at BOS, id 1, which its TinyStories models emit between stories); -1 never
/// stops. Time spent in `on_token` (printing) is not counted in the phases.
///
/// \param model       a model; generation continues from its current position
/// \param sampler     the sampling rule and its seeded generator
/// \param prompt      [P] token ids, P >= 1 (llama2.c starts every prompt with BOS)
/// \param steps       tokens to generate, >= 1
/// \param on_token    if set, called with each generated token as soon as it is drawn
/// \param stop_token  the token that ends generation (not included in the result), or -1
/// \throws InvalidArgument if `prompt` is empty or has a bad id, `steps < 1`, `stop_token` is
///         neither -1 nor an id of the vocabulary, or the model cannot hold
///         `prompt.size() + steps - 1` more tokens (nothing is run then).
inline Generation generate(LlamaModel& model, Sampler& sampler, const std::vector<int>& prompt,
                           int steps, const std::function<void(int)>& on_token = nullptr,
                           int stop_token = -1) {
  constexpr const char* kWhere = "kvlab::generate";
  using Clock = std::chrono::steady_clock;
  detail::require_at_least(kWhere, "prompt.size()", prompt.size(), std::size_t{1});
  detail::require_at_least(kWhere, "steps", steps, 1);
  if (stop_token < -1 || stop_token >= model.config().vocab_size)
    detail::fail(kWhere, "stop_token",
                 "-1 (none) or an id in [0, " + std::to_string(model.config().vocab_size) + ")",
                 stop_token);
  const long room = static_cast<long>(model.max_tokens()) - model.position() -
                    static_cast<long>(prompt.size()) + 1;
  if (steps > room) {
    detail::fail(kWhere, "steps",
                 "at most " + std::to_string(room) + " (max_tokens " +
                     std::to_string(model.max_tokens()) + " - position " +
                     std::to_string(model.position()) + " - prompt " +
                     std::to_string(prompt.size()) + " + 1)",
                 steps);
  }
  Generation g;
  g.prompt_tokens = static_cast<int>(prompt.size());
  // The next token drawn from `logits`, its time added to g.sampling_seconds.
  const auto sample = [&](const RowVector<float>& logits) {
    const auto at = Clock::now();
    const int id = sampler.sample(logits);
    g.sampling_seconds += std::chrono::duration<double>(Clock::now() - at).count();
    return id;
  };
  auto start = Clock::now();
  int next = sample(model.prefill(prompt));  // 1. prefill, first token
  g.prefill_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  while (true) {
    if (next == stop_token) {
      g.stopped = true;
      break;
    }
    g.tokens.push_back(next);
    if (on_token) on_token(next);
    if (static_cast<int>(g.tokens.size()) == steps) break;
    start = Clock::now();
    next = sample(model.decode(next));  // 2. decode: feed the last token, draw the next
    g.decode_seconds += std::chrono::duration<double>(Clock::now() - start).count();
    ++g.decode_steps;
  }
  return g;
}

}  // namespace kvlab
