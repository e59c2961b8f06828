/// \file
/// \brief `make_scheduler`: the scheduler of the policy a configuration names.
///
/// It makes a `Scheduler` (continuous batching), `StaticScheduler` or `ContiguousScheduler`.
/// `Engine` uses it.
#pragma once

#include <memory>
#include <utility>

#include "kvlab/cache/paged_kv_cache.hpp"
#include "kvlab/serving/contiguous_scheduler.hpp"
#include "kvlab/serving/prefix_cache.hpp"
#include "kvlab/serving/scheduler.hpp"
#include "kvlab/serving/static_scheduler.hpp"
#include "kvlab/serving/step_plan.hpp"

namespace kvlab {

/// The scheduler of `config.policy` over `pool` (arguments as `Scheduler`'s constructor).
/// \throws InvalidArgument as that class's constructor.
inline std::unique_ptr<Scheduler> make_scheduler(
    std::shared_ptr<PagedKVCacheBase> pool, const SchedulerConfig& config, int max_tokens,
    int vocab_size, PrefixCache::HashFunction hash = PrefixCache::chain_hash) {
  switch (config.policy) {
    case BatchingPolicy::Static:
      return std::make_unique<StaticScheduler>(std::move(pool), config, max_tokens, vocab_size,
                                               hash);
    case BatchingPolicy::Contiguous:
      return std::make_unique<ContiguousScheduler>(std::move(pool), config, max_tokens, vocab_size,
                                                   hash);
    case BatchingPolicy::Continuous:
      break;
  }
  return std::make_unique<Scheduler>(std::move(pool), config, max_tokens, vocab_size, hash);
}

}  // namespace kvlab
