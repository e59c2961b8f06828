/// \file
/// \brief `ContiguousStore`: the `KVStore` of a contiguous KV cache per sequence.
///
/// Each sequence reserves `capacity` tokens up front (`ContiguousKVCache`); a step projects the new
/// tokens only, appends their K and V and attends with `cpu::decode_attention`. Checked against
/// `RecomputeStore` and `PagedStore` in `tests/store/test_kv_store.cpp`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kvlab/cache/contiguous_kv_cache.hpp"
#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/cpu/decode_attention.hpp"
#include "kvlab/matrix.hpp"
#include "kvlab/store/kv_store.hpp"

namespace kvlab {

/// K and V of every past token, in one `ContiguousKVCache` per sequence, each preallocated for
/// `capacity` tokens — the static reservation that paging replaces.
///
/// At a step in which a sequence of `t` tokens adds `p`:
///  - `begin_step` checks that `t + p <= capacity` for every sequence (nothing is allocated:
///    the room was reserved when the sequence was added); the step computes the `p` new tokens
///    only;
///  - each layer projects q, k and v of those `p` tokens, `append` copies k and v into the
///    sequence's cache (q is not kept: it is used once, now);
///  - `attend` runs `cpu::decode_attention` of the `p` queries over the sequence's cache.
/// So a decode step costs one K/V projection per K/V head and layer, Θ(1). Memory:
/// `2 · layers · kv_heads · capacity · head_dim · sizeof(T)` per sequence, however short it is.
/// `fork` copies the whole cache. With a sliding window of W keys each sequence's cache is a
/// ring of `capacity` slots (`ContiguousKVCache`): sequences grow without bound, each step adds at
/// most `capacity − W + 1` tokens to a sequence, and memory stays `capacity` tokens per sequence.
/// With `sinks` attention sinks the ring's first `sinks` slots keep each sequence's first tokens
/// (`ContiguousKVCache`), and a step adds at most `capacity − sinks − W + 1`.
/// `S` is the type K and V are stored as (`KVStorage`: `T`,
/// fp16, bf16, int8, int4): each row is encoded when appended and decoded as the kernel reads
/// it, so memory per token is `2 · layers · kv_heads · storage_row_bytes<S>(head_dim)`.
template <typename T, typename S = T>
class ContiguousStore : public KVStore<T> {
 public:
  /// A store whose sequences each reserve `capacity` tokens in every layer — with a sliding
  /// window of `window` keys (>= 1), a ring of `capacity` slots each, the first `sinks` of them
  /// for the attention sinks.
  /// \throws InvalidArgument if any size is below 1, `window` is negative or above `capacity`
  ///         less the sinks, `sinks` is negative or not below a window (none without one), or
  ///         `head_dim` is not a multiple of the values per stored element of `S` (32 for int8
  ///         and int4).
  ContiguousStore(int num_layers, int num_kv_heads, int head_dim, int capacity, int window = 0,
                  int sinks = 0)
      : KVStore<T>("kvlab::ContiguousStore", num_layers, num_kv_heads, head_dim),
        capacity_(capacity),
        window_(window),
        sinks_(sinks) {
    detail::require_at_least("kvlab::ContiguousStore", "capacity", capacity, 1);
    detail::check_window_sinks("kvlab::ContiguousStore", window, sinks);
    if (window + sinks > capacity) {
      detail::fail("kvlab::ContiguousStore", "window",
                   (sinks == 0 ? "at most capacity (" : "at most capacity - sinks (") +
                       std::to_string(capacity - sinks) + ")",
                   window);
    }
    detail::require_storage_head_dim<S>("kvlab::ContiguousStore", head_dim);
  }

  const char* name() const override { return "contiguous"; }
  const char* storage_name() const override { return KVStorage<S>::name(); }
  std::size_t bytes_per_token() const override {
    return 2 * static_cast<std::size_t>(this->num_layers()) *
           static_cast<std::size_t>(this->num_kv_heads()) * storage_row_bytes<S>(this->head_dim());
  }
  /// Tokens each sequence can hold (slots of its ring, with a window).
  int capacity() const { return capacity_; }
  int window() const override { return window_; }
  int sinks() const override { return sinks_; }
  /// `capacity − sinks − window + 1` with a window (the ring holds the step's tokens and the
  /// window's keys before them); no limit without one (room is checked per sequence).
  int max_step_tokens() const override {
    return window_ > 0 ? capacity_ - sinks_ - window_ + 1 : KVStore<T>::max_step_tokens();
  }

  /// Reserves a cache of `capacity` tokens and returns the new sequence's id.
  int add_sequence() override {
    caches_.emplace(next_id_,
                    ContiguousKVCache<T, S>(this->num_layers(), this->num_kv_heads(),
                                            this->head_dim(), capacity_, window_, sinks_));
    return next_id_++;
  }
  std::vector<int> sequences() const override {
    std::vector<int> ids;
    for (const auto& entry : caches_) ids.push_back(entry.first);
    return ids;
  }
  std::size_t bytes_reserved() const override {
    std::size_t bytes = 0;
    for (const auto& entry : caches_) bytes += entry.second.bytes_reserved();
    return bytes;
  }
  std::size_t bytes_used() const override {
    std::size_t bytes = 0;
    for (const auto& entry : caches_) bytes += entry.second.bytes_used();
    return bytes;
  }

  /// The cache of `seq` (read-only): its K/V, per layer `[num_kv_heads, capacity, head_dim]`.
  /// \throws InvalidArgument if `seq` is not live.
  const ContiguousKVCache<T, S>& cache(int seq) const {
    if (!do_contains(seq))
      detail::fail("kvlab::ContiguousStore::cache", "seq", "a live sequence id", seq);
    return caches_.at(seq);
  }

 protected:
  bool do_contains(int seq) const override { return caches_.count(seq) != 0; }
  int do_length(int seq) const override { return caches_.at(seq).length(0); }
  void do_free_sequence(int seq) override { caches_.erase(seq); }
  int do_fork(int seq) override {
    caches_.emplace(next_id_, caches_.at(seq));  // a contiguous fork copies every token
    return next_id_++;
  }
  void do_truncate(int seq, int length) override { caches_.at(seq).truncate(length); }

  void do_begin_step(StepBatch& batch, const RowMatrix<T>& new_inputs, RowMatrix<T>& inputs,
                     const char* caller) override {
    batch.row_indptr = batch.new_indptr;  // the new tokens only
    batch.first_position.clear();
    for (int i = 0; i < batch.size(); ++i) {
      const int seq = batch.seq(i);
      const int length = do_length(seq);
      // the cache's own check (before any layer is touched)
      const std::string name = "new tokens of sequence " + std::to_string(seq);
      detail::check_contiguous_append(caller, name.c_str(), batch.new_tokens(i), capacity_, window_,
                                      length, sinks_);
      batch.first_position.push_back(length);
    }
    inputs = new_inputs;
  }

  void do_append(int layer, const RowMatrix<T>& k, const RowMatrix<T>& v) override {
    const StepBatch& batch = this->step();
    for (int i = 0; i < batch.size(); ++i) {
      caches_.at(batch.seq(i))
          .append(layer, k.middleRows(batch.row_begin(i), batch.computed(i)),
                  v.middleRows(batch.row_begin(i), batch.computed(i)));
    }
  }

  void do_attend(int layer, const AttentionShape& shape, const RowMatrix<T>& q,
                 const std::vector<std::int32_t>& q_indptr, RowMatrix<T>& out,
                 CostCounters* counters) override {
    const StepBatch& batch = this->step();
    if (batch.size() == 1) {  // one sequence: all of q is its
      cpu::decode_attention(shape, q, caches_.at(batch.seqs[0]).view(layer), out, counters);
      return;
    }
    out.resize(q.rows(), shape.q_width());
    RowMatrix<T> part;  // [queries of one sequence, num_heads * head_dim]
    for (int i = 0; i < batch.size(); ++i) {
      const auto s = static_cast<std::size_t>(i);
      const auto rows = q.middleRows(q_indptr[s], q_indptr[s + 1] - q_indptr[s]);
      cpu::decode_attention(shape, rows, caches_.at(batch.seq(i)).view(layer), part, counters);
      out.middleRows(q_indptr[s], part.rows()) = part;
    }
  }

  void do_end_step() override {}
  void do_abort_step() noexcept override {
    const StepBatch& batch = this->step();
    for (int i = 0; i < batch.size(); ++i) {
      // Back to the length before the step, in every layer (some may not have been appended).
      caches_.at(batch.seq(i)).truncate(batch.first(i));
    }
  }

 private:
  int capacity_;
  int window_;                                     // 0, or each cache's window
  int sinks_;                                      // 0, or each cache's attention sinks
  std::map<int, ContiguousKVCache<T, S>> caches_;  // seq -> its cache
  int next_id_ = 0;
};

}  // namespace kvlab
