/// \file
/// \brief `PhaseTimes`: where the time of a model's steps goes.
///
/// The phases are the matrix products, the classifier, attention, RoPE, the norms and the rest,
/// measured with a steady clock where asked (`LlamaModel::time_phases`), so that the distance
/// between a step and its limit can be placed (`bench/bench_generate.cpp` prints it).
#pragma once

#include <chrono>

namespace kvlab {

/// Seconds spent in each kind of work of a model's steps, added up over the steps measured.
struct PhaseTimes {
  /// the layers' matrix products (`cpu::linear`): the q, k, v and o projections and the MLP's
  /// w1, w3 and w2
  double matmuls = 0;
  /// the classifier's product, logits = RMSNorm(x) · classifierᵀ (`cpu::linear`)
  double classifier = 0;
  /// the K/V store: keeping each layer's k and v (`KVStore::append`) and attending to them
  /// (`KVStore::attend`, the attention kernel)
  double attention = 0;
  /// rotating q and k to their positions (`RotaryEmbedding::apply`)
  double rope = 0;
  /// the RMSNorms (`cpu::rmsnorm`)
  double norms = 0;
  /// whole steps, from the embedding lookup to the logits
  double total = 0;

  /// The rest of the steps' time: the embedding lookup, SiLU(gate) ⊙ up, the residual additions,
  /// the copies between buffers and the steps' bookkeeping. The phases are measured inside the
  /// steps, so this is never below 0 but by rounding.
  double other() const { return total - matmuls - classifier - attention - rope - norms; }

  /// Adds every phase of `o`.
  PhaseTimes& operator+=(const PhaseTimes& o) {
    matmuls += o.matmuls;
    classifier += o.classifier;
    attention += o.attention;
    rope += o.rope;
    norms += o.norms;
    total += o.total;
    return *this;
  }
};

namespace detail {

/// Runs `f()` and, where `times` is not null, adds the seconds it took to `times->*phase`.
template <typename F>
void timed(PhaseTimes* times, double PhaseTimes::*phase, F&& f) {
  if (times == nullptr) {
    f();
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  f();
  times->*phase += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace detail
}  // namespace kvlab
