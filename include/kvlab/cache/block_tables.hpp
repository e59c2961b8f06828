/// \file
/// \brief `BlockTables`: the block tables of a batch of sequences in CSR form.
///
/// The tables (indptr, indices, last_page_len) are checked on construction, and give the
/// `PagedKVView` over a block pool.
#pragma once

#include <climits>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/core/paged_view.hpp"
#include "kvlab/core/random.hpp"

namespace kvlab {

/// Tokens per block of a paged pool, as a type of its own: where a block size and a block count
/// are passed side by side (`BlockTables(indptr, indices, last_page_len, BlockSize{16},
/// NumBlocks{64})`), the two cannot be swapped, and a call with two plain ints does not compile.
struct BlockSize {
  /// `tokens` per block (checked by the function it is given to: >= 1).
  explicit constexpr BlockSize(int tokens) : value(tokens) {}
  int value;  ///< tokens per block
};

/// Blocks in a paged pool, as a type of its own (see `BlockSize`).
struct NumBlocks {
  /// `blocks` in the pool (checked by the function it is given to: >= 1).
  explicit constexpr NumBlocks(int blocks) : value(blocks) {}
  int value;  ///< blocks in the pool
};

/// Owns the CSR arrays of a batch's block tables (see `PagedKVView` for their meaning) and
/// guarantees their invariants: `indptr` starts at 0 and grows by at least one block per
/// sequence, every index is a block of the pool, and `1 <= last_page_len[s] <= block_size`.
class BlockTables {
 public:
  /// Tables from their CSR arrays, checked.
  /// \param indptr         [batch + 1], batch >= 1
  /// \param indices        [indptr[batch]], each in [0, num_blocks), or — in tables with a
  ///                       window — `kReleasedBlock` for a block gone back to the pool out of
  ///                       the sliding window (a kernel refuses it unless the window leaves it
  ///                       unread)
  /// \param last_page_len  [batch], each in [1, block_size]
  /// \param block_size     tokens per block, >= 1
  /// \param num_blocks     blocks in the pool the indices point into, >= 1
  /// \param window         the sliding window the tables are read with, in keys (0: none, the
  ///                       default); the views carry it (`PagedKVView::window`)
  ///
  /// The two sizes have types of their own (`BlockSize{16}, NumBlocks{64}`): swapped, or given as
  /// plain ints, they do not compile.
  /// \throws InvalidArgument naming the first array element that breaks an invariant (a
  ///         `kReleasedBlock` in tables without a window is one: no block is released there).
  BlockTables(std::vector<std::int32_t> indptr, std::vector<std::int32_t> indices,
              std::vector<std::int32_t> last_page_len, BlockSize block_size, NumBlocks num_blocks,
              int window = 0)
      : indptr_(std::move(indptr)),
        indices_(std::move(indices)),
        last_page_len_(std::move(last_page_len)),
        num_blocks_(num_blocks.value),
        block_size_(block_size.value),
        window_(window) {
    constexpr const char* kWhere = "kvlab::BlockTables";
    detail::require_at_least(kWhere, "num_blocks", num_blocks_, 1);
    detail::require_at_least(kWhere, "block_size", block_size_, 1);
    detail::require_at_least(kWhere, "window", window_, 0);
    detail::require_at_least(kWhere, "indptr.size()", indptr_.size(), std::size_t{2});
    const std::size_t batch = indptr_.size() - 1;
    detail::require_equal(kWhere, "indptr[0]", indptr_[0], 0);
    for (std::size_t s = 0; s < batch; ++s) {
      if (indptr_[s + 1] <= indptr_[s]) {
        detail::fail(kWhere, "indptr[" + std::to_string(s + 1) + "]",
                     "> indptr[" + std::to_string(s) + "] (" + std::to_string(indptr_[s]) +
                         "): every sequence holds at least one block",
                     indptr_[s + 1]);
      }
      const std::int64_t pages = indptr_[s + 1] - indptr_[s];
      if (pages > INT_MAX / block_size_) {
        detail::fail(kWhere, "indptr[" + std::to_string(s + 1) + "]",
                     "a sequence of at most " + std::to_string(INT_MAX / block_size_) + " blocks",
                     std::to_string(pages) + " blocks");
      }
    }
    detail::require_equal(kWhere, "indices.size()", indices_.size(),
                          static_cast<std::size_t>(indptr_.back()), "indptr[batch]");
    for (std::size_t i = 0; i < indices_.size(); ++i) {
      const bool released = window_ > 0 && indices_[i] == kReleasedBlock;
      if (!released && (indices_[i] < 0 || indices_[i] >= num_blocks_)) {
        detail::fail(kWhere, "indices[" + std::to_string(i) + "]",
                     "in [0, " + std::to_string(num_blocks_) + ")" +
                         (window_ > 0 ? " or kReleasedBlock (-1)"
                                      : " (kReleasedBlock only in tables with a window)"),
                     indices_[i]);
      }
    }
    detail::require_equal(kWhere, "last_page_len.size()", last_page_len_.size(), batch, "batch");
    for (std::size_t s = 0; s < batch; ++s) {
      if (last_page_len_[s] < 1 || last_page_len_[s] > block_size_) {
        detail::fail(kWhere, "last_page_len[" + std::to_string(s) + "]",
                     "in [1, block_size (" + std::to_string(block_size_) + ")]", last_page_len_[s]);
      }
    }
  }

  /// Tables from one list of physical blocks per sequence and the sequences' lengths in tokens
  /// (each list must hold exactly ceil(length / block_size) blocks), read with `window` (as the
  /// constructor's).
  /// \throws InvalidArgument if a list has the wrong number of blocks, or as the constructor.
  static BlockTables from_lists(const std::vector<std::vector<std::int32_t>>& blocks,
                                const std::vector<int>& lengths, BlockSize block_size,
                                NumBlocks num_blocks, int window = 0) {
    constexpr const char* kWhere = "kvlab::BlockTables::from_lists";
    const int tokens = block_size.value;  // per block
    detail::require_at_least(kWhere, "block_size", tokens, 1);
    detail::require_equal(kWhere, "lengths.size()", lengths.size(), blocks.size(), "blocks.size()");
    std::vector<std::int32_t> indptr{0}, indices, last_page_len;
    for (std::size_t s = 0; s < blocks.size(); ++s) {
      const std::string name = "blocks[" + std::to_string(s) + "].size()";
      detail::require_at_least(kWhere, "lengths[" + std::to_string(s) + "]", lengths[s], 1);
      const int pages = (lengths[s] - 1) / tokens + 1;
      detail::require_equal(kWhere, name, blocks[s].size(), static_cast<std::size_t>(pages),
                            "ceil(lengths[" + std::to_string(s) + "] / block_size)");
      indices.insert(indices.end(), blocks[s].begin(), blocks[s].end());
      indptr.push_back(static_cast<std::int32_t>(indices.size()));
      last_page_len.push_back(lengths[s] - (pages - 1) * tokens);
    }
    return BlockTables(std::move(indptr), std::move(indices), std::move(last_page_len), block_size,
                       num_blocks, window);
  }

  /// Tables of sequences of `lengths` tokens whose blocks are taken from a shuffled pool of
  /// `ceil(lengths[0] / block_size) + ... + spare_blocks` blocks (`kvlab::shuffle` by `rng`): the
  /// block tables are not monotonic, and `spare_blocks` blocks belong to no sequence — the layout
  /// of a pool after some traffic, on which tests and benchmarks check and time the paged
  /// kernels. The pool has `num_blocks()` blocks.
  /// \throws InvalidArgument if `lengths` is empty, a length or `block_size` is below 1, or
  ///         `spare_blocks < 0`.
  static BlockTables shuffled(const std::vector<int>& lengths, int block_size, int spare_blocks,
                              Rng& rng) {
    constexpr const char* kWhere = "kvlab::BlockTables::shuffled";
    detail::require_at_least(kWhere, "block_size", block_size, 1);
    detail::require_at_least(kWhere, "spare_blocks", spare_blocks, 0);
    detail::require_at_least(kWhere, "lengths.size()", lengths.size(), std::size_t{1});
    long long pages = 0;
    for (std::size_t s = 0; s < lengths.size(); ++s) {
      detail::require_at_least(kWhere, "lengths[" + std::to_string(s) + "]", lengths[s], 1);
      pages += (lengths[s] - 1) / block_size + 1;
    }
    if (pages + spare_blocks > INT_MAX) {
      detail::fail(kWhere, "lengths", "at most " + std::to_string(INT_MAX) + " blocks in all",
                   pages + spare_blocks);
    }
    const int num_blocks = static_cast<int>(pages) + spare_blocks;
    std::vector<std::int32_t> order(static_cast<std::size_t>(num_blocks));  // [num_blocks]
    for (int b = 0; b < num_blocks; ++b) order[static_cast<std::size_t>(b)] = b;
    shuffle(order, rng);
    std::vector<std::vector<std::int32_t>> lists;  // [batch][blocks of the sequence]
    std::size_t next = 0;
    for (int len : lengths) {
      const auto count = static_cast<std::size_t>((len - 1) / block_size + 1);
      lists.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(next),
                         order.begin() + static_cast<std::ptrdiff_t>(next + count));
      next += count;
    }
    return from_lists(lists, lengths, BlockSize{block_size}, NumBlocks{num_blocks});
  }

  /// Sequences in the batch.
  int batch() const { return static_cast<int>(indptr_.size()) - 1; }
  /// Tokens per block.
  int block_size() const { return block_size_; }
  /// Blocks in the pool.
  int num_blocks() const { return num_blocks_; }
  /// The sliding window the tables are read with, in keys (0: none).
  int window() const { return window_; }
  /// CSR row pointers, [batch + 1].
  const std::vector<std::int32_t>& indptr() const { return indptr_; }
  /// Physical block ids, [indptr[batch]].
  const std::vector<std::int32_t>& indices() const { return indices_; }
  /// Tokens in each sequence's last block, [batch].
  const std::vector<std::int32_t>& last_page_len() const { return last_page_len_; }
  /// Tokens in sequence `seq`.
  /// \throws InvalidArgument if `seq` is not in [0, batch()).
  int seq_len(int seq) const {
    if (seq < 0 || seq >= batch()) {
      detail::fail("kvlab::BlockTables::seq_len", "seq", "in [0, " + std::to_string(batch()) + ")",
                   seq);
    }
    return view<float>(nullptr, nullptr, 1, 1).seq_len(seq);
  }

  /// The view of a pool through these tables; valid while both live.
  /// \param k             keys, `num_blocks * block_size * num_kv_heads * head_dim` values in
  ///                      `layout`
  /// \param v             values, the same
  /// \param num_kv_heads  K/V heads per token
  /// \param head_dim      values per head
  /// \param layout        `KVLayout::NHD`: `[num_blocks, block_size, num_kv_heads, head_dim]`;
  ///                      `KVLayout::HND`: `[num_blocks, num_kv_heads, block_size, head_dim]`
  /// \throws InvalidArgument if `num_kv_heads` or `head_dim` is below 1. (Null `k` and `v` give a
  ///         view of the tables alone: `seq_len` and `block_of` read no pool.)
  template <typename T>
  PagedKVView<T> view(const T* k, const T* v, int num_kv_heads, int head_dim,
                      KVLayout layout = KVLayout::NHD) const& {
    constexpr const char* kWhere = "kvlab::BlockTables::view";
    detail::require_at_least(kWhere, "num_kv_heads", num_kv_heads, 1);
    detail::require_at_least(kWhere, "head_dim", head_dim, 1);
    PagedKVView<T> out;
    out.k = k;
    out.v = v;
    out.num_blocks = num_blocks_;
    out.block_size = block_size_;
    out.num_kv_heads = num_kv_heads;
    out.head_dim = head_dim;
    out.batch = batch();
    out.indptr = indptr_.data();
    out.indices = indices_.data();
    out.layout = layout;
    out.last_page_len = last_page_len_.data();
    out.window = window_;
    return out;
  }
  /// The view of temporary tables would point into arrays freed at the end of the statement:
  /// keep the tables in a variable.
  template <typename T>
  PagedKVView<T> view(const T* k, const T* v, int num_kv_heads, int head_dim,
                      KVLayout layout = KVLayout::NHD) const&& = delete;

 private:
  std::vector<std::int32_t> indptr_;         // [batch + 1]
  std::vector<std::int32_t> indices_;        // [indptr[batch]]
  std::vector<std::int32_t> last_page_len_;  // [batch]
  int num_blocks_;
  int block_size_;
  int window_;  // keys, 0: none
};

}  // namespace kvlab
