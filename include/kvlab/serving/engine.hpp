/// \file
/// \brief `Engine`: a serving loop, with a step log.
///
/// The `Scheduler` decides each step, `LlamaModel` runs it as one batched forward pass over a
/// shared paged pool, and each request's own `Sampler` draws its next token. The step log says who
/// ran, with how many tokens, and how the memory stood. Checked in `tests/serving/test_engine.cpp`:
/// every request gets the tokens (and, within a stated tolerance, the logits) it gets alone through
/// `generate`, under every policy.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvlab/cache/paged_kv_cache.hpp"
#include "kvlab/config.hpp"
#include "kvlab/matrix.hpp"
#include "kvlab/model/llama_model.hpp"
#include "kvlab/model/llama_weights.hpp"
#include "kvlab/model/sampler.hpp"
#include "kvlab/serving/make_scheduler.hpp"
#include "kvlab/serving/request.hpp"
#include "kvlab/serving/scheduler.hpp"
#include "kvlab/serving/step_plan.hpp"
#include "kvlab/store/paged_store.hpp"

namespace kvlab {

/// What the engine's time is.
enum class EngineClock {
  /// Seconds of a steady clock since the first `step` (arrivals are waited for, sleeping).
  Wall,
  /// Steps: step k runs at time k and its tokens are drawn at k + 1; when nothing can run,
  /// time jumps to the next arrival, rounded up to a whole step. Deterministic, for tests and
  /// tutorials.
  Steps,
};

/// The engine's settings.
struct EngineConfig {
  SchedulerConfig scheduler;         ///< the policy, token budget, max running, watermark, prefixes
  int block_size = 16;               ///< tokens per block of the pool, >= 1
  int num_blocks = 256;              ///< blocks in the pool, >= 1
  int max_tokens = 0;                ///< the longest sequence; 0 means the model's seq_len
  KVDtype kv_dtype = KVDtype::fp32;  ///< how the pool stores K and V (`KVStorage`)
  /// A sliding window: each query attends to its last `window` keys and the blocks before them
  /// go back to the pool after every step (0: none). Prefix caching must be off with a window.
  int window = 0;
  /// Attention sinks (with a window, below it): each query also attends to its sequence's first
  /// `sinks` tokens, whose blocks stay held (0: none).
  int sinks = 0;
  EngineClock clock = EngineClock::Wall;  ///< what time is
  bool keep_logits = false;               ///< keep the logits of every drawn token (`logits(id)`)
  bool check_invariants = false;          ///< run `Scheduler::check_invariants` after every step
  /// Keep every step's record in `step_log` (off: only the last, `last_step`; the log grows by
  /// one record per step, so a long-running engine turns it off to keep its memory flat).
  bool keep_step_log = true;
  PrefixCache::HashFunction hash = PrefixCache::chain_hash;  ///< the prefix cache's block names
};

/// Serves requests with a `LlamaModel` over one paged pool, step by step.
///
/// A step: `Scheduler::schedule(now)` picks the chunks; `LlamaModel::forward_batch` feeds them
/// all in one pass (every weight matrix read once for the whole batch, one attention call per
/// layer over the ragged batch); each chunk that ends its request's known tokens draws the next
/// token from its last logits with the request's sampler; `Scheduler::complete_step` appends,
/// finishes and frees. The step is logged (`step_log`).
///
/// Requests are submitted at any time with an arrival time (`Request::arrival`, in the engine's
/// time); `run` steps until every submitted request has finished, waiting for arrivals when
/// nothing can run.
class Engine {
 public:
  /// An engine for `weights` with a pool of `config.num_blocks` blocks.
  /// \throws InvalidArgument for null or malformed weights or a bad setting.
  Engine(std::shared_ptr<const LlamaWeights> weights, const EngineConfig& config)
      : config_(config),
        paged_(make_pool(weights, config)),
        model_(std::move(weights), paged_.store, config.max_tokens),
        scheduler_(make_scheduler(paged_.pool, config.scheduler, model_.max_tokens(),
                                  model_.config().vocab_size, config.hash)) {}

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Adds a request, seen from its arrival time on; returns its id (0, 1, ... in submission
  /// order).
  /// \throws InvalidArgument as `Scheduler::submit` (an empty prompt, an id outside the
  ///         vocabulary, a prompt longer than the context, `max_new_tokens < 1`, a request that
  ///         cannot fit the pool alone, ...). Nothing changes: the engine goes on serving the
  ///         others.
  int submit(const Request& r) {
    const int id = scheduler_->submit(r);
    samplers_.emplace_back(std::in_place, model_.config().vocab_size, r.sampling.temperature,
                           r.sampling.top_p, r.sampling.seed);
    logits_.emplace_back();
    return id;
  }

  /// True when every submitted request has finished.
  bool done() const { return scheduler_->unfinished() == 0; }
  /// The engine's time now (0 before the first step).
  double now() const {
    if (config_.clock == EngineClock::Steps) return virtual_time_;
    if (!started_) return 0.0;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

  /// Runs one step, or, when nothing can run, waits for the next arrival (sleeps, or jumps with
  /// `EngineClock::Steps`). Returns true if a step ran (its record is `last_step()`).
  /// \throws InvalidArgument when every request has finished (nothing to wait for);
  ///         InvariantViolation if requests are unfinished and none can ever run (a bug).
  ///         Whatever the planning, the forward pass or a draw throws (host memory exhausted)
  ///         propagates with the step undone: the pool, its block tables, the prefix cache,
  ///         every queue and request, the samplers and the kept logits are as before the call
  ///         (`Scheduler::abort_step`), and the next call runs the same step. (The model's work
  ///         counters keep what the failed step did.)
  bool step() {
    if (done()) detail::fail("kvlab::Engine::step", "requests", "one not finished", "none");
    if (!started_) {
      started_ = true;
      start_ = std::chrono::steady_clock::now();
    }
    const double begin = now();
    const StepPlan& plan = scheduler_->schedule(begin);
    if (plan.chunks.empty()) {  // nothing runnable: wait for the next arrival
      const double next = scheduler_->next_arrival();
      if (!std::isfinite(next)) {  // unfinished requests, none can run and none will arrive
        throw InvariantViolation(
            "kvlab::Engine::step: " + std::to_string(scheduler_->unfinished()) +
            " requests unfinished, none can run and none is pending");
      }
      if (config_.clock == EngineClock::Steps) {
        virtual_time_ = std::max(virtual_time_, std::ceil(next));
      } else if (next > begin) {
        std::this_thread::sleep_for(std::chrono::duration<double>(next - begin));
      }
      return false;
    }
    // One forward pass over every chunk, then a token for each chunk that ends its request.
    std::vector<SequenceChunk> batch;  // [chunks]
    for (const ScheduledChunk& c : plan.chunks) batch.push_back(SequenceChunk{c.seq, c.tokens});
    std::vector<int> drawn(plan.chunks.size(), -1);  // [chunks]
    std::vector<std::uint64_t> generators;           // [chunks drawn]: each sampler's state before
    try {
      const RowMatrix<float> logits = model_.forward_batch(batch);  // [chunks, vocab_size]
      generators.reserve(plan.chunks.size());
      for (std::size_t i = 0; i < plan.chunks.size(); ++i) {
        const ScheduledChunk& c = plan.chunks[i];
        if (!c.samples || c.kind == ChunkKind::Padding) continue;
        const RowVector<float> row = logits.row(static_cast<Eigen::Index>(i));
        generators.push_back(sampler(c.request).generator_state());
        const int token = sampler(c.request).sample(row);
        if (config_.keep_logits) kept_logits(c.request).push_back(row);
        drawn[i] = token;  // set last: drawn[i] >= 0 means the logits were kept too
      }
    } catch (...) {  // the model aborted its store's step; now the rest, newest first
      undo_draws(plan, drawn, generators);
      scheduler_->abort_step();
      throw;
    }
    if (config_.clock == EngineClock::Steps) virtual_time_ += 1.0;
    const double end = now();
    StepRecord record = log_entry(plan, begin);
    record.finished = scheduler_->complete_step(drawn, end);
    // A finished request draws no more: its sampler's buffers (vocab_size long) go.
    for (int id : record.finished) sampler_slot(id).reset();
    drop_freed();  // records of requests forgotten while their static batch ran
    record.end = end;
    fill_memory(record);
    ++steps_;
    if (config_.keep_step_log) log_.push_back(record);
    last_ = std::move(record);
    if (config_.check_invariants) scheduler_->check_invariants();
    return true;
  }

  /// Steps until every submitted request has finished; `on_step` (if set) sees each step's
  /// record as it is logged.
  void run(const std::function<void(const StepRecord&)>& on_step = nullptr) {
    while (!done()) {
      if (step() && on_step) on_step(last_);
    }
  }

  /// What request `id` got so far.
  /// \throws InvalidArgument if no request has that id, or its output was taken.
  const RequestOutput& output(int id) const { return scheduler_->request(id).output; }
  /// Hands over finished request `id`'s output and forgets the request: its record, and its
  /// logits with `EngineConfig::keep_logits`, are freed (`Scheduler::forget`), and `output(id)`,
  /// `logits(id)` and `scheduler().request(id)` refuse it from then on. A long-running engine
  /// takes every finished request's output, so that its memory stays bounded by the requests in
  /// flight; otherwise every record stays (about 1.2 KiB per request of the built-in tiny model,
  /// measured by tests/stress/kvlab_stress).
  /// \throws InvalidArgument (nothing changes) if no request has that id, it has not finished,
  ///         or its output was taken already.
  RequestOutput take_output(int id) {
    const RequestState& r = scheduler_->request(id);  // checks the id
    if (r.status != RequestStatus::Finished)
      detail::fail("kvlab::Engine::take_output", "id", "a finished request",
                   std::to_string(id) + " (not finished)");
    RequestOutput out = r.output;
    kept_logits(id) = {};
    scheduler_->forget(id);
    drop_freed();
    return out;
  }
  /// The logits of every token drawn for request `id` ([draws][vocab_size]: the stop id's
  /// too), with `EngineConfig::keep_logits`; empty otherwise.
  /// \throws InvalidArgument if no request has that id, or its output was taken.
  const std::vector<RowVector<float>>& logits(int id) const {
    scheduler_->request(id);  // checks the id
    return logits_[static_cast<std::size_t>(id - first_kept_)];
  }
  /// One record per step that ran, in order (empty without `EngineConfig::keep_step_log`).
  const std::vector<StepRecord>& step_log() const { return log_; }
  /// The record of the last step that ran (a default record before the first).
  const StepRecord& last_step() const { return last_; }
  /// Steps that ran.
  int steps() const { return steps_; }
  /// The scheduler (read-only): requests, queues, pool, prefix cache, invariants.
  const Scheduler& scheduler() const { return *scheduler_; }
  /// The model (read-only): its shape and counters.
  const LlamaModel& model() const { return model_; }
  /// The settings.
  const EngineConfig& config() const { return config_; }

 private:
  // The pool (its bookkeeping, for the scheduler) and the model's store over it.
  struct PoolAndStore {
    std::shared_ptr<PagedKVCacheBase> pool;
    std::shared_ptr<KVStore<float>> store;
  };
  static PoolAndStore make_pool(const std::shared_ptr<const LlamaWeights>& weights,
                                const EngineConfig& config) {
    if (!weights) detail::fail("kvlab::Engine", "weights", "non-null weights", "nullptr");
    const LlamaConfig& c = weights->config;
    return visit_kv_dtype(config.kv_dtype, [&](auto tag) {
      using S = typename decltype(tag)::type;
      auto pool = std::make_shared<PagedKVCache<float, S>>(
          c.n_layers, c.n_kv_heads, c.head_dim(), config.block_size, config.num_blocks,
          KVLayout::NHD, config.window, config.sinks);
      return PoolAndStore{pool, std::make_shared<PagedStore<float, S>>(pool)};
    });
  }

  // Undoes the draws of a failed step: every sampler that drew (or was drawing) goes back to
  // its state `generators[k]` before, and the logits kept for a draw go.
  void undo_draws(const StepPlan& plan, const std::vector<int>& drawn,
                  const std::vector<std::uint64_t>& generators) {
    for (std::size_t i = 0, k = 0; i < plan.chunks.size() && k < generators.size(); ++i) {
      const ScheduledChunk& c = plan.chunks[i];
      if (!c.samples || c.kind == ChunkKind::Padding) continue;
      sampler(c.request).set_generator_state(generators[k++]);
      if (config_.keep_logits && drawn[i] >= 0) kept_logits(c.request).pop_back();
    }
  }

  StepRecord log_entry(const StepPlan& plan, double begin) const {
    StepRecord r;
    r.step = steps_;
    r.start = begin;
    for (const ScheduledChunk& c : plan.chunks)
      r.batch.push_back(StepEntry{c.request, static_cast<int>(c.tokens.size()), c.kind});
    r.admitted = plan.admitted;
    r.preempted = plan.preempted;
    r.prefix_hit_tokens = plan.prefix_hit_tokens;
    r.evicted_blocks = plan.evicted_blocks;
    return r;
  }
  void fill_memory(StepRecord& r) const {
    const BlockAllocator& alloc = paged_.pool->allocator();
    r.waiting = static_cast<int>(scheduler_->waiting().size());
    r.running = static_cast<int>(scheduler_->running().size());
    r.blocks_cached = scheduler_->prefix_cache().evictable_blocks();
    r.blocks_free = alloc.num_free();
    r.blocks_used = alloc.num_used() - r.blocks_cached;
    r.blocks_reserved = scheduler_->promised_blocks();
  }

  EngineConfig config_;
  PoolAndStore paged_;  // the blocks every request's K/V live in, and the model's store over them
  LlamaModel model_;
  std::unique_ptr<Scheduler> scheduler_;  // the policy's (make_scheduler)
  // Request id's sampler and kept logits are at id - first_kept_, as the scheduler's records.
  std::optional<Sampler>& sampler_slot(int id) {
    return samplers_[static_cast<std::size_t>(id - first_kept_)];
  }
  Sampler& sampler(int id) { return *sampler_slot(id); }
  // Drops the samplers and logits of the requests whose records the scheduler freed.
  void drop_freed() {
    while (first_kept_ < scheduler_->num_requests() - scheduler_->kept_records()) {
      samplers_.pop_front();
      logits_.pop_front();
      ++first_kept_;
    }
  }
  std::vector<RowVector<float>>& kept_logits(int id) {
    return logits_[static_cast<std::size_t>(id - first_kept_)];
  }

  std::deque<std::optional<Sampler>>
      samplers_;  // [kept requests] each one's own, until it finishes
  std::deque<std::vector<RowVector<float>>> logits_;  // [kept requests][draws] with keep_logits
  int first_kept_ = 0;                                // the oldest kept request's id
  std::vector<StepRecord> log_;                       // [steps] with keep_step_log
  StepRecord last_;
  int steps_ = 0;
  bool started_ = false;
  std::chrono::steady_clock::time_point start_;
  double virtual_time_ = 0.0;  // EngineClock::Steps
};

}  // namespace kvlab
