/// \file
/// \brief `PagedDecoder`: decoding with a paged KV cache. Each step projects q, k and v of the
/// new tokens only, writes k and v into the sequence's blocks, and attends through its block
/// table. Several decoders can share one pool, and a decoder can be forked. Checked against
/// `CachedDecoder` and `NaiveDecoder` at every step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvlab/cache/paged_kv_cache.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/cpu/paged_attention.hpp"
#include "kvlab/cpu/types.hpp"
#include "kvlab/model/attention_layer.hpp"
#include "kvlab/model/decoder.hpp"

namespace kvlab {

/// A decoder that keeps K and V of its tokens in the blocks of a `PagedKVCache`: one sequence
/// of a pool that other decoders may share.
///
/// At step t (p new tokens):
///  0. `append(seq, p)` makes room: a new block only when the last one is full (a shared,
///     partly filled last block is copied first) — the only allocation of the step;
/// then each layer:
///  1. projects q, k and v of the p new tokens only;
///  2. writes k and v into the slots from step 0 (`PagedKVCache::write`);
///  3. runs `cpu::paged_prefill_attention` of the p queries through the sequence's block table
///     (causal within the new tokens; with p = 1 it is a decode step).
///
/// The work is exactly that of `CachedDecoder` (the same counts in every counter); what differs
/// is the memory: blocks as the sequence grows instead of `capacity` tokens up front. `fork()`
/// gives a second decoder that continues from the same tokens without copying them.
template <typename T>
class PagedDecoder : public Decoder<T> {
 public:
  /// A decoder with a pool of its own: `num_blocks` blocks of `block_size` tokens, their values
  /// in `layout`.
  /// \throws InvalidArgument if `block_size` or `num_blocks` is below 1.
  PagedDecoder(std::shared_ptr<const AttentionStack<T>> stack, int block_size, int num_blocks,
               KVLayout layout = KVLayout::NHD)
      : Decoder<T>(std::move(stack)),
        pool_(std::make_shared<PagedKVCache<T>>(
            this->stack().num_layers(), this->stack().shape().num_kv_heads(),
            this->stack().shape().head_dim(), block_size, num_blocks, layout)),
        seq_(pool_->add_sequence()) {}

  /// A decoder that adds its sequence to `pool`, shared with other decoders of the same stack.
  /// \throws InvalidArgument if `pool` is null or its layers, K/V heads or head_dim differ from
  ///         the stack's.
  PagedDecoder(std::shared_ptr<const AttentionStack<T>> stack,
               std::shared_ptr<PagedKVCache<T>> pool)
      : Decoder<T>(std::move(stack)),
        pool_(checked(std::move(pool), this->stack())),
        seq_(pool_->add_sequence()) {}

  /// Frees this decoder's blocks (those no fork still holds).
  ~PagedDecoder() override { pool_->free_sequence(seq_); }

  /// A new decoder at the same position, continuing from the same tokens: it shares every
  /// block (no K/V is copied) until one of the two appends into the shared last block, which is
  /// then copied for it (copy on write). Counters start at zero.
  std::unique_ptr<PagedDecoder> fork() const {
    return std::unique_ptr<PagedDecoder>(new PagedDecoder(*this, pool_->fork(seq_)));
  }

  /// The pool (read-only): blocks, reference counts, the block tables of every sequence.
  const PagedKVCache<T>& cache() const { return *pool_; }
  /// This decoder's sequence id in `cache()`.
  int sequence() const { return seq_; }

 protected:
  RowMatrix<T> forward(const RowMatrix<T>& x, CostCounters& counters) override {
    const AttentionStack<T>& stack = this->stack();
    const int p = static_cast<int>(x.rows());
    // 0. Room for the p new tokens (throws OutOfBlocks, changing nothing, if the pool is dry).
    const std::vector<std::int64_t> slots = pool_->append(seq_, p);  // [p]
    RowMatrix<T> h = x;  // [p, d_model]: the current layer's input
    RowMatrix<T> k, v;   // [p, num_kv_heads * head_dim]
    try {
      const BlockTables tables = pool_->tables({seq_});  // the same blocks in every layer
      const std::vector<std::int32_t> qo_indptr{0, p};   // [2]: all p queries are this sequence's
      for (int l = 0; l < stack.num_layers(); ++l) {
        const AttentionLayer<T>& layer = stack.layer(l);
        // 1. q, k, v of the new tokens only.
        layer.project_kv(h, k, v, &counters);
        const RowMatrix<T> q = layer.project_q(h, &counters);  // [p, num_heads * head_dim]
        // 2. Keep k and v in the sequence's blocks.
        pool_->write(l, slots, k, v);
        // 3. The new queries attend through the block table to every token, themselves included.
        const RowMatrix<T> attn = cpu::paged_prefill_attention(layer.shape(), q, qo_indptr,
                                                               pool_->view(l, tables), &counters);
        h += layer.project_out(attn, &counters);
      }
    } catch (...) {
      pool_->truncate(seq_, this->position());  // undo step 0 (out of memory in a later layer)
      throw;
    }
    return h;  // [p, d_model]
  }

  void truncate(int position) override { pool_->truncate(seq_, position); }

 private:
  // The fork: same stack, same pool, sequence `seq` (already forked in the pool), position kept.
  PagedDecoder(const PagedDecoder& parent, int seq)
      : Decoder<T>(parent.stack_pointer()), pool_(parent.pool_), seq_(seq) {
    this->continue_from(parent);
  }

  static std::shared_ptr<PagedKVCache<T>> checked(std::shared_ptr<PagedKVCache<T>> pool,
                                                  const AttentionStack<T>& stack) {
    constexpr const char* kWhere = "kvlab::PagedDecoder";
    if (!pool) detail::fail(kWhere, "pool", "a non-null pool", "nullptr");
    detail::require_equal(kWhere, "pool->num_layers()", pool->num_layers(), stack.num_layers(),
                          "stack's num_layers");
    detail::require_equal(kWhere, "pool->num_kv_heads()", pool->num_kv_heads(),
                          stack.shape().num_kv_heads(), "stack's num_kv_heads");
    detail::require_equal(kWhere, "pool->head_dim()", pool->head_dim(), stack.shape().head_dim(),
                          "stack's head_dim");
    return pool;
  }

  std::shared_ptr<PagedKVCache<T>> pool_;
  int seq_;  // this decoder's sequence in pool_
};

}  // namespace kvlab
