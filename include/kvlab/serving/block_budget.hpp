/// \file
/// \brief `BlockBudget`: the pool's blocks as a scheduler sees them during a step.
///
/// It is what a scheduler's admission and growth see, shared by every batching policy (`Scheduler`,
/// `ContiguousScheduler`, `StaticScheduler`).
#pragma once

#include <algorithm>
#include <climits>
#include <string>

#include "kvlab/cache/paged_kv_cache.hpp"
#include "kvlab/config.hpp"
#include "kvlab/serving/prefix_cache.hpp"
#include "kvlab/serving/request.hpp"

namespace kvlab {

/// The pool's blocks as a scheduler's admission and growth see them during a step.
///
/// A block is free, held by sequences, held only by the prefix cache (evictable), or promised
/// to a request: blocks reserved for it when it was admitted and not taken yet, so that a
/// prompt split over steps never runs out half way. `unpromised()` — free blocks, less those
/// the step takes, plus evictable ones, less every promise — is what admission and growth may
/// still use. The engine takes the blocks when it runs the step (`KVStore::begin_step`); the
/// cache's are evicted just before, as needed (`short_by`).
class BlockBudget {
 public:
  /// A budget over the blocks of `pool` and the evictable ones of `cache`, which outlive it.
  BlockBudget(const PagedKVCacheBase& pool, const PrefixCache& cache)
      : pool_(&pool), cache_(&cache) {}

  /// Blocks needed for a sequence of `tokens` tokens; errors name `caller`.
  /// \throws InvalidArgument if `tokens` is negative or needs more blocks than an `int` counts.
  int blocks_for(long tokens, const char* caller = "kvlab::BlockBudget::blocks_for") const {
    const long block = pool_->block_size();
    detail::require_at_least(caller, "tokens", tokens, 0L);
    if (tokens > static_cast<long>(INT_MAX) * block) {
      detail::fail(caller, "tokens",
                   "at most " + std::to_string(static_cast<long>(INT_MAX) * block) +
                       " (INT_MAX blocks of " + std::to_string(block) + ")",
                   tokens);
    }
    return static_cast<int>((tokens + block - 1) / block);
  }
  /// Blocks that admission and growth may still use: free (less what this step takes) plus
  /// evictable, less every promise.
  int unpromised() const {
    return pool_->allocator().num_free() - taken_ + cache_->evictable_blocks() - promised_;
  }
  /// Blocks promised to requests and not yet taken.
  int promised() const { return promised_; }
  /// Blocks the free list lacks for this step to take `need` more (evict that many, if > 0).
  int short_by(int need) const { return taken_ + need - pool_->allocator().num_free(); }

  /// A new step: it has taken nothing yet.
  void start_step() { taken_ = 0; }
  /// Promises `blocks` more to request `r`.
  void promise(RequestState& r, int blocks) {
    r.promised += blocks;
    promised_ += blocks;
  }
  /// This step takes `need` blocks for request `r`: from its promise first (evict what
  /// `short_by` says before).
  void take(RequestState& r, int need) {
    taken_ += need;
    const int from_promise = std::min(need, r.promised);
    r.promised -= from_promise;
    promised_ -= from_promise;
  }
  /// Request `r` gives back what is still promised to it.
  void release_promise(RequestState& r) {
    promised_ -= r.promised;
    r.promised = 0;
  }

 private:
  const PagedKVCacheBase* pool_;
  const PrefixCache* cache_;
  int taken_ = 0;     // blocks this step takes from the free list
  int promised_ = 0;  // sum of every request's promised blocks
};

}  // namespace kvlab
