// PrefixCache (include/kvlab/serving/prefix_cache.hpp): blocks are named by their whole prefix;
// a match is the longest cached chain, capped so the prompt's last token is computed; only full
// blocks are shared (a common prefix shorter than a block gets no hit); ended sequences' blocks
// join the LRU queue deepest first and are evicted only when no block is free; a hash that
// collides for every block still never shares the K/V of another prefix; switched off, nothing
// is shared. Through the engine, every request's tokens equal its tokens alone (the logits are
// compared in test_engine.cpp).
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <vector>

#include "kvlab/kvlab.hpp"
#include "model_writers.hpp"

using kvlab::Engine;
using kvlab::EngineConfig;
using kvlab::PagedKVCache;
using kvlab::PrefixCache;
using kvlab::Request;

namespace {

// A one-layer pool with sequence `seq` holding `tokens`' K/V (values: the token ids), and the
// cache holding its full blocks as one chain. Returns the blocks.
std::vector<std::int32_t> cache_sequence(PagedKVCache<float>& pool, PrefixCache& cache,
                                         const std::vector<int>& tokens, int& seq) {
  seq = pool.add_sequence();
  kvlab::RowMatrix<float> kv(static_cast<Eigen::Index>(tokens.size()), 2);  // [tokens, 1 * 2]
  for (std::size_t i = 0; i < tokens.size(); ++i)
    kv.row(static_cast<Eigen::Index>(i)).setConstant(float(tokens[i]));
  pool.append(seq, kv, kv);
  std::int64_t parent = PrefixCache::kRoot;
  const int bs = pool.block_size();
  for (std::size_t k = 0; (k + 1) * static_cast<std::size_t>(bs) <= tokens.size(); ++k)
    parent = cache.insert(pool, parent, tokens.data() + k * static_cast<std::size_t>(bs),
                          pool.blocks(seq)[k]);
  return pool.blocks(seq);
}

Engine& run(Engine& engine, const std::vector<Request>& requests) {
  for (const Request& r : requests) engine.submit(r);
  engine.run();
  return engine;
}

EngineConfig config(int block_size, int num_blocks) {
  EngineConfig c;
  c.block_size = block_size;
  c.num_blocks = num_blocks;
  c.clock = kvlab::EngineClock::Steps;
  c.check_invariants = true;
  return c;
}

// Each request's tokens when it runs alone.
std::vector<int> alone(const Request& r) {
  kvlab::LlamaModel model(kvlab_test::builtin_weights(), kvlab::LlamaBackend::Cached);
  kvlab::Sampler sampler(256, 0.0f, 1.0f, 0);
  return kvlab::generate(model, sampler, r.prompt, r.max_new_tokens).tokens;
}

Request request(std::vector<int> prompt, double arrival, int max_new = 6) {
  Request r;
  r.prompt = std::move(prompt);
  r.arrival = arrival;
  r.max_new_tokens = max_new;
  return r;
}

std::vector<int> iota(int n, int from) {
  std::vector<int> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = (from + 7 * i) % 256;
  return v;
}

}  // namespace

TEST_CASE("a block is named by its whole prefix, and a match is the longest cached chain") {
  const int a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 5};
  const std::uint64_t root = PrefixCache::kRootHash;
  CHECK(PrefixCache::chain_hash(root, a, 4) != PrefixCache::chain_hash(root, b, 4));
  CHECK(PrefixCache::chain_hash(1, a, 4) != PrefixCache::chain_hash(2, a, 4));  // parent counts
  PagedKVCache<float> pool(1, 1, 2, 4, 16);
  PrefixCache cache(4);
  const std::vector<int> tokens = iota(14, 3);  // 3 full blocks and 2 tokens
  int seq = -1;
  const std::vector<std::int32_t> blocks = cache_sequence(pool, cache, tokens, seq);
  CHECK(cache.cached_blocks() == 3);
  std::vector<int> probe = tokens;
  CHECK(cache.match(probe).blocks == std::vector<std::int32_t>(blocks.begin(), blocks.begin() + 3));
  probe[9] = 255;  // block 2 differs: the chain stops before it
  CHECK(cache.match(probe).blocks == std::vector<std::int32_t>(blocks.begin(), blocks.begin() + 2));
  probe = tokens;
  probe[0] = 255;  // block 0 differs: blocks 1 and 2 (same ids, another prefix) must not match
  CHECK(cache.match(probe).blocks.empty());
  cache.check(pool);
}

TEST_CASE("the last prompt token is always computed: a match covers at most length - 1 tokens") {
  PagedKVCache<float> pool(1, 1, 2, 4, 16);
  PrefixCache cache(4);
  const std::vector<int> tokens = iota(12, 5);  // 3 full blocks
  int seq = -1;
  cache_sequence(pool, cache, tokens, seq);
  CHECK(cache.match(tokens).blocks.size() == 2);  // 12 tokens: at most 11 cached, so 2 blocks
  std::vector<int> longer = tokens;
  longer.push_back(9);
  CHECK(cache.match(longer).blocks.size() == 3);                            // 13 tokens: 3 blocks
  CHECK(cache.match({tokens.begin(), tokens.begin() + 4}).blocks.empty());  // 4 tokens: none
  CHECK(cache.match({tokens.begin(), tokens.begin() + 5}).blocks.size() == 1);
}

TEST_CASE("only full blocks are shared: a common prefix shorter than one block gets no hit") {
  const int bs = 16;
  // Two requests share 15 tokens (one short of a block), two others share 19 (a block and 3).
  const std::vector<int> short_shared = iota(15, 1), long_shared = iota(19, 2);
  std::vector<Request> requests;
  for (int i = 0; i < 2; ++i) {
    std::vector<int> p = short_shared;
    p.push_back(100 + i);
    p.push_back(50);
    requests.push_back(request(p, 10.0 * i));
  }
  for (int i = 0; i < 2; ++i) {
    std::vector<int> p = long_shared;
    p.push_back(200 + i);
    requests.push_back(request(p, 20.0 + 10.0 * i));
  }
  Engine engine(kvlab_test::builtin_weights(), config(bs, 64));
  run(engine, requests);
  CHECK(engine.output(0).prefix_hit_tokens == 0);
  CHECK(engine.output(1).prefix_hit_tokens == 0);  // 15 shared tokens: no full block
  CHECK(engine.output(2).prefix_hit_tokens == 0);
  CHECK(engine.output(3).prefix_hit_tokens == bs);  // 19 shared tokens: one block
  for (int id = 0; id < 4; ++id)
    CHECK(engine.output(id).tokens == alone(requests[static_cast<std::size_t>(id)]));
}

TEST_CASE("ended sequences' blocks are evicted deepest first, and only when no block is free") {
  PagedKVCache<float> pool(1, 1, 2, 4, 6);
  PrefixCache cache(4);
  int seq = -1;
  const std::vector<std::int32_t> blocks = cache_sequence(pool, cache, iota(13, 1), seq);
  CHECK(cache.evictable_blocks() == 0);  // the sequence holds them
  pool.free_sequence(seq);
  cache.released(pool, blocks);
  // Blocks 0..2 cached (the partial block 3 is not): the LRU queue holds the deepest first.
  CHECK(cache.eviction_order() == std::vector<std::int32_t>{blocks[2], blocks[1], blocks[0]});
  CHECK(pool.allocator().num_free() == 3);  // 6 - 3 cached
  cache.check(pool);
  // A hit takes its blocks out of the queue.
  const PrefixCache::Match hit = cache.match(iota(9, 1));
  REQUIRE(hit.blocks.size() == 2);
  cache.take(hit.blocks);
  const int holder = pool.add_sequence(hit.blocks);
  CHECK(cache.eviction_order() == std::vector<std::int32_t>{blocks[2]});
  pool.free_sequence(holder);
  cache.released(pool, hit.blocks);
  CHECK(cache.eviction_order() == std::vector<std::int32_t>{blocks[2], blocks[1], blocks[0]});
  CHECK(cache.evict(pool, 1) == 1);  // the deepest goes first: the chain shortens from its end
  CHECK(cache.match(iota(13, 1)).blocks == std::vector<std::int32_t>{blocks[0], blocks[1]});
  CHECK(pool.allocator().num_free() == 4);
  cache.check(pool);

  // Through the engine: a pool of 9 blocks of 4; A (20 tokens) ends and leaves 5 blocks cached;
  // B (8 tokens, 2 blocks, unrelated) takes free blocks and evicts nothing; C (24 tokens) must
  // evict.
  Engine engine(kvlab_test::builtin_weights(), config(4, 9));
  run(engine,
      {request(iota(17, 3), 0, 4), request(iota(7, 90), 10, 2), request(iota(23, 50), 20, 2)});
  const std::vector<kvlab::StepRecord>& log = engine.step_log();
  int evicted_by_b = 0, evicted_by_c = 0, cached_after_a = 0;
  for (const kvlab::StepRecord& s : log) {
    for (const kvlab::StepEntry& e : s.batch) {
      if (e.request == 1) evicted_by_b += s.evicted_blocks;
      if (e.request == 2) evicted_by_c += s.evicted_blocks;
    }
    for (int id : s.finished)
      if (id == 0) cached_after_a = s.blocks_cached;
  }
  CHECK(cached_after_a == 5);  // 20 tokens: 5 full blocks
  CHECK(evicted_by_b == 0);
  CHECK(evicted_by_c > 0);
}

TEST_CASE("a hash that collides for every block never shares another prefix's K/V") {
  // Prompts that share 0, 1 or 2 blocks of 8 with earlier ones; with every hash equal to 0 the
  // cache must still return exactly the true common prefix.
  std::vector<Request> requests;
  const std::vector<int> base = iota(30, 11);
  for (int i = 0; i < 6; ++i) {
    std::vector<int> p = base;
    p[static_cast<std::size_t>(8 * (i % 3) + 2)] = 200 + i;  // differs in block i % 3
    requests.push_back(request(p, 5.0 * i, 5));
  }
  const auto hit_tokens = [&](PrefixCache::HashFunction hash) {
    EngineConfig c = config(8, 64);
    c.hash = hash;
    Engine engine(kvlab_test::builtin_weights(), c);
    run(engine, requests);
    std::vector<int> hits;
    for (int id = 0; id < 6; ++id) {
      CHECK(engine.output(id).tokens == alone(requests[static_cast<std::size_t>(id)]));
      hits.push_back(engine.output(id).prefix_hit_tokens);
    }
    return hits;
  };
  const std::vector<int> real = hit_tokens(PrefixCache::chain_hash);
  const std::vector<int> colliding =
      hit_tokens([](std::uint64_t, const int*, int) { return std::uint64_t{0}; });
  // Request i differs from the base prompt in block i % 3, with its own value: it shares the base's
  // blocks before that one, when an earlier request cached them (request 1 caches block 0, request
  // 2 block 1).
  CHECK(real == std::vector<int>{0, 0, 8, 0, 8, 16});
  CHECK(colliding == real);
}

TEST_CASE("prefix caching switched off shares nothing and gives the same tokens") {
  std::vector<Request> requests;
  for (int i = 0; i < 4; ++i) {
    std::vector<int> p = iota(24, 1);
    p.push_back(i);
    requests.push_back(request(p, 4.0 * i));
  }
  EngineConfig c = config(4, 64);
  c.scheduler.prefix_caching = false;
  Engine engine(kvlab_test::builtin_weights(), c);
  run(engine, requests);
  for (int id = 0; id < 4; ++id) {
    CHECK(engine.output(id).prefix_hit_tokens == 0);
    CHECK(engine.output(id).tokens == alone(requests[static_cast<std::size_t>(id)]));
  }
  CHECK(engine.scheduler().prefix_cache().cached_blocks() == 0);
}

TEST_CASE("the cache's check finds a block whose holders it miscounts") {
  PagedKVCache<float> pool(1, 1, 2, 4, 8);
  PrefixCache cache(4);
  int seq = -1;
  const std::vector<std::int32_t> blocks = cache_sequence(pool, cache, iota(8, 1), seq);
  pool.free_sequence(seq);  // the cache is now the blocks' only holder, but not told (released)
  CHECK_THROWS_AS(cache.check(pool), kvlab::InvariantViolation);
  cache.released(pool, blocks);
  CHECK_NOTHROW(cache.check(pool));
}
