/// \file
/// \brief `Scheduler::check_invariants`: checks every rule a scheduler keeps between steps.
///
/// The rules: the pool's reference counts against their holders, no leaked block or sequence,
/// promises that add up and are covered, the token budget, FCFS admission, the prefix cache's own
/// rules. Included by `scheduler.hpp`; run after every step by `tests/serving/test_engine.cpp` and,
/// with `EngineConfig::check_invariants`, by the engine.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/serving/scheduler.hpp"

namespace kvlab {

inline void Scheduler::check_invariants() const {
  const auto broken = [](const std::string& what) {
    throw InvariantViolation("kvlab::Scheduler::check_invariants: " + what);
  };
  const BlockAllocator& alloc = pool_->allocator();
  std::vector<int> holders(static_cast<std::size_t>(alloc.num_blocks()), 0);  // [num_blocks]
  int held = 0;
  std::vector<int> owned;  // [requests holding a sequence] their sequences, sorted
  for (const RequestState& r : requests_)
    if (r.seq >= 0) owned.push_back(r.seq);
  std::sort(owned.begin(), owned.end());
  for (int seq : pool_->sequences()) {
    if (!std::binary_search(owned.begin(), owned.end(), seq))
      broken("sequence " + std::to_string(seq) + " belongs to no request (leaked)");
    for (std::int32_t b : pool_->blocks(seq))
      if (b != kReleasedBlock) ++holders[static_cast<std::size_t>(b)];  // skip the window's
  }
  for (int b = 0; b < alloc.num_blocks(); ++b) {
    const int expected = holders[static_cast<std::size_t>(b)] + (cache_.holds(b) ? 1 : 0);
    if (alloc.ref_count(b) != expected) {
      broken("block " + std::to_string(b) + " has reference count " +
             std::to_string(alloc.ref_count(b)) + " but " + std::to_string(expected) + " holders");
    }
    if (expected > 0) ++held;
  }
  if (held + alloc.num_free() != alloc.num_blocks())
    broken(std::to_string(held) + " blocks held + " + std::to_string(alloc.num_free()) +
           " free != " + std::to_string(alloc.num_blocks()) + " (a block leaked)");
  int promised = 0, running = 0;
  for (const RequestState& r : requests_) {
    promised += r.promised;
    const std::string who = "request " + std::to_string(r.id);
    if (r.status == RequestStatus::Running) {
      ++running;
      if (!pool_->contains(r.seq) || pool_->length(r.seq) != r.computed)
        broken(who + " runs without a sequence of its computed length");
    } else if (r.seq >= 0 && !(r.status == RequestStatus::Finished && in_batch(r.id))) {
      // (a finished member of a running static batch keeps its sequence until the batch ends)
      broken(who + " holds a sequence while not running");
    }
    if (r.status != RequestStatus::Running && r.promised != 0 && !in_batch(r.id))
      broken(who + " holds promised blocks while not running");
  }
  if (open_) broken("a step is open");
  if (promised != budget_.promised()) broken("promised blocks do not add up");
  if (alloc.num_free() + cache_.evictable_blocks() < budget_.promised())
    broken("more blocks promised than free or evictable");
  if (has_token_budget() && plan_.tokens() > config_.max_batched_tokens)
    broken("the last step fed " + std::to_string(plan_.tokens()) + " tokens, budget " +
           std::to_string(config_.max_batched_tokens));
  if (static_cast<int>(running_.size()) > config_.max_running || running > config_.max_running)
    broken(std::to_string(running_.size()) + " requests running, max_running " +
           std::to_string(config_.max_running));
  if (admitted_out_of_order_)
    broken("requests were first admitted out of arrival order (not FCFS)");
  cache_.check(*pool_);
}

}  // namespace kvlab
