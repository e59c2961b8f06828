/// \file
/// \brief `PagedStore`: the `KVStore` of a paged KV cache.
///
/// The K and V of every sequence are in the blocks of one shared pool (`PagedKVCache`), taken as
/// sequences grow. A step projects the new tokens only, writes their K and V into their slots and
/// attends through the batch's block tables with one `cpu::paged_prefill_attention` call per layer.
/// Checked against `RecomputeStore` and `ContiguousStore` in `tests/store/test_kv_store.cpp`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvlab/analysis/memory_accounting.hpp"
#include "kvlab/cache/block_tables.hpp"
#include "kvlab/cache/paged_kv_cache.hpp"
#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/paged_view.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/cpu/paged_attention.hpp"
#include "kvlab/matrix.hpp"
#include "kvlab/store/kv_store.hpp"

namespace kvlab {

/// K and V of every past token, in the blocks of a `PagedKVCache` pool shared by all sequences
/// (and possibly by other stores over the same pool).
///
/// At a step of a batch of sequences:
///  - `begin_step` counts the blocks that all of them need (new blocks, and copies of shared
///    partly filled last blocks) and throws `OutOfBlocks` before taking any if the pool lacks
///    them; then it reserves each sequence's slots and builds the batch's block tables once for
///    all layers; the step computes the new tokens only;
///  - `append` writes each layer's k and v into those slots (`PagedKVCache::write`);
///  - `attend` is one `cpu::paged_prefill_attention` over the ragged batch: each sequence's
///    queries, through its block table.
/// The work is that of `ContiguousStore` (the same counts in every counter); the memory differs:
/// blocks as sequences grow instead of a reservation per sequence, and `fork` shares blocks
/// instead of copying (copy on write of a shared last block). `S` is the type K and V are
/// stored as (`KVStorage`: `T`, fp16, bf16, int8, int4), encoded on write and decoded as read.
template <typename T, typename S = T>
class PagedStore : public KVStore<T> {
 public:
  /// A store with a pool of its own: `num_blocks` blocks of `block_size` tokens, in `layout`,
  /// with a sliding window of `window` keys and `sinks` attention sinks (0: none).
  /// \throws InvalidArgument if any size is below 1 (or as `PagedKVCache`).
  PagedStore(int num_layers, int num_kv_heads, int head_dim, int block_size, int num_blocks,
             KVLayout layout = KVLayout::NHD, int window = 0, int sinks = 0)
      : PagedStore(std::make_shared<PagedKVCache<T, S>>(
            num_layers, num_kv_heads, head_dim, block_size, num_blocks, layout, window, sinks)) {}

  /// A store over `pool`, which other stores may share (each sequence belongs to the pool; a
  /// store is the step's bookkeeping and the kernel).
  /// \throws InvalidArgument if `pool` is null.
  explicit PagedStore(std::shared_ptr<PagedKVCache<T, S>> pool)
      : KVStore<T>("kvlab::PagedStore", checked(pool).num_layers(), checked(pool).num_kv_heads(),
                   checked(pool).head_dim()),
        pool_(std::move(pool)) {}

  const char* name() const override { return "paged"; }
  const char* storage_name() const override { return KVStorage<S>::name(); }
  std::size_t bytes_per_token() const override {
    return static_cast<std::size_t>(cache_bytes_per_token(*pool_));
  }
  const PagedKVCacheBase* paged_pool() const override { return pool_.get(); }
  /// The pool's sliding window (`PagedKVCache::window`): after each step, the blocks wholly
  /// before each stepped sequence's window go back to the pool.
  int window() const override { return pool_->window(); }
  /// The pool's attention sinks (`PagedKVCache::sinks`): their blocks are never given back.
  int sinks() const override { return pool_->sinks(); }

  int add_sequence() override { return pool_->add_sequence(); }
  std::vector<int> sequences() const override { return pool_->sequences(); }
  /// The blocks in use, whole (`paged_cache_footprint`).
  std::size_t bytes_reserved() const override {
    return static_cast<std::size_t>(paged_cache_footprint(*pool_).reserved_bytes);
  }
  /// The tokens in those blocks, a block shared by forks counted once (`paged_cache_footprint`).
  std::size_t bytes_used() const override {
    return static_cast<std::size_t>(paged_cache_footprint(*pool_).used_bytes);
  }

  /// The pool (read-only): blocks, reference counts, every sequence's block table.
  const PagedKVCache<T, S>& cache() const { return *pool_; }
  /// The pool, shared (to build another store or decoder over the same blocks).
  const std::shared_ptr<PagedKVCache<T, S>>& pool() const { return pool_; }

 protected:
  bool do_contains(int seq) const override { return pool_->contains(seq); }
  int do_length(int seq) const override { return pool_->length(seq); }
  void do_free_sequence(int seq) override { pool_->free_sequence(seq); }
  int do_fork(int seq) override { return pool_->fork(seq); }
  void do_truncate(int seq, int length) override { pool_->truncate(seq, length); }

  void do_begin_step(StepBatch& batch, const RowMatrix<T>& new_inputs, RowMatrix<T>& inputs,
                     const char* caller) override {
    // Every block the step needs, counted before any is taken: all or nothing.
    std::vector<int> tokens;  // [batch]
    for (int i = 0; i < batch.size(); ++i) tokens.push_back(batch.new_tokens(i));
    const int needed = pool_->blocks_needed(batch.seqs, tokens);
    if (needed > pool_->allocator().num_free()) {
      const std::string what =
          batch.size() == 1 ? " tokens of sequence " + std::to_string(batch.seqs[0])
                            : " new tokens of " + std::to_string(batch.size()) + " sequences";
      detail::fail<OutOfBlocks>(
          caller, "free blocks",
          "at least " + std::to_string(needed) + " for " + std::to_string(batch.new_rows()) + what,
          pool_->allocator().num_free());
    }
    batch.row_indptr = batch.new_indptr;  // the new tokens only
    batch.first_position.clear();
    slots_.clear();
    int reserved = 0;  // sequences given their slots so far
    try {
      for (; reserved < batch.size(); ++reserved) {
        const int seq = batch.seq(reserved);
        batch.first_position.push_back(pool_->length(seq));
        const std::vector<std::int64_t> slots = pool_->reserve(seq, batch.new_tokens(reserved));
        slots_.insert(slots_.end(), slots.begin(), slots.end());
      }
      tables_ = std::make_unique<BlockTables>(pool_->tables(batch.seqs));  // every layer's
      inputs = new_inputs;
    } catch (...) {  // out of memory on the host: give back what was reserved
      for (int i = 0; i < reserved; ++i) pool_->truncate(batch.seq(i), batch.first(i));
      release_step();
      throw;
    }
  }

  void do_append(int layer, const RowMatrix<T>& k, const RowMatrix<T>& v) override {
    pool_->write(layer, slots_, k, v);
  }

  void do_attend(int layer, const AttentionShape& shape, const RowMatrix<T>& q,
                 const std::vector<std::int32_t>& q_indptr, RowMatrix<T>& out,
                 CostCounters* counters) override {
    cpu::paged_prefill_attention(shape, q, q_indptr, pool_->view(layer, *tables_), out, counters);
  }

  void do_end_step() override {
    const StepBatch& batch = this->step();
    for (int i = 0; i < batch.size(); ++i) pool_->release_out_of_window(batch.seq(i));
    release_step();
  }
  // Every sequence back to its length; a private copy made of a shared last block (copy on
  // write) stays the sequence's, holding the same tokens: lengths and contents are restored,
  // block ids and reference counts may differ.
  void do_abort_step() noexcept override {
    const StepBatch& batch = this->step();
    for (int i = 0; i < batch.size(); ++i) {  // give back the step's slots
      pool_->truncate(batch.seq(i), batch.first(i));
    }
    release_step();
  }

 private:
  static const PagedKVCache<T, S>& checked(const std::shared_ptr<PagedKVCache<T, S>>& pool) {
    if (!pool) detail::fail("kvlab::PagedStore", "pool", "a non-null pool", "nullptr");
    return *pool;
  }
  void release_step() noexcept {
    slots_.clear();
    tables_.reset();
  }

  std::shared_ptr<PagedKVCache<T, S>> pool_;
  std::vector<std::int64_t> slots_;      // [step rows]: the open step's slots, in row order
  std::unique_ptr<BlockTables> tables_;  // the open step's block tables, for every layer
};

}  // namespace kvlab
