/// \file
/// \brief Memory accounting of KV caches under contiguous preallocation and under paging.
///
/// It computes the bytes reserved and the bytes used under contiguous max-length preallocation and
/// under paging, the waste between them, how many sequences fit in a byte budget, and the footprint
/// of a live `PagedKVCache`. Checked in `tests/analysis/test_memory_accounting.cpp` against
/// hand-computed values and against a real PagedKVCache driven through random appends, forks and
/// frees.
///
/// Two ways to keep the KV caches of many sequences, each sequence holding `len` tokens:
///
///  - **Contiguous preallocation.** Each sequence gets one contiguous region for the most
///    tokens it may ever hold, `max_len`, reserved when it starts (the server cannot know how
///    long the answer will be). Reserved: `max_len` tokens per sequence; used: `len`.
///  - **Paging.** The cache is a pool of blocks of `block_size` tokens; a sequence takes a new
///    block only when its last one is full. Reserved: `ceil(len / block_size) · block_size`
///    tokens per sequence; used: `len`. Only the tail of the last block is unused: fewer than
///    `block_size` tokens per sequence (the *internal waste* of paging).
///
/// Tokens become bytes through `bytes_per_token`, the K and V bytes of one token over all
/// layers: kvlab::bytes_per_token(config, dtype) for a real model (524,288 for Llama-2-7B in
/// fp16). All arithmetic is exact, in 64-bit unsigned integers, and checked for overflow.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kvlab/cache/paged_kv_cache.hpp"
#include "kvlab/config.hpp"

namespace kvlab {

/// What a set of KV caches holds in memory: bytes set aside for K and V (`reserved_bytes`) and
/// bytes that hold the K and V of a token (`used_bytes`). The rest is waste: reserved, so no
/// other sequence can use it, yet holding nothing.
struct MemoryFootprint {
  /// Bytes set aside for the sequences' K and V (in no other sequence's use).
  std::uint64_t reserved_bytes = 0;
  /// Bytes of the reservation that hold K and V of a token; at most `reserved_bytes`.
  std::uint64_t used_bytes = 0;

  /// Reserved bytes that hold nothing: `reserved_bytes - used_bytes`.
  std::uint64_t waste_bytes() const { return reserved_bytes - used_bytes; }
  /// `waste_bytes() / reserved_bytes`, in [0, 1]; 0 when nothing is reserved.
  double waste_fraction() const {
    return reserved_bytes == 0
               ? 0.0
               : static_cast<double>(waste_bytes()) / static_cast<double>(reserved_bytes);
  }
  /// `used_bytes / reserved_bytes`, in [0, 1]: the share of the reservation that holds
  /// tokens, `1 - waste_fraction()`; 1 when nothing is reserved.
  double used_fraction() const { return 1.0 - waste_fraction(); }
};

namespace detail {

// tokens * bytes_per_token, or InvalidArgument naming bytes_per_token if the product does not
// fit in std::uint64_t. `what` says which tokens ("reserved").
inline std::uint64_t accounting_bytes(const char* where, std::uint64_t tokens,
                                      std::uint64_t bytes_per_token, const char* what) {
  return checked_size_product(where, "bytes_per_token", tokens, bytes_per_token,
                              " for " + std::to_string(tokens) + " " + what + " tokens");
}

// Checks that lengths[i] >= 0 (and <= max_len when max_len >= 0).
inline void check_lengths(const char* where, const std::vector<std::int64_t>& lengths,
                          std::int64_t max_len = -1) {
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    const std::string name = "lengths[" + std::to_string(i) + "]";
    if (lengths[i] < 0) fail(where, name, ">= 0", lengths[i]);
    if (max_len >= 0 && lengths[i] > max_len) {
      fail(where, name, "in [0, max_len (" + std::to_string(max_len) + ")]", lengths[i]);
    }
  }
}

// Tokens that `len` tokens occupy in blocks of `block_size`: ceil(len / block_size) * block_size.
// len >= 0, block_size >= 1; cannot overflow (len < 2^63, block_size < 2^31).
inline std::uint64_t block_rounded_tokens(std::int64_t len, int block_size) {
  const auto b = static_cast<std::uint64_t>(block_size);
  return (static_cast<std::uint64_t>(len) + b - 1) / b * b;
}

}  // namespace detail

/// Blocks of `block_size` tokens that a sequence of `tokens` tokens holds under paging:
/// `ceil(tokens / block_size)`; 0 for an empty sequence (as kvlab::PagedKVCache, which gives a
/// sequence its first block with its first token).
/// \throws InvalidArgument if `tokens < 0` or `block_size < 1`.
inline std::int64_t blocks_needed(std::int64_t tokens, int block_size) {
  constexpr const char* kWhere = "kvlab::blocks_needed";
  detail::require_at_least(kWhere, "tokens", tokens, std::int64_t{0});
  detail::require_at_least(kWhere, "block_size", block_size, 1);
  return static_cast<std::int64_t>(detail::block_rounded_tokens(tokens, block_size) /
                                   static_cast<std::uint64_t>(block_size));
}

/// The footprint of sequences of `lengths` tokens when each preallocates `max_len` tokens:
///
///     reserved = lengths.size() · max_len · bytes_per_token
///     used     = (lengths[0] + lengths[1] + ...) · bytes_per_token
///
/// The waste is `max_len - len` tokens per sequence: room for tokens that the sequence has
/// not produced yet, or never will.
///
/// \param lengths          [num_sequences] tokens each sequence holds, each in [0, max_len]
/// \param max_len          tokens reserved per sequence, >= 1
/// \param bytes_per_token  K and V bytes of one token, >= 1 (see kvlab::bytes_per_token)
/// \throws InvalidArgument naming the argument for a value out of range, or if a size does not
///         fit in std::uint64_t.
inline MemoryFootprint contiguous_footprint(const std::vector<std::int64_t>& lengths,
                                            std::int64_t max_len, std::uint64_t bytes_per_token) {
  constexpr const char* kWhere = "kvlab::contiguous_footprint";
  detail::require_at_least(kWhere, "max_len", max_len, std::int64_t{1});
  detail::require_at_least(kWhere, "bytes_per_token", bytes_per_token, std::uint64_t{1});
  detail::check_lengths(kWhere, lengths, max_len);
  const auto per_sequence = static_cast<std::uint64_t>(max_len);
  const std::uint64_t reserved =
      detail::checked_size_product(kWhere, "lengths.size()", per_sequence, lengths.size(),
                                   " sequences of max_len " + std::to_string(max_len));
  std::uint64_t used = 0;  // <= reserved: no overflow
  for (std::int64_t len : lengths) used += static_cast<std::uint64_t>(len);
  MemoryFootprint out;
  out.reserved_bytes = detail::accounting_bytes(kWhere, reserved, bytes_per_token, "reserved");
  out.used_bytes = used * bytes_per_token;  // used <= reserved
  return out;
}

/// The footprint of sequences of `lengths` tokens in blocks of `block_size` tokens, with no
/// block shared between sequences:
///
///     reserved = sum over sequences of ceil(len / block_size) · block_size · bytes_per_token
///     used     = (lengths[0] + lengths[1] + ...) · bytes_per_token
///
/// The waste is the internal waste of paging, the unused tail of each sequence's last block:
/// `(block_size - len % block_size) % block_size` tokens, at most `block_size - 1` per
/// sequence. This is what a kvlab::PagedKVCache holds after appending `lengths[i]` tokens to
/// sequence i (`paged_cache_footprint` gives the same figures). With forked sequences, which
/// share blocks, a live cache reserves less.
///
/// \param lengths          [num_sequences] tokens each sequence holds, each >= 0
/// \param block_size       tokens per block, >= 1
/// \param bytes_per_token  K and V bytes of one token, >= 1 (see kvlab::bytes_per_token)
/// \throws InvalidArgument naming the argument for a value out of range, or if a size does not
///         fit in std::uint64_t.
inline MemoryFootprint paged_footprint(const std::vector<std::int64_t>& lengths, int block_size,
                                       std::uint64_t bytes_per_token) {
  constexpr const char* kWhere = "kvlab::paged_footprint";
  detail::require_at_least(kWhere, "block_size", block_size, 1);
  detail::require_at_least(kWhere, "bytes_per_token", bytes_per_token, std::uint64_t{1});
  detail::check_lengths(kWhere, lengths);
  std::uint64_t reserved = 0;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    reserved = detail::checked_size_sum(
        kWhere, "lengths[" + std::to_string(i) + "]", reserved,
        detail::block_rounded_tokens(lengths[i], block_size),
        " tokens in blocks after the " + std::to_string(reserved) + " reserved before it");
  }
  std::uint64_t used = 0;  // each length <= its reservation: no overflow
  for (std::int64_t len : lengths) used += static_cast<std::uint64_t>(len);
  MemoryFootprint out;
  out.reserved_bytes = detail::accounting_bytes(kWhere, reserved, bytes_per_token, "reserved");
  out.used_bytes = used * bytes_per_token;  // used <= reserved
  return out;
}

/// How many sequences fit in `budget_bytes` when each preallocates `max_len` tokens:
/// `floor(budget_bytes / (max_len · bytes_per_token))`, whatever their actual lengths. A
/// reservation that does not fit in std::uint64_t exceeds every budget: the answer is then 0.
/// \throws InvalidArgument if `max_len < 1` or `bytes_per_token < 1`.
inline std::uint64_t max_contiguous_sequences(std::uint64_t budget_bytes, std::int64_t max_len,
                                              std::uint64_t bytes_per_token) {
  constexpr const char* kWhere = "kvlab::max_contiguous_sequences";
  detail::require_at_least(kWhere, "max_len", max_len, std::int64_t{1});
  detail::require_at_least(kWhere, "bytes_per_token", bytes_per_token, std::uint64_t{1});
  const auto per_sequence_tokens = static_cast<std::uint64_t>(max_len);
  if (bytes_per_token > budget_bytes / per_sequence_tokens) return 0;  // one does not fit
  return budget_bytes / (per_sequence_tokens * bytes_per_token);
}

/// Blocks of `block_size` tokens that fit in `budget_bytes`:
/// `floor(budget_bytes / (block_size · bytes_per_token))` (0 if one block does not fit).
/// This is the `num_blocks` of a kvlab::PagedKVCache pool of at most that many bytes.
/// \throws InvalidArgument if `block_size < 1` or `bytes_per_token < 1`.
inline std::uint64_t blocks_in_budget(std::uint64_t budget_bytes, int block_size,
                                      std::uint64_t bytes_per_token) {
  constexpr const char* kWhere = "kvlab::blocks_in_budget";
  detail::require_at_least(kWhere, "block_size", block_size, 1);
  detail::require_at_least(kWhere, "bytes_per_token", bytes_per_token, std::uint64_t{1});
  const auto b = static_cast<std::uint64_t>(block_size);
  if (bytes_per_token > budget_bytes / b) return 0;
  return budget_bytes / (b * bytes_per_token);
}

/// How many sequences fit in `budget_bytes` under paging, admitted in the order given.
///
/// The budget is a pool of `blocks_in_budget(budget_bytes, block_size, bytes_per_token)`
/// blocks. Sequence 0, 1, 2, ... is admitted while the pool still holds the
/// `blocks_needed(lengths[i], block_size)` blocks it needs at its length `lengths[i]`; the
/// first sequence that does not fit stops the admission (first come, first served: no later,
/// shorter sequence overtakes it). Returns the number admitted, at most `lengths.size()`.
///
/// Pass the lengths the sequences reach at the end (prompt and output): then every admitted
/// sequence can run to completion without taking blocks from another. An empty sequence needs
/// no block and always fits. This is the count that a kvlab::PagedKVCache with that pool
/// reaches when each sequence appends its tokens in turn, until an append throws OutOfBlocks.
///
/// \param lengths          [num_sequences] tokens of each sequence, in order, each >= 0
/// \param block_size       tokens per block, >= 1
/// \param bytes_per_token  K and V bytes of one token, >= 1
/// \param budget_bytes     bytes available for the pool
/// \throws InvalidArgument if an argument is out of range.
inline std::size_t max_paged_sequences(const std::vector<std::int64_t>& lengths, int block_size,
                                       std::uint64_t bytes_per_token, std::uint64_t budget_bytes) {
  constexpr const char* kWhere = "kvlab::max_paged_sequences";
  detail::require_at_least(kWhere, "block_size", block_size, 1);
  detail::require_at_least(kWhere, "bytes_per_token", bytes_per_token, std::uint64_t{1});
  detail::check_lengths(kWhere, lengths);
  const std::uint64_t pool = blocks_in_budget(budget_bytes, block_size, bytes_per_token);
  std::uint64_t taken = 0;
  std::size_t admitted = 0;
  for (std::int64_t len : lengths) {
    const auto need = static_cast<std::uint64_t>(blocks_needed(len, block_size));
    if (need > pool - taken) break;
    taken += need;
    ++admitted;
  }
  return admitted;
}

/// K and V bytes of one token in `cache`, over all layers, as stored:
/// `2 · num_layers · num_kv_heads · storage_row_bytes<S>(head_dim)` (`head_dim · sizeof(T)` per
/// row for a cache that stores its rows as given).
inline std::uint64_t cache_bytes_per_token(const PagedKVCacheBase& cache) {
  // The cache has allocated num_blocks · block_size tokens of this size: no overflow.
  return 2 * static_cast<std::uint64_t>(cache.num_layers()) *
         static_cast<std::uint64_t>(cache.token_bytes());
}

/// The footprint of a live kvlab::PagedKVCache, read through its public interface, with each
/// token counted as `bytes_per_token` bytes (pass kvlab::bytes_per_token of a real model to
/// scale a small cache up to it, or use the overload without it for the cache's own size).
///
///  - **reserved**: the blocks in use, `allocator().num_used() · block_size` tokens. Free blocks
///    of the pool are not counted: they belong to no sequence and any sequence may take them.
///  - **used**: the tokens of live sequences stored in those blocks. A block shared by forked
///    sequences is counted once, with the fill of its fullest holder (the tokens of block i of a
///    sequence of length len are `min(block_size, len - i · block_size)`). Holders can see
///    different fills: after `truncate`, a sequence may use only the front of a block that
///    another holder fills further; the block stores the longer prefix, so that is what counts.
///    A block copied on write holds its own copy of the tokens and counts them again. Slots past
///    every holder's length (left by `truncate`, to be overwritten) count as waste.
///
/// Without forks this equals `paged_footprint` of the sequences' lengths; with forks, shared
/// blocks make it smaller. Either way the waste is below `block_size` tokens per live
/// sequence: a block that is not full for its fullest holder is that holder's last block.
///
/// \throws InvalidArgument if `bytes_per_token < 1` or a size does not fit in std::uint64_t.
inline MemoryFootprint paged_cache_footprint(const PagedKVCacheBase& cache,
                                             std::uint64_t bytes_per_token) {
  constexpr const char* kWhere = "kvlab::paged_cache_footprint";
  detail::require_at_least(kWhere, "bytes_per_token", bytes_per_token, std::uint64_t{1});
  const int block_size = cache.block_size();
  // distinct block -> tokens its fullest holder has in it
  std::map<std::int32_t, std::int64_t> fill;
  for (int seq : cache.sequences()) {
    const std::int64_t len = cache.length(seq);
    const std::vector<std::int32_t>& blocks = cache.blocks(seq);
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i] == kReleasedBlock) continue;  // back in the pool, out of a sliding window
      const std::int64_t in_block =
          std::min<std::int64_t>(block_size, len - static_cast<std::int64_t>(i) * block_size);
      std::int64_t& f = fill[blocks[i]];
      f = std::max(f, in_block);
    }
  }
  std::uint64_t used = 0;
  for (const auto& entry : fill) used += static_cast<std::uint64_t>(entry.second);
  const std::uint64_t reserved = static_cast<std::uint64_t>(cache.allocator().num_used()) *
                                 static_cast<std::uint64_t>(block_size);
  MemoryFootprint out;
  out.reserved_bytes = detail::accounting_bytes(kWhere, reserved, bytes_per_token, "reserved");
  out.used_bytes = detail::accounting_bytes(kWhere, used, bytes_per_token, "used");
  return out;
}

/// The footprint of a live kvlab::PagedKVCache in its own bytes:
/// `paged_cache_footprint(cache, cache_bytes_per_token(cache))`.
inline MemoryFootprint paged_cache_footprint(const PagedKVCacheBase& cache) {
  return paged_cache_footprint(cache, cache_bytes_per_token(cache));
}

}  // namespace kvlab
