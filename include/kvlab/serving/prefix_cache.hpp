/// \file
/// \brief `PrefixCache`: automatic prefix caching over a paged pool, in vLLM's design.
///
/// Every full block of a sequence is named by a hash chained from its parent block's hash and its
/// token ids; blocks whose sequences have ended stay cached in an LRU queue until the pool needs
/// them; a new request starts from the longest cached chain that matches its prompt. Checked in
/// `tests/serving/test_prefix_cache.cpp` (matching, eviction order, a colliding hash) and through
/// the engine in `tests/serving/test_engine.cpp` (the same tokens with and without the cache).
#pragma once

#include <algorithm>
#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvlab/config.hpp"

namespace kvlab {

/// The full blocks of past sequences, kept so that a later prompt with the same beginning
/// reuses their keys and values instead of computing them again.
///
/// What is cached: block k of a sequence (its tokens `[k * block_size, (k + 1) * block_size)`)
/// once it is full and written in every layer. Its keys and values depend on those tokens and
/// on every token before them (attention mixes them in), and on nothing else, so the block is
/// named by its whole prefix: `hash_k = hash(hash_{k-1}, tokens of block k)`, with a fixed root
/// before block 0. Only full blocks are shared: a prompt that shares fewer than `block_size`
/// tokens with a cached one gets no hit at all (so does every prompt shorter than
/// `block_size + 1`).
///
/// The hash only finds candidates. A match also requires the same token ids and the same parent
/// entry (entries have ids that are never reused), so two prefixes whose hashes collide never
/// share K/V: the test suite runs the engine with a hash that is always 0.
///
/// Holding and eviction. The cache is a holder of its blocks, like a sequence: it keeps one
/// reference on each (`PagedKVCache::retain_block`), so a block stays out of the free list while
/// it is cached. A cached block that no sequence holds (reference count 1: the cache's own) is
/// *evictable* and sits in an LRU queue; the blocks of an ended sequence join the queue's back
/// in reverse order, so a prefix's deepest block is evicted first and a chain shortens from its
/// end. Allocation takes truly free blocks first and evicts from the front of the queue only when
/// none is left (`evict`). A hit takes blocks out of the queue (a sequence holds them again).
/// (vLLM keeps free and cached blocks in one queue and may evict a cached block while a never
/// used one is free; here a cached block is only evicted when the pool needs it.)
///
/// A match is capped at `(prompt length - 1) / block_size` blocks, so at least the prompt's last
/// token is computed: its logits give the first generated token.
class PrefixCache {
 public:
  /// A block's name from its parent's (`kRootHash` for block 0) and its `n` token ids.
  using HashFunction = std::uint64_t (*)(std::uint64_t parent, const int* tokens, int n);
  /// The parent hash of a sequence's first block.
  static constexpr std::uint64_t kRootHash = 0xcbf29ce484222325ull;  // the FNV-1a offset basis
  /// The parent entry of a sequence's first block (no entry).
  static constexpr std::int64_t kRoot = -1;
  /// A chain that can no longer be extended (its parent entry was evicted).
  static constexpr std::int64_t kBroken = -2;

  /// 64-bit FNV-1a over the parent hash's 8 bytes and each token id's 4 bytes.
  static std::uint64_t chain_hash(std::uint64_t parent, const int* tokens, int n) {
    std::uint64_t h = kRootHash;
    const auto mix = [&h](std::uint64_t byte) {
      h ^= byte;
      h *= 0x100000001b3ull;  // the FNV prime
    };
    for (int i = 0; i < 8; ++i) mix((parent >> (8 * i)) & 0xff);
    for (int t = 0; t < n; ++t) {
      const auto id = static_cast<std::uint32_t>(tokens[t]);
      for (int i = 0; i < 4; ++i) mix((id >> (8 * i)) & 0xff);
    }
    return h;
  }

  /// An empty cache for blocks of `block_size` tokens, naming blocks with `hash`.
  /// \throws InvalidArgument if `block_size < 1` or `hash` is null.
  explicit PrefixCache(int block_size, HashFunction hash = chain_hash)
      : block_size_(block_size), hash_(hash) {
    detail::require_at_least("kvlab::PrefixCache", "block_size", block_size, 1);
    if (hash == nullptr) detail::fail("kvlab::PrefixCache", "hash", "a function", "nullptr");
  }

  /// A copy, with its own LRU queue (the index into the queue is rebuilt for the copy's).
  PrefixCache(const PrefixCache& other)
      : block_size_(other.block_size_),
        hash_(other.hash_),
        entries_(other.entries_),
        by_hash_(other.by_hash_),
        by_block_(other.by_block_),
        lru_(other.lru_),
        next_id_(other.next_id_) {
    for (auto it = lru_.begin(); it != lru_.end(); ++it) lru_at_[*it] = it;
  }
  /// Copies `other` (see the copy constructor).
  PrefixCache& operator=(const PrefixCache& other) {
    if (this != &other) *this = PrefixCache(other);
    return *this;
  }
  /// Moves: the queue's nodes move with it, so the index stays valid.
  PrefixCache(PrefixCache&&) = default;
  /// Moves (see the move constructor).
  PrefixCache& operator=(PrefixCache&&) = default;
  ~PrefixCache() = default;

  /// Tokens per block.
  int block_size() const { return block_size_; }
  /// Blocks held by the cache.
  int cached_blocks() const { return static_cast<int>(entries_.size()); }
  /// Cached blocks that no sequence holds: the ones `evict` can give back to the pool.
  int evictable_blocks() const { return static_cast<int>(lru_.size()); }
  /// True when the cache holds `block`.
  bool holds(std::int32_t block) const { return by_block_.count(block) != 0; }
  /// The evictable blocks, the next to be evicted first.
  std::vector<std::int32_t> eviction_order() const { return {lru_.begin(), lru_.end()}; }

  /// The longest cached chain that begins `tokens`, at most `(tokens.size() - 1) / block_size`
  /// blocks.
  struct Match {
    std::vector<std::int32_t> blocks;   ///< [hits] the cached blocks, in order
    std::vector<std::int64_t> entries;  ///< [hits] their entries (parents of the next blocks)
    /// Tokens the hit covers: hits * block_size.
    int tokens(int block_size) const { return static_cast<int>(blocks.size()) * block_size; }
  };

  /// The cached blocks that hold the keys and values of `tokens`' first full blocks: block k
  /// matches when its hash, its token ids and its parent entry all match.
  Match match(const std::vector<int>& tokens) const {
    Match m;
    const int limit = tokens.empty() ? 0 : static_cast<int>(tokens.size() - 1) / block_size_;
    std::int64_t parent = kRoot;
    std::uint64_t parent_hash = kRootHash;
    for (int k = 0; k < limit; ++k) {
      const int* block_tokens = tokens.data() + static_cast<std::ptrdiff_t>(k) * block_size_;
      const std::uint64_t h = hash_(parent_hash, block_tokens, block_size_);
      const std::int64_t found = find(h, parent, block_tokens);
      if (found < 0) break;
      m.blocks.push_back(entries_.at(found).block);
      m.entries.push_back(found);
      parent = found;
      parent_hash = h;
    }
    return m;
  }

  /// Caches `block`, a full block written in every layer whose tokens are `tokens[0,
  /// block_size)` and whose parent entry is `parent` (`kRoot` for a sequence's first block), and
  /// returns its entry: the parent of the sequence's next block. If the same chain is cached
  /// already (two sequences computed the same prefix), that entry is returned and `block` is not
  /// kept; if `parent` is `kBroken` or no longer cached, nothing is cached and `kBroken` is
  /// returned.
  /// \param pool    the pool of `block` (`retain_block` is called on it)
  /// \param parent  the entry of the block before it, `kRoot` or `kBroken`
  /// \param tokens  [block_size] the block's token ids
  /// \param block   the pool block that holds their keys and values
  /// \throws InvalidArgument (nothing changes) if `block` is out of the pool's range, free, or
  ///         cached already under another chain.
  template <typename Pool>
  std::int64_t insert(Pool& pool, std::int64_t parent, const int* tokens, std::int32_t block) {
    if (parent == kBroken || (parent != kRoot && entries_.count(parent) == 0)) return kBroken;
    const std::uint64_t h =
        hash_(parent == kRoot ? kRootHash : entries_.at(parent).hash, tokens, block_size_);
    const std::int64_t found = find(h, parent, tokens);
    if (found >= 0) return found;
    if (holds(block)) {  // the block is cached under another chain: cannot happen for full blocks
      detail::fail("kvlab::PrefixCache::insert", "block", "a block not cached yet", block);
    }
    pool.retain_block(block);  // the cache's reference
    const std::int64_t id = next_id_++;
    entries_[id] = Entry{h, parent, std::vector<int>(tokens, tokens + block_size_), block};
    by_hash_.emplace(h, id);
    by_block_[block] = id;
    return id;
  }

  /// Takes the blocks of a hit out of the LRU queue: a sequence is about to hold them.
  /// \throws InvalidArgument (nothing changes) if a block is not cached.
  void take(const std::vector<std::int32_t>& blocks) {
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      if (!holds(blocks[i]))
        detail::fail("kvlab::PrefixCache::take", "blocks[" + std::to_string(i) + "]",
                     "a cached block", blocks[i]);
    }
    for (std::int32_t b : blocks) unqueue(b);
  }

  /// After a sequence that held `blocks` (its block table, in order) has been freed: its cached
  /// blocks that no other sequence holds join the LRU queue, the deepest first.
  template <typename Pool>
  void released(const Pool& pool, const std::vector<std::int32_t>& blocks) {
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
      if (holds(*it) && pool.allocator().ref_count(*it) == 1 && lru_at_.count(*it) == 0) {
        lru_at_[*it] = lru_.insert(lru_.end(), *it);
      }
    }
  }

  /// Evicts up to `n` evictable blocks, from the front of the LRU queue, and gives them back to
  /// `pool`. Returns how many were evicted.
  /// \throws InvalidArgument if `n < 0`.
  template <typename Pool>
  int evict(Pool& pool, int n) {
    detail::require_at_least("kvlab::PrefixCache::evict", "n", n, 0);
    int evicted = 0;
    for (; evicted < n && !lru_.empty(); ++evicted) {
      const std::int32_t b = lru_.front();
      unqueue(b);
      drop(b);
      pool.release_block(b);
    }
    return evicted;
  }

  /// Evicts every evictable block; blocks that sequences still hold stay cached.
  template <typename Pool>
  void clear(Pool& pool) {
    evict(pool, evictable_blocks());
  }

  /// Checks the cache against `pool`: every cached block is in use and named once; the LRU
  /// queue holds exactly the cached blocks whose only holder is the cache.
  /// \throws InvariantViolation naming the first broken rule.
  template <typename Pool>
  void check(const Pool& pool) const {
    const auto broken = [](const std::string& what) {
      throw InvariantViolation("kvlab::PrefixCache::check: " + what);
    };
    if (by_block_.size() != entries_.size() || by_hash_.size() != entries_.size())
      broken("the indexes disagree with the entries");
    for (const auto& e : entries_) {
      const std::int32_t b = e.second.block;
      const auto it = by_block_.find(b);
      if (it == by_block_.end() || it->second != e.first)
        broken("block " + std::to_string(b) + " is not indexed by its entry");
      const int refs = pool.allocator().ref_count(b);
      if (refs < 1) broken("cached block " + std::to_string(b) + " is free");
      if ((refs == 1) != (lru_at_.count(b) != 0))
        broken("cached block " + std::to_string(b) + " with " + std::to_string(refs) +
               (refs == 1 ? " holder is not" : " holders is") + " in the LRU queue");
    }
    if (lru_at_.size() != lru_.size()) broken("the LRU queue and its index disagree");
  }

 private:
  struct Entry {
    std::uint64_t hash;       // hash_(parent's hash, tokens)
    std::int64_t parent;      // the parent entry, or kRoot
    std::vector<int> tokens;  // [block_size] the block's token ids
    std::int32_t block;       // the pool block holding their K/V
  };

  // The entry with hash h, parent `parent` and these tokens, or -1.
  std::int64_t find(std::uint64_t h, std::int64_t parent, const int* tokens) const {
    const auto range = by_hash_.equal_range(h);
    for (auto it = range.first; it != range.second; ++it) {
      const Entry& e = entries_.at(it->second);
      if (e.parent == parent && std::equal(e.tokens.begin(), e.tokens.end(), tokens))
        return it->second;
    }
    return -1;
  }
  void unqueue(std::int32_t block) {
    const auto it = lru_at_.find(block);
    if (it == lru_at_.end()) return;
    lru_.erase(it->second);
    lru_at_.erase(it);
  }
  void drop(std::int32_t block) {
    const std::int64_t id = by_block_.at(block);
    const auto range = by_hash_.equal_range(entries_.at(id).hash);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second == id) {
        by_hash_.erase(it);
        break;
      }
    }
    by_block_.erase(block);
    entries_.erase(id);
  }

  int block_size_;
  HashFunction hash_;
  std::unordered_map<std::int64_t, Entry> entries_;               // entry id -> entry
  std::unordered_multimap<std::uint64_t, std::int64_t> by_hash_;  // hash -> entry ids
  std::unordered_map<std::int32_t, std::int64_t> by_block_;       // block -> entry id
  std::list<std::int32_t> lru_;                                   // evictable blocks, front first
  std::unordered_map<std::int32_t, std::list<std::int32_t>::iterator> lru_at_;
  std::int64_t next_id_ = 0;
};

}  // namespace kvlab
