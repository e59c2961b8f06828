/// \file
/// \brief `ContiguousKVView`: the documented layout of one layer of a contiguous KV cache,
/// as plain pointers and sizes that host and device code read the same way.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kvlab/config.hpp"
#include "kvlab/core/quant_blocks.hpp"

namespace kvlab {

/// The first key that the query at position `position` sees with a sliding window of `window`
/// keys (`cpu::reference_attention`: keys (position − W, position]), or 0 without one (0).
KVLAB_HOST_DEVICE inline int first_visible_key(int position, int window) {
  return window > 0 && position - window + 1 > 0 ? position - window + 1 : 0;
}

/// The attention sinks (StreamingLLM) that the query at `position` sees besides its window:
/// keys [0, sink_keys) with sink_keys = min(S, first_visible_key(position, W)), the first
/// `sinks` = S tokens of the sequence where they have left the window of `window` = W keys
/// (`cpu::reference_attention`). 0 without a window, or while the window still holds them.
KVLAB_HOST_DEVICE inline int sink_keys(int position, int window, int sinks) {
  const int first = first_visible_key(position, window);
  return sinks < first ? sinks : first;
}

/// Keys seen in all by `q_len` queries at positions `first_position`, `first_position + 1`, …,
/// each seeing every key up to itself, or with a window its last `window` and the `sinks` first
/// of the sequence: Σ_i (p_i + 1 − first_visible_key(p_i, W) + sink_keys(p_i, W, S)). What the
/// counters of every attention kernel count as q·k dots per query head.
/// \throws InvalidArgument if an argument is negative.
inline std::uint64_t visible_keys(int first_position, int q_len, int window, int sinks = 0) {
  constexpr const char* kWhere = "kvlab::visible_keys";
  detail::require_at_least(kWhere, "first_position", first_position, 0);
  detail::require_at_least(kWhere, "q_len", q_len, 0);
  detail::require_at_least(kWhere, "window", window, 0);
  detail::require_at_least(kWhere, "sinks", sinks, 0);
  std::uint64_t keys = 0;
  for (int i = 0; i < q_len; ++i) {
    const int p = first_position + i;
    keys += static_cast<std::uint64_t>(p + 1 - first_visible_key(p, window) +
                                       sink_keys(p, window, sinks));
  }
  return keys;
}

/// Read-only view of one layer of a contiguous KV cache.
///
/// Layout (head-major, "HND"): `k` and `v` each point to `[num_kv_heads, capacity, head_dim]`
/// values; rows `[0, length)` of every head are valid. `T` is the stored element: a number
/// (`float`, fp16, bf16), one per value, or a quantized block (`BlockQ8_0`, `BlockQ4_0`) of 32
/// values, so a row is `row_units()` elements and offsets count elements.
///
/// With a sliding window (`window` = W >= 1; see `cpu::reference_attention`) a query sees only
/// its last W keys, so only the last rows need be kept: the cache is a ring of `capacity` slots,
/// row `pos` in slot `pos % capacity`, and `length` counts every token of the sequence (it may
/// exceed `capacity`). A step of q queries needs the W − 1 rows before its first one as well as
/// its own q: `q + W − 1 <= capacity`. With attention sinks (`sinks` = S >= 1, a window only)
/// each query also sees the sequence's first S keys: they keep slots [0, S), and the ring is
/// the other `capacity − S` slots (row pos >= S in slot S + (pos − S) % (capacity − S)), so
/// `q + W − 1 <= capacity − S`. Without a window (0) row `pos` is in slot `pos`. Each
/// head's keys are one contiguous `[capacity, head_dim]` block, so a decode step streams them
/// front to back, and the query heads of a GQA group read the same block once.
template <typename T>
struct ContiguousKVView {
  const T* k = nullptr;  ///< keys:   [num_kv_heads, capacity, head_dim]
  const T* v = nullptr;  ///< values: [num_kv_heads, capacity, head_dim]
  int num_kv_heads = 0;  ///< K/V heads
  int head_dim = 0;      ///< values per head
  int capacity = 0;      ///< rows reserved per head
  int length = 0;        ///< tokens of the sequence (<= capacity without a window)
  int window = 0;        ///< W >= 1: queries see their last W keys, rows in a ring; 0: all keys
  int sinks = 0;         ///< S >= 1 (a window only): queries also see keys [0, S), kept in slots

  /// Stored elements of one head's row: `head_dim / StorageUnit<T>::kValues`.
  KVLAB_HOST_DEVICE int row_units() const { return head_dim / StorageUnit<T>::kValues; }
  /// The slot of row `pos`: in a ring (a window) `pos` for a sink (pos < S), else
  /// `S + (pos − S) % (capacity − S)`; without a window `pos`. Positions below `capacity` are
  /// always in slot `pos`.
  KVLAB_HOST_DEVICE int slot(int pos) const {
    return window > 0 && pos >= sinks ? sinks + (pos - sinks) % (capacity - sinks) : pos;
  }
  /// Offset, in elements, of row `pos` of K/V head `kv_head` from `k` (or `v`).
  KVLAB_HOST_DEVICE std::ptrdiff_t offset(int kv_head, int pos) const {
    return (static_cast<std::ptrdiff_t>(kv_head) * capacity + slot(pos)) * row_units();
  }
  /// Key row `pos` of K/V head `kv_head`: `row_units()` elements.
  KVLAB_HOST_DEVICE const T* key(int kv_head, int pos) const { return k + offset(kv_head, pos); }
  /// Value row `pos` of K/V head `kv_head`: `row_units()` elements.
  KVLAB_HOST_DEVICE const T* value(int kv_head, int pos) const { return v + offset(kv_head, pos); }
};

namespace detail {

/// The length checks of a contiguous cache read by `q_rows` new queries, shared by the CPU and
/// CUDA kernels: without a window q_rows <= length <= capacity; with one (a ring) q_rows <=
/// length, and once the ring has wrapped the queries and the W − 1 keys before them must fit
/// in its slots besides the S sinks' (q_rows + W − 1 <= capacity − S); sinks only with a window,
/// fewer than capacity. `q_rows_name` is the caller's name for q_rows.
/// \throws InvalidArgument naming the argument that does not fit.
template <typename T>
void check_contiguous_length(const char* where, const char* q_rows_name, long long q_rows,
                             const ContiguousKVView<T>& cache) {
  require_at_least(where, "cache.window", cache.window, 0);
  require_at_least(where, "cache.sinks", cache.sinks, 0);
  if (cache.sinks > 0 && (cache.window == 0 || cache.sinks >= cache.capacity)) {
    fail(where, "cache.sinks",
         cache.window == 0 ? std::string("0 without a window (every key is seen)")
                           : "below cache.capacity (" + std::to_string(cache.capacity) + ")",
         cache.sinks);
  }
  if (cache.window == 0 && (cache.length < q_rows || cache.length > cache.capacity)) {
    fail(where, "cache.length",
         std::string("in [") + q_rows_name + " (" + std::to_string(q_rows) + "), cache.capacity (" +
             std::to_string(cache.capacity) + ")]",
         cache.length);
  }
  if (cache.window > 0) {  // a ring: the queries and the W - 1 keys before them in its slots
    if (cache.length < q_rows) {
      fail(where, "cache.length",
           std::string(">= ") + q_rows_name + " (" + std::to_string(q_rows) + ")", cache.length);
    }
    const int ring = cache.capacity - cache.sinks;  // slots of the ring
    if (cache.length > cache.capacity && q_rows + cache.window - 1 > ring) {
      fail(where, q_rows_name,
           (cache.sinks == 0
                ? std::string("at most cache.capacity - cache.window + 1 = ")
                : std::string("at most cache.capacity - cache.sinks - cache.window + 1 = ")) +
               std::to_string(ring - cache.window + 1) +
               " (a ring holds the queries and the window's keys before them)",
           q_rows);
    }
  }
}

/// The window and sinks of a cache or store: W >= 0 (0: no window), S >= 0, and sinks only with
/// a window and fewer than it (S < W: `SelectiveStore`'s rule).
/// \throws InvalidArgument naming `window` or `sinks`.
inline void check_window_sinks(const char* where, int window, int sinks) {
  require_at_least(where, "window", window, 0);
  require_at_least(where, "sinks", sinks, 0);
  if (sinks > 0 && sinks >= window) {
    fail(where, "sinks",
         window == 0 ? std::string("0 without a window (every key is seen)")
                     : "below the window (" + std::to_string(window) + ")",
         sinks);
  }
}

/// The window and sinks of a contiguous cache, checked by the constructors of
/// `ContiguousKVCache` and `cuda::ContiguousKVCache`: W >= 0 (0: no window), S >= 0, sinks only
/// with a window and fewer than it (S < W: `SelectiveStore`'s rule), and S + W at most
/// `capacity`, since a decode step needs its W keys in the ring besides the sinks' slots.
/// \throws InvalidArgument naming `window` or `sinks`.
inline void check_ring_window(const char* where, int capacity, int window, int sinks = 0) {
  check_window_sinks(where, window, sinks);
  if (window + sinks > capacity) {
    fail(where, "window",
         (sinks == 0 ? "at most capacity (" : "at most capacity - sinks (") +
             std::to_string(capacity - sinks) + "): a decode step needs its W keys in the ring",
         window);
  }
}

/// The capacity checks of appending `rows` tokens to a contiguous cache that holds `length`,
/// shared by `ContiguousKVCache::append` and `cuda::ContiguousKVCache::append`. Without a window,
/// length + rows <= capacity. With one (a ring of `capacity − sinks` slots), rows <= capacity −
/// sinks − W + 1: the chunk's first query sees the W − 1 keys before it, which the chunk's writes
/// must not overwrite; and positions must fit in an int. `rows_name` is the caller's name for
/// rows.
/// \throws CapacityError naming `rows_name`.
inline void check_contiguous_append(const char* where, const char* rows_name, long long rows,
                                    int capacity, int window, int length, int sinks = 0) {
  const int ring = capacity - sinks;  // slots of the ring
  if (window > 0 && rows > ring - window + 1) {
    fail<CapacityError>(where, rows_name,
                        (sinks == 0 ? "at most capacity - window + 1 = "
                                    : "at most capacity - sinks - window + 1 = ") +
                            std::to_string(ring - window + 1) + " (a ring of " +
                            std::to_string(ring) +
                            " slots holds a chunk and the window's keys before it)",
                        rows);
  }
  if (window > 0 && length + rows > INT_MAX) {
    fail<CapacityError>(
        where, rows_name,
        "at most " + std::to_string(INT_MAX - length) + " (positions fit in an int)", rows);
  }
  if (window == 0 && length + rows > capacity) {
    fail<CapacityError>(where, rows_name,
                        "at most " + std::to_string(capacity - length) + " (capacity " +
                            std::to_string(capacity) + ", length " + std::to_string(length) + ")",
                        rows);
  }
}

/// The oldest position of the ring that a contiguous cache still holds once its sequence has
/// reached `length`, given the oldest it held before (`valid_from`): without a window 0; with
/// one, the rows of a ring of `capacity − sinks` slots that have not been overwritten, from
/// length − capacity + sinks on (the sinks themselves are never overwritten).
inline int ring_valid_from(int valid_from, int length, int capacity, int window, int sinks = 0) {
  if (window == 0) return 0;
  return valid_from > length - capacity + sinks ? valid_from : length - capacity + sinks;
}

/// The check of truncating a contiguous cache's layer `layer` (holding `layer_length` tokens, its
/// ring holding positions from `valid_from` on) to `length`, shared by
/// `ContiguousKVCache::truncate` and `cuda::ContiguousKVCache::truncate`: 0 <= length <=
/// layer_length, and with a window the next token's W keys (from length − W + 1; those below
/// `sinks` are sinks, always kept) still in the ring.
/// \throws InvalidArgument naming `length`.
inline void check_contiguous_truncate(const char* where, int length, int layer, int layer_length,
                                      int window, int valid_from, int sinks = 0) {
  require_at_least(where, "length", length, 0);
  if (length > layer_length) {
    fail(where, "length",
         "at most the length of layer " + std::to_string(layer) + " (" +
             std::to_string(layer_length) + ")",
         length);
  }
  const int first = first_visible_key(length, window);
  if (window > 0 && (first > sinks ? first : sinks) < valid_from) {
    fail(where, "length",
         "at least " + std::to_string(valid_from + window - 1) +
             " (the next token's window would reach rows the ring has overwritten)",
         length);
  }
}

}  // namespace detail

}  // namespace kvlab
