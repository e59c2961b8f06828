/// \file
/// \brief `CostCounters`: exact counts of the work an attention path does.
///
/// It counts projections, dot products, bytes of K/V read and multiply-accumulates. Tests compare
/// the counts with closed forms.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvlab/config.hpp"
#include "kvlab/core/shape.hpp"

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

/// Adds the projections of one layer to `counters` — the one place where kvlab counts them, for
/// the CPU and the GPU paths alike: `q_rows` rows projected to queries, `kv_rows` to keys and
/// values, `out_rows` attention outputs projected back, each row of `d_model` inputs:
///  - `q_projections += q_rows · num_heads`, `kv_projections += kv_rows · num_kv_heads`;
///  - `macs += d_model · (q_rows · q_width + 2 · kv_rows · kv_width + out_rows · q_width)`.
KVLAB_HOST_DEVICE inline void add_projection_counts(const AttentionShape& shape, int d_model,
                                                    std::uint64_t q_rows, std::uint64_t kv_rows,
                                                    std::uint64_t out_rows,
                                                    CostCounters& counters) {
  const auto d = static_cast<std::uint64_t>(d_model);
  const auto q_width = static_cast<std::uint64_t>(shape.q_width());
  const auto kv_width = static_cast<std::uint64_t>(shape.kv_width());
  counters.q_projections += q_rows * static_cast<std::uint64_t>(shape.num_heads());
  counters.kv_projections += kv_rows * static_cast<std::uint64_t>(shape.num_kv_heads());
  counters.macs += d * (q_rows * q_width + 2 * kv_rows * kv_width + out_rows * q_width);
}

/// Adds the work of an attention kernel to `counters` — the one place where kvlab counts it:
/// `keys` (query row, key) pairs per query head met by a dot product, and `rows_streamed` key
/// rows (and as many value rows) read per K/V head, each `row_bytes` bytes as stored
/// (`head_dim · sizeof(T)`, or less for a quantized cache: `storage_row_bytes`):
///  - `qk_dots += num_heads · keys`, `macs += 2 · qk_dots · head_dim` (q·k and p·v);
///  - `kv_bytes_read += 2 · row_bytes · rows_streamed · num_kv_heads`.
/// Each kernel says how many rows it streams (once per K/V head and query tile on the CPU).
KVLAB_HOST_DEVICE inline void add_attention_counts(const AttentionShape& shape,
                                                   std::size_t row_bytes, std::uint64_t keys,
                                                   std::uint64_t rows_streamed,
                                                   CostCounters& counters) {
  const std::uint64_t dots = static_cast<std::uint64_t>(shape.num_heads()) * keys;
  const auto head_dim = static_cast<std::uint64_t>(shape.head_dim());
  counters.qk_dots += dots;
  counters.macs += 2 * dots * head_dim;
  counters.kv_bytes_read += 2 * static_cast<std::uint64_t>(row_bytes) * rows_streamed *
                            static_cast<std::uint64_t>(shape.num_kv_heads());
}

}  // namespace kvlab
