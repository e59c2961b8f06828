// The bad-input cases of include/kvlab/serving/: each calls a public function declared there with
// one bad argument. The rules of the table are in tests/bad_input/ (entry_points.txt lists the
// entry points and is checked against the headers by the test bad_input_table; bad_input.hpp runs a
// case): each input class that applies — wrong shape, zero or negative size, empty, an index or id
// out of range, a call the object's state does not allow, overflow-sized arguments, values that
// cannot be stored — is tried, and each case asserts kvlab's exception type, a message naming the
// argument with the expected and the actual value, and the object's observable state unchanged
// (compared before and after).
#include <catch2/catch.hpp>

#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "bad_input/bad_input.hpp"
#include "bad_input/states.hpp"
#include "kvlab/kvlab.hpp"

using kvlab::InvalidArgument;
using kvlab_test::names;
using kvlab_test::refuses;
using kvlab_test::bad_input_states::no_state;
using kvlab_test::bad_input_states::request_of;
using kvlab_test::bad_input_states::state_of;
namespace input = kvlab_test::input;

TEST_CASE("Scheduler and Engine: bad requests and calls are refused and change nothing") {
  auto pool = std::make_shared<kvlab::PagedKVCache<float>>(1, 1, 2, 4, 8);
  const char* ctor =
      "kvlab::Scheduler::Scheduler(std::shared_ptr< PagedKVCacheBase > pool, SchedulerConfig "
      "config, "
      "int max_tokens, int vocab_size, PrefixCache::HashFunction hash=PrefixCache::chain_hash)";
  refuses<InvalidArgument>(
      ctor, input::kEmpty, no_state,
      [] { kvlab::Scheduler s(nullptr, kvlab::SchedulerConfig{}, 32, 10); },
      names("pool", "a non-null pool", "nullptr"));
  refuses<InvalidArgument>(
      ctor, input::kSize, no_state,
      [&] { kvlab::Scheduler s(pool, kvlab::SchedulerConfig{}, 0, 10); },
      names("max_tokens", ">= 1", "0"));
  refuses<InvalidArgument>(
      ctor, input::kSize, no_state,
      [&] {
        kvlab::SchedulerConfig c;
        c.max_running = 0;
        kvlab::Scheduler s(pool, c, 32, 10);
      },
      names("config.max_running", ">= 1", "0"));
  refuses<InvalidArgument>(
      ctor, input::kRange, no_state,
      [&] {
        kvlab::SchedulerConfig c;
        c.max_len = 33;
        kvlab::Scheduler s(pool, c, 32, 10);
      },
      names("config.max_len", "in [0, 32]", "33"));
  refuses<InvalidArgument>(
      ctor, input::kEmpty, no_state,
      [&] { kvlab::Scheduler s(pool, kvlab::SchedulerConfig{}, 32, 10, nullptr); },
      names("hash", "a function", "nullptr"));
  // Each policy's class refuses a configuration of another; make_scheduler builds any.
  kvlab::SchedulerConfig static_config;
  static_config.policy = kvlab::BatchingPolicy::Static;
  refuses<InvalidArgument>(
      ctor, input::kState, no_state, [&] { kvlab::Scheduler s(pool, static_config, 32, 10); },
      names("config.policy",
            "continuous (this class's; make_scheduler builds the class of any policy)", "static"));
  refuses<InvalidArgument>(
      "kvlab::StaticScheduler::StaticScheduler(std::shared_ptr< PagedKVCacheBase > pool, "
      "SchedulerConfig config, int max_tokens, int vocab_size, PrefixCache::HashFunction "
      "hash=PrefixCache::chain_hash)",
      input::kState, no_state,
      [&] { kvlab::StaticScheduler s(pool, kvlab::SchedulerConfig{}, 32, 10); },
      names("config.policy", "static (this class's; make_scheduler builds the class of any policy)",
            "continuous"));
  refuses<InvalidArgument>(
      "kvlab::ContiguousScheduler::ContiguousScheduler(std::shared_ptr< PagedKVCacheBase > pool, "
      "SchedulerConfig config, int max_tokens, int vocab_size, PrefixCache::HashFunction "
      "hash=PrefixCache::chain_hash)",
      input::kState, no_state, [&] { kvlab::ContiguousScheduler s(pool, static_config, 32, 10); },
      names("config.policy",
            "contiguous (this class's; make_scheduler builds the class of any policy)", "static"));
  refuses<InvalidArgument>(
      "kvlab::make_scheduler(std::shared_ptr< PagedKVCacheBase > pool, const SchedulerConfig "
      "&config, int max_tokens, int vocab_size, PrefixCache::HashFunction "
      "hash=PrefixCache::chain_hash)",
      input::kSize, no_state, [&] { (void)kvlab::make_scheduler(pool, static_config, 0, 10); },
      names("max_tokens", ">= 1", "0"));
  CHECK(dynamic_cast<kvlab::StaticScheduler*>(
            kvlab::make_scheduler(pool, static_config, 32, 10).get()) != nullptr);

  kvlab::Scheduler scheduler(pool, kvlab::SchedulerConfig{}, 32, 10);
  scheduler.submit(request_of({1, 2, 3}, 1));
  const auto state = [&] { return state_of(scheduler); };
  const char* submit = "kvlab::Scheduler::submit(const Request &r)";
  refuses<InvalidArgument>(
      submit, input::kEmpty, state, [&] { scheduler.submit(request_of({})); },
      names("request.prompt.size()", ">= 1", "0"));
  refuses<InvalidArgument>(
      submit, input::kRange, state,
      [&] {
        scheduler.submit(request_of({1, 10}));
      },
      names("request.prompt[1]", "an id in [0, 10)", "10"));
  refuses<InvalidArgument>(
      submit, input::kSize, state, [&] { scheduler.submit(request_of({1}, 0)); },
      names("request.max_new_tokens", ">= 1", "0"));
  refuses<InvalidArgument>(
      submit, input::kOverflow, state,
      [&] { scheduler.submit(request_of(std::vector<int>(33, 1))); },
      names("request.prompt.size()", "at most 32 (the model's context)", "33"));
  refuses<InvalidArgument>(
      submit, input::kValue, state,
      [&] {
        kvlab::Request r = request_of({1});
        r.sampling.temperature = std::numeric_limits<float>::infinity();
        scheduler.submit(r);
      },
      names("request.sampling.temperature", "a finite number >= 0", "inf"));
  refuses<InvalidArgument>(
      submit, input::kValue, state,
      [&] {
        kvlab::Request r = request_of({1});
        r.arrival = -1.0;
        scheduler.submit(r);
      },
      names("request.arrival", "a finite time >= 0", "-1"));
  refuses<InvalidArgument>(
      submit, input::kRange, state,
      [&] {
        kvlab::Request r = request_of({1});
        r.stop_ids = {-1};
        scheduler.submit(r);
      },
      names("request.stop_ids[0]", "an id in [0, 10)", "-1"));
  const char* complete =
      "kvlab::Scheduler::complete_step(const std::vector< int > &drawn, double now)";
  refuses<InvalidArgument>(
      complete, input::kState, state, [&] { (void)scheduler.complete_step({1}, 0.0); },
      names("step", "a step open (schedule first)", "none"));
  const kvlab::StepPlan plan = scheduler.schedule(0.0);
  REQUIRE(plan.chunks.size() == 1);
  refuses<InvalidArgument>(
      complete, input::kShape, state,
      [&] {
        (void)scheduler.complete_step({1, 2}, 0.0);
      },
      names("drawn.size()", "1 (the plan's chunks)", "2"));
  refuses<InvalidArgument>(
      complete, input::kRange, state, [&] { (void)scheduler.complete_step({-1}, 0.0); },
      names("drawn[0]", "an id in [0, 10)", "-1"));
  pool->reserve(plan.chunks[0].seq, 3);
  (void)scheduler.complete_step({4}, 1.0);
  for (const char* e :
       {"kvlab::Scheduler::request(int id) const", "kvlab::Scheduler::forgotten(int id) const",
        "kvlab::Scheduler::forget(int id)"}) {
    const std::string name = e;
    const auto call = [&](int id) {
      if (name.find("::request") != std::string::npos) (void)scheduler.request(id);
      if (name.find("::forgotten") != std::string::npos) (void)scheduler.forgotten(id);
      if (name.find("::forget(") != std::string::npos) scheduler.forget(id);
    };
    refuses<InvalidArgument>(
        e, input::kRange, state, [&] { call(1); }, names("id", "in [0, 1)", "1"));
  }
  scheduler.submit(request_of({5, 6}));
  refuses<InvalidArgument>(
      "kvlab::Scheduler::forget(int id)", input::kState, state, [&] { scheduler.forget(1); },
      names("id", "a finished request", "1 (not finished)"));
  scheduler.forget(0);
  refuses<InvalidArgument>(
      "kvlab::Scheduler::request(int id) const", input::kState, state,
      [&] { (void)scheduler.request(0); }, names("id", "a request not forgotten", "0 (forgotten)"));
  refuses<InvalidArgument>(
      "kvlab::Scheduler::forget(int id)", input::kState, state, [&] { scheduler.forget(0); },
      names("id", "a request not forgotten", "0 (forgotten)"));

  const auto weights = std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin());
  const char* engine_ctor =
      "kvlab::Engine::Engine(std::shared_ptr< const LlamaWeights > weights, const EngineConfig "
      "&config)";
  refuses<InvalidArgument>(
      engine_ctor, input::kEmpty, no_state, [] { kvlab::Engine e(nullptr, kvlab::EngineConfig{}); },
      names("weights", "non-null weights", "nullptr"));
  refuses<InvalidArgument>(
      engine_ctor, input::kSize, no_state,
      [&] {
        kvlab::EngineConfig c;
        c.num_blocks = 0;
        kvlab::Engine e(weights, c);
      },
      names("num_blocks", ">= 1", "0"));
  kvlab::EngineConfig c;
  c.clock = kvlab::EngineClock::Steps;
  kvlab::Engine engine(weights, c);
  engine.submit(request_of({1, 2, 3}, 2));
  const auto engine_state = [&] {
    std::vector<long> s = state_of(engine.scheduler());
    s.push_back(engine.steps());
    return s;
  };
  refuses<InvalidArgument>(
      "kvlab::Engine::submit(const Request &r)", input::kRange, engine_state,
      [&] {
        engine.submit(request_of({1, 256}));
      },
      names("request.prompt[1]", "an id in [0, 256)", "256"));
  refuses<InvalidArgument>(
      "kvlab::Engine::take_output(int id)", input::kState, engine_state,
      [&] { (void)engine.take_output(0); }, names("id", "a finished request", "0 (not finished)"));
  for (const char* e :
       {"kvlab::Engine::output(int id) const", "kvlab::Engine::logits(int id) const",
        "kvlab::Engine::take_output(int id)"}) {
    const std::string name = e;
    const auto call = [&](int id) {
      if (name.find("::output") != std::string::npos) (void)engine.output(id);
      if (name.find("::logits") != std::string::npos) (void)engine.logits(id);
      if (name.find("::take_output") != std::string::npos) (void)engine.take_output(id);
    };
    refuses<InvalidArgument>(
        e, input::kRange, engine_state, [&] { call(1); }, names("id", "in [0, 1)", "1"));
    refuses<InvalidArgument>(
        e, input::kRange, engine_state, [&] { call(-1); }, names("id", "in [0, 1)", "-1"));
  }
}

TEST_CASE("PrefixCache's constructor, the policy's name parser and quantile refuse bad input") {
  const char* cache_ctor =
      "kvlab::PrefixCache::PrefixCache(int block_size, HashFunction hash=chain_hash)";
  refuses<InvalidArgument>(
      cache_ctor, input::kSize, no_state, [] { kvlab::PrefixCache c(0); },
      names("block_size", ">= 1", "0"));
  refuses<InvalidArgument>(
      cache_ctor, input::kEmpty, no_state, [] { kvlab::PrefixCache c(4, nullptr); },
      names("hash", "a function", "nullptr"));

  refuses<InvalidArgument>(
      "kvlab::parse_batching_policy(const std::string &name)", input::kValue, no_state,
      [] { (void)kvlab::parse_batching_policy(""); },
      names("name", "continuous, static or contiguous", "''"));
  refuses<InvalidArgument>(
      "kvlab::quantile(std::vector< double > values, double q)", input::kValue, no_state,
      [] {
        (void)kvlab::quantile({1.0, 2.0, 3.0}, 2.0);
      },
      names("q", "in [0, 1]", "2"));
  refuses<InvalidArgument>(
      "kvlab::quantile(std::vector< double > values, double q)", input::kValue, no_state,
      [] { (void)kvlab::quantile({1.0}, std::nan("")); }, names("q", "in [0, 1]", "nan"));
}

TEST_CASE("make_workload refuses prompt lengths out of order and an empty vocabulary") {
  kvlab::WorkloadSpec spec;
  spec.prompt_min = 5;
  spec.prompt_max = 4;
  refuses<InvalidArgument>(
      "kvlab::make_workload(const WorkloadSpec &spec, int vocab_size)", input::kRange, no_state,
      [&] { (void)kvlab::make_workload(spec, 256); },
      names("spec.prompt_max", ">= spec.prompt_min (5)", "4"));
  refuses<InvalidArgument>(
      "kvlab::make_workload(const WorkloadSpec &spec, int vocab_size)", input::kSize, no_state,
      [] { (void)kvlab::make_workload(kvlab::WorkloadSpec{}, 0); },
      names("vocab_size", ">= 1", "0"));
}

TEST_CASE("Scheduler::schedule refuses a time that is not finite") {
  auto pool = std::make_shared<kvlab::PagedKVCache<float>>(1, 1, 2, 4, 8);
  kvlab::Scheduler scheduler(pool, kvlab::SchedulerConfig{}, 32, 10);
  const auto scheduler_state = [&] { return state_of(scheduler); };
  refuses<InvalidArgument>(
      "kvlab::Scheduler::schedule(double now)", input::kValue, scheduler_state,
      [&] { (void)scheduler.schedule(std::nan("")); }, names("now", "a finite time", "nan"));
}

TEST_CASE("PrefixCache: blocks it does not hold and negative counts are refused") {
  kvlab::PagedKVCache<float> pool(1, 1, 2, 4, 8);
  const int seq = pool.add_sequence();
  (void)pool.reserve(seq, 8);
  const std::vector<std::int32_t> blocks = pool.blocks(seq);  // [2]
  kvlab::PrefixCache cache(4);
  const int first[4] = {1, 2, 3, 4}, other[4] = {5, 6, 7, 8};
  (void)cache.insert(pool, kvlab::PrefixCache::kRoot, first, blocks[0]);
  const auto state = [&] {
    std::vector<long> s = state_of(static_cast<const kvlab::PagedKVCacheBase&>(pool));
    s.push_back(cache.cached_blocks());
    s.push_back(cache.evictable_blocks());
    return s;
  };
  const char* insert =
      "kvlab::PrefixCache::insert(Pool &pool, std::int64_t parent, const int *tokens, std::int32_t "
      "block)";
  refuses<InvalidArgument>(
      insert, input::kRange, state,
      [&] { (void)cache.insert(pool, kvlab::PrefixCache::kRoot, other, 99); },
      names("block", "in [0, 8)", "99"));
  refuses<InvalidArgument>(
      insert, input::kState, state,
      [&] { (void)cache.insert(pool, kvlab::PrefixCache::kRoot, other, blocks[0]); },
      names("block", "a block not cached yet", std::to_string(blocks[0])));
  refuses<InvalidArgument>(
      "kvlab::PrefixCache::evict(Pool &pool, int n)", input::kSize, state,
      [&] { (void)cache.evict(pool, -1); }, names("n", ">= 0", "-1"));
  refuses<InvalidArgument>(
      "kvlab::PrefixCache::take(const std::vector< std::int32_t > &blocks)", input::kState, state,
      [&] {
        cache.take({blocks[0], blocks[1]});
      },
      names("blocks[1]", "a cached block", std::to_string(blocks[1])));
}

TEST_CASE("The block counts of the scheduler and of its block budget refuse bad token counts") {
  // The scheduler's block count.
  auto pool = std::make_shared<kvlab::PagedKVCache<float>>(1, 1, 2, 4, 8);
  kvlab::Scheduler scheduler(pool, kvlab::SchedulerConfig{}, 32, 10);
  const char* blocks_for = "kvlab::Scheduler::blocks_for(long tokens) const";
  refuses<InvalidArgument>(
      blocks_for, input::kSize, no_state, [&] { (void)scheduler.blocks_for(-1); },
      names("tokens", ">= 0", "-1"));
  refuses<InvalidArgument>(
      blocks_for, input::kOverflow, no_state, [&] { (void)scheduler.blocks_for(LONG_MAX); },
      names("tokens", "at most " + std::to_string(4L * INT_MAX) + " (INT_MAX blocks of 4)",
            std::to_string(LONG_MAX)));
  // The budget under every policy's scheduler: its errors name it unless a caller is given.
  const kvlab::PrefixCache cache(4);
  const kvlab::BlockBudget budget(*pool, cache);
  refuses<InvalidArgument>(
      "kvlab::BlockBudget::blocks_for(long tokens, const char *caller=\"kvlab::BlockBudget::"
      "blocks_for\") const",
      input::kSize, no_state, [&] { (void)budget.blocks_for(-2); }, names("tokens", ">= 0", "-2"));
  CHECK_THROWS_WITH(budget.blocks_for(-2), Catch::StartsWith("kvlab::BlockBudget::blocks_for: "));
  CHECK_THROWS_WITH(scheduler.blocks_for(-2), Catch::StartsWith("kvlab::Scheduler::blocks_for: "));
}

TEST_CASE(
    "Refusals that no case had reached: sampling, context and an open step, workload ranges") {
  // Found by scripts/coverage.sh: each check below was written, and no test had ever taken it.
  auto pool = std::make_shared<kvlab::PagedKVCache<float>>(1, 1, 2, 4, 8);
  kvlab::SchedulerConfig contiguous;
  contiguous.policy = kvlab::BatchingPolicy::Contiguous;
  contiguous.max_len = 8;
  kvlab::ContiguousScheduler scheduler(pool, contiguous, 32, 10);
  scheduler.submit(request_of({1, 2}, 2));
  const auto state = [&] { return state_of(scheduler); };
  const char* submit = "kvlab::Scheduler::submit(const Request &r)";
  refuses<InvalidArgument>(
      submit, input::kValue, state,
      [&] {
        kvlab::Request r = request_of({1});
        r.sampling.top_p = 0.0f;
        scheduler.submit(r);
      },
      names("request.sampling.top_p", "in (0, 1]", "0"));
  refuses<InvalidArgument>(
      submit, input::kOverflow, state,
      [&] {
        scheduler.submit(request_of({1, 2, 3}, 10));
      },
      names("request.prompt.size() + request.max_new_tokens - 1", "at most max_len (8)", "12"));
  (void)scheduler.schedule(0.0);
  refuses<InvalidArgument>(
      "kvlab::Scheduler::schedule(double now)", input::kState, state,
      [&] { (void)scheduler.schedule(1.0); },
      names("step", "none open (complete_step first)", "a step open"));

  const char* workload = "kvlab::make_workload(const WorkloadSpec &spec, int vocab_size)";
  kvlab::WorkloadSpec spec;
  spec.output_min = 9;
  spec.output_max = 8;
  refuses<InvalidArgument>(
      workload, input::kRange, no_state, [&] { (void)kvlab::make_workload(spec, 256); },
      names("spec.output_max", ">= spec.output_min (9)", "8"));
  spec = kvlab::WorkloadSpec{};
  spec.rate = std::nan("");
  refuses<InvalidArgument>(
      workload, input::kValue, no_state, [&] { (void)kvlab::make_workload(spec, 256); },
      names("spec.rate", "a finite rate >= 0", "nan"));
}
