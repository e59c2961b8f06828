// CachePolicy: the text of a policy reads back to the same policy; make_policy_store builds the
// store it names, whose KV bytes equal their closed form as a sequence grows (the full cache,
// a ring of W − 1 + step slots, the paged store's blocks from the next token's first key on),
// both held (reserved, whole blocks) and filled;
// and a model over a policy's ring computes what it computes over make_llama_store's ring;
// a policy per head is a SelectiveStore, whose bytes follow HeadPolicy's closed form, and which
// with every head kept in full at fp32 computes what the full cache computes.
//
// Tolerance: the two rings hold the same rows in different slots, so the kernels read them in
// spans cut at other places and sum in another order: logits within 1e-5 of each other
// (test_support.hpp, `tolerance<float>`), relative to the row's largest.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "kvlab/kvlab.hpp"
#include "kvlab/model/cache_policy.hpp"
#include "test_support.hpp"

using kvlab::CachePolicy;
using kvlab::KVDtype;
using kvlab::LlamaBackend;

namespace {
// Grows `model`'s sequence `seq` by steps of `step` made-up tokens up to 60, and calls
// `after(length)` after each step.
template <typename After>
void grow(kvlab::LlamaModel& model, int seq, int step, const After& after) {
  for (int length = step; length <= 60; length += step) {
    std::vector<int> tokens(static_cast<std::size_t>(step));
    for (int i = 0; i < step; ++i) tokens[static_cast<std::size_t>(i)] = (length * 7 + i) % 256;
    (void)model.forward_batch({kvlab::SequenceChunk{seq, tokens}});
    after(length);
  }
}
}  // namespace

TEST_CASE("a policy's text reads back to the same policy, defaults left out") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"cached", "cached"},
      {"paged", "paged"},
      {"kv=int8", "cached,kv=int8"},
      {"cached,kv=fp32,window=0", "cached"},
      {"paged,window=512,kv=int4", "paged,kv=int4,window=512"},
      {"paged,block=32", "paged,block=32"},
      {"paged,block=16", "paged"},
      {"cached,kv=bf16,window=1", "cached,kv=bf16,window=1"},
      {"k=fp16,v=int8,window=4", "cached,k=fp16,v=int8,window=4"},
      {"k=int4,v=int4", "cached,kv=int4"},
      {"v=bf16", "cached,k=fp32,v=bf16"},
      {"cached,window=256,h2o=64,sinks=4", "cached,window=256,sinks=4,h2o=64"},
      {"window=9,full_heads=3.1+0.2,full_layers=5+2",
       "cached,window=9,full_layers=2+5,full_heads=0.2+3.1"},
  };
  for (const auto& [spec, name] : cases) {
    CAPTURE(spec);
    const CachePolicy p = kvlab::parse_cache_policy(spec);
    CHECK(p.name() == name);
    CHECK(kvlab::parse_cache_policy(p.name()) == p);
  }
  const CachePolicy p = kvlab::parse_cache_policy("paged,kv=fp16,window=7,block=3");
  CHECK(p.backend == LlamaBackend::Paged);
  CHECK(p.key_dtype == KVDtype::fp16);
  CHECK(p.value_dtype == KVDtype::fp16);
  CHECK(p.window == 7);
  CHECK(p.block_size == 3);
  const CachePolicy s = kvlab::parse_cache_policy("k=int8,window=64,sinks=4,h2o=32,full_heads=1.0");
  CHECK(s.key_dtype == KVDtype::int8);
  CHECK(s.value_dtype == KVDtype::fp32);
  CHECK((s.sinks == 4 && s.heavy == 32));
  CHECK(s.head(1, 0) == kvlab::HeadPolicy{KVDtype::int8, KVDtype::fp32});  // kept in full
  CHECK(s.head(1, 1) == kvlab::HeadPolicy{KVDtype::int8, KVDtype::fp32, 64, 4, 32});
}

TEST_CASE("a policy per head: a SelectiveStore, its bytes equal to their closed form") {
  const kvlab::LlamaConfig config = kvlab::LlamaConfig::tiny();  // 3 layers, 2 K/V heads of 8
  auto weights = std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin());
  const int max_tokens = 64, step = 5;
  // one head's row of 8 values: fp32 32 bytes, fp16 16
  struct Case {
    std::string spec;
    std::size_t (*bytes)(std::size_t length);  // held once the sequence has `length` tokens
  };
  const std::vector<Case> cases = {
      // every token, K fp16 and V fp32, 6 heads
      {"cached,k=fp16,v=fp32", [](std::size_t n) { return n * 6 * (16 + 32); }},
      // K fp16 and V fp32, 2 sinks and the next query's 7 keys: 9 rows per head at most
      {"cached,k=fp16,v=fp32,window=8,sinks=2",
       [](std::size_t n) { return std::min<std::size_t>(n, 9) * 6 * (16 + 32); }},
      // and 5 heavy hitters: 14
      {"cached,window=8,sinks=2,h2o=5",
       [](std::size_t n) { return std::min<std::size_t>(n, 14) * 6 * 64; }},
      // layer 1 in full, the 4 other heads their window's 7
      {"cached,window=8,full_layers=1",
       [](std::size_t n) { return (2 * n + 4 * std::min<std::size_t>(n, 7)) * 64; }},
      // heads 0.1 and 2.0 in full
      {"cached,kv=fp16,window=8,full_heads=0.1+2.0",
       [](std::size_t n) { return (2 * n + 4 * std::min<std::size_t>(n, 7)) * 32; }},
  };
  for (const Case& c : cases) {
    CAPTURE(c.spec);
    auto store =
        kvlab::make_policy_store(kvlab::parse_cache_policy(c.spec), config, max_tokens, step);
    CHECK(std::string(store->name()) == "selective");
    kvlab::LlamaModel model(weights, store, max_tokens);
    const int seq = store->add_sequence();
    grow(model, seq, step, [&](int length) {
      CAPTURE(length);
      CHECK(store->bytes_used() == c.bytes(static_cast<std::size_t>(length)));
      CHECK(store->bytes_reserved() == store->bytes_used());
    });
  }
}

TEST_CASE(
    "a window with sinks is a ContiguousStore or PagedStore, computing what SelectiveStore "
    "computes") {
  // The same policy on every head: the tuned stores (a ring whose first S slots keep the sinks;
  // a pool keeping the sinks' blocks) against SelectiveStore's reference path, on the builtin
  // model, 56 tokens in steps of 4 past a window of 8 with 2 sinks.
  auto weights = std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin());
  const kvlab::LlamaConfig& config = weights->config;
  const int max_tokens = 60, step = 4;
  for (const char* spec :
       {"cached,kv=fp16,window=8,sinks=2", "paged,kv=fp16,window=8,sinks=2,block=3"}) {
    CAPTURE(spec);
    auto store =
        kvlab::make_policy_store(kvlab::parse_cache_policy(spec), config, max_tokens, step);
    const bool paged = std::string(spec).rfind("paged", 0) == 0;
    CHECK(std::string(store->name()) == (paged ? "paged" : "contiguous"));
    CHECK(store->window() == 8);
    CHECK(store->sinks() == 2);
    // the reference: every head's policy given one by one (a SelectiveStore)
    std::vector<kvlab::HeadPolicy> heads(
        static_cast<std::size_t>(config.n_layers * config.n_kv_heads),
        kvlab::HeadPolicy{KVDtype::fp16, KVDtype::fp16, 8, 2, 0});
    auto reference = std::make_shared<kvlab::SelectiveStore<float>>(
        config.n_layers, config.n_kv_heads, config.head_dim(), heads);
    kvlab::LlamaModel ours(weights, store, max_tokens);
    kvlab::LlamaModel oracle(weights, reference, max_tokens);
    const int seq = store->add_sequence(), ref = reference->add_sequence();
    for (int at = 0; at < 56; at += step) {
      const std::vector<int> tokens = {(at * 7) % 256, (at * 7 + 1) % 256, (at * 7 + 2) % 256,
                                       (at * 7 + 3) % 256};
      const kvlab::RowMatrix<float> a =
          ours.forward_batch({kvlab::SequenceChunk{seq, tokens}}, true);
      const kvlab::RowMatrix<float> b =
          oracle.forward_batch({kvlab::SequenceChunk{ref, tokens}}, true);
      CAPTURE(at);
      REQUIRE(kvlab_test::max_row_relative_error(a, b) <= kvlab_test::tolerance<float>());
    }
    // the ring: the sinks, the window's 7 keys before a step and the step's 4 tokens
    if (!paged) CHECK(store->bytes_reserved() == (2 + 7 + 4) * store->bytes_per_token());
  }
}

TEST_CASE("a policy whose every head keeps every token at fp32 computes what the full cache does") {
  // A window on every head but every layer kept in full: a SelectiveStore of full fp32 heads.
  auto weights = std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin());
  const int max_tokens = 60, step = 4;
  auto store = kvlab::make_policy_store(
      kvlab::parse_cache_policy("cached,window=8,sinks=2,full_layers=0+1+2"), weights->config,
      max_tokens, step);
  REQUIRE(std::string(store->name()) == "selective");
  kvlab::LlamaModel ours(weights, store, max_tokens);
  kvlab::LlamaModel full(weights, LlamaBackend::Cached, 16, max_tokens);
  const int seq = store->add_sequence();
  for (int at = 0; at < 56; at += step) {
    const std::vector<int> tokens = {(at * 5) % 256, (at * 5 + 1) % 256, (at * 5 + 2) % 256,
                                     (at * 5 + 3) % 256};
    const kvlab::RowMatrix<float> a = ours.forward_batch({kvlab::SequenceChunk{seq, tokens}}, true);
    const kvlab::RowMatrix<float> b = full.forward(tokens);
    CAPTURE(at);
    REQUIRE(kvlab_test::max_row_relative_error(a, b) <= kvlab_test::tolerance<float>());
  }
}

TEST_CASE("a policy's store: its type, and KV bytes equal to their closed form as it grows") {
  const kvlab::LlamaConfig config = kvlab::LlamaConfig::tiny();  // 3 layers, 2 K/V heads of 8
  auto weights = std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin());
  const int max_tokens = 64, step = 5;
  // one token, every layer: K and V of 2 heads of 8 values, as stored
  const auto row = [&](std::size_t value_bytes) { return 2 * 3 * 2 * 8 * value_bytes; };
  struct Case {
    std::string spec;
    std::size_t row_bytes;
    const char* store;
    // Tokens' rows the store holds (reserved, whole blocks) and fills, once the sequence has
    // `length` tokens (every step of `step` tokens done).
    int (*held)(int length);
    int (*used)(int length);
  };
  const std::vector<Case> cases = {
      // the full cache reserves max_tokens rows up front
      {"cached", row(4), "contiguous", [](int) { return 64; }, [](int n) { return n; }},
      {"cached,kv=fp16", row(2), "contiguous", [](int) { return 64; }, [](int n) { return n; }},
      // a ring of W - 1 + step = 12 slots
      {"cached,window=8", row(4), "contiguous", [](int) { return 12; },
       [](int n) { return std::min(n, 12); }},
      // whole blocks of 4, as the sequence grows
      {"paged,block=4", row(4), "paged", [](int n) { return (n + 3) / 4 * 4; },
       [](int n) { return n; }},
      // blocks of 4 from the one holding the next token's first key, n - 8 + 1
      {"paged,window=8,block=4", row(4), "paged",
       [](int n) { return (n + 3) / 4 * 4 - std::max(0, n - 7) / 4 * 4; },
       [](int n) { return n - std::max(0, n - 7) / 4 * 4; }},
  };
  for (const Case& c : cases) {
    CAPTURE(c.spec);
    auto store =
        kvlab::make_policy_store(kvlab::parse_cache_policy(c.spec), config, max_tokens, step);
    CHECK(std::string(store->name()) == c.store);
    CHECK(store->bytes_per_token() == c.row_bytes);
    kvlab::LlamaModel model(weights, store, max_tokens);
    const int seq = store->add_sequence();
    grow(model, seq, step, [&](int length) {
      CAPTURE(length);
      CHECK(store->bytes_reserved() == static_cast<std::size_t>(c.held(length)) * c.row_bytes);
      CHECK(store->bytes_used() == static_cast<std::size_t>(c.used(length)) * c.row_bytes);
    });
  }
}

TEST_CASE("a policy's ring of W - 1 + step slots computes what make_llama_store's ring does") {
  auto weights = std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin());
  const kvlab::LlamaConfig& config = weights->config;
  const int window = 8, step = 3, max_tokens = 90;
  auto policy_store = kvlab::make_policy_store(kvlab::parse_cache_policy("cached,window=8"), config,
                                               max_tokens, step);
  kvlab::LlamaModel ours(weights, policy_store, max_tokens);
  kvlab::LlamaModel theirs(weights, LlamaBackend::Cached, 16, max_tokens, KVDtype::fp32, window);
  const int seq = policy_store->add_sequence();
  for (int at = 0; at < 84; at += step) {
    const std::vector<int> tokens = {(at * 5) % 256, (at * 5 + 1) % 256, (at * 5 + 2) % 256};
    const kvlab::RowMatrix<float> a = ours.forward_batch({kvlab::SequenceChunk{seq, tokens}}, true);
    const kvlab::RowMatrix<float> b = theirs.forward(tokens);
    CAPTURE(at);
    REQUIRE(kvlab_test::max_row_relative_error(a, b) <= kvlab_test::tolerance<float>());
  }
}

TEST_CASE("a window as long as the sequences is the full cache, and near that, steps are shorter") {
  const kvlab::LlamaConfig config = kvlab::LlamaConfig::tiny();
  // W >= max_tokens leaves no key out: the full cache, no window
  for (int window : {40, 41, 1000}) {
    CAPTURE(window);
    kvlab::CachePolicy policy = kvlab::parse_cache_policy("cached");
    policy.window = window;
    const auto store = kvlab::make_policy_store(policy, config, 40, 16);
    CHECK(store->window() == 0);
    policy.backend = LlamaBackend::Paged;
    CHECK(kvlab::make_policy_store(policy, config, 40, 16)->window() == 0);
  }
  // W = 30 of 40 tokens: the ring is cut to 40 slots, so a step takes 40 - 30 + 1 = 11 at most
  const auto store =
      kvlab::make_policy_store(kvlab::parse_cache_policy("cached,window=30"), config, 40, 16);
  CHECK(store->window() == 30);
  CHECK(store->max_step_tokens() == 11);
}
