/// \file
/// \brief `ContiguousScheduler`: contiguous preallocation, a baseline for continuous batching.
///
/// Continuous batching is measured against it. It follows the continuous rule, but every admitted
/// request reserves `max_len` tokens of memory up front, as a contiguous cache sized for the
/// longest sequence would (`BatchingPolicy::Contiguous`). Checked in
/// `tests/serving/test_engine.cpp`, as every policy.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "kvlab/cache/paged_kv_cache.hpp"
#include "kvlab/config.hpp"
#include "kvlab/serving/prefix_cache.hpp"
#include "kvlab/serving/request.hpp"
#include "kvlab/serving/scheduler.hpp"
#include "kvlab/serving/step_plan.hpp"

namespace kvlab {

/// Contiguous preallocation over a paged pool (`BatchingPolicy::Contiguous`): `Scheduler`'s
/// continuous rule — token budget, chunked prefill, preemption — with every admission reserving
/// the blocks of `config.max_len` tokens (as Orca and FasterTransformer size a contiguous cache
/// for the longest possible sequence). The K/V live in the pool's blocks, so the kernels are the
/// same and the difference is the memory held in reserve. No prefix caching.
class ContiguousScheduler final : public Scheduler {
 public:
  /// A contiguous-preallocation scheduler: as `Scheduler`'s constructor, with `config.policy`
  /// `BatchingPolicy::Contiguous` (`config.prefix_caching` is ignored: off).
  /// \throws InvalidArgument as `Scheduler`'s constructor.
  ContiguousScheduler(std::shared_ptr<PagedKVCacheBase> pool, SchedulerConfig config,
                      int max_tokens, int vocab_size,
                      PrefixCache::HashFunction hash = PrefixCache::chain_hash)
      : Scheduler(BatchingPolicy::Contiguous, std::move(pool), config, max_tokens, vocab_size,
                  hash) {}

 protected:
  // A request longer than max_len does not fit its reservation.
  void check_request(const Request& r, long longest) const override {
    if (longest > config_.max_len) {
      detail::fail("kvlab::Scheduler::submit", "request.prompt.size() + request.max_new_tokens - 1",
                   "at most max_len (" + std::to_string(config_.max_len) + ")",
                   static_cast<long>(r.prompt.size()) + r.max_new_tokens - 1);
    }
  }
  int blocks_alone(const Request& /*r*/, long /*longest*/) const override {
    return blocks_for(config_.max_len);
  }
  int admission_reserve(const RequestState& /*r*/, int /*hit_blocks*/) const override {
    return blocks_for(config_.max_len);
  }
};

}  // namespace kvlab
