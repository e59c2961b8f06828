/// \file
/// \brief `LlamaCounters`: the exact work of a `LlamaModel`.
///
/// It holds the attention block's counts (`CostCounters`) and, beside them, the multiply-adds of
/// the MLP and the classifier. Checked in the tests against closed forms for the whole model.
#pragma once

#include <cstdint>

#include "kvlab/core/counters.hpp"

namespace kvlab {

/// The work of a `LlamaModel`, counted exactly.
///
/// `attention` counts what kvlab's decoders count (`CostCounters`): q and K/V projections per
/// token, layer and head, their multiply-adds and those of the output projection, and the
/// attention kernels' dot products and bytes. The MLP and the classifier are counted beside it
/// (they cost the same per computed position with or without a cache, but the naive backend
/// computes more positions), so that `macs()` is every multiply-add of the matrix products.
struct LlamaCounters {
  /// projections q, k, v, o and attention, as `CostCounters` defines them
  CostCounters attention;
  /// multiply-adds of w1, w3 and w2: 3 * dim * hidden_dim per computed position
  std::uint64_t mlp_macs = 0;
  /// multiply-adds of the classifier: dim * vocab_size per logits row
  std::uint64_t classifier_macs = 0;

  /// Every multiply-add of the matrix products: attention + MLP + classifier.
  std::uint64_t macs() const { return attention.macs + mlp_macs + classifier_macs; }

  /// Adds every count of `other`.
  LlamaCounters& operator+=(const LlamaCounters& other) {
    attention += other.attention;
    mlp_macs += other.mlp_macs;
    classifier_macs += other.classifier_macs;
    return *this;
  }
  /// True when every count is equal.
  bool operator==(const LlamaCounters& o) const {
    return attention == o.attention && mlp_macs == o.mlp_macs &&
           classifier_macs == o.classifier_macs;
  }
  /// True when any count differs.
  bool operator!=(const LlamaCounters& o) const { return !(*this == o); }
};

}  // namespace kvlab
