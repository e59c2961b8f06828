/// \file
/// \brief `PagedSequences`: the bookkeeping of a paged KV cache.
///
/// It records which blocks each sequence holds, in which order, and how many tokens, with
/// allocation on demand, fork by reference count and copy on write. The K/V storage is the owner's
/// (host memory in `PagedKVCache`, device memory in `cuda::PagedKVCache`). Checked in the tests
/// against a model over 10^5 random operations.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kvlab/cache/block_allocator.hpp"
#include "kvlab/cache/block_tables.hpp"
#include "kvlab/config.hpp"
#include "kvlab/core/views.hpp"

namespace kvlab {

/// The block lists of many sequences over one pool of `num_blocks` blocks of `block_size`
/// tokens: everything a paged KV cache knows except the keys and values themselves.
///
/// A sequence holds `ceil(length / block_size)` blocks, all full but the last. `reserve` takes a
/// new block only when the last one is full; `fork` shares every block (reference count + 1);
/// appending into a shared, partly filled last block first moves the sequence to a private
/// copy (copy on write), which the owner makes through the callback it passes to `reserve`.
/// Every operation checks everything first: on error no sequence, block or count has changed.
class PagedSequences {
 public:
  /// No sequence yet; a pool of `num_blocks` free blocks of `block_size` tokens.
  /// \param block_size  tokens per block, >= 1
  /// \param num_blocks  blocks in the pool, >= 1
  /// \param owner       the owner's name, which every error message starts with (e.g.
  ///                    "kvlab::PagedKVCache", giving "kvlab::PagedKVCache::reserve: ...")
  /// \throws InvalidArgument if `block_size` or `num_blocks` is below 1.
  PagedSequences(int block_size, int num_blocks, std::string owner)
      : owner_(std::move(owner)),
        block_size_(checked_block_size(block_size, owner_)),
        allocator_(num_blocks) {}

  /// Tokens per block.
  int block_size() const { return block_size_; }
  /// The pool's allocator (read-only): free and used blocks, reference counts.
  const BlockAllocator& allocator() const { return allocator_; }

  /// Starts an empty sequence (no block yet) and returns its id; ids are never reused.
  int add_sequence() {
    sequences_[next_id_] = Sequence{};
    return next_id_++;
  }

  /// Starts a sequence whose first tokens are those of `blocks`, full blocks that other
  /// holders keep (a prefix cache's hit): each gets one more holder, and the sequence has
  /// `blocks.size() * block_size` tokens. Returns its id.
  /// \throws InvalidArgument if a block is out of range or not in use (nothing changes).
  int add_sequence(const std::vector<std::int32_t>& blocks) {
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i] < 0 || blocks[i] >= allocator_.num_blocks() ||
          allocator_.ref_count(blocks[i]) == 0) {
        detail::fail(where("add_sequence").c_str(), "blocks[" + std::to_string(i) + "]",
                     "a block in use in [0, " + std::to_string(allocator_.num_blocks()) + ")",
                     blocks[i]);
      }
    }
    for (std::int32_t b : blocks) allocator_.share(b);
    sequences_[next_id_] = Sequence{blocks, static_cast<int>(blocks.size()) * block_size_};
    return next_id_++;
  }

  /// Adds a holder that is not a sequence to block `block` (a prefix cache keeping it).
  /// \throws InvalidArgument if `block` is out of range or free.
  void retain(std::int32_t block) { allocator_.share(block); }
  /// Removes a holder added by `retain`; at reference count 0 the block returns to the pool.
  /// \throws InvalidArgument if `block` is out of range or free.
  void release(std::int32_t block) { allocator_.release(block); }

  /// True when `seq` is a live sequence.
  bool contains(int seq) const { return sequences_.count(seq) != 0; }

  /// Ids of the live sequences, ascending.
  std::vector<int> sequences() const {
    std::vector<int> ids;
    for (const auto& entry : sequences_) ids.push_back(entry.first);
    return ids;
  }

  /// Tokens in sequence `seq`.
  /// \throws InvalidArgument if `seq` is not a live sequence.
  int length(int seq) const { return find("length", seq).length; }

  /// The block table of `seq`: physical block ids, logical order.
  /// \throws InvalidArgument if `seq` is not a live sequence.
  const std::vector<std::int32_t>& blocks(int seq) const { return find("blocks", seq).blocks; }

  /// Blocks that `reserve(seq, n)` takes from the pool: new blocks past the last one, plus one
  /// for the private copy of a shared, partly filled last block.
  /// \throws InvalidArgument if `seq` is not live or `n < 1`.
  int blocks_needed(int seq, int n) const { return plan_reserve("blocks_needed", seq, n).needed(); }

  /// Blocks that `reserve(seqs[i], tokens[i])` for every i, in turn, takes from the pool: the
  /// new blocks, and the copies of shared, partly filled last blocks — of which, when every
  /// holder of such a block is in the batch, the last to reserve copies nothing (the block is
  /// its alone by then). So a forked pair decoding together needs one copy, not two.
  /// \throws InvalidArgument if a sequence is not live, `tokens[i] < 1`, or the sizes differ.
  int blocks_needed(const std::vector<int>& seqs, const std::vector<int>& tokens) const {
    detail::require_equal(where("blocks_needed").c_str(), "tokens.size()", tokens.size(),
                          seqs.size(), "seqs.size()");
    int needed = 0;
    std::map<std::int32_t, int> copies;  // shared partly filled last block -> batch holders
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      const std::string at = "[" + std::to_string(i) + "]";
      const ReservePlan plan =
          plan_reserve("blocks_needed", seqs[i], tokens[i], "seqs" + at, "tokens" + at);
      needed += plan.new_blocks;
      if (plan.copy_last) ++copies[find("blocks_needed", seqs[i]).blocks.back()];
    }
    for (const auto& entry : copies)
      needed += std::min(entry.second, allocator_.ref_count(entry.first) - 1);
    return needed;
  }

  /// Makes room for `n` more tokens of `seq` and returns their slots, [n]: slot
  /// `block * block_size + offset`. A block is allocated when the last one is full; a shared,
  /// partly filled last block is first replaced by a private copy, made by
  /// `copy_block(from, to, tokens)` (copy the first `tokens` slots of block `from` into block
  /// `to`, in every layer).
  /// \throws InvalidArgument if `seq` is not live or `n < 1`; OutOfBlocks if the pool lacks
  ///         the blocks; whatever `copy_block` throws. Nothing changes in any of these cases.
  /// Errors name `function` (the public function the caller called; `reserve` by default).
  template <typename CopyBlock>
  std::vector<std::int64_t> reserve(int seq, int n, CopyBlock&& copy_block,
                                    const char* function = "reserve") {
    const ReservePlan plan = plan_reserve(function, seq, n);
    Sequence& s = find(function, seq);
    const int filled = plan.filled;
    const bool copy_last = plan.copy_last;
    const int new_blocks = plan.new_blocks;
    const int needed = plan.needed();
    if (needed > allocator_.num_free()) {
      detail::fail<OutOfBlocks>(where(function).c_str(), "free blocks",
                                "at least " + std::to_string(needed) + " for " + std::to_string(n) +
                                    " tokens of sequence " + std::to_string(seq),
                                allocator_.num_free());
    }
    // The memory first, then every block at once (the copy first): a failure changes nothing.
    std::vector<std::int64_t> slots(static_cast<std::size_t>(n));  // [n]
    s.blocks.reserve(s.blocks.size() + static_cast<std::size_t>(new_blocks));
    const std::vector<std::int32_t> taken = allocator_.allocate(needed);  // [needed]
    if (copy_last) {  // copy on write: this sequence gets a private copy of the shared block
      try {
        copy_block(s.blocks.back(), taken.front(), filled);
      } catch (...) {
        for (auto b = taken.rbegin(); b != taken.rend(); ++b) allocator_.release(*b);  // as before
        throw;
      }
      allocator_.release(s.blocks.back());
      s.blocks.back() = taken.front();
    }
    s.blocks.insert(s.blocks.end(), taken.begin() + (copy_last ? 1 : 0), taken.end());
    for (int i = 0; i < n; ++i) {
      const int pos = s.length + i;
      slots[static_cast<std::size_t>(i)] =
          static_cast<std::int64_t>(s.blocks[static_cast<std::size_t>(pos / block_size_)]) *
              block_size_ +
          pos % block_size_;
    }
    s.length += n;
    return slots;
  }

  /// Gives back the blocks of `seq` that hold only tokens before position `keep_from` (a sliding
  /// window's first visible key): each loses this holder, and its entry in the block table
  /// becomes `kReleasedBlock` — the table stays append-only, positions keep their pages. The
  /// last block, which later tokens fill, is given back only when it is full. Blocks holding a
  /// token before `keep_before` (attention sinks) are kept. Returns the blocks given back now.
  /// \throws InvalidArgument if `seq` is not live or `keep_from` is not in [0, length(seq)].
  int release_front(int seq, int keep_from, int keep_before = 0) {
    Sequence& s = find("release_front", seq);
    if (keep_from < 0 || keep_from > s.length) {
      detail::fail(where("release_front").c_str(), "keep_from",
                   "in [0, " + std::to_string(s.length) + "]", keep_from);
    }
    int released = 0;
    for (std::size_t b = 0;
         b < s.blocks.size() && static_cast<int>(b + 1) * block_size_ <= keep_from; ++b) {
      if (s.blocks[b] == kReleasedBlock || static_cast<int>(b) * block_size_ < keep_before)
        continue;
      allocator_.release(s.blocks[b]);
      s.blocks[b] = kReleasedBlock;
      ++released;
    }
    return released;
  }

  /// With a sliding window of `window` keys, gives back the blocks of `seq` wholly before the
  /// next token's window (`release_front` from `first_visible_key(length(seq), window)`) but
  /// those holding its first `sinks` tokens (attention sinks), and returns how many went back
  /// now; without a window (0) does nothing. What `PagedKVCache::release_out_of_window` and its
  /// CUDA twin do.
  /// \throws InvalidArgument if `seq` is not live, `window < 0` or `sinks < 0`.
  int release_out_of_window(int seq, int window, int sinks = 0) {
    const int length = find("release_out_of_window", seq).length;
    detail::require_at_least(where("release_out_of_window").c_str(), "window", window, 0);
    detail::require_at_least(where("release_out_of_window").c_str(), "sinks", sinks, 0);
    return window == 0 ? 0 : release_front(seq, first_visible_key(length, window), sinks);
  }

  /// Throws unless the next token after truncating `seq` to `length` could still see its window
  /// of `window` keys (from `length − window + 1`, `first_visible_key`): their first block must
  /// not have been given back (`release_front`). Nothing to check without a window, or for a
  /// `length` outside [0, length(seq)] (which `truncate` refuses). The check of
  /// `PagedKVCache::truncate` and `cuda::PagedKVCache::truncate`, before they change anything.
  /// \throws InvalidArgument if `seq` is not live, `window < 0`, or naming `length` (with the
  ///         smallest length that would do) if the window reaches a block given back.
  void check_window_truncate(int seq, int length, int window) const {
    const Sequence& s = find("truncate", seq);
    detail::require_at_least(where("truncate").c_str(), "window", window, 0);
    if (window == 0 || length < 0 || length > s.length) return;
    const auto page = static_cast<std::size_t>(first_visible_key(length, window) / block_size_);
    if (page >= s.blocks.size() || s.blocks[page] != kReleasedBlock) return;
    std::size_t first_kept = page;  // the first page still held
    while (first_kept < s.blocks.size() && s.blocks[first_kept] == kReleasedBlock) ++first_kept;
    detail::fail(where("truncate").c_str(), "length",
                 "at least " +
                     std::to_string(static_cast<long long>(first_kept) * block_size_ + window - 1) +
                     " (the next token's window would reach blocks already back in the pool)",
                 length);
  }

  /// Blocks of `seq` that it still holds (its table's entries other than `kReleasedBlock`).
  /// \throws InvalidArgument if `seq` is not live.
  int held_blocks(int seq) const {
    const Sequence& s = find("held_blocks", seq);
    return static_cast<int>(std::count_if(s.blocks.begin(), s.blocks.end(),
                                          [](std::int32_t b) { return b != kReleasedBlock; }));
  }

  /// Starts a sequence that shares every block of `seq` (reference counts + 1) and returns its
  /// id. Nothing is copied until one of them appends into the shared last block.
  /// \throws InvalidArgument if `seq` is not live.
  int fork(int seq) {
    const Sequence parent = find("fork", seq);
    for (std::int32_t b : parent.blocks)
      if (b != kReleasedBlock) allocator_.share(b);
    sequences_[next_id_] = parent;
    return next_id_++;
  }

  /// Shortens `seq` to its first `length` tokens: the blocks past them lose this holder (and
  /// return to the pool when no other sequence holds them). A kept shared last block is copied
  /// on the next append, as usual.
  /// \throws InvalidArgument if `seq` is not live or `length` is not in [0, length(seq)].
  void truncate(int seq, int length) {
    Sequence& s = find("truncate", seq);
    if (length < 0 || length > s.length) {
      detail::fail(where("truncate").c_str(), "length", "in [0, " + std::to_string(s.length) + "]",
                   length);
    }
    const std::size_t keep =
        length == 0 ? 0 : static_cast<std::size_t>((length - 1) / block_size_ + 1);
    for (std::size_t b = keep; b < s.blocks.size(); ++b)
      if (s.blocks[b] != kReleasedBlock) allocator_.release(s.blocks[b]);
    s.blocks.resize(keep);
    s.length = length;
  }

  /// Ends `seq`: its blocks lose a holder, and those with none left return to the pool.
  /// \throws InvalidArgument if `seq` is not live.
  void free_sequence(int seq) {
    const Sequence& s = find("free_sequence", seq);
    for (std::int32_t b : s.blocks)
      if (b != kReleasedBlock) allocator_.release(b);
    sequences_.erase(seq);
  }

  /// The block tables of a batch of live, non-empty sequences, in the order given, read with
  /// the sliding window `window` (0: none; a sequence whose blocks went back out of a window,
  /// `release_front`, needs one).
  /// \throws InvalidArgument if `seqs` is empty or names a sequence that is not live or empty,
  ///         or holds a released block and `window` is 0.
  BlockTables tables(const std::vector<int>& seqs, int window = 0) const {
    const std::string at = where("tables");
    detail::require_at_least(at.c_str(), "seqs.size()", seqs.size(), std::size_t{1});
    std::vector<std::vector<std::int32_t>> lists;
    std::vector<int> lengths;
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      const int seq = seqs[i];
      const std::string name = "seqs[" + std::to_string(i) + "]";
      const Sequence& s = find("tables", seq, name);
      if (s.length == 0)
        detail::fail(at.c_str(), name, "a non-empty sequence", std::to_string(seq) + " (empty)");
      if (window == 0 && !s.blocks.empty() && s.blocks.front() == kReleasedBlock) {
        detail::fail(at.c_str(), name, "a sequence that holds all its blocks (window is 0)",
                     std::to_string(seq) + " (its first block went back out of a window)");
      }
      lists.push_back(s.blocks);
      lengths.push_back(s.length);
    }
    return BlockTables::from_lists(lists, lengths, BlockSize{block_size_},
                                   NumBlocks{allocator_.num_blocks()}, window);
  }

 private:
  // What reserve(seq, n) does to the pool.
  struct ReservePlan {
    int filled = 0;          // tokens in the last block, 0 if it is full or there is none
    bool copy_last = false;  // the last block is shared and partly filled: copy it first
    int new_blocks = 0;      // blocks past the last one
    int needed() const { return new_blocks + (copy_last ? 1 : 0); }
  };
  // The plan of reserve(seq, n); errors name the arguments `seq_name` and `n_name`.
  ReservePlan plan_reserve(const char* function, int seq, int n,
                           const std::string& seq_name = "seq",
                           const std::string& n_name = "n") const {
    const Sequence& s = find(function, seq, seq_name);
    detail::require_at_least(where(function).c_str(), n_name.c_str(), n, 1);
    ReservePlan plan;
    plan.filled = s.length % block_size_;
    plan.copy_last = plan.filled != 0 && allocator_.ref_count(s.blocks.back()) > 1;
    const int room = plan.filled == 0 ? 0 : block_size_ - plan.filled;
    plan.new_blocks = n <= room ? 0 : (n - room - 1) / block_size_ + 1;
    return plan;
  }

  struct Sequence {
    std::vector<std::int32_t> blocks;  // [ceil(length / block_size)]: physical ids, logical order
    int length = 0;                    // tokens
  };

  static int checked_block_size(int block_size, const std::string& owner) {
    detail::require_at_least(owner.c_str(), "block_size", block_size, 1);
    return block_size;
  }
  std::string where(const char* function) const { return owner_ + "::" + function; }
  // Live sequence `seq`; an error names the argument `name`.
  Sequence& find(const char* function, int seq, const std::string& name = "seq") {
    const auto it = sequences_.find(seq);
    if (it == sequences_.end())
      detail::fail(where(function).c_str(), name, "a live sequence id", seq);
    return it->second;
  }
  const Sequence& find(const char* function, int seq, const std::string& name = "seq") const {
    const auto it = sequences_.find(seq);
    if (it == sequences_.end())
      detail::fail(where(function).c_str(), name, "a live sequence id", seq);
    return it->second;
  }

  std::string owner_;
  int block_size_;
  BlockAllocator allocator_;
  std::map<int, Sequence> sequences_;
  int next_id_ = 0;
};

}  // namespace kvlab
