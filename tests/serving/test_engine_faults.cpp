// A failure inside a step changes nothing (include/kvlab/serving/engine.hpp `Engine::step`,
// `Scheduler::abort_step`, `OpenStep` in include/kvlab/store/kv_store.hpp). Faults are thrown at
// kvlab's fault points (include/kvlab/core/fault_points.hpp; this program defines
// KVLAB_FAULT_INJECTION, so it compiles kvlab's templates itself rather than using the shared
// instances): inside a layer after its K and V were kept ("attention_step"), inside a draw
// ("Sampler::sample") and in the block allocator ("BlockAllocator::allocate"), at chosen steps of
// running engines — with preemption, prefix-cache eviction, sampling, each batching policy, and
// fp16 K/V. After the failed step the engine's whole state is compared with a fault-free run's
// before the same step: every request's record and the queues, the pool's block tables,
// reference counts and free blocks, the prefix cache (its blocks and their eviction order), and
// the stored K/V of every token a sequence or the cache holds, bit for bit. Then the engine goes
// on: at every later step its state equals the fault-free run's, and every request ends with the
// same tokens. Exact equality, no tolerance: the retried step computes the same values from the
// same state. The model alone (`LlamaModel`, and the toy stack's `run_stack`) is checked the same
// way: a failure inside a layer leaves its sequence as it was, and the next step gives the same
// logits.
#define KVLAB_FAULT_INJECTION
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvlab/kvlab.hpp"
#include "model_writers.hpp"
#include "serving_helpers.hpp"

using kvlab::BatchingPolicy;
using kvlab::Engine;
using kvlab::EngineConfig;
using kvlab::Request;

namespace {

// The fault a test throws.
struct InjectedFault : std::runtime_error {
  InjectedFault() : std::runtime_error("injected fault") {}
};

// Counts the passes through every fault point, and throws at the `nth` pass (1 = the next)
// through `site` once armed. Installed as kvlab's fault hook while it lives.
class FaultPoints {
 public:
  FaultPoints() {
    kvlab::detail::fault_hook() = [this](const char* name) {
      const int pass = ++passes_[name];
      if (armed_ && site_ == name && pass == nth_) {
        armed_ = false;
        fired_ = true;
        throw InjectedFault();
      }
    };
  }
  ~FaultPoints() { kvlab::detail::fault_hook() = nullptr; }
  FaultPoints(const FaultPoints&) = delete;
  FaultPoints& operator=(const FaultPoints&) = delete;

  // Starts counting afresh.
  void reset() { passes_.clear(); }
  // Passes through `site` since the last reset.
  int passes(const std::string& site) const {
    const auto it = passes_.find(site);
    return it == passes_.end() ? 0 : it->second;
  }
  // Throws at the nth pass through `site` from now on.
  void arm(const std::string& site, int nth) {
    reset();
    site_ = site;
    nth_ = nth;
    armed_ = true;
    fired_ = false;
  }
  bool fired() const { return fired_; }

 private:
  std::map<std::string, int> passes_;
  std::string site_;
  int nth_ = 0;
  bool armed_ = false;
  bool fired_ = false;
};

// FNV-1a over bytes.
void mix(std::uint64_t& h, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
}

// The stored K and V of every slot that a sequence (below its length) or the prefix cache (a
// whole block) holds, hashed per layer: fp32 pools only.
std::string pool_values(const Engine& e) {
  const auto* pool = dynamic_cast<const kvlab::PagedKVCache<float, float>*>(&e.scheduler().pool());
  if (pool == nullptr) return "(values not read: not an fp32 pool)";
  const int bs = pool->block_size();
  const int num_blocks = pool->allocator().num_blocks();
  std::vector<std::int64_t> slots;  // [held slots]
  for (int b = 0; b < num_blocks; ++b)
    if (e.scheduler().prefix_cache().holds(b))
      for (int t = 0; t < bs; ++t) slots.push_back(static_cast<std::int64_t>(b) * bs + t);
  for (int seq : pool->sequences())
    for (int pos = 0; pos < pool->length(seq); ++pos) {
      const std::int32_t b = pool->blocks(seq)[static_cast<std::size_t>(pos / bs)];
      if (b != kvlab::kReleasedBlock) slots.push_back(static_cast<std::int64_t>(b) * bs + pos % bs);
    }
  std::vector<std::int32_t> in_use;  // [blocks in use]: one table over all, to read the pool
  for (int b = 0; b < num_blocks; ++b)
    if (pool->allocator().ref_count(b) > 0) in_use.push_back(b);
  if (in_use.empty()) return "(no block in use)";
  const kvlab::BlockTables all =
      kvlab::BlockTables::from_lists({in_use}, {static_cast<int>(in_use.size()) * bs},
                                     kvlab::BlockSize{bs}, kvlab::NumBlocks{num_blocks});
  std::ostringstream out;
  for (int l = 0; l < pool->num_layers(); ++l) {
    const kvlab::PagedKVView<float> view = pool->view(l, all);
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (std::int64_t slot : slots)
      for (int head = 0; head < view.num_kv_heads; ++head) {
        const std::ptrdiff_t at = view.slot_offset(slot, head);
        mix(h, view.k + at, sizeof(float) * static_cast<std::size_t>(view.head_dim));
        mix(h, view.v + at, sizeof(float) * static_cast<std::size_t>(view.head_dim));
      }
    out << " layer " << l << ": " << std::hex << h << std::dec;
  }
  return out.str();
}

template <typename Container>
std::string list(const Container& values) {
  std::ostringstream out;
  out << '[';
  for (const auto& v : values) out << v << ' ';
  out << ']';
  return out.str();
}

// Everything a failed step must leave as it was, written out.
std::string state_of(const Engine& e) {
  const kvlab::Scheduler& s = e.scheduler();
  const kvlab::PagedKVCacheBase& pool = s.pool();
  std::ostringstream out;
  out << "steps " << e.steps() << " time " << e.now() << "\nwaiting " << list(s.waiting())
      << " running " << list(s.running()) << " unfinished " << s.unfinished() << " promised "
      << s.promised_blocks() << " preemptions " << s.preemptions() << " spared "
      << s.spared_recomputes() << '\n';
  for (int id = 0; id < s.num_requests(); ++id) {
    const kvlab::RequestState& r = s.request(id);
    out << "request " << id << ": status " << static_cast<int>(r.status) << " computed "
        << r.computed << " seq " << r.seq << " promised " << r.promised << " recomputing "
        << r.recomputing << " queue " << r.queue_order << " chain " << list(r.chain) << " tokens "
        << list(r.tokens) << " drawn " << list(r.output.tokens) << " first "
        << r.output.first_scheduled << " preempted " << r.output.preemptions << " hits "
        << r.output.prefix_hit_tokens << " logits " << e.logits(id).size() << '\n';
    if (s.config().prefix_caching) {
      const kvlab::PrefixCache::Match m = s.prefix_cache().match(r.tokens);
      out << "  cache match " << list(m.blocks) << list(m.entries) << '\n';
    }
  }
  for (int seq : pool.sequences())
    out << "sequence " << seq << ": length " << pool.length(seq) << " blocks "
        << list(pool.blocks(seq)) << '\n';
  out << "free " << pool.allocator().num_free() << " counts";
  for (int b = 0; b < pool.allocator().num_blocks(); ++b)
    out << ' ' << pool.allocator().ref_count(b);
  out << "\ncache " << s.prefix_cache().cached_blocks() << " blocks, eviction order "
      << list(s.prefix_cache().eviction_order()) << "\nvalues" << pool_values(e) << '\n';
  return out.str();
}

// A fault-free run: the state before each call of `step`, the fault points passed in each call,
// and each request's tokens.
struct Reference {
  std::vector<std::string> before;                 // [calls]
  std::vector<std::map<std::string, int>> passes;  // [calls]: site -> passes
  std::vector<bool> preempted, evicted;            // [calls]: the step preempted, evicted
  std::vector<std::vector<int>> tokens;            // [requests]
  std::string end;                                 // the state after the last call
};

const char* const kSites[] = {"attention_step", "Sampler::sample", "BlockAllocator::allocate"};

std::unique_ptr<Engine> make_engine(const EngineConfig& c, const std::vector<Request>& requests) {
  auto e = std::make_unique<Engine>(kvlab_test::builtin_weights(), c);
  for (const Request& r : requests) e->submit(r);
  return e;
}

Reference reference_run(FaultPoints& faults, const EngineConfig& c,
                        const std::vector<Request>& requests) {
  Reference ref;
  const auto e = make_engine(c, requests);
  while (!e->done()) {
    ref.before.push_back(state_of(*e));
    faults.reset();
    const bool ran = e->step();
    std::map<std::string, int> passes;
    for (const char* site : kSites) passes[site] = faults.passes(site);
    ref.passes.push_back(passes);
    ref.preempted.push_back(ran && !e->last_step().preempted.empty());
    ref.evicted.push_back(ran && e->last_step().evicted_blocks > 0);
  }
  ref.end = state_of(*e);
  for (int id = 0; id < e->scheduler().num_requests(); ++id)
    ref.tokens.push_back(e->output(id).tokens);
  return ref;
}

// The calls at which to inject a fault at `site`: the first and last that pass it, a middle one,
// and the first that preempted and the first that evicted (where the site is passed).
std::vector<std::size_t> fault_calls(const Reference& ref, const std::string& site) {
  std::vector<std::size_t> passing;
  for (std::size_t k = 0; k < ref.passes.size(); ++k)
    if (ref.passes[k].at(site) > 0) passing.push_back(k);
  std::vector<std::size_t> calls;
  const auto add = [&calls](std::size_t k) {
    if (std::find(calls.begin(), calls.end(), k) == calls.end()) calls.push_back(k);
  };
  if (passing.empty()) return calls;
  add(passing.front());
  add(passing[passing.size() / 2]);
  add(passing.back());
  for (std::size_t k : passing)
    if (ref.preempted[k]) {
      add(k);
      break;
    }
  for (std::size_t k : passing)
    if (ref.evicted[k]) {
      add(k);
      break;
    }
  return calls;
}

// Replays `c` with a fault at each chosen call and pass of each site; checks the state after the
// failure and at every later call against the fault-free run. Returns the faults injected.
int check_faults(const EngineConfig& c, const std::vector<Request>& requests) {
  FaultPoints faults;
  const Reference ref = reference_run(faults, c, requests);
  int injected = 0;
  for (const char* site : kSites) {
    for (std::size_t k : fault_calls(ref, site)) {
      const int passes = ref.passes[k].at(site);
      for (int nth : {1, (passes + 1) / 2, passes}) {
        INFO("fault at " << site << ", call " << k << ", pass " << nth << " of " << passes);
        const auto e = make_engine(c, requests);
        for (std::size_t i = 0; i < k; ++i) e->step();
        REQUIRE(state_of(*e) == ref.before[k]);
        faults.arm(site, nth);
        REQUIRE_THROWS_AS(e->step(), InjectedFault);
        REQUIRE(faults.fired());
        ++injected;
        CHECK(state_of(*e) == ref.before[k]);  // as before the failed step
        e->scheduler().check_invariants();     // no block leaked
        faults.reset();
        for (std::size_t i = k; !e->done(); ++i) {  // then the same run as without the fault
          REQUIRE(i < ref.before.size());
          REQUIRE(state_of(*e) == ref.before[i]);
          e->step();
        }
        CHECK(state_of(*e) == ref.end);
        for (int id = 0; id < e->scheduler().num_requests(); ++id)
          CHECK(e->output(id).tokens == ref.tokens[static_cast<std::size_t>(id)]);
        if (nth == passes) break;  // 1 and passes may be the same
      }
    }
  }
  return injected;
}

// `n` requests of prompts 3..30 tokens (the first `shared` common to all), outputs 3..16, one
// arrival each step; every other one sampled at temperature 0.8 (seeded).
std::vector<Request> workload(int n, int shared, std::uint64_t seed) {
  std::vector<Request> requests = kvlab_test::arriving_workload(n, shared, 30, 3, 16, 1.0, seed);
  for (std::size_t i = 0; i < requests.size(); i += 2) requests[i].sampling.temperature = 0.8f;
  return requests;
}

EngineConfig config(int block_size, int num_blocks) {
  return kvlab_test::step_clock_config(block_size, num_blocks);
}

}  // namespace

TEST_CASE("an engine undoes a step that fails in a layer, a draw or the allocator, and goes on") {
  SECTION("continuous batching: preemption and prefix-cache eviction in a small pool") {
    const std::vector<Request> requests = workload(10, 8, 21);
    EngineConfig c = config(4, 20);  // 80 tokens: requests preempt each other
    c.scheduler.max_batched_tokens = 16;
    c.scheduler.prefix_caching = true;
    FaultPoints probe;
    const Reference ref = reference_run(probe, c, requests);
    int preempting = 0, evicting = 0;
    for (std::size_t k = 0; k < ref.preempted.size(); ++k) {
      preempting += ref.preempted[k] ? 1 : 0;
      evicting += ref.evicted[k] ? 1 : 0;
    }
    REQUIRE(preempting > 0);  // the paths this section names ran
    REQUIRE(evicting > 0);
    CHECK(check_faults(c, requests) >= 3 * 4);
  }
  SECTION("continuous batching with fp16 K/V") {
    EngineConfig c = config(8, 12);
    c.kv_dtype = kvlab::KVDtype::fp16;
    c.scheduler.max_batched_tokens = 24;
    CHECK(check_faults(c, workload(6, 0, 22)) >= 3 * 3);
  }
  SECTION("static batching") {
    EngineConfig c = config(4, 64);
    c.scheduler.policy = BatchingPolicy::Static;
    c.scheduler.max_running = 3;
    CHECK(check_faults(c, workload(6, 0, 23)) >= 3 * 3);
  }
  SECTION("contiguous reservation") {
    EngineConfig c = config(4, 64);
    c.scheduler.policy = BatchingPolicy::Contiguous;
    c.scheduler.max_len = 48;
    CHECK(check_faults(c, workload(6, 0, 24)) >= 3 * 3);
  }
}

TEST_CASE("a model's step that fails in a layer leaves its sequence as it was") {
  FaultPoints faults;
  const auto weights = kvlab_test::builtin_weights();
  const std::vector<int> prompt = {1, 5, 9, 13, 17, 21};
  for (kvlab::LlamaBackend backend :
       {kvlab::LlamaBackend::Naive, kvlab::LlamaBackend::Cached, kvlab::LlamaBackend::Paged}) {
    INFO("backend " << kvlab::to_string(backend));
    kvlab::LlamaModel clean(weights, backend, 4, 32);
    clean.prefill(prompt);
    const kvlab::RowVector<float> expected = clean.decode(7);
    kvlab::LlamaModel model(weights, backend, 4, 32);
    model.prefill(prompt);
    faults.arm("attention_step", weights->config.n_layers);  // the last layer
    REQUIRE_THROWS_AS(model.decode(7), InjectedFault);
    CHECK(model.position() == static_cast<int>(prompt.size()));
    faults.reset();
    const kvlab::RowVector<float> again = model.decode(7);
    CHECK(std::memcmp(again.data(), expected.data(),
                      sizeof(float) * static_cast<std::size_t>(again.size())) == 0);
  }
}

TEST_CASE("run_stack: a failure inside a layer leaves every sequence of the batch as it was") {
  FaultPoints faults;
  const auto stack_ptr =
      kvlab::AttentionStack<double>::random(3, kvlab::AttentionShape(4, 2, 8), 16, 31);
  const kvlab::AttentionStack<double>& stack = *stack_ptr;
  kvlab::PagedStore<double> store(3, 2, 8, 4, 16);
  const int a = store.add_sequence(), b = store.add_sequence();
  kvlab::Rng rng(5);
  const kvlab::RowMatrix<double> first = kvlab::random_matrix<double>(7, stack.d_model(), rng);
  kvlab::run_stack(stack, store, {a, b}, {0, 3, 7}, first);
  const kvlab::RowMatrix<double> x = kvlab::random_matrix<double>(3, stack.d_model(), rng);
  faults.arm("attention_step", 2);  // the second layer
  REQUIRE_THROWS_AS(kvlab::run_stack(stack, store, {a, b}, {0, 1, 3}, x), InjectedFault);
  CHECK(store.length(a) == 3);
  CHECK(store.length(b) == 4);
  faults.reset();
  const kvlab::RowMatrix<double> out = kvlab::run_stack(stack, store, {a, b}, {0, 1, 3}, x);
  CHECK(faults.passes("attention_step") == 3);  // the step ran through every layer this time
  CHECK(store.length(a) == 4);
  CHECK(store.length(b) == 6);
  CHECK(out.allFinite());
}
