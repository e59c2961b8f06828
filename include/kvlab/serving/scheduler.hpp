/// \file
/// \brief `Scheduler`: continuous batching over a paged pool, the vLLM v1 rule.
///
/// The rule: a token budget per step, running requests first, then waiting ones first come first
/// served; chunked prefill; admission only when the blocks fit with a watermark to spare;
/// preemption by recompute, newest first; automatic prefix caching. The baselines it is measured
/// against derive from it (`ContiguousScheduler`, `StaticScheduler`; `make_scheduler`); its
/// invariants are checked in `scheduler_invariants.hpp`. Checked in
/// `tests/serving/test_engine.cpp`: the invariants after every step of random workloads, the same
/// tokens as each request alone.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kvlab/cache/paged_kv_cache.hpp"
#include "kvlab/config.hpp"
#include "kvlab/serving/block_budget.hpp"
#include "kvlab/serving/prefix_cache.hpp"
#include "kvlab/serving/request.hpp"
#include "kvlab/serving/step_plan.hpp"

namespace kvlab {

/// Decides, step by step, which requests run and with how many tokens, and keeps the pool's
/// blocks for them.
///
/// **The rule of a step** (continuous policy), `schedule(now)`:
///  1. Requests whose arrival time has come join the back of the waiting queue, in arrival
///     order.
///  2. Running requests, in the order they were admitted: each gets its next tokens — one
///     decode token, or its next prefill chunk — up to the token budget left. If the blocks for
///     them are not there, the newest running request is preempted (its blocks freed, it goes
///     back to the front of the queue) until they are, or the request preempts itself when it
///     is the newest.
///  3. If nobody was preempted: waiting requests, first come first served — the queue's front
///     first, and a front that does not fit blocks those behind it (no overtaking). A request
///     is admitted when the running count is below `max_running`, budget is left, and the
///     blocks for all the tokens it has (prompt, plus what it generated before a preemption;
///     less its prefix-cache hit) fit with `watermark_blocks` to spare. Those blocks are
///     reserved for it (`promised`), so a prompt split over steps never runs out half way.
///     Its first chunk is as much of it as the budget leaves (**chunked prefill**): a long
///     prompt never stalls the decodes, which were scheduled before it.
///
/// **Preemption by recompute.** A preempted request forgets its K/V and, when admitted again,
/// computes its prompt and its generated tokens again (as one prefill) before it draws its next
/// token. While it recomputes it is not chosen as a victim: otherwise a request whose recompute
/// is longer than the budget can be readmitted and preempted again at every step without ever
/// progressing (vLLM issue 25538). So every readmission ends in a new token, and a request that
/// fits the pool alone always finishes. The price: when every newer running request is
/// recomputing, a request that needs a block preempts itself, even the oldest.
///
/// **Memory accounting** (`BlockBudget`). Blocks are free, held by sequences, held only by the
/// prefix cache (evictable), or promised: `free + evictable - promised` is what admission and
/// growth may use. Blocks are taken when the engine runs the step; the cache's blocks are
/// evicted just before, as needed.
///
/// **Baselines.** `ContiguousScheduler` and `StaticScheduler` (`BatchingPolicy::Contiguous` and
/// `BatchingPolicy::Static`) derive from this class and change what a policy decides — what an
/// admission reserves, how a step is planned, when memory goes back — through the same
/// `schedule` / `complete_step` calls; `make_scheduler` builds the one a configuration names.
///
/// \par Example
/// A program rarely drives a scheduler itself: `Engine` builds the one its configuration names
/// (`make_scheduler`) and runs it step by step. Tutorial 07 sets the policy and the pool, then
/// runs its requests (the continuous-batching page shows each step):
/// \snippet 07_continuous_batching.cpp policy
/// \snippet 07_continuous_batching.cpp run
/// Used in \ref tutorial_07, through `Engine`, and by `kvlab-serve`.
class Scheduler {
 public:
  /// A scheduler over `pool` for a model of `max_tokens` positions and `vocab_size` tokens,
  /// under the continuous policy (`config.policy`; the baselines are the derived classes).
  /// The pool must hold no sequence yet; the scheduler owns its sequences from now on.
  /// \throws InvalidArgument for a null or non-empty pool, or a bad setting (another policy;
  ///         prefix caching over a pool with a sliding window among them).
  Scheduler(std::shared_ptr<PagedKVCacheBase> pool, SchedulerConfig config, int max_tokens,
            int vocab_size, PrefixCache::HashFunction hash = PrefixCache::chain_hash)
      : Scheduler(BatchingPolicy::Continuous, std::move(pool), config, max_tokens, vocab_size,
                  hash) {}
  virtual ~Scheduler() = default;
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  /// The settings (with `max_len` resolved).
  const SchedulerConfig& config() const { return config_; }
  /// The pool.
  const PagedKVCacheBase& pool() const { return *pool_; }
  /// The prefix cache (empty unless the continuous policy caches prefixes).
  const PrefixCache& prefix_cache() const { return cache_; }
  /// Request `id`.
  /// \throws InvalidArgument if no request has that id, or it was forgotten.
  const RequestState& request(int id) const {
    check_id("kvlab::Scheduler::request", id);
    if (forgotten(id))
      detail::fail("kvlab::Scheduler::request", "id", "a request not forgotten",
                   std::to_string(id) + " (forgotten)");
    return state(id);
  }
  /// True when request `id` was forgotten (`forget`).
  /// \throws InvalidArgument if no request has that id.
  bool forgotten(int id) const {
    check_id("kvlab::Scheduler::forgotten", id);
    return id < first_kept_ || state(id).forgotten;
  }
  /// Requests submitted (ids are 0 .. num_requests() - 1), forgotten ones included.
  int num_requests() const { return first_kept_ + static_cast<int>(requests_.size()); }
  /// Records the scheduler keeps: requests submitted and not forgotten, and forgotten ones whose
  /// record waits for an older request to be forgotten too (records are freed oldest first).
  int kept_records() const { return static_cast<int>(requests_.size()); }

  /// Forgets finished request `id`: its record (prompt, tokens, output) is freed, and
  /// `request(id)` refuses it from then on. A long-running server forgets every request once it
  /// has its output, so that the scheduler's memory stays bounded by the requests in flight.
  /// (A finished member of a running static batch keeps its sequence until the batch ends, and
  /// its record until then.)
  /// \throws InvalidArgument (nothing changes) if no request has that id, it is not finished,
  ///         or it was forgotten already.
  void forget(int id) {
    constexpr const char* kWhere = "kvlab::Scheduler::forget";
    check_id(kWhere, id);
    if (forgotten(id))
      detail::fail(kWhere, "id", "a request not forgotten", std::to_string(id) + " (forgotten)");
    RequestState& r = state(id);
    if (r.status != RequestStatus::Finished)
      detail::fail(kWhere, "id", "a finished request", std::to_string(id) + " (not finished)");
    r.forgotten = true;
    if (r.seq < 0) drop(r);
  }
  /// Running requests, in admission order.
  const std::vector<int>& running() const { return running_; }
  /// Arrived requests waiting, front first.
  const std::deque<int>& waiting() const { return waiting_; }
  /// Requests not finished (pending, waiting or running).
  int unfinished() const { return unfinished_; }
  /// The earliest arrival among pending requests, or +infinity when none is pending.
  double next_arrival() const {
    return pending_.empty() ? INFINITY : request(pending_.front()).request.arrival;
  }
  /// Blocks promised to requests and not yet taken.
  int promised_blocks() const { return budget_.promised(); }
  /// Preemptions so far.
  int preemptions() const { return preemptions_; }
  /// Times a recomputing request was passed over when choosing whom to preempt.
  int spared_recomputes() const { return spared_; }

  /// Blocks needed for a sequence of `tokens` tokens.
  /// \throws InvalidArgument if `tokens` is negative or needs more blocks than an `int` counts.
  int blocks_for(long tokens) const {
    return budget_.blocks_for(tokens, "kvlab::Scheduler::blocks_for");
  }

  /// Adds a request; it is seen from its arrival time on. Returns its id.
  /// \throws InvalidArgument (nothing changes) for an empty prompt, a token or stop id outside
  ///         [0, vocab_size), a prompt longer than the model's context, `max_new_tokens < 1`,
  ///         a bad sampling setting or arrival, or a request that cannot fit the pool even
  ///         alone: its longest sequence (prompt + max_new_tokens - 1, at most the context; under
  ///         the contiguous policy `max_len`) and the watermark must fit the pool, since a
  ///         request preempted near its end is readmitted with all its tokens.
  int submit(const Request& r) {
    constexpr const char* kWhere = "kvlab::Scheduler::submit";
    detail::require_at_least(kWhere, "request.prompt.size()", r.prompt.size(), std::size_t{1});
    if (r.prompt.size() > static_cast<std::size_t>(max_tokens_)) {
      detail::fail(kWhere, "request.prompt.size()",
                   "at most " + std::to_string(max_tokens_) + " (the model's context)",
                   r.prompt.size());
    }
    check_ids(kWhere, "request.prompt", r.prompt);
    check_ids(kWhere, "request.stop_ids", r.stop_ids);
    detail::require_at_least(kWhere, "request.max_new_tokens", r.max_new_tokens, 1);
    if (!(r.sampling.temperature >= 0.0f) || !std::isfinite(r.sampling.temperature))
      detail::fail(kWhere, "request.sampling.temperature", "a finite number >= 0",
                   r.sampling.temperature);
    if (!(r.sampling.top_p > 0.0f && r.sampling.top_p <= 1.0f))
      detail::fail(kWhere, "request.sampling.top_p", "in (0, 1]", r.sampling.top_p);
    if (!(r.arrival >= 0.0) || !std::isfinite(r.arrival))
      detail::fail(kWhere, "request.arrival", "a finite time >= 0", r.arrival);
    // The longest its sequence gets: the last token drawn is never fed.
    const long longest =
        std::min(static_cast<long>(r.prompt.size()) + r.max_new_tokens - 1, long{max_tokens_});
    check_request(r, longest);
    const int alone = std::max(blocks_alone(r, longest), blocks_for(longest));
    if (alone + config_.watermark_blocks > pool_->allocator().num_blocks()) {
      detail::fail(
          kWhere, "request",
          "a request that fits the pool alone: " + std::to_string(pool_->allocator().num_blocks()) +
              " blocks of " + std::to_string(pool_->block_size()) + " tokens, " +
              std::to_string(config_.watermark_blocks) + " kept free",
          "one that needs " + std::to_string(alone) + " blocks (" + std::to_string(longest) +
              " tokens, " + to_string(config_.policy) + " policy)");
    }
    RequestState s;
    s.id = num_requests();
    s.request = r;
    s.tokens = r.prompt;
    s.output.arrival = r.arrival;
    requests_.push_back(std::move(s));
    // Pending requests stay sorted by arrival (ties: submission order).
    auto at = pending_.end();
    while (at != pending_.begin() && request(*(at - 1)).request.arrival > r.arrival) --at;
    pending_.insert(at, requests_.back().id);
    ++unfinished_;
    return requests_.back().id;
  }

  /// Decides the step at time `now`: preempts, admits and returns what runs. The engine then
  /// feeds each chunk's tokens to its sequence (one batched forward pass) and calls
  /// `complete_step` with the tokens it drew. The plan is empty when nothing can run.
  const StepPlan& schedule(double now) {
    if (open_) {
      detail::fail("kvlab::Scheduler::schedule", "step", "none open (complete_step first)",
                   "a step open");
    }
    if (!std::isfinite(now))
      detail::fail("kvlab::Scheduler::schedule", "now", "a finite time", now);
    save_before_step();
    try {
      while (!pending_.empty() && request(pending_.front()).request.arrival <= now) {
        RequestState& r = changing(pending_.front());
        pending_.pop_front();
        r.status = RequestStatus::Waiting;
        r.queue_order = next_queue_order_++;
        waiting_.push_back(r.id);
      }
      plan_step(now);
      save_freed_values();
    } catch (...) {  // host memory exhausted while planning: as before the call
      undo_step();
      throw;
    }
    open_ = !plan_.chunks.empty();
    if (!open_) undo_.reset();  // nothing runs: what changed (arrivals, preemptions) stands
    return plan_;
  }

  /// Undoes the step that `schedule` planned and `complete_step` has not ended, after the
  /// forward pass or a draw failed: the queues, every request, the prefix cache and the pool —
  /// its block tables, its allocator, and the values of the blocks the plan freed (preempted or
  /// evicted) and the step may have overwritten — are again as they were before `schedule`,
  /// and the next `schedule` at the same time plans the same step. Call it once any store over
  /// the pool has aborted its own step (`KVStore::abort_step`; `LlamaModel` does that as the
  /// failure leaves it). Does nothing when no step is open; allocates no memory.
  /// \throws InvalidArgument (nothing changes) if a store's step is still open over the pool.
  void abort_step() {
    if (!open_) return;
    undo_step();
  }

  /// Ends the step planned by `schedule`: every chunk's tokens are now in its sequence, and
  /// `drawn[i]` is the token drawn from chunk i's last logits where `chunks[i].samples` (else
  /// ignored). Appends the tokens, finishes requests (stop id, max_new_tokens, context), frees
  /// what finished requests and pad rows held, and caches newly full blocks. Returns the
  /// requests that finished.
  /// \throws InvalidArgument (nothing changes) if no step is open, `drawn` has the wrong size,
  ///         or a drawn id of a sampling chunk is outside [0, vocab_size).
  std::vector<int> complete_step(const std::vector<int>& drawn, double now) {
    constexpr const char* kWhere = "kvlab::Scheduler::complete_step";
    if (!open_) detail::fail(kWhere, "step", "a step open (schedule first)", "none");
    if (!std::isfinite(now)) detail::fail(kWhere, "now", "a finite time", now);
    detail::require_equal(kWhere, "drawn.size()", drawn.size(), plan_.chunks.size(),
                          "the plan's chunks");
    for (std::size_t i = 0; i < plan_.chunks.size(); ++i) {  // checked before anything changes
      if (plan_.chunks[i].samples && (drawn[i] < 0 || drawn[i] >= vocab_size_)) {
        detail::fail(kWhere, "drawn[" + std::to_string(i) + "]",
                     "an id in [0, " + std::to_string(vocab_size_) + ")", drawn[i]);
      }
    }
    open_ = false;
    undo_.reset();  // the step stands
    std::vector<int> finished;
    for (std::size_t i = 0; i < plan_.chunks.size(); ++i) {
      const ScheduledChunk& c = plan_.chunks[i];
      // Every row the model ran counts, pad rows included (they cost the same).
      state(c.request).output.computed_tokens += static_cast<int>(c.tokens.size());
      if (c.kind == ChunkKind::Padding && c.seq != state(c.request).seq) {
        // A member's prompt padding, on a scratch sequence: its blocks go back to the member.
        RequestState& member = state(c.request);
        pool_->free_sequence(c.seq);
        budget_.promise(member, blocks_for(static_cast<long>(c.tokens.size())));
        continue;
      }
      RequestState& r = state(c.request);
      if (c.kind == ChunkKind::Padding) continue;  // a finished member of a static batch
      r.computed += static_cast<int>(c.tokens.size());
      cache_blocks(r);
      if (c.samples && append(r, drawn[i], now)) finished.push_back(r.id);
    }
    release_finished(finished);
    return finished;
  }

  /// Checks every rule the scheduler keeps, between steps:
  ///  - the pool: every block's reference count equals its holders (sequences that list it,
  ///    plus the prefix cache), and every block is free, cached or held (none leaked);
  ///  - every sequence in the pool belongs to a running request (or a finished member of a
  ///    static batch); each running request's sequence holds exactly its computed tokens;
  ///  - waiting and pending requests hold nothing; promised blocks add up and are covered by
  ///    free and evictable blocks;
  ///  - the last step fed at most `max_batched_tokens` (static batches excepted: they have no
  ///    budget) and at most `max_running` requests ran;
  ///  - requests were first admitted in the order they arrived (FCFS);
  ///  - the prefix cache's own rules (`PrefixCache::check`).
  /// \throws InvariantViolation naming the first broken rule.
  /// (Defined in `scheduler_invariants.hpp`, a file of its own.)
  void check_invariants() const;

 protected:
  /// The scheduler of policy `policy` (which `config.policy` must name) — a derived class's.
  /// \throws as the public constructor.
  Scheduler(BatchingPolicy policy, std::shared_ptr<PagedKVCacheBase> pool, SchedulerConfig config,
            int max_tokens, int vocab_size, PrefixCache::HashFunction hash)
      : pool_(checked(std::move(pool))),
        config_(checked(config, policy, max_tokens, vocab_size)),
        max_tokens_(max_tokens),
        vocab_size_(vocab_size),
        cache_(pool_->block_size(), hash),
        budget_(*pool_, cache_) {
    if (config_.max_len == 0) config_.max_len = max_tokens_;
    if (pool_->window() > 0 && config_.prefix_caching) {
      detail::fail("kvlab::Scheduler", "config.prefix_caching",
                   "false with a sliding window (the pool gives back the blocks before each "
                   "window, and a cached prefix is a run of blocks from the first: kvlab does "
                   "not combine them)",
                   "true");
    }
  }

  // --- what a policy decides (the continuous policy's here; the baselines override) ---------

  /// Refuses (InvalidArgument, naming `kvlab::Scheduler::submit`) a request the policy cannot
  /// serve, whose longest sequence is `longest` tokens; the continuous policy serves any.
  virtual void check_request(const Request& /*r*/, long /*longest*/) const {}
  /// Blocks request `r` (longest sequence `longest` tokens) reserves when admitted alone: its
  /// prompt's.
  virtual int blocks_alone(const Request& r, long /*longest*/) const {
    return blocks_for(static_cast<long>(r.prompt.size()));
  }
  /// Blocks reserved for waiting request `r` when it is admitted with a prefix-cache hit of
  /// `hit_blocks` blocks: those of all its tokens, less the hit.
  virtual int admission_reserve(const RequestState& r, int hit_blocks) const {
    return blocks_for(static_cast<long>(r.tokens.size())) - hit_blocks;
  }
  /// Plans the step at time `now` into `plan_` (arrivals have joined the waiting queue): the
  /// vLLM rule (see the class).
  virtual void plan_step(double now) { plan_continuous(now); }
  /// After a step, gives back what the requests that `finished` in it held.
  virtual void release_finished(const std::vector<int>& finished) {
    for (int id : finished) {
      release(state(id));
      running_.erase(std::find(running_.begin(), running_.end(), id));
    }
  }
  /// Whether a step's tokens are bounded by `max_batched_tokens` (`check_invariants`).
  virtual bool has_token_budget() const { return true; }

  // --- what the policies plan with ------------------------------------------------------

  /// Request `id`'s record, which must be kept (`id >= first_kept_`); unchecked.
  RequestState& state(int id) { return requests_[static_cast<std::size_t>(id - first_kept_)]; }
  /// Request `id`'s record (read-only), which must be kept; unchecked.
  const RequestState& state(int id) const {
    return requests_[static_cast<std::size_t>(id - first_kept_)];
  }
  /// Request `id`'s record, to be changed by the step being planned: saved first (for
  /// `abort_step`) if the step has not changed it yet.
  RequestState& changing(int id) {
    RequestState& r = state(id);
    if (undo_->saved.insert(id).second) undo_->requests.push_back(r);
    return r;
  }
  /// Notes `r`'s first admission, for the FCFS check of `check_invariants`.
  void first_admission(const RequestState& r) {
    if (r.queue_order < last_first_admission_) admitted_out_of_order_ = true;
    last_first_admission_ = r.queue_order;
  }
  /// Frees forgotten request r's vectors; then the records at the front that are forgotten and
  /// freed go (ids stay: state(id) indexes from first_kept_).
  void drop(RequestState& r) {
    r.request = Request{};
    r.output = RequestOutput{};
    r.tokens = std::vector<int>{};
    r.chain = std::vector<std::int64_t>{};
    while (!requests_.empty() && requests_.front().forgotten && requests_.front().seq < 0) {
      requests_.pop_front();
      ++first_kept_;
    }
  }
  /// Blocks that admission and growth may still use (`BlockBudget::unpromised`).
  int unpromised() const { return budget_.unpromised(); }
  /// Takes `need` blocks for request r in this step: from its promise first; evicts cached
  /// blocks when the free list alone cannot cover the step.
  void take(RequestState& r, int need) {
    const int short_by = budget_.short_by(need);
    if (short_by > 0) {
      changing_cache();
      plan_.evicted_blocks += cache_.evict(*pool_, short_by);
    }
    budget_.take(r, need);
  }
  /// Gives back everything request r holds: its sequence (its cached blocks stay in the cache)
  /// and its promise.
  void release(RequestState& r) {
    if (r.seq >= 0) {
      const std::vector<std::int32_t> blocks = pool_->blocks(r.seq);  // [ceil(computed / bs)]
      pool_->free_sequence(r.seq);
      cache_.released(*pool_, blocks);
      r.seq = -1;
    }
    budget_.release_promise(r);
  }
  /// The chunk of request r for its next n tokens.
  ScheduledChunk chunk(const RequestState& r, int n) const {
    ScheduledChunk c;
    c.request = r.id;
    c.seq = r.seq;
    c.first_position = r.computed;
    c.tokens.assign(r.tokens.begin() + r.computed, r.tokens.begin() + r.computed + n);
    c.samples = r.computed + n == static_cast<int>(r.tokens.size());
    const bool feeds_last_output = n == 1 && r.tokens.size() > r.request.prompt.size() && c.samples;
    c.kind = feeds_last_output && !r.recomputing ? ChunkKind::Decode : ChunkKind::Prefill;
    return c;
  }

  std::shared_ptr<PagedKVCacheBase> pool_;  ///< the pool whose sequences the scheduler owns
  SchedulerConfig config_;                  ///< the settings, `max_len` resolved
  int max_tokens_;                          ///< the model's positions
  int vocab_size_;                          ///< the model's tokens
  PrefixCache cache_;                       ///< full blocks already computed, by their tokens
  BlockBudget budget_;                      ///< the pool's blocks as admission sees them
  std::deque<int> waiting_;                 ///< arrived or preempted requests, front first
  std::vector<int> running_;                ///< admission order (a static batch: its members)
  StepPlan plan_;                           ///< the step being planned, then the last step's

 private:
  static std::shared_ptr<PagedKVCacheBase> checked(std::shared_ptr<PagedKVCacheBase> pool) {
    if (!pool) detail::fail("kvlab::Scheduler", "pool", "a non-null pool", "nullptr");
    detail::require_equal("kvlab::Scheduler", "pool->sequences().size()", pool->sequences().size(),
                          std::size_t{0}, "an empty pool");
    return pool;
  }
  static SchedulerConfig checked(SchedulerConfig c, BatchingPolicy policy, int max_tokens,
                                 int vocab_size) {
    constexpr const char* kWhere = "kvlab::Scheduler";
    if (c.policy != policy) {
      detail::fail(kWhere, "config.policy",
                   std::string(to_string(policy)) +
                       " (this class's; make_scheduler builds the class of any policy)",
                   to_string(c.policy));
    }
    detail::require_at_least(kWhere, "max_tokens", max_tokens, 1);
    detail::require_at_least(kWhere, "vocab_size", vocab_size, 1);
    detail::require_at_least(kWhere, "config.max_batched_tokens", c.max_batched_tokens, 1);
    detail::require_at_least(kWhere, "config.max_running", c.max_running, 1);
    detail::require_at_least(kWhere, "config.watermark_blocks", c.watermark_blocks, 0);
    if (c.max_len < 0 || c.max_len > max_tokens)
      detail::fail(kWhere, "config.max_len", "in [0, " + std::to_string(max_tokens) + "]",
                   c.max_len);
    // the baselines never share
    if (c.policy != BatchingPolicy::Continuous) c.prefix_caching = false;
    return c;
  }
  void check_ids(const char* where, const char* name, const std::vector<int>& ids) const {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= vocab_size_) {
        detail::fail(where, std::string(name) + "[" + std::to_string(i) + "]",
                     "an id in [0, " + std::to_string(vocab_size_) + ")", ids[i]);
      }
    }
  }

  void check_id(const char* where, int id) const {
    if (id < 0 || id >= num_requests())
      detail::fail(where, "id", "in [0, " + std::to_string(num_requests()) + ")", id);
  }
  bool in_batch(int id) const {
    return std::find(running_.begin(), running_.end(), id) != running_.end();
  }
  // The vLLM rule (see the class).
  void plan_continuous(double now) {
    int budget = config_.max_batched_tokens;
    // 2. Running requests, oldest first.
    for (std::size_t i = 0; i < running_.size() && budget > 0;) {
      RequestState& r = changing(running_[i]);
      const int n = std::min(r.remaining(), budget);
      const int need = pool_->blocks_needed(r.seq, n);
      bool self_preempted = false;
      while (need > r.promised + unpromised()) {
        const std::size_t victim = pick_victim(i);
        if (victim == i) {
          self_preempted = true;
          preempt(i);
          break;
        }
        preempt(victim);
      }
      if (self_preempted) continue;  // running_[i] is now the next request
      take(r, need);
      plan_.chunks.push_back(chunk(r, n));
      budget -= n;
      ++i;
    }
    // 3. Waiting requests, first come first served, when nobody was preempted.
    while (plan_.preempted.empty() && !waiting_.empty() && budget > 0 &&
           static_cast<int>(running_.size()) < config_.max_running) {
      RequestState& r = changing(waiting_.front());
      const PrefixCache::Match hit =
          config_.prefix_caching ? cache_.match(r.tokens) : PrefixCache::Match{};
      const int hit_tokens = hit.tokens(pool_->block_size());
      int evictable_hits = 0;  // hit blocks that only the cache holds: no longer evictable
      for (std::int32_t b : hit.blocks)
        evictable_hits += pool_->allocator().ref_count(b) == 1 ? 1 : 0;
      const int reserve = admission_reserve(r, static_cast<int>(hit.blocks.size()));
      if (reserve + config_.watermark_blocks > unpromised() - evictable_hits) break;  // FCFS
      waiting_.pop_front();
      changing_cache();
      cache_.take(hit.blocks);
      r.seq = pool_->add_sequence(hit.blocks);
      r.chain = hit.entries;
      r.computed = hit_tokens;
      budget_.promise(r, reserve);
      r.status = RequestStatus::Running;
      if (r.output.first_scheduled < 0) {
        r.output.first_scheduled = now;
        first_admission(r);
      }
      r.output.prefix_hit_tokens += hit_tokens;
      if (config_.prefix_caching)
        r.output.prefix_lookup_tokens += static_cast<int>(r.tokens.size());
      plan_.prefix_hit_tokens += hit_tokens;
      plan_.admitted.push_back(r.id);
      running_.push_back(r.id);
      const int n = std::min(r.remaining(), budget);
      take(r, pool_->blocks_needed(r.seq, n));
      plan_.chunks.push_back(chunk(r, n));
      budget -= n;
    }
  }

  // The running request to preempt so that running_[i] can run: the newest one after it that
  // is not recomputing after an earlier preemption, or i itself.
  std::size_t pick_victim(std::size_t i) {
    for (std::size_t j = running_.size() - 1; j > i; --j) {
      if (!request(running_[j]).recomputing) return j;
      ++spared_;  // a recomputing request passed over
    }
    return i;
  }
  // Preempts running_[i]: its blocks go back, it returns to the front of the queue and will
  // compute its prompt and output again.
  void preempt(std::size_t i) {
    RequestState& r = changing(running_[i]);
    changing_cache();  // release gives cached blocks back to it
    release(r);
    r.computed = 0;
    r.chain.clear();
    r.recomputing = true;
    r.status = RequestStatus::Waiting;
    ++r.output.preemptions;
    ++preemptions_;
    running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
    waiting_.push_front(r.id);
    plan_.preempted.push_back(r.id);
  }

  // Appends token `t` drawn for request r at time `now`; returns true when r finished.
  bool append(RequestState& r, int t, double now) {
    r.recomputing = false;
    const Request& q = r.request;
    FinishReason why = FinishReason::None;
    if (std::find(q.stop_ids.begin(), q.stop_ids.end(), t) != q.stop_ids.end()) {
      why = FinishReason::Stop;
    } else {
      r.tokens.push_back(t);
      r.output.tokens.push_back(t);
      r.output.token_times.push_back(now);
      if (static_cast<int>(r.output.tokens.size()) == q.max_new_tokens) {
        why = FinishReason::Length;
      } else if (static_cast<int>(r.tokens.size()) - 1 == max_tokens_) {
        why = FinishReason::Context;  // the token just drawn has no position left to be fed at
      }
    }
    if (why == FinishReason::None) return false;
    r.output.finish = why;
    r.output.finished = now;
    r.status = RequestStatus::Finished;
    --unfinished_;
    return true;
  }

  // Caches the full blocks of request r that are computed and not cached yet.
  void cache_blocks(RequestState& r) {
    if (!config_.prefix_caching) return;
    const int bs = pool_->block_size();
    const std::vector<std::int32_t>& blocks = pool_->blocks(r.seq);
    for (int k = static_cast<int>(r.chain.size()); (k + 1) * bs <= r.computed; ++k) {
      const std::int64_t parent = k == 0 ? PrefixCache::kRoot : r.chain.back();
      r.chain.push_back(cache_.insert(*pool_, parent,
                                      r.tokens.data() + static_cast<std::ptrdiff_t>(k) * bs,
                                      blocks[static_cast<std::size_t>(k)]));
    }
  }

  // What `abort_step` puts back: the state before `schedule`, the parts a step rarely changes
  // saved as it changes them.
  struct Undo {
    std::deque<int> pending, waiting;
    std::vector<int> running;
    long last_first_admission = -1;
    bool admitted_out_of_order = false;
    int preemptions = 0, spared = 0;
    BlockBudget budget;
    long next_queue_order = 0;
    StepPlan plan;                       // the previous step's (check_invariants reads it)
    PagedKVCacheBase::Checkpoint pool;   // with the values of the blocks the plan freed
    std::vector<RequestState> requests;  // each request the step changed, as it was
    std::unordered_set<int> saved;       // their ids
    std::optional<PrefixCache> cache;    // as it was, once the step changes it
  };
  // Saves what any step may change; the rest is saved as it changes (`changing`,
  // `changing_cache`, `save_freed_values`).
  void save_before_step() {
    Undo u{pending_,
           waiting_,
           running_,
           last_first_admission_,
           admitted_out_of_order_,
           preemptions_,
           spared_,
           budget_,
           next_queue_order_,
           std::move(plan_),
           pool_->checkpoint(),
           {},
           {},
           {}};
    plan_ = StepPlan{};
    budget_.start_step();
    undo_ = std::move(u);
  }
  // Saves the prefix cache if this step has not changed it yet.
  void changing_cache() {
    if (!undo_->cache) undo_->cache = cache_;
  }
  // Keeps the values of the blocks that held K/V before the step and are free now (preempted or
  // evicted): the step may hand them to new tokens and overwrite them.
  void save_freed_values() {
    if (plan_.preempted.empty() && plan_.evicted_blocks == 0) return;
    const BlockAllocator& before = undo_->pool.book.allocator();
    std::vector<std::int32_t> freed;  // [blocks freed by the plan]
    for (std::int32_t b = 0; b < before.num_blocks(); ++b)
      if (before.ref_count(b) > 0 && pool_->allocator().ref_count(b) == 0) freed.push_back(b);
    pool_->save_values(undo_->pool, freed);
  }
  // Puts back everything saved for the step (moves only: nothing is allocated).
  void undo_step() {
    Undo& u = *undo_;
    pool_->restore(std::move(u.pool));  // first: it refuses an open store step
    pending_ = std::move(u.pending);
    waiting_ = std::move(u.waiting);
    running_ = std::move(u.running);
    last_first_admission_ = u.last_first_admission;
    admitted_out_of_order_ = u.admitted_out_of_order;
    budget_ = u.budget;
    budget_.start_step();
    preemptions_ = u.preemptions;
    spared_ = u.spared;
    next_queue_order_ = u.next_queue_order;
    plan_ = std::move(u.plan);
    for (RequestState& r : u.requests) state(r.id) = std::move(r);
    if (u.cache) cache_ = std::move(*u.cache);
    open_ = false;
    undo_.reset();
  }

  std::deque<RequestState> requests_;   // [kept records] request id at id - first_kept_
  int first_kept_ = 0;                  // the oldest kept record's id
  std::deque<int> pending_;             // not arrived yet, by arrival time
  long last_first_admission_ = -1;      // queue_order of the latest first admission
  bool admitted_out_of_order_ = false;  // a first admission came before an earlier one's
  bool open_ = false;                   // a planned step not completed yet
  int unfinished_ = 0;                  // requests not finished
  int preemptions_ = 0;                 // preemptions so far
  int spared_ = 0;                      // recomputing requests passed over as victims
  long next_queue_order_ = 0;           // FCFS counter
  std::optional<Undo> undo_;            // from schedule to complete_step or abort_step
};

}  // namespace kvlab

#include "kvlab/serving/scheduler_invariants.hpp"  // Scheduler::check_invariants
