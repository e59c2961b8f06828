/// \file
/// \brief `StaticScheduler`: static batching, the baseline continuous batching is measured against.
///
/// A fixed batch is admitted together when the engine is idle, padded to its longest member, and
/// its memory is given back only when its last member finishes (`BatchingPolicy::Static`). Checked
/// in `tests/serving/test_engine.cpp`, as every policy: the same tokens as each request alone, the
/// invariants after every step.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "kvlab/cache/paged_kv_cache.hpp"
#include "kvlab/serving/prefix_cache.hpp"
#include "kvlab/serving/request.hpp"
#include "kvlab/serving/scheduler.hpp"
#include "kvlab/serving/step_plan.hpp"

namespace kvlab {

/// Static batching over a paged pool (`BatchingPolicy::Static`).
///
/// When no batch runs, the waiting requests form one, first come first served, as many as
/// `max_running` allows and the padded rectangle's memory fits: each member reserves the blocks
/// of the batch's longest prompt plus its longest output, and one block for its pad rows.
/// Every prompt is padded to the batch's longest (the pad rows are computed on a scratch
/// sequence, freed after the step), and a member that has finished keeps computing a pad row
/// each step until the last member finishes; only then does the batch's memory go back and the
/// next batch form. No token budget: the batch's prompts run in one step. No prefix caching.
class StaticScheduler final : public Scheduler {
 public:
  /// A static-batching scheduler: as `Scheduler`'s constructor, with `config.policy`
  /// `BatchingPolicy::Static` (`config.prefix_caching` is ignored: off).
  /// \throws InvalidArgument as `Scheduler`'s constructor.
  StaticScheduler(std::shared_ptr<PagedKVCacheBase> pool, SchedulerConfig config, int max_tokens,
                  int vocab_size, PrefixCache::HashFunction hash = PrefixCache::chain_hash)
      : Scheduler(BatchingPolicy::Static, std::move(pool), config, max_tokens, vocab_size, hash) {}

 protected:
  // A batch of one: its padded sequence, and a block for the pad rows' scratch sequence.
  int blocks_alone(const Request& /*r*/, long longest) const override {
    return blocks_for(longest) + 1;
  }
  void plan_step(double now) override {
    if (running_.empty()) admit_batch(now);
    int longest_prompt = 0;
    for (int id : running_)
      longest_prompt = std::max(longest_prompt, static_cast<int>(state(id).request.prompt.size()));
    for (int id : running_) {
      RequestState& r = changing(id);
      if (r.status == RequestStatus::Finished) {  // a pad row, while the others finish
        if (pool_->length(r.seq) >= max_tokens_) continue;
        take(r, pool_->blocks_needed(r.seq, 1));
        ScheduledChunk pad;
        pad.request = id;
        pad.seq = r.seq;
        pad.first_position = pool_->length(r.seq);
        pad.tokens = {0};
        pad.kind = ChunkKind::Padding;
        plan_.chunks.push_back(pad);
        continue;
      }
      const int n = r.remaining();  // the whole prompt, or one decode token
      take(r, pool_->blocks_needed(r.seq, n));
      plan_.chunks.push_back(chunk(r, n));
      const int pad_rows = longest_prompt - n;
      if (r.computed == 0 && pad_rows > 0) {  // the prompt padded to the batch's longest
        ScheduledChunk pad;                   // on a scratch sequence, freed after the step
        pad.request = id;
        pad.seq = pool_->add_sequence({});
        take(r, blocks_for(pad_rows));
        pad.tokens.assign(static_cast<std::size_t>(pad_rows), 0);
        pad.kind = ChunkKind::Padding;
        plan_.chunks.push_back(pad);
      }
    }
  }
  // The batch's memory goes back only when its last member has finished.
  void release_finished(const std::vector<int>& /*finished*/) override {
    bool all_done = !running_.empty();
    for (int id : running_) all_done = all_done && state(id).status == RequestStatus::Finished;
    if (!all_done) return;
    for (int id : running_) {
      release(state(id));
      if (state(id).forgotten) drop(state(id));  // forgotten while the batch ran
    }
    running_.clear();
  }
  bool has_token_budget() const override { return false; }

 private:
  // Forms a batch: FCFS, as many waiting requests as fit the padded rectangle.
  void admit_batch(double now) {
    long longest_prompt = 0, longest_output = 0;
    std::size_t members = 0;
    int reserve = 0;  // blocks per member
    while (members < waiting_.size() && static_cast<int>(members) < config_.max_running) {
      const Request& next = request(waiting_[members]).request;
      const long p = std::max(longest_prompt, static_cast<long>(next.prompt.size()));
      const long o = std::max(longest_output, static_cast<long>(next.max_new_tokens));
      // Each member's padded sequence, and one block for its pad rows' scratch sequence.
      const int per = blocks_for(std::min(p + o - 1, long{max_tokens_})) + 1;
      if (static_cast<long>(members + 1) * per + config_.watermark_blocks > unpromised()) break;
      longest_prompt = p;
      longest_output = o;
      reserve = per;
      ++members;
    }
    for (std::size_t m = 0; m < members; ++m) {
      RequestState& r = changing(waiting_.front());
      waiting_.pop_front();
      r.seq = pool_->add_sequence({});
      r.status = RequestStatus::Running;
      budget_.promise(r, reserve);
      r.output.first_scheduled = now;
      first_admission(r);
      plan_.admitted.push_back(r.id);
      running_.push_back(r.id);
    }
  }
};

}  // namespace kvlab
