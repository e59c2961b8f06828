/// \file
/// \brief `ContiguousKVCache`: the KV cache of one sequence, preallocated to a fixed capacity,
/// `[num_layers][num_kv_heads][capacity][head_dim]` for K and for V.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/core/views.hpp"
#include "kvlab/kv_storage.hpp"
#include "kvlab/matrix.hpp"

namespace kvlab {

/// The KV cache of one sequence, preallocated for `capacity` tokens in every layer.
///
/// K and V of past tokens never change once computed (the weights and the inputs are fixed),
/// so a decoder keeps them here instead of re-projecting the prefix at every step. Per layer,
/// the keys are stored head-major, `[num_kv_heads, capacity, head_dim]`, and so are the values
/// (see `ContiguousKVView`). Queries are not cached: each is used once, by its own step.
///
/// Appending takes token-major rows (`[n, num_kv_heads * head_dim]`, as a K/V projection
/// produces them) and scatters each head's slice into its block. Each layer keeps its own
/// length, because a decoder appends layer by layer within a step.
///
/// `T` is the type the rows come in and attention computes in; `S` the type they are stored as
/// (`KVStorage`): `T` itself, fp16 (`Eigen::half`), bf16 (`Eigen::bfloat16`), int8
/// (`BlockQ8_0`) or int4 (`BlockQ4_0`). A row is encoded when it is appended — a value that `S`
/// cannot hold (NaN, ±Inf, beyond its range) is refused before anything changes — and the
/// kernels decode the rows they read.
///
/// **Sliding window** (`window` = W >= 1; see `cpu::reference_attention`): a query sees only its
/// last W keys, so the cache keeps only the last rows, in a ring of `capacity` slots — row `pos`
/// in slot `pos % capacity` — and the sequence may grow past `capacity`. A decode step needs W
/// slots; a step of C new tokens needs W − 1 + C (its first query sees the W − 1 keys before it,
/// which the chunk's own writes must not overwrite): `append` refuses a chunk larger than
/// `capacity − W + 1`, and `truncate` a length whose window reaches rows already overwritten.
/// With attention sinks (`sinks` = S, 1 <= S < W: StreamingLLM) each query also sees the
/// sequence's first S keys: they keep slots [0, S) and the ring is the other `capacity − S`
/// (`ContiguousKVView::slot`), so every size above counts `capacity − S` slots. Keys are cached
/// after RoPE, each rotated by its own position: a sink at position 0 and a query at p are p
/// apart, as in `reference_attention` (StreamingLLM instead renumbers the kept keys 0 … S + W − 1
/// and rotates them again at every step; kvlab keeps the positions the model was trained with).
///
/// Memory: `2 * num_layers * num_kv_heads * capacity * storage_row_bytes<S>(head_dim)` bytes
/// (`head_dim * sizeof(T)` per row for `S = T`), reserved up front whether or not the sequence
/// ever gets that long — with a window, however long it gets.
template <typename T, typename S = T>
class ContiguousKVCache {
 public:
  /// An empty cache for `capacity` tokens, or with a sliding window of `window` keys a ring of
  /// `capacity` slots (`capacity >= window`: W − 1 + C for steps of up to C tokens), the first
  /// `sinks` of them kept for the sequence's first tokens (`capacity >= sinks + window`).
  /// \throws InvalidArgument if any size is below 1, `window` is negative or above `capacity`
  ///         less the sinks, `sinks` is negative, or not below a window (none without one),
  ///         `head_dim` is not a multiple of the values per stored element of `S` (32 for int8
  ///         and int4), a K/V row (num_kv_heads * head_dim) does not fit in an `int`, or the
  ///         cache does not fit in the address space.
  ContiguousKVCache(int num_layers, int num_kv_heads, int head_dim, int capacity, int window = 0,
                    int sinks = 0)
      : num_layers_(num_layers),
        num_kv_heads_(num_kv_heads),
        head_dim_(head_dim),
        capacity_(capacity),
        window_(window),
        sinks_(sinks) {
    constexpr const char* kWhere = "kvlab::ContiguousKVCache";
    detail::require_at_least(kWhere, "num_layers", num_layers, 1);
    detail::require_at_least(kWhere, "num_kv_heads", num_kv_heads, 1);
    detail::require_at_least(kWhere, "head_dim", head_dim, 1);
    detail::require_at_least(kWhere, "capacity", capacity, 1);
    detail::check_ring_window(kWhere, capacity, window, sinks);
    detail::require_storage_head_dim<S>(kWhere, head_dim);
    if (num_kv_heads > INT_MAX / head_dim) {
      detail::fail(kWhere, "num_kv_heads * head_dim", "at most " + std::to_string(INT_MAX),
                   1LL * num_kv_heads * head_dim);
    }
    // Elements per layer and tensor, checked against overflow before they are multiplied (the
    // sizes, checked >= 1 above, as std::size_t once).
    const std::size_t layers = at(num_layers), tokens = at(capacity);
    const std::size_t row = at(num_kv_heads) * at(head_dim / KVStorage<S>::kValues);
    const std::size_t max_elements = static_cast<std::size_t>(PTRDIFF_MAX) / sizeof(S) / 2 / layers;
    if (row > max_elements / tokens) {
      detail::fail(kWhere, "capacity",
                   "at most " + std::to_string(max_elements / row) +
                       " (the cache must fit in the address space)",
                   capacity);
    }
    k_.assign(layers, std::vector<S>(row * tokens));
    v_.assign(layers, std::vector<S>(row * tokens));
    length_.assign(layers, 0);
    valid_from_.assign(layers, 0);
  }

  /// Number of layers.
  int num_layers() const { return num_layers_; }
  /// K/V heads per layer.
  int num_kv_heads() const { return num_kv_heads_; }
  /// Values per head.
  int head_dim() const { return head_dim_; }
  /// Tokens reserved per layer (slots of the ring, with a window).
  int capacity() const { return capacity_; }
  /// The sliding window: each query sees its last `window()` keys; 0 for none.
  int window() const { return window_; }
  /// The attention sinks: each query also sees the first `sinks()` keys; 0 for none.
  int sinks() const { return sinks_; }
  /// The most tokens one `append` may add: `capacity() − sinks() − window() + 1` with a window
  /// (the rest of the ring holds the keys before them), the free capacity without.
  int max_chunk(int layer) const {
    check_layer("kvlab::ContiguousKVCache::max_chunk", layer);
    return window_ > 0 ? capacity_ - sinks_ - window_ + 1 : capacity_ - length_[at(layer)];
  }
  /// The name of the storage type: "fp32", "fp16", "bf16", "int8", "int4" (`KVStorage<S>`).
  static const char* storage_name() { return KVStorage<S>::name(); }

  /// Tokens of the sequence in `layer` (with a window, possibly more than the ring keeps).
  /// \throws InvalidArgument if `layer` is out of range.
  int length(int layer) const {
    check_layer("kvlab::ContiguousKVCache::length", layer);
    return length_[at(layer)];
  }

  /// Appends `n` tokens to `layer`.
  /// \param layer  the layer, in [0, num_layers)
  /// \param k      keys of the new tokens, [n, num_kv_heads * head_dim], n >= 1: any Eigen
  ///               expression of scalar T (`k.row(t)`, `k.middleRows(a, n)` are read in place)
  /// \param v      values of the new tokens, [n, num_kv_heads * head_dim]
  /// \throws InvalidArgument for a wrong shape or layer, or a value that `S` cannot hold
  ///         (`KVStorage<S>::limit()`; the message names its row and column); CapacityError if
  ///         the layer would hold more than `capacity()` tokens, or with a window if `n` exceeds
  ///         `max_chunk` (the chunk would overwrite keys its first query sees). Either way the
  ///         cache is unchanged.
  void append(int layer, const Eigen::Ref<const RowMatrix<T>>& k,
              const Eigen::Ref<const RowMatrix<T>>& v) {
    constexpr const char* kWhere = "kvlab::ContiguousKVCache::append";
    check_layer(kWhere, layer);
    const int width = num_kv_heads_ * head_dim_;
    detail::require_at_least(kWhere, "k.rows()", static_cast<long>(k.rows()), 1L);
    detail::require_equal(kWhere, "k.cols()", static_cast<long>(k.cols()), static_cast<long>(width),
                          "num_kv_heads * head_dim");
    detail::require_equal(kWhere, "v.rows()", static_cast<long>(v.rows()),
                          static_cast<long>(k.rows()), "k.rows()");
    detail::require_equal(kWhere, "v.cols()", static_cast<long>(v.cols()), static_cast<long>(width),
                          "num_kv_heads * head_dim");
    const std::size_t l = at(layer);
    detail::check_contiguous_append(kWhere, "k.rows()", k.rows(), capacity_, window_, length_[l],
                                    sinks_);
    detail::require_storable<S>(kWhere, "k", k);
    detail::require_storable<S>(kWhere, "v", v);
    // Encode each token's row, head by head, into the head-major blocks.
    const ContiguousKVView<S> layout = view(layer);
    for (Eigen::Index t = 0; t < k.rows(); ++t) {
      const int pos = length_[l] + static_cast<int>(t);
      for (int kv_head = 0; kv_head < num_kv_heads_; ++kv_head) {
        const std::ptrdiff_t dst = layout.offset(kv_head, pos);
        KVStorage<S>::encode(k.row(t).data() + kv_head * head_dim_, head_dim_, k_[l].data() + dst);
        KVStorage<S>::encode(v.row(t).data() + kv_head * head_dim_, head_dim_, v_[l].data() + dst);
      }
    }
    length_[l] += static_cast<int>(k.rows());
    // the rows overwritten in the ring are gone
    valid_from_[l] =
        detail::ring_valid_from(valid_from_[l], length_[l], capacity_, window_, sinks_);
  }

  /// Forgets every token at position `length` and after, in every layer (for example to undo
  /// rejected draft tokens). The storage stays reserved. With a window, the next token's window
  /// (the keys from `length − W + 1`) must still be in the ring.
  /// \throws InvalidArgument if `length` is negative, above a layer's current length, or with a
  ///         window below the oldest row kept plus W − 1.
  void truncate(int length) {
    constexpr const char* kWhere = "kvlab::ContiguousKVCache::truncate";
    for (int l = 0; l < num_layers_; ++l)
      detail::check_contiguous_truncate(kWhere, length, l, length_[at(l)], window_,
                                        valid_from_[at(l)], sinks_);
    for (int& len : length_) len = length;
  }

  /// Empties every layer; the storage stays reserved.
  void clear() {
    for (int& len : length_) len = 0;
    for (int& from : valid_from_) from = 0;
  }

  /// A read-only view of `layer`, valid until the cache is destroyed.
  /// \throws InvalidArgument if `layer` is out of range.
  ContiguousKVView<S> view(int layer) const {
    check_layer("kvlab::ContiguousKVCache::view", layer);
    const std::size_t l = at(layer);
    ContiguousKVView<S> view;
    view.k = k_[l].data();
    view.v = v_[l].data();
    view.num_kv_heads = num_kv_heads_;
    view.head_dim = head_dim_;
    view.capacity = capacity_;
    view.length = length_[l];
    view.window = window_;
    view.sinks = sinks_;
    return view;
  }

  /// Keys of K/V head `kv_head`, [length(layer), head_dim], as an Eigen map into the cache. The
  /// map keeps the length it was made with: rows appended later are not in it.
  /// Only where the rows are stored as given (`S = T`).
  /// \throws InvalidArgument if `layer` or `head` is out of range, or the cache has a window
  ///         (its rows are in a ring, not in order).
  template <typename U = S, typename = std::enable_if_t<std::is_same<U, T>::value>>
  Eigen::Map<const RowMatrix<T>> keys(int layer, int kv_head) const {
    check_head("kvlab::ContiguousKVCache::keys", layer, kv_head);
    const ContiguousKVView<T> v = view(layer);
    return Eigen::Map<const RowMatrix<T>>(v.key(kv_head, 0), v.length, head_dim_);
  }

  /// Values of K/V head `kv_head`, [length(layer), head_dim], as an Eigen map into the cache.
  /// The map keeps the length it was made with: rows appended later are not in it.
  /// Only where the rows are stored as given (`S = T`).
  /// \throws InvalidArgument if `layer` or `head` is out of range, or the cache has a window.
  template <typename U = S, typename = std::enable_if_t<std::is_same<U, T>::value>>
  Eigen::Map<const RowMatrix<T>> values(int layer, int kv_head) const {
    check_head("kvlab::ContiguousKVCache::values", layer, kv_head);
    const ContiguousKVView<T> v = view(layer);
    return Eigen::Map<const RowMatrix<T>>(v.value(kv_head, 0), v.length, head_dim_);
  }

  /// Bytes reserved for K and V in all layers.
  std::size_t bytes_reserved() const { return 2 * at(num_layers_) * row_bytes() * at(capacity_); }

  /// Bytes holding tokens (the filled rows of K and V in all layers; with a window, the rows
  /// the ring still holds).
  std::size_t bytes_used() const {
    std::size_t rows = 0;
    for (int len : length_) rows += at(window_ > 0 ? std::min(len, capacity_) : len);
    return 2 * rows * row_bytes();
  }

 private:
  // A layer (or a size, >= 0) as the index (or the size) of k_, v_ and length_.
  static std::size_t at(int i) { return static_cast<std::size_t>(i); }
  // Bytes of one token in one layer, K or V: num_kv_heads rows of head_dim values, stored as S.
  std::size_t row_bytes() const { return at(num_kv_heads_) * storage_row_bytes<S>(head_dim_); }
  void check_layer(const char* where, int layer) const {
    if (layer < 0 || layer >= num_layers_) {
      detail::fail(where, "layer", "in [0, " + std::to_string(num_layers_) + ")", layer);
    }
  }
  void check_head(const char* where, int layer, int kv_head) const {
    check_layer(where, layer);
    if (window_ > 0) {
      detail::fail(where, "window", "0 (a windowed cache keeps its rows in a ring, not in order)",
                   window_);
    }
    if (kv_head < 0 || kv_head >= num_kv_heads_) {
      detail::fail(where, "kv_head", "in [0, " + std::to_string(num_kv_heads_) + ")", kv_head);
    }
  }

  int num_layers_;
  int num_kv_heads_;
  int head_dim_;
  int capacity_;
  int window_;  // 0, or W: a ring of capacity_ slots
  int sinks_;   // 0, or S < W: slots [0, S) keep the first S tokens, the ring the others
  // [num_layers][num_kv_heads * capacity * row_units]: row_units = head_dim / values per S
  std::vector<std::vector<S>> k_;
  std::vector<std::vector<S>> v_;  // [num_layers][num_kv_heads * capacity * row_units]
  std::vector<int> length_;        // [num_layers]: tokens of the sequence
  std::vector<int> valid_from_;    // [num_layers]: the oldest position the ring still holds
};

}  // namespace kvlab
