/// \file
/// \brief `CostCounters`: exact counts of the work an attention path does (projections, dot
/// products, bytes of K/V read, multiply-accumulates). Tests compare them with closed forms.
#pragma once

#include <cstdint>

#include "kvlab/config.hpp"

namespace kvlab {

/// Exact counts of the work done by kvlab's attention paths and decoders.
///
/// Every kernel and decoder that takes a `CostCounters*` adds to it what it computed (nothing
/// when the pointer is null). The counts are of work actually performed, not estimates.
///
/// What is Θ(n²) and what Θ(n) — over `n` decoded tokens of a one-layer model, per K/V head:
/// | quantity | naive (no cache) | cached |
/// |---|---|---|
/// | `kv_projections` in step t | t | 1 |
/// | `kv_projections` in total | n(n+1)/2: Θ(n²) | n: Θ(n) |
/// | `qk_dots` in step t (per query head) | t | t |
/// | `qk_dots` in total (per query head) | n(n+1)/2 | n(n+1)/2 |
///
/// So the cache removes the quadratic *projection* work; the attention scores stay Θ(t) per
/// step with or without it (every new query must meet every past key). With L > 1 layers the
/// naive decoder must also recompute every earlier position's output in layers 0..L-2, so its
/// `qk_dots` become Θ(t²) per step and Θ(n³) in total, while the cached decoder's stay Θ(t).
struct CostCounters {
  /// Query vectors projected: one per (token, layer, query head).
  std::uint64_t q_projections = 0;
  /// K/V projections: one per (token, layer, K/V head), counting the key and the value vector
  /// of that head together.
  std::uint64_t kv_projections = 0;
  /// Query-key dot products computed: one per (query head, query token, key token). A path that
  /// materialises the full score matrix counts its masked entries too, since it computes them.
  std::uint64_t qk_dots = 0;
  /// Bytes of K and V that attention streamed: each K/V row counted once per pass that reads
  /// it — once per query head in `cpu::naive_attention` (a GEMM per head), once per K/V head
  /// and per tile of up to `cpu::kDecodeQueryTile` query rows in `cpu::decode_attention`
  /// (so once per K/V head in a decode step, whatever the GQA group size).
  std::uint64_t kv_bytes_read = 0;
  /// Multiply-accumulates in projections (q, k, v, output) and attention (q.k and p.v);
  /// softmax and residual adds are not counted.
  std::uint64_t macs = 0;

  /// Adds every count of `other` to this one.
  KVLAB_HOST_DEVICE CostCounters& operator+=(const CostCounters& other) {
    q_projections += other.q_projections;
    kv_projections += other.kv_projections;
    qk_dots += other.qk_dots;
    kv_bytes_read += other.kv_bytes_read;
    macs += other.macs;
    return *this;
  }

  /// True when every count is equal.
  KVLAB_HOST_DEVICE bool operator==(const CostCounters& other) const {
    return q_projections == other.q_projections && kv_projections == other.kv_projections &&
           qk_dots == other.qk_dots && kv_bytes_read == other.kv_bytes_read && macs == other.macs;
  }
  /// True when any count differs.
  KVLAB_HOST_DEVICE bool operator!=(const CostCounters& other) const { return !(*this == other); }
};

}  // namespace kvlab
