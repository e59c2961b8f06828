/// \file
/// \brief The decoders of the toy `AttentionStack`, one sequence each.
///
/// `NaiveDecoder` has no cache, `CachedDecoder` a contiguous cache and `PagedDecoder` blocks of a
/// shared pool. They differ only in their `KVStore`; every step is `run_stack`. Checked against
/// each other at every step in `tests/model/test_decoders.cpp`.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvlab/cache/contiguous_kv_cache.hpp"
#include "kvlab/cache/paged_kv_cache.hpp"
#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/paged_view.hpp"
#include "kvlab/matrix.hpp"
#include "kvlab/model/attention_layer.hpp"
#include "kvlab/model/decoder.hpp"
#include "kvlab/store/contiguous_store.hpp"
#include "kvlab/store/kv_store.hpp"
#include "kvlab/store/paged_store.hpp"
#include "kvlab/store/recompute_store.hpp"

namespace kvlab {

/// A `Decoder` whose one sequence lives in a `KVStore` (possibly shared with other decoders):
/// each `prefill` or `decode` is one `run_stack` step over that sequence alone. The sequence is
/// freed when the decoder is destroyed.
template <typename T, typename Store>
class StoreDecoder : public Decoder<T> {
 public:
  ~StoreDecoder() override { store_->free_sequence(seq_); }

  /// The store that holds this decoder's sequence (read-only).
  const Store& store() const { return *store_; }
  /// This decoder's sequence id in `store()`.
  int sequence() const { return seq_; }

 protected:
  /// A decoder running `stack` on a new sequence of `store`.
  /// \throws InvalidArgument if `stack` or `store` is null, or the store's layers, K/V heads
  ///         or head_dim differ from the stack's.
  StoreDecoder(std::shared_ptr<const AttentionStack<T>> stack, std::shared_ptr<Store> store)
      : Decoder<T>(std::move(stack)),
        store_(checked(std::move(store), this->stack())),
        seq_(store_->add_sequence()) {}
  /// A decoder that continues sequence `seq` of `parent`'s store (a fork made by the store).
  StoreDecoder(const StoreDecoder& parent, int seq)
      : Decoder<T>(parent.stack_pointer()), store_(parent.store_), seq_(seq) {
    this->continue_from(parent);
  }

  /// The store, shared (for a fork).
  const std::shared_ptr<Store>& store_pointer() const { return store_; }

  /// One `run_stack` step of this decoder's sequence alone.
  RowMatrix<T> forward(const RowMatrix<T>& x, CostCounters& counters) override {
    const std::vector<std::int32_t> x_indptr{0, static_cast<std::int32_t>(x.rows())};  // [2]
    return run_stack(this->stack(), *store_, {seq_}, x_indptr, x, &counters,
                     "kvlab::Decoder::prefill");
  }
  /// Shortens the sequence in the store to `position` tokens.
  void truncate(int position) override { store_->truncate(seq_, position); }

 private:
  static std::shared_ptr<Store> checked(std::shared_ptr<Store> store,
                                        const AttentionStack<T>& stack) {
    constexpr const char* kWhere = "kvlab::StoreDecoder";
    if (!store) detail::fail(kWhere, "store", "a non-null store", "nullptr");
    detail::require_equal(kWhere, "store->num_layers()", store->num_layers(), stack.num_layers(),
                          "stack's num_layers");
    detail::require_equal(kWhere, "store->num_kv_heads()", store->num_kv_heads(),
                          stack.shape().num_kv_heads(), "stack's num_kv_heads");
    detail::require_equal(kWhere, "store->head_dim()", store->head_dim(), stack.shape().head_dim(),
                          "stack's head_dim");
    return store;
  }

  std::shared_ptr<Store> store_;
  int seq_;  // this decoder's sequence in store_
};

/// A decoder without a cache: its `RecomputeStore` keeps only the inputs, so step t projects K
/// and V of all t tokens again in every layer (and, below the top layer, recomputes every
/// position) and attends with `cpu::naive_attention`.
///
/// So a one-layer model costs t K/V projections and t scores per query head per step: over n
/// steps n(n+1)/2 of each, Θ(n²). A deeper model also recomputes t positions in each lower
/// layer: t² scores per head per lower layer per step, Θ(n³) in total. Memory: the inputs,
/// [t, d_model]. With a `window` of W keys each query sees its last W keys only (the oracle of
/// the windowed `CachedDecoder` and `PagedDecoder`): the scores outside the band are masked,
/// still computed.
template <typename T>
class NaiveDecoder : public StoreDecoder<T, RecomputeStore<T>> {
 public:
  /// A decoder running `stack`, with no token yet, each query seeing its last `window` keys (0:
  /// all).
  /// \throws InvalidArgument if `stack` is null or `window` is negative.
  explicit NaiveDecoder(std::shared_ptr<const AttentionStack<T>> stack, int window = 0)
      : StoreDecoder<T, RecomputeStore<T>>(stack, store_for(stack.get(), window)) {}

 private:
  static std::shared_ptr<RecomputeStore<T>> store_for(const AttentionStack<T>* s, int window) {
    if (s == nullptr) detail::fail("kvlab::Decoder", "stack", "a non-null stack", "nullptr");
    return std::make_shared<RecomputeStore<T>>(s->num_layers(), s->shape().num_kv_heads(),
                                               s->shape().head_dim(), s->d_model(), window);
  }
};

/// A decoder that keeps K and V of every past token in a `ContiguousKVCache` reserved for
/// `capacity` tokens (its `ContiguousStore`): each step projects q, k and v of the new tokens
/// only, appends k and v, and attends with `cpu::decode_attention` (causal within the new
/// tokens, so a prompt can be prefilled at once).
///
/// So each step costs p K/V projections per K/V head per layer, Θ(1) for a decode step, and the
/// scores still cost t per query head (every new query meets every cached key). Memory: the
/// cache, reserved for `capacity` tokens.
///
/// `S` is the type K and V are stored as (`KVStorage`: `T`, fp16, bf16, int8 or int4 blocks),
/// and with a `window` of W keys each query sees its last W keys only, kept in a ring of
/// `capacity` slots (`ContiguousKVCache`): the same decoder, the cache of another variant.
template <typename T, typename S = T>
class CachedDecoder : public StoreDecoder<T, ContiguousStore<T, S>> {
 public:
  /// A decoder running `stack` with room for `capacity` tokens, or with a sliding window of
  /// `window` keys a ring of `capacity` slots (W − 1 + C for steps of up to C tokens).
  /// \throws InvalidArgument if `stack` is null, `capacity < 1`, or the window or `head_dim`
  ///         does not suit the cache (`ContiguousKVCache`).
  CachedDecoder(std::shared_ptr<const AttentionStack<T>> stack, int capacity, int window = 0)
      : StoreDecoder<T, ContiguousStore<T, S>>(stack, store_for(stack.get(), capacity, window)) {}

  /// The cache (read-only), e.g. to print its contents or its size.
  const ContiguousKVCache<T, S>& cache() const { return this->store().cache(this->sequence()); }

 private:
  static std::shared_ptr<ContiguousStore<T, S>> store_for(const AttentionStack<T>* s, int capacity,
                                                          int window) {
    if (s == nullptr) detail::fail("kvlab::Decoder", "stack", "a non-null stack", "nullptr");
    return std::make_shared<ContiguousStore<T, S>>(s->num_layers(), s->shape().num_kv_heads(),
                                                   s->shape().head_dim(), capacity, window);
  }
};

/// A decoder that keeps K and V of its tokens in the blocks of a `PagedKVCache` (its
/// `PagedStore`): one sequence of a pool that other decoders may share. Each step makes room in
/// the sequence's blocks (a new block only when the last one is full — the only allocation of
/// the step), writes the new tokens' k and v there layer by layer and attends with
/// `cpu::paged_prefill_attention` through the sequence's block table.
///
/// The work is exactly that of `CachedDecoder` (the same counts in every counter); what differs
/// is the memory: blocks as the sequence grows instead of `capacity` tokens up front. `fork()`
/// gives a second decoder that continues from the same tokens without copying them. `S` and a
/// `window` as for `CachedDecoder`: with a window, the blocks wholly before it go back to the pool
/// after each step (`PagedStore`).
template <typename T, typename S = T>
class PagedDecoder : public StoreDecoder<T, PagedStore<T, S>> {
 public:
  /// A decoder with a pool of its own: `num_blocks` blocks of `block_size` tokens, their values
  /// in `layout`, each query seeing its last `window` keys (0: all).
  /// \throws InvalidArgument if `stack` is null, `block_size` or `num_blocks` is below 1, or the
  ///         window or `head_dim` does not suit the pool (`PagedKVCache`).
  PagedDecoder(std::shared_ptr<const AttentionStack<T>> stack, int block_size, int num_blocks,
               KVLayout layout = KVLayout::NHD, int window = 0)
      : StoreDecoder<T, PagedStore<T, S>>(
            stack, store_for(stack.get(), block_size, num_blocks, layout, window)) {}

  /// A decoder that adds its sequence to `pool`, shared with other decoders of the same stack.
  /// \throws InvalidArgument if `pool` is null or its layers, K/V heads or head_dim differ from
  ///         the stack's.
  PagedDecoder(std::shared_ptr<const AttentionStack<T>> stack,
               std::shared_ptr<PagedKVCache<T, S>> pool)
      : StoreDecoder<T, PagedStore<T, S>>(stack, store_over(std::move(pool), stack.get())) {}

  /// A new decoder at the same position, continuing from the same tokens: it shares every
  /// block (no K/V is copied) until one of the two appends into the shared last block, which is
  /// then copied for it (copy on write). Counters start at zero.
  std::unique_ptr<PagedDecoder> fork() const {
    return std::unique_ptr<PagedDecoder>(
        new PagedDecoder(*this, this->store_pointer()->fork(this->sequence())));
  }

  /// The pool (read-only): blocks, reference counts, the block tables of every sequence.
  const PagedKVCache<T, S>& cache() const { return this->store().cache(); }

 private:
  PagedDecoder(const PagedDecoder& parent, int seq)
      : StoreDecoder<T, PagedStore<T, S>>(parent, seq) {}

  static std::shared_ptr<PagedStore<T, S>> store_over(std::shared_ptr<PagedKVCache<T, S>> pool,
                                                      const AttentionStack<T>* s) {
    constexpr const char* kWhere = "kvlab::PagedDecoder";
    if (s == nullptr) detail::fail("kvlab::Decoder", "stack", "a non-null stack", "nullptr");
    if (!pool) detail::fail(kWhere, "pool", "a non-null pool", "nullptr");
    detail::require_equal(kWhere, "pool->num_layers()", pool->num_layers(), s->num_layers(),
                          "stack's num_layers");
    detail::require_equal(kWhere, "pool->num_kv_heads()", pool->num_kv_heads(),
                          s->shape().num_kv_heads(), "stack's num_kv_heads");
    detail::require_equal(kWhere, "pool->head_dim()", pool->head_dim(), s->shape().head_dim(),
                          "stack's head_dim");
    return std::make_shared<PagedStore<T, S>>(std::move(pool));
  }
  static std::shared_ptr<PagedStore<T, S>> store_for(const AttentionStack<T>* s, int block_size,
                                                     int num_blocks, KVLayout layout, int window) {
    if (s == nullptr) detail::fail("kvlab::Decoder", "stack", "a non-null stack", "nullptr");
    return std::make_shared<PagedStore<T, S>>(s->num_layers(), s->shape().num_kv_heads(),
                                              s->shape().head_dim(), block_size, num_blocks, layout,
                                              window);
  }
};

/// A decoder that caches K and V of some layers and not of others: selective caching by layer,
/// the reading "for an unimportant layer, do not cache" made concrete, with its cost counted.
///
/// Layer l's K and V at a past token are a projection of layer l's input at that token, and that
/// input is the output of every layer below. So a layer without a cache must get its past inputs
/// from somewhere: each run of consecutive uncached layers [a, b] keeps the input of its first
/// layer a for every token (a `RecomputeStore`, `d_model` values per token) and runs layers a…b
/// again over every token at each step; the layers between runs keep K and V as
/// `CachedDecoder` does (a `ContiguousStore` of `capacity` tokens each). Two readings of "layer
/// l not cached":
///  - `{l}`: keep layer l's input instead of its K/V. Per token that is `d_model` values against
///    `2 · num_kv_heads · head_dim` — for SmolLM2-135M 576 against 2 × 192 = 384, half as much
///    again (grouped-query attention made the K/V narrower than the input); only multi-head
///    attention (K/V as wide as the input, 2 × d_model) saves by it. A step of p new tokens after
///    t then projects K/V of t + p tokens in layer l instead of p: `t · num_kv_heads` more K/V
///    projections, `2 · t · d_model · num_kv_heads · head_dim` more multiply-adds.
///  - `{0, …, l}`: keep nothing of layer l (only the model's inputs, which token ids give back):
///    then layers 0…l run over all t + p tokens at each step — below l every position's query
///    and attention too, (t + p)² scores per head per layer — Θ(n²) projections over n tokens,
///    what `NaiveDecoder` pays for the whole stack.
/// The outputs are those of `CachedDecoder` (the same arithmetic on every token, to rounding:
/// `cpu::naive_attention` sums in another order), checked with the closed forms of every counter
/// in `tests/model/test_decoders.cpp`. A run of uncached layers attends with
/// `cpu::naive_attention`, which computes the masked scores too (`qk_dots` counts them).
template <typename T>
class PartialCacheDecoder : public Decoder<T> {
 public:
  /// A decoder running `stack` whose layers `uncached_layers` (ascending, each in
  /// [0, num_layers)) keep no K/V, and whose other layers cache up to `capacity` tokens.
  /// \throws InvalidArgument if `stack` is null, `capacity < 1`, or `uncached_layers` is not
  ///         strictly ascending within [0, num_layers) (naming the entry).
  PartialCacheDecoder(std::shared_ptr<const AttentionStack<T>> stack, int capacity,
                      std::vector<int> uncached_layers)
      : Decoder<T>(std::move(stack)), state_(std::make_unique<State>()) {
    constexpr const char* kWhere = "kvlab::PartialCacheDecoder";
    const AttentionStack<T>& s = this->stack();
    detail::require_at_least(kWhere, "capacity", capacity, 1);
    for (std::size_t i = 0; i < uncached_layers.size(); ++i) {
      const int lo = i == 0 ? 0 : uncached_layers[i - 1] + 1;  // ascending, no repeats
      if (uncached_layers[i] < lo || uncached_layers[i] >= s.num_layers()) {
        detail::fail(kWhere, "uncached_layers[" + std::to_string(i) + "]",
                     "in [" + std::to_string(lo) + ", " + std::to_string(s.num_layers()) +
                         ") (ascending layers of the stack)",
                     uncached_layers[i]);
      }
    }
    state_->uncached = std::move(uncached_layers);
    // The runs of layers of one kind, bottom to top.
    for (int first = 0; first < s.num_layers();) {
      const bool cached = !is_uncached(first);
      int end = first + 1;
      while (end < s.num_layers() && !is_uncached(end) == cached) ++end;
      std::vector<AttentionLayer<T>> layers;
      for (int l = first; l < end; ++l) layers.push_back(s.layer(l));
      Segment seg;
      seg.first = first;
      seg.stack = std::make_shared<const AttentionStack<T>>(std::move(layers));
      const int kv_heads = s.shape().num_kv_heads(), head_dim = s.shape().head_dim();
      if (cached) {
        seg.store = std::make_unique<ContiguousStore<T>>(end - first, kv_heads, head_dim, capacity);
      } else {
        seg.store =
            std::make_unique<RecomputeStore<T>>(end - first, kv_heads, head_dim, s.d_model());
      }
      seg.seq = seg.store->add_sequence();
      state_->segments.push_back(std::move(seg));
      first = end;
    }
  }

  /// The layers that keep no K/V, ascending.
  const std::vector<int>& uncached_layers() const { return state_->uncached; }
  /// Bytes kept per token, all layers: `2 · num_kv_heads · head_dim · sizeof(T)` per cached
  /// layer, plus `d_model · sizeof(T)` per run of uncached layers (the input of its first).
  std::size_t bytes_per_token() const {
    std::size_t bytes = 0;
    for (const Segment& seg : state_->segments) bytes += seg.store->bytes_per_token();
    return bytes;
  }
  /// Bytes that hold tokens now: `bytes_per_token() · position()`, from the stores' counters.
  std::size_t bytes_used() const {
    std::size_t bytes = 0;
    for (const Segment& seg : state_->segments) bytes += seg.store->bytes_used();
    return bytes;
  }

 protected:
  RowMatrix<T> forward(const RowMatrix<T>& x, CostCounters& counters) override {
    const std::vector<std::int32_t> x_indptr{0, static_cast<std::int32_t>(x.rows())};  // [2]
    CostCounters work;
    RowMatrix<T> h = x;  // [p, d_model]: the new tokens' input to the next run of layers
    std::vector<Segment>& segments = state_->segments;
    std::size_t done = 0;
    try {
      for (; done < segments.size(); ++done) {
        Segment& seg = segments[done];
        h = run_stack(*seg.stack, *seg.store, {seg.seq}, x_indptr, h, &work,
                      "kvlab::Decoder::prefill");
      }
    } catch (...) {
      // The runs below kept the step: back to the tokens before it (the failing run is unchanged).
      for (std::size_t i = 0; i < done; ++i)
        segments[i].store->truncate(segments[i].seq, this->position());
      throw;
    }
    counters += work;
    return h;  // [p, d_model]
  }
  void truncate(int position) override {
    for (Segment& seg : state_->segments) seg.store->truncate(seg.seq, position);
  }

 private:
  struct Segment {
    int first = 0;                                   // the run's first layer
    std::shared_ptr<const AttentionStack<T>> stack;  // its layers
    std::unique_ptr<KVStore<T>> store;               // K/V (cached) or its first layer's inputs
    int seq = 0;                                     // this decoder's sequence in store
  };
  // Behind one pointer: GCC 12 at -O3 speculatively inlines this class's forward() where
  // another decoder's is called, and warns (-Warray-bounds) of members past that object's end.
  struct State {
    std::vector<int> uncached;      // ascending
    std::vector<Segment> segments;  // the runs of layers, bottom to top
  };
  bool is_uncached(int layer) const {
    for (int l : state_->uncached)
      if (l == layer) return true;
    return false;
  }

  std::unique_ptr<State> state_;
};

}  // namespace kvlab
