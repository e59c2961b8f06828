/// \file
/// \brief The partial softmax state of a subset of a query's keys, and how two such states merge.
///
/// The partial results of two disjoint subsets merge into the result over both by the log-sum-exp
/// rule: the arithmetic of split-K ("flash-decoding"), shared by host and device code. Checked in
/// the tests against one pass over all keys. How the keys are cut is in `core/split_k.hpp`.
#pragma once

#include <cmath>

#include "kvlab/config.hpp"

namespace kvlab {

/// The softmax-weighted sum of values for one query over a subset of its keys, kept in the form
/// in which two subsets merge exactly.
///
/// Over keys j of the subset, with scores s_j and value rows v_j:
///  - `max` = max_j s_j (minus infinity for an empty subset);
///  - `sum` = Σ_j exp(s_j − max);
///  - the accumulator (`head_dim` values, stored by the caller) = Σ_j exp(s_j − max) · v_j.
///
/// The attention output over the subset is accumulator / sum; over all keys it is the same
/// formula once every subset has been merged in (`merge_softmax_states`). Softmax is per query,
/// so cutting the keys of one query into parts and merging the parts loses nothing: this is how
/// a long context is spread over several workers (split-K).
template <typename T>
struct SoftmaxState {
  T max;  ///< largest score of the subset (-inf when empty)
  T sum;  ///< Σ exp(score − max) over the subset (0 when empty)
};

/// The state of an empty subset: max = −∞, sum = 0 (its accumulator must be zeros).
template <typename T>
KVLAB_HOST_DEVICE SoftmaxState<T> empty_softmax_state() {
  return SoftmaxState<T>{-INFINITY, T(0)};
}

/// The factors by which two accumulators combine when one subset is merged into another:
/// `acc = acc_a · a + acc_b · b` (see `merge_softmax_scales`).
template <typename T>
struct SoftmaxScales {
  T a;  ///< factor of subset a's accumulator: exp(a.max − M), or 0 if a is empty
  T b;  ///< factor of subset b's accumulator: exp(b.max − M), or 0 if b is empty
};

/// The merge of `merge_softmax_states` without the accumulators: merges state `b` into `a` and
/// returns the factors with which the accumulators combine, `acc_a[c] = acc_a[c] · a + acc_b[c]
/// · b` — for a caller that keeps the accumulators elsewhere, such as a GPU block whose threads
/// each hold some of the accumulator's values and rescale them by the factors one thread
/// computed. An empty `b` gives {1, 0}; an empty `a` becomes `b` and
/// gives {0, 1} (its accumulator is zeros).
template <typename T>
KVLAB_HOST_DEVICE SoftmaxScales<T> merge_softmax_scales(SoftmaxState<T>& a,
                                                        const SoftmaxState<T>& b) {
  if (b.sum == T(0)) return SoftmaxScales<T>{T(1), T(0)};  // b is empty: a stays
  if (a.sum == T(0)) {                                     // a is empty: the union is b
    a = b;
    return SoftmaxScales<T>{T(0), T(1)};
  }
  const T max = a.max > b.max ? a.max : b.max;
  using std::exp;
  const SoftmaxScales<T> scales{exp(a.max - max), exp(b.max - max)};  // both <= 1
  a.sum = a.sum * scales.a + b.sum * scales.b;
  a.max = max;
  return scales;
}

/// Merges subset b into subset a (disjoint subsets of one query's keys): afterwards `a` and
/// `acc_a` describe the union. With M = max(a.max, b.max):
/// `sum = a.sum·exp(a.max − M) + b.sum·exp(b.max − M)` and
/// `acc = acc_a·exp(a.max − M) + acc_b·exp(b.max − M)`. Either side may be empty; the rescaling
/// exponents are ≤ 0, so nothing overflows.
/// \param a      in: subset a; out: the union
/// \param acc_a  [head_dim] in: subset a's accumulator; out: the union's
/// \param b      subset b
/// \param acc_b  [head_dim]: subset b's accumulator
/// \param head_dim  values per accumulator
template <typename T>
KVLAB_HOST_DEVICE void merge_softmax_states(SoftmaxState<T>& a, T* acc_a, const SoftmaxState<T>& b,
                                            const T* acc_b, int head_dim) {
  if (b.sum == T(0)) return;           // b is empty: its accumulator is not read
  const bool a_empty = a.sum == T(0);  // then a's accumulator is not read either: the union is b
  const SoftmaxScales<T> scale = merge_softmax_scales(a, b);
  for (int c = 0; c < head_dim; ++c)
    acc_a[c] = a_empty ? acc_b[c] : acc_a[c] * scale.a + acc_b[c] * scale.b;
}

}  // namespace kvlab
