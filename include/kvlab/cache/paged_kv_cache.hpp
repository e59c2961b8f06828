/// \file
/// \brief `PagedKVCache`: the KV caches of many sequences in one pool of fixed-size blocks.
///
/// The blocks are reached through per-sequence block tables; they are allocated on demand, shared
/// between forked sequences by reference count and copied on write. `PagedKVCacheBase` is its
/// bookkeeping, which does not depend on how values are stored (the scheduler reads only that).
/// Checked in the tests against a model over 10^5 random operations.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvlab/cache/block_allocator.hpp"
#include "kvlab/cache/block_tables.hpp"
#include "kvlab/cache/paged_sequences.hpp"
#include "kvlab/config.hpp"
#include "kvlab/core/paged_view.hpp"
#include "kvlab/kv_storage.hpp"
#include "kvlab/matrix.hpp"

namespace kvlab {

/// The bookkeeping of a `PagedKVCache`, which does not depend on how its values are stored: the
/// layers and heads, the block allocator, every sequence's block table, forks, truncation, and
/// which reserved slots each layer has written. A scheduler that decides which blocks go where
/// (`Scheduler`) reads and changes the pool through this class alone; the values and the views
/// over them are `PagedKVCache<T, S>`'s.
class PagedKVCacheBase {
 public:
  virtual ~PagedKVCacheBase() = default;

  /// Layers.
  int num_layers() const { return num_layers_; }
  /// K/V heads per layer.
  int num_kv_heads() const { return num_kv_heads_; }
  /// Values per head.
  int head_dim() const { return head_dim_; }
  /// Tokens per block.
  int block_size() const { return book_.block_size(); }
  /// The order of a block's values.
  KVLayout layout() const { return layout_; }
  /// The name of the storage type: "fp32", "fp16", "bf16", "int8", "int4" (`KVStorage`).
  virtual const char* storage_name() const = 0;
  /// Bytes of one token's K (or V) in one layer, as stored:
  /// `num_kv_heads · storage_row_bytes<S>(head_dim)`.
  virtual std::size_t token_bytes() const = 0;
  /// The pool's allocator (read-only): free and used blocks, reference counts.
  const BlockAllocator& allocator() const { return book_.allocator(); }

  /// Starts an empty sequence (no block yet) and returns its id; ids are never reused.
  int add_sequence() { return book_.add_sequence(); }

  /// Starts a sequence that begins with the full blocks `blocks`, which other holders keep (the
  /// blocks of a prefix-cache hit): `PagedSequences::add_sequence(blocks)`. Its length is
  /// `blocks.size() * block_size`; it shares the blocks, and appends go to new blocks.
  /// \throws InvalidArgument if a block is out of range, not in use, or holds a slot not yet
  ///         written in some layer (nothing changes).
  int add_sequence(const std::vector<std::int32_t>& blocks) {
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const std::int32_t b = blocks[i];
      if (b < 0 || b >= allocator().num_blocks()) continue;  // refused by book_ below
      for (int l = 0; l < num_layers_; ++l) {
        for (int t = 0; unwritten_[at(l)] > 0 && t < block_size(); ++t) {
          if (written_[at(l)][at(static_cast<std::int64_t>(b) * block_size() + t)] == 0) {
            detail::fail("kvlab::PagedKVCache::add_sequence", "blocks[" + std::to_string(i) + "]",
                         "a block written in every layer",
                         "block " + std::to_string(b) + ", slot " + std::to_string(t) +
                             " unwritten in layer " + std::to_string(l));
          }
        }
      }
    }
    return book_.add_sequence(blocks);
  }

  /// Adds a holder that is not a sequence to `block` (a prefix cache keeping a block whose
  /// sequence has ended): the block stays out of the free list until `release_block`.
  /// \throws InvalidArgument if `block` is out of range or free.
  void retain_block(std::int32_t block) { book_.retain(block); }
  /// Removes a holder added by `retain_block`; the block returns to the pool when none is left.
  /// \throws InvalidArgument if `block` is out of range or free.
  void release_block(std::int32_t block) { book_.release(block); }

  /// True when `seq` is a live sequence.
  bool contains(int seq) const { return book_.contains(seq); }

  /// Ids of the live sequences, ascending.
  std::vector<int> sequences() const { return book_.sequences(); }

  /// Tokens in sequence `seq`.
  /// \throws InvalidArgument if `seq` is not a live sequence.
  int length(int seq) const { return book_.length(seq); }

  /// The block table of `seq`: physical block ids, logical order.
  /// \throws InvalidArgument if `seq` is not a live sequence.
  const std::vector<std::int32_t>& blocks(int seq) const { return book_.blocks(seq); }

  /// Blocks that `reserve(seq, n)` would take from the pool: new blocks past the last one, and
  /// one for the copy of a shared, partly filled last block.
  /// \throws InvalidArgument if `seq` is not live or `n < 1`.
  int blocks_needed(int seq, int n) const { return book_.blocks_needed(seq, n); }

  /// Blocks that reserving `tokens[i]` for each `seqs[i]` in turn takes: see
  /// `PagedSequences::blocks_needed` (a block shared only within the batch is copied once fewer).
  /// \throws InvalidArgument if a sequence is not live, a count is below 1 or the sizes differ.
  int blocks_needed(const std::vector<int>& seqs, const std::vector<int>& tokens) const {
    return book_.blocks_needed(seqs, tokens);
  }

  /// Makes room for `n` more tokens of `seq` and returns their slots, [n]: slot
  /// `block * block_size + offset` in every layer's pool. A block is allocated when the last
  /// one is full; a shared, partly filled last block is copied first (all layers). The slots
  /// count as unwritten in every layer until `write` fills them.
  /// \throws InvalidArgument if `seq` is not live or `n < 1`; OutOfBlocks if the pool lacks
  ///         the blocks (nothing changes).
  std::vector<std::int64_t> reserve(int seq, int n) { return reserve_for("reserve", seq, n); }

  /// Starts a sequence that shares every block of `seq` (reference counts + 1) and returns its
  /// id. No K/V is copied until one of them appends into the shared last block. A sequence with
  /// reserved tokens not yet written in every layer cannot be forked (the fork would share slots
  /// that only the parent's writes fill): write them first.
  /// \throws InvalidArgument if `seq` is not live or has unwritten tokens.
  int fork(int seq) {
    if (book_.contains(seq)) {
      for (int l = 0; l < num_layers_; ++l) {
        if (unwritten_[at(l)] == 0) continue;  // the usual case: nothing to look for
        const std::vector<std::int32_t>& blocks = book_.blocks(seq);
        for (int pos = 0; pos < book_.length(seq); ++pos) {
          if (blocks[at(pos / block_size())] == kReleasedBlock) continue;  // out of the window
          if (written_[at(l)][at(slot_of(blocks, pos))] == 0) {
            detail::fail("kvlab::PagedKVCache::fork", "seq",
                         "a sequence whose tokens are written in every layer",
                         "sequence " + std::to_string(seq) + ", token " + std::to_string(pos) +
                             " unwritten in layer " + std::to_string(l));
          }
        }
      }
    }
    return book_.fork(seq);
  }

  /// Shortens `seq` to its first `length` tokens: the blocks past them lose this holder (and
  /// return to the pool when no other sequence holds them). The kept tokens are untouched; a
  /// later append overwrites the dropped slots of a private last block, and copies a shared one
  /// first, as usual.
  /// With a sliding window, the next token's window (keys from `length − W + 1`) must not reach
  /// a block already given back (`release_out_of_window`).
  /// \throws InvalidArgument if `seq` is not live, `length` is not in [0, length(seq)], or its
  ///         window reaches a released block.
  void truncate(int seq, int length) {
    if (book_.contains(seq) && length >= 0 && length <= book_.length(seq)) {
      book_.check_window_truncate(seq, length, window_);
      release_slots(seq, length);
    }
    book_.truncate(seq, length);
  }

  /// The sliding window of the pool's attention: each query sees its last `window()` keys, and
  /// `release_out_of_window` gives back the blocks before them; 0 for none.
  int window() const { return window_; }
  /// The attention sinks: each query also sees the first `sinks()` tokens of its sequence,
  /// whose blocks `release_out_of_window` keeps; 0 for none.
  int sinks() const { return sinks_; }

  /// With a window, gives back the blocks of `seq` wholly before the next token's window — the
  /// keys from `length(seq) − W + 1` on are all a later query can see — and returns how many
  /// went back now (`PagedSequences::release_front`: their table entries become
  /// `kReleasedBlock`). A sequence then holds at most `ceil((W − 1 + C) / block_size) + 1`
  /// blocks while a step of C tokens runs. Without a window it does nothing.
  /// \throws InvalidArgument if `seq` is not live.
  int release_out_of_window(int seq) { return book_.release_out_of_window(seq, window_, sinks_); }

  /// Blocks that `seq` holds: its table's entries less those given back out of the window.
  /// \throws InvalidArgument if `seq` is not live.
  int held_blocks(int seq) const { return book_.held_blocks(seq); }

  /// Ends `seq`: its blocks lose a holder, and those with none left return to the pool.
  /// \throws InvalidArgument if `seq` is not live.
  void free_sequence(int seq) {
    if (book_.contains(seq)) release_slots(seq, 0);
    book_.free_sequence(seq);
  }

  /// The block tables of a batch of live, non-empty sequences, in the order given, with the pool's
  /// window (`BlockTables::window`).
  /// \throws InvalidArgument if `seqs` is empty or names a sequence that is not live or empty.
  BlockTables tables(const std::vector<int>& seqs) const { return book_.tables(seqs, window_); }

  /// A saved state of the pool, for `restore`: its bookkeeping (every sequence's block table,
  /// the allocator's reference counts and free list) and the stored K and V of chosen blocks.
  struct Checkpoint {
    PagedSequences book;                ///< the bookkeeping as it was
    std::vector<std::int32_t> blocks;   ///< [saved blocks]: whose values are kept below
    std::vector<unsigned char> values;  ///< their K and V, every layer, as stored
  };
  /// Bytes of one block's stored K and V, every layer: what `save_values` keeps per block.
  std::size_t block_bytes() const { return 2 * at(num_layers_) * at(block_size()) * token_bytes(); }
  /// The bookkeeping as it is now, without values (`save_values` adds them). Its size is that of
  /// the block tables: a pool's values are not copied.
  Checkpoint checkpoint() const { return Checkpoint{book_, {}, {}}; }
  /// Keeps in `saved` the stored K and V (every layer) of `blocks`, which `restore` writes back:
  /// the blocks that may be overwritten before it (freed, and perhaps taken by a new sequence).
  /// \throws InvalidArgument if a block is out of range.
  void save_values(Checkpoint& saved, const std::vector<std::int32_t>& blocks) const {
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i] < 0 || blocks[i] >= allocator().num_blocks()) {
        detail::fail("kvlab::PagedKVCache::save_values", "blocks[" + std::to_string(i) + "]",
                     "in [0, " + std::to_string(allocator().num_blocks()) + ")", blocks[i]);
      }
    }
    std::vector<unsigned char> values(blocks.size() * block_bytes());  // [blocks, block bytes]
    for (std::size_t i = 0; i < blocks.size(); ++i)
      copy_values_out(blocks[i], values.data() + i * block_bytes());
    saved.blocks = blocks;
    saved.values = std::move(values);
  }
  /// Puts the pool back as it was at `checkpoint`: every sequence and block table, the
  /// allocator, and the values of the blocks that `save_values` kept (`saved` is consumed; no
  /// memory is allocated). What the checkpoint does not hold is the caller's to know: blocks it
  /// did not save must not have been overwritten since. Every reserved slot must be written
  /// (no step open in a store over the pool): which slots are written is not saved.
  /// \throws InvalidArgument (nothing changes) if `saved` is of a pool of another size or a
  ///         reserved slot is unwritten.
  void restore(Checkpoint&& saved) {
    constexpr const char* kWhere = "kvlab::PagedKVCache::restore";
    detail::require_equal(kWhere, "saved.book.block_size()", saved.book.block_size(), block_size(),
                          "block_size");
    detail::require_equal(kWhere, "saved.book.allocator().num_blocks()",
                          saved.book.allocator().num_blocks(), allocator().num_blocks(),
                          "num_blocks");
    detail::require_equal(kWhere, "saved.values.size()", saved.values.size(),
                          saved.blocks.size() * block_bytes(), "saved.blocks.size() * block bytes");
    for (int l = 0; l < num_layers_; ++l) {
      if (unwritten_[at(l)] != 0) {
        detail::fail(
            kWhere, "pool", "every reserved slot written (no step open)",
            std::to_string(unwritten_[at(l)]) + " unwritten in layer " + std::to_string(l));
      }
    }
    book_ = std::move(saved.book);
    for (std::size_t i = 0; i < saved.blocks.size(); ++i)
      copy_values_in(saved.blocks[i], saved.values.data() + i * block_bytes());
  }

 protected:
  /// The bookkeeping of an empty pool whose stored elements are `unit_bytes` bytes each, holding
  /// `unit_values` values (`sizeof(S)` and `KVStorage<S>::kValues` of the derived cache), named
  /// `storage` in messages.
  /// A sliding window of `window` keys (0: none) makes the views carry it and lets
  /// `release_out_of_window` give blocks back, those of the first `sinks` tokens kept.
  /// \throws InvalidArgument if any size is below 1, `window` is negative, `sinks` is negative
  ///         or not below a window (none without one), `head_dim` is not a multiple of
  ///         `unit_values`, or the pool overflows the address space.
  PagedKVCacheBase(int num_layers, int num_kv_heads, int head_dim, int block_size, int num_blocks,
                   KVLayout layout, std::size_t unit_bytes, int unit_values, const char* storage,
                   int window, int sinks = 0)
      : num_layers_(num_layers),
        num_kv_heads_(num_kv_heads),
        head_dim_(head_dim),
        layout_(layout),
        window_(window),
        sinks_(sinks),
        book_(checked_sizes(num_layers, num_kv_heads, head_dim, block_size, num_blocks, unit_bytes,
                            unit_values, storage, window, sinks),
              num_blocks, "kvlab::PagedKVCache") {
    const std::size_t layers = at(num_layers), slots = at(num_blocks) * at(block_size);
    written_.assign(layers, std::vector<std::uint8_t>(slots, 1));  // nothing reserved yet
    unwritten_.assign(layers, 0);
  }
  /// Checks every size of the constructor before anything is allocated (the pool's free list
  /// included: a pool too large for the address space is refused, not allocated in part);
  /// returns `block_size`.
  /// \throws InvalidArgument as the constructor.
  static int checked_sizes(int num_layers, int num_kv_heads, int head_dim, int block_size,
                           int num_blocks, std::size_t unit_bytes, int unit_values,
                           const char* storage, int window, int sinks) {
    constexpr const char* kWhere = "kvlab::PagedKVCache";
    detail::require_at_least(kWhere, "block_size", block_size, 1);
    detail::require_at_least(kWhere, "num_blocks", num_blocks, 1);
    detail::check_window_sinks(kWhere, window, sinks);
    detail::require_at_least(kWhere, "num_layers", num_layers, 1);
    detail::require_at_least(kWhere, "num_kv_heads", num_kv_heads, 1);
    detail::require_at_least(kWhere, "head_dim", head_dim, 1);
    if (head_dim % unit_values != 0) {
      detail::fail(kWhere, "head_dim",
                   "a multiple of " + std::to_string(unit_values) + " (the values of one " +
                       storage + " block)",
                   head_dim);
    }
    // The sizes, checked >= 1, as std::size_t once.
    const std::size_t layers = at(num_layers), slots = at(num_blocks) * at(block_size);
    const std::size_t token = at(num_kv_heads) * at(head_dim / unit_values);
    const std::size_t limit =
        static_cast<std::size_t>(PTRDIFF_MAX) / unit_bytes / 2 / layers / token;
    if (slots > limit) {
      detail::fail(kWhere, "num_blocks * block_size",
                   "at most " + std::to_string(limit) + " tokens", slots);
    }
    return block_size;
  }
  /// A copy of the bookkeeping (the derived cache copies its values beside it).
  PagedKVCacheBase(const PagedKVCacheBase&) = default;
  /// Copies the bookkeeping (the derived cache copies its values beside it).
  PagedKVCacheBase& operator=(const PagedKVCacheBase&) = default;

  /// `reserve(seq, n)` for the public function `function` (of this class), which errors name.
  std::vector<std::int64_t> reserve_for(const char* function, int seq, int n) {
    std::vector<std::int64_t> slots = book_.reserve(
        seq, n,
        [this](std::int32_t from, std::int32_t to, int tokens) { copy_block(from, to, tokens); },
        function);
    for (int l = 0; l < num_layers_; ++l)
      for (std::int64_t slot : slots) mark(l, slot, false);
    return slots;
  }
  /// A layer, or a slot, as the index of the per-layer and per-slot vectors.
  static std::size_t at(std::int64_t i) { return static_cast<std::size_t>(i); }
  /// Copies the stored K and V of the first `tokens` slots of block `from` into block `to`, in
  /// every layer (copy on write; the written marks are the base's).
  virtual void copy_block_data(std::int32_t from, std::int32_t to, int tokens) = 0;
  /// Copies block `block`'s stored K and V, every layer, to `out` (`block_bytes()` bytes).
  virtual void copy_values_out(std::int32_t block, unsigned char* out) const = 0;
  /// Writes block `block`'s stored K and V, every layer, from `in` (`block_bytes()` bytes, from
  /// `copy_values_out`).
  virtual void copy_values_in(std::int32_t block, const unsigned char* in) = 0;

  /// Throws InvalidArgument (naming `where`) if a token that `view` reaches was reserved and
  /// never written in `layer`.
  template <typename S>
  void check_written(const char* where, int layer, const PagedKVView<S>& view) const {
    const std::size_t l = at(layer);
    // Every reserved slot of this layer written (the usual case, counted): nothing to look for.
    for (int s = 0; unwritten_[l] > 0 && s < view.batch; ++s) {
      for (int pos = 0; pos < view.seq_len(s); ++pos) {
        if (view.block_of(s, pos) == kReleasedBlock) continue;  // out of the window
        const std::int64_t slot =
            static_cast<std::int64_t>(view.block_of(s, pos)) * block_size() + pos % block_size();
        if (written_[l][at(slot)] == 0) {
          detail::fail(where, "tables", "tokens written in layer " + std::to_string(layer),
                       "token " + std::to_string(pos) + " of sequence " + std::to_string(s) +
                           " of the tables reserved but never written (write it first)");
        }
      }
    }
  }
  /// Throws InvalidArgument (naming `where`) unless `layer` is in [0, num_layers()).
  void check_layer(const char* where, int layer) const {
    if (layer < 0 || layer >= num_layers_) {
      detail::fail(where, "layer", "in [0, " + std::to_string(num_layers_) + ")", layer);
    }
  }
  /// Marks `slot` of `layer` written (or reserved and not written), keeping the count.
  void mark(int layer, std::int64_t slot, bool written) {
    std::uint8_t& flag = written_[at(layer)][at(slot)];
    if (flag == (written ? 1 : 0)) return;
    unwritten_[at(layer)] += written ? -1 : 1;
    flag = written ? 1 : 0;
  }
  /// The slots of `seq` at positions `length` and after are no longer reserved: if never
  /// written, they stop counting as unwritten. (A slot of a block that another sequence still
  /// holds keeps its mark: it is that sequence's too.)
  void release_slots(int seq, int length) {
    const std::vector<std::int32_t>& blocks = book_.blocks(seq);
    for (int pos = length; pos < book_.length(seq); ++pos) {
      const std::int32_t block = blocks[at(pos / block_size())];
      if (block == kReleasedBlock || allocator().ref_count(block) > 1) continue;
      for (int l = 0; l < num_layers_; ++l) mark(l, slot_of(blocks, pos), true);
    }
  }
  /// The slot of token `pos` of a sequence whose block table is `blocks`.
  std::int64_t slot_of(const std::vector<std::int32_t>& blocks, int pos) const {
    return static_cast<std::int64_t>(blocks[at(pos / block_size())]) * block_size() +
           pos % block_size();
  }

 private:
  // Copies the first `tokens` slots of block `from` into block `to`, in every layer: the marks
  // (the copy is as written as the original), then the stored values (`copy_block_data`).
  void copy_block(std::int32_t from, std::int32_t to, int tokens) {
    for (int l = 0; l < num_layers_; ++l) {
      for (int i = 0; i < tokens; ++i) {
        const std::int64_t slot = static_cast<std::int64_t>(from) * block_size() + i;
        mark(l, static_cast<std::int64_t>(to) * block_size() + i, written_[at(l)][at(slot)] != 0);
      }
    }
    copy_block_data(from, to, tokens);
  }

  int num_layers_;
  int num_kv_heads_;
  int head_dim_;
  KVLayout layout_;
  int window_;           // 0, or the window of the pool's attention
  int sinks_;            // 0, or S < window: the first S tokens of each sequence are kept
  PagedSequences book_;  // which blocks each sequence holds; the allocator
  // [num_layers][num_blocks * block_size]: 0 where reserve() made room and write() has not
  // filled it yet, 1 elsewhere
  std::vector<std::vector<std::uint8_t>> written_;
  std::vector<std::int64_t> unwritten_;  // [num_layers]: the 0s of written_, counted
};

/// The KV caches of many sequences, in one pool of `num_blocks` blocks of `block_size` tokens.
///
/// Per layer the pool is `[num_blocks, block_size, num_kv_heads, head_dim]` for K and the same
/// for V (`KVLayout::NHD`, the default), or `[num_blocks, num_kv_heads, block_size, head_dim]`
/// (`KVLayout::HND`; see `PagedKVView`); one `BlockAllocator` and one block table per sequence
/// serve all layers (a block id means the same slots in every layer).
///
/// A cache of one layer takes new tokens in one call: `append(seq, k, v)`. With several layers
/// a decoder step is two calls, as in vLLM: `reserve(seq, n)` makes room for n tokens — a new
/// block only when the last one is full — and returns their slots; then, layer by layer,
/// `write(layer, slots, k, v)` stores the tokens' keys and values. A slot reserved but not yet
/// written in a layer cannot be read by mistake: `view` of that layer refuses tables that reach
/// it (and `fork` refuses a sequence with such slots, which its fork would share). `fork(seq)`
/// starts a sequence that shares every block of `seq` (a common prompt, beam search); when either
/// later appends into a shared, partly filled last block, that block is first copied (copy on
/// write), so the other sequence never sees the change. `free_sequence` returns blocks whose last
/// holder is gone.
///
/// `T` is the type rows come in; `S` the type they are stored as (`KVStorage`: `T`, fp16, bf16,
/// int8 or int4 — see `ContiguousKVCache`): `write` encodes, the kernels decode what they read.
///
/// The bookkeeping (sequences, blocks, forks, what is written) is `PagedKVCacheBase`'s.
///
/// \par Example
/// Three sequences grown in turns, so that their blocks interleave in the pool, then the block
/// tables of the batch and the view a kernel reads (tutorial 04, which prints them):
/// \snippet 04_paged_attention.cpp batch
/// Used in \ref tutorial_03 (forks, copy on write, freeing), \ref tutorial_04 (attention through
/// the tables) and \ref tutorial_05 (its memory against a contiguous cache's).
///
/// Every operation checks everything first: on error (`OutOfBlocks`, `InvalidArgument`) no
/// sequence, block or count has changed.
template <typename T, typename S = T>
class PagedKVCache : public PagedKVCacheBase {
 public:
  /// An empty cache.
  /// \param num_layers    layers, each with a K and a V pool
  /// \param num_kv_heads  K/V heads per token
  /// \param head_dim      values per head
  /// \param block_size    tokens per block
  /// \param num_blocks    blocks in the pool (shared by all layers)
  /// \param layout        the order of a block's values (NHD: token-major, HND: head-major)
  /// \param window        a sliding window of that many keys (0: none): the views carry it and
  ///                      `release_out_of_window` gives the blocks before it back
  /// \param sinks         attention sinks (0: none; below `window`): each query also sees the
  ///                      first `sinks` tokens of its sequence, whose blocks are kept
  /// \throws InvalidArgument if any size is below 1, `window` is negative, `sinks` is negative
  ///         or not below a window (none without one), `head_dim` is not a multiple of the
  ///         values per stored element of `S` (32 for int8 and int4), or the pool overflows the
  ///         address space.
  PagedKVCache(int num_layers, int num_kv_heads, int head_dim, int block_size, int num_blocks,
               KVLayout layout = KVLayout::NHD, int window = 0, int sinks = 0)
      : PagedKVCacheBase(num_layers, num_kv_heads, head_dim, block_size, num_blocks, layout,
                         sizeof(S), KVStorage<S>::kValues, KVStorage<S>::name(), window, sinks) {
    const std::size_t slots = at(num_blocks) * at(block_size);
    const std::size_t token = at(num_kv_heads) * at(head_dim / KVStorage<S>::kValues);
    k_.assign(at(num_layers), std::vector<S>(slots * token));
    v_.assign(at(num_layers), std::vector<S>(slots * token));
  }

  /// The name of the storage type: "fp32", "fp16", "bf16", "int8", "int4" (`KVStorage<S>`).
  const char* storage_name() const override { return KVStorage<S>::name(); }
  /// Bytes of one token's K (or V) in one layer: `num_kv_heads · storage_row_bytes<S>(head_dim)`.
  std::size_t token_bytes() const override {
    return at(this->num_kv_heads()) * storage_row_bytes<S>(this->head_dim());
  }

  /// Appends the keys and values of `k.rows()` new tokens to `seq` in a cache of one layer:
  /// `reserve(seq, n)` and `write(0, slots, k, v)` in one call. Returns the slots.
  /// \param seq  a live sequence
  /// \param k  [n, num_kv_heads * head_dim], n >= 1 (any Eigen expression of scalar T)
  /// \param v  [n, num_kv_heads * head_dim]
  /// \throws InvalidArgument if the cache has more than one layer (reserve, then write each
  ///         layer), `seq` is not live or a shape is wrong; OutOfBlocks if the pool lacks the
  ///         blocks. Nothing changes in any of these cases.
  std::vector<std::int64_t> append(int seq, const Eigen::Ref<const RowMatrix<T>>& k,
                                   const Eigen::Ref<const RowMatrix<T>>& v) {
    constexpr const char* kWhere = "kvlab::PagedKVCache::append";
    detail::require_equal(kWhere, "num_layers()", this->num_layers(), 1,
                          "a cache of one layer; with more, reserve then write each layer");
    detail::require_at_least(kWhere, "k.rows()", static_cast<long>(k.rows()), 1L);
    check_rows(kWhere, k, v, static_cast<long>(k.rows()), "k.rows()");
    detail::require_storable<S>(kWhere, "k", k);  // before anything changes (write checks again)
    detail::require_storable<S>(kWhere, "v", v);
    const std::vector<std::int64_t> slots =
        this->reserve_for("append", seq, static_cast<int>(k.rows()));
    write(0, slots, k, v);
    return slots;
  }

  /// Removed: room for `n` tokens is `reserve(seq, n)`, which returns their slots; then
  /// `write(layer, slots, k, v)` in each layer. An old call fails to compile, naming `reserve`.
  std::vector<std::int64_t> append(int seq, int n) = delete;  // use reserve(seq, n), then write

  /// Stores keys and values of tokens at `slots` (from `reserve`) in `layer`. Any slot of the
  /// pool is accepted, as in vLLM's slot mapping: writing into a slot that `reserve` did not just
  /// return (a block shared with a fork, say) overwrites what is there.
  /// \param layer  in [0, num_layers)
  /// \param slots  [n] slots, each in [0, num_blocks * block_size)
  /// \param k      [n, num_kv_heads * head_dim] (any Eigen expression of scalar T; row-major
  ///               rows and row blocks are read in place)
  /// \param v      [n, num_kv_heads * head_dim]
  /// \throws InvalidArgument for a wrong layer, shape or slot, or a value that `S` cannot hold
  ///         (`KVStorage<S>::limit()`); nothing is written.
  void write(int layer, const std::vector<std::int64_t>& slots,
             const Eigen::Ref<const RowMatrix<T>>& k, const Eigen::Ref<const RowMatrix<T>>& v) {
    constexpr const char* kWhere = "kvlab::PagedKVCache::write";
    this->check_layer(kWhere, layer);
    check_rows(kWhere, k, v, static_cast<long>(slots.size()), "slots.size()");
    const std::int64_t num_slots =
        static_cast<std::int64_t>(this->allocator().num_blocks()) * this->block_size();
    for (std::size_t i = 0; i < slots.size(); ++i) {
      if (slots[i] < 0 || slots[i] >= num_slots) {
        detail::fail(kWhere, "slots[" + std::to_string(i) + "]",
                     "in [0, " + std::to_string(num_slots) + ")", slots[i]);
      }
    }
    detail::require_storable<S>(kWhere, "k", k);
    detail::require_storable<S>(kWhere, "v", v);
    const std::size_t l = at(layer);
    const PagedKVView<S> pool = layout_view(layer);  // slot_offset() of the pool's layout
    for (std::size_t i = 0; i < slots.size(); ++i) {
      const auto row = static_cast<Eigen::Index>(i);
      for (int h = 0; h < this->num_kv_heads();
           ++h) {  // each head's row encoded where its layout puts it
        const auto dst = static_cast<std::ptrdiff_t>(pool.slot_offset(slots[i], h));
        KVStorage<S>::encode(k.row(row).data() + h * this->head_dim(), this->head_dim(),
                             k_[l].data() + dst);
        KVStorage<S>::encode(v.row(row).data() + h * this->head_dim(), this->head_dim(),
                             v_[l].data() + dst);
      }
      this->mark(layer, slots[i], true);
    }
  }

  /// The view of `layer` through `tables` (from `tables()`); valid while both live and until
  /// the next reserve, fork or free. Every token that the tables reach must have been written
  /// in this layer: a slot that `reserve` made and `write` never filled is refused here, not
  /// read as stale keys.
  /// \throws InvalidArgument if `layer` is out of range, `tables` is for another pool, or a
  ///         token of the tables is unwritten in `layer`.
  PagedKVView<S> view(int layer, const BlockTables& tables) const {
    constexpr const char* kWhere = "kvlab::PagedKVCache::view";
    this->check_layer(kWhere, layer);
    detail::require_equal(kWhere, "tables.num_blocks()", tables.num_blocks(),
                          this->allocator().num_blocks(), "num_blocks");
    detail::require_equal(kWhere, "tables.block_size()", tables.block_size(), this->block_size(),
                          "block_size");
    const std::size_t l = at(layer);
    PagedKVView<S> view = tables.view(k_[l].data(), v_[l].data(), this->num_kv_heads(),
                                      this->head_dim(), this->layout());
    view.window = this->window();
    view.sinks = this->sinks();
    check_written(kWhere, layer, view);
    return view;
  }

  /// A view of a temporary `BlockTables` would dangle as soon as the statement ends: keep the
  /// tables in a variable (`const BlockTables t = cache.tables({seq}); cache.view(0, t)`).
  PagedKVView<S> view(int layer, const BlockTables&& tables) const = delete;

 private:
  // Checks that k and v are [rows, num_kv_heads * head_dim]; `rows_from` names where rows comes
  // from.
  void check_rows(const char* where, const Eigen::Ref<const RowMatrix<T>>& k,
                  const Eigen::Ref<const RowMatrix<T>>& v, long rows, const char* rows_from) const {
    const long width = static_cast<long>(this->num_kv_heads()) * this->head_dim();
    detail::require_equal(where, "k.rows()", static_cast<long>(k.rows()), rows, rows_from);
    detail::require_equal(where, "k.cols()", static_cast<long>(k.cols()), width,
                          "num_kv_heads * head_dim");
    detail::require_equal(where, "v.rows()", static_cast<long>(v.rows()), rows, "k.rows()");
    detail::require_equal(where, "v.cols()", static_cast<long>(v.cols()), width,
                          "num_kv_heads * head_dim");
  }
  // A view of `layer` without block tables: for its slot_offset() only.
  PagedKVView<S> layout_view(int layer) const {
    PagedKVView<S> pool;
    pool.k = k_[at(layer)].data();
    pool.v = v_[at(layer)].data();
    pool.num_blocks = this->allocator().num_blocks();
    pool.block_size = this->block_size();
    pool.num_kv_heads = this->num_kv_heads();
    pool.head_dim = this->head_dim();
    pool.layout = this->layout();
    return pool;
  }
  // One run of `tokens` rows per head (HND), or of `tokens` whole token rows (NHD), per layer.
  void copy_block_data(std::int32_t from, std::int32_t to, int tokens) override {
    const bool hnd = this->layout() == KVLayout::HND;
    const int runs = hnd ? this->num_kv_heads() : 1;
    const std::size_t run = at(tokens) * at(this->head_dim() / KVStorage<S>::kValues) *
                            at(hnd ? 1 : this->num_kv_heads());
    for (int l = 0; l < this->num_layers(); ++l) {
      const PagedKVView<S> pool = layout_view(l);
      for (std::vector<S>* values : {&k_[at(l)], &v_[at(l)]}) {
        for (int h = 0; h < runs; ++h) {
          const auto src =
              values->begin() +
              pool.slot_offset(static_cast<std::int64_t>(from) * this->block_size(), h);
          std::copy(src, src + static_cast<std::ptrdiff_t>(run),
                    values->begin() +
                        pool.slot_offset(static_cast<std::int64_t>(to) * this->block_size(), h));
        }
      }
    }
  }

  // A block's elements in one layer's K (or V): in both layouts a block is one run of
  // block_size * num_kv_heads * row_units elements, from block * that.
  std::size_t block_elements() const {
    return at(this->block_size()) * at(this->num_kv_heads()) *
           at(this->head_dim() / KVStorage<S>::kValues);
  }
  void copy_values_out(std::int32_t block, unsigned char* out) const override {
    static_assert(std::is_trivially_copyable<S>::value, "stored values are copied as bytes");
    const std::size_t n = block_elements(), bytes = n * sizeof(S);
    for (int l = 0; l < this->num_layers(); ++l) {
      for (const std::vector<S>* values : {&k_[at(l)], &v_[at(l)]}) {
        std::memcpy(out, values->data() + at(block) * n, bytes);
        out += bytes;
      }
    }
  }
  void copy_values_in(std::int32_t block, const unsigned char* in) override {
    const std::size_t n = block_elements(), bytes = n * sizeof(S);
    for (int l = 0; l < this->num_layers(); ++l) {
      for (std::vector<S>* values : {&k_[at(l)], &v_[at(l)]}) {
        std::memcpy(values->data() + at(block) * n, in, bytes);
        in += bytes;
      }
    }
  }

  // [num_layers][num_blocks * block_size * num_kv_heads * row_units], in layout, row_units =
  // head_dim / values per S
  std::vector<std::vector<S>> k_;
  // [num_layers][num_blocks * block_size * num_kv_heads * row_units], in layout
  std::vector<std::vector<S>> v_;
};

}  // namespace kvlab
