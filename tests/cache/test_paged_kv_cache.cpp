// PagedKVCache: blocks on demand, tokens stored where the block tables say, forks share blocks
// and copy on write, truncation releases blocks, failures change nothing, and 10^5 random
// operations (add, append, fork, truncate, free) keep every invariant of a simple model. Every
// case runs on both pool layouts (NHD and HND), with two K/V heads so that the layouts differ.
#include <catch2/catch.hpp>

#include <vector>

#include "kvlab/cache/paged_kv_cache.hpp"
#include "stress/paged_cache_stress.hpp"
#include "test_support.hpp"

using kvlab::PagedKVCache;
using kvlab::RowMatrix;
using kvlab_test::names;

using kvlab_stress::append_tokens;  // token i's key and value in every head and layer
using kvlab_stress::read_tokens;    // key of head 0, element 0, the others checked against it

TEST_CASE("blocks are taken only on block boundaries") {
  const kvlab::KVLayout layout = GENERATE(kvlab::KVLayout::NHD, kvlab::KVLayout::HND);
  CAPTURE(kvlab::to_string(layout));
  PagedKVCache<double> cache(2, 2, 3, /*block_size=*/4, /*num_blocks=*/10, layout);
  CHECK(cache.layout() == layout);
  const int s = cache.add_sequence();
  CHECK(cache.blocks(s).empty());
  append_tokens(cache, s, {1});
  CHECK(cache.blocks(s).size() == 1);
  append_tokens(cache, s, {2, 3, 4});  // fills block 0 exactly
  CHECK(cache.blocks(s).size() == 1);
  append_tokens(cache, s, {5});  // one past the boundary
  CHECK(cache.blocks(s).size() == 2);
  append_tokens(cache, s, {6, 7, 8, 9, 10, 11, 12, 13});  // 3 + 4 + 1
  CHECK(cache.blocks(s).size() == 4);
  CHECK(cache.length(s) == 13);
  CHECK(cache.allocator().num_used() == 4);
  CHECK(read_tokens(cache, s) == std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13});
  CHECK(read_tokens(cache, s, 1) == read_tokens(cache, s, 0));
}

TEST_CASE("interleaved sequences share the pool without touching each other") {
  const kvlab::KVLayout layout = GENERATE(kvlab::KVLayout::NHD, kvlab::KVLayout::HND);
  CAPTURE(kvlab::to_string(layout));
  PagedKVCache<double> cache(1, 2, 2, 3, 20, layout);
  const int a = cache.add_sequence(), b = cache.add_sequence(), c = cache.add_sequence();
  append_tokens(cache, a, {1, 2});
  append_tokens(cache, b, {10});
  append_tokens(cache, a, {3, 4});
  append_tokens(cache, c, {100, 101, 102, 103});
  append_tokens(cache, b, {11, 12, 13});
  CHECK(read_tokens(cache, a) == std::vector<double>{1, 2, 3, 4});
  CHECK(read_tokens(cache, b) == std::vector<double>{10, 11, 12, 13});
  CHECK(read_tokens(cache, c) == std::vector<double>{100, 101, 102, 103});
  const kvlab::BlockTables batch = cache.tables({c, a, b});
  CHECK(batch.batch() == 3);
  CHECK(batch.seq_len(0) == 4);
  CHECK(batch.last_page_len() == std::vector<std::int32_t>{1, 1, 1});
}

TEST_CASE("fork shares blocks, and appending into a shared partial block copies it first") {
  const kvlab::KVLayout layout = GENERATE(kvlab::KVLayout::NHD, kvlab::KVLayout::HND);
  CAPTURE(kvlab::to_string(layout));
  PagedKVCache<double> cache(2, 2, 2, 4, 10, layout);
  const int parent = cache.add_sequence();
  append_tokens(cache, parent, {1, 2, 3, 4, 5, 6});  // blocks [x, y], y holds 2 tokens
  const std::vector<std::int32_t> before = cache.blocks(parent);
  const int child = cache.fork(parent);
  CHECK(cache.blocks(child) == before);
  for (std::int32_t blk : before) CHECK(cache.allocator().ref_count(blk) == 2);
  CHECK(cache.allocator().num_used() == 2);

  append_tokens(cache, child, {70});           // copy on write of y
  CHECK(cache.blocks(child)[0] == before[0]);  // the full block stays shared
  CHECK(cache.blocks(child)[1] != before[1]);  // the partial one is now private
  CHECK(cache.allocator().ref_count(before[0]) == 2);
  CHECK(cache.allocator().ref_count(before[1]) == 1);
  CHECK(read_tokens(cache, child) == std::vector<double>{1, 2, 3, 4, 5, 6, 70});
  CHECK(read_tokens(cache, child, 1) == std::vector<double>{1, 2, 3, 4, 5, 6, 70});
  CHECK(read_tokens(cache, parent) == std::vector<double>{1, 2, 3, 4, 5, 6});

  append_tokens(cache, parent, {7});  // y is the parent's alone now: no copy
  CHECK(cache.blocks(parent) == before);
  CHECK(read_tokens(cache, parent) == std::vector<double>{1, 2, 3, 4, 5, 6, 7});

  SECTION("a fork at a block boundary copies nothing") {
    append_tokens(cache, parent, {8});  // parent: 8 tokens, 2 full blocks
    const int twin = cache.fork(parent);
    const int used = cache.allocator().num_used();
    append_tokens(cache, twin, {9});
    CHECK(cache.allocator().num_used() == used + 1);
    CHECK(cache.allocator().ref_count(before[1]) == 2);
    CHECK(read_tokens(cache, parent) == std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8});
  }
  SECTION("freeing returns only the blocks nobody holds") {
    cache.free_sequence(parent);
    CHECK(cache.allocator().ref_count(before[0]) == 1);  // still the child's
    CHECK(cache.allocator().ref_count(before[1]) == 0);
    cache.free_sequence(child);
    CHECK(cache.allocator().num_free() == 10);
    CHECK_THROWS_MATCHES(cache.length(child), kvlab::InvalidArgument,
                         names("seq", "a live sequence id", std::to_string(child)));
  }
}

TEST_CASE("one call appends to a one-layer cache, and an unwritten slot cannot be read") {
  const kvlab::KVLayout layout = GENERATE(kvlab::KVLayout::NHD, kvlab::KVLayout::HND);
  kvlab::Rng rng(3);
  const RowMatrix<double> k = kvlab::random_matrix<double>(5, 4, rng), v = -k;
  PagedKVCache<double> one(1, 2, 2, 4, 4, layout);
  const int a = one.add_sequence();
  CHECK(one.append(a, k.topRows(3), v.topRows(3)) == std::vector<std::int64_t>{0, 1, 2});
  CHECK(one.append(a, k.row(3), v.row(3)) == std::vector<std::int64_t>{3});  // a row expression
  const kvlab::BlockTables tables = one.tables({a});
  const kvlab::PagedKVView<double> view = one.view(0, tables);
  for (int pos = 0; pos < 4; ++pos)
    for (int c = 0; c < 2; ++c) CHECK(view.key(0, pos, 1)[c] == k(pos, 2 + c));
  // With two layers, append would fill one of them: it refuses, and nothing changes.
  PagedKVCache<double> two(2, 2, 2, 4, 4, layout);
  const int b = two.add_sequence();
  CHECK_THROWS_MATCHES(
      two.append(b, k, v), kvlab::InvalidArgument,
      names("num_layers()", "1 (a cache of one layer; with more, reserve then write each layer)",
            "2"));
  CHECK(two.length(b) == 0);
  // reserve, then write layer 0 only: layer 1's view refuses the unwritten tokens.
  const std::vector<std::int64_t> slots = two.reserve(b, 5);
  two.write(0, slots, k, v);
  const kvlab::BlockTables t2 = two.tables({b});
  CHECK_NOTHROW(two.view(0, t2));
  CHECK_THROWS_MATCHES(two.view(1, t2), kvlab::InvalidArgument,
                       names("tables", "tokens written in layer 1",
                             "token 0 of sequence 0 of the tables reserved but never written "
                             "(write it first)"));
  two.write(1, slots, k, v);
  CHECK_NOTHROW(two.view(1, t2));
  // A copy on write carries what was written: a fork appends into the shared partial block.
  const int c = two.fork(b);
  const std::vector<std::int64_t> more = two.reserve(c, 1);
  two.write(0, more, k.row(0), v.row(0));
  two.write(1, more, k.row(0), v.row(0));
  const kvlab::BlockTables t3 = two.tables({b, c});
  CHECK_NOTHROW(two.view(1, t3));
}

TEST_CASE("a sequence with unwritten tokens is not forked, and a fork keeps the marks it shares") {
  kvlab::Rng rng(5);
  const RowMatrix<double> k = kvlab::random_matrix<double>(3, 4, rng), v = -k;
  PagedKVCache<double> cache(1, 2, 2, 4, 4);
  const int a = cache.add_sequence();
  cache.append(a, k.topRows(2), v.topRows(2));
  const std::vector<std::int64_t> slot = cache.reserve(a, 1);  // reserved, not written
  CHECK_THROWS_MATCHES(cache.fork(a), kvlab::InvalidArgument,
                       names("seq", "a sequence whose tokens are written in every layer",
                             "sequence 0, token 2 unwritten in layer 0"));
  CHECK(cache.sequences() == std::vector<int>{a});
  cache.write(0, slot, k.row(2), v.row(2));
  const int b = cache.fork(a);  // written now: the fork shares blocks as usual
  // Reserve in b (a copy of the shared last block), truncate a's copy-free tail: b's tables stay
  // readable only once b writes its slot.
  const std::vector<std::int64_t> b_slot = cache.reserve(b, 1);
  const kvlab::BlockTables tb = cache.tables({b});
  CHECK_THROWS_AS(cache.view(0, tb), kvlab::InvalidArgument);
  cache.truncate(a, 1);  // a's block is b's no longer (b copied it): a's marks are its own
  cache.write(0, b_slot, k.row(0), v.row(0));
  CHECK_NOTHROW(cache.view(0, tb));
}

TEST_CASE("failed operations change nothing") {
  PagedKVCache<double> cache(1, 2, 1, 4, 3);
  const int a = cache.add_sequence();
  append_tokens(cache, a, {1, 2, 3, 4, 5, 6});  // 2 of 3 blocks
  const int b = cache.fork(a);
  const auto blocks = cache.blocks(a);
  // b needs a copy of the shared partial block plus 2 new blocks for 7 tokens: 3 > 1 free.
  CHECK_THROWS_MATCHES(cache.reserve(b, 7), kvlab::OutOfBlocks,
                       names("free blocks", "at least 3 for 7 tokens of sequence 1", "1"));
  CHECK(cache.length(b) == 6);
  CHECK(cache.blocks(b) == blocks);
  CHECK(cache.allocator().num_free() == 1);
  CHECK(cache.allocator().ref_count(blocks[1]) == 2);
  CHECK_THROWS_MATCHES(cache.reserve(a, 0), kvlab::InvalidArgument, names("n", ">= 1", "0"));
  CHECK_THROWS_MATCHES(cache.reserve(9, 1), kvlab::InvalidArgument,
                       names("seq", "a live sequence id", "9"));
  CHECK_THROWS_MATCHES(
      cache.write(1, {0}, RowMatrix<double>::Zero(1, 2), RowMatrix<double>::Zero(1, 2)),
      kvlab::InvalidArgument, names("layer", "in [0, 1)", "1"));
  CHECK_THROWS_MATCHES(
      cache.write(0, {12}, RowMatrix<double>::Zero(1, 2), RowMatrix<double>::Zero(1, 2)),
      kvlab::InvalidArgument, names("slots[0]", "in [0, 12)", "12"));
  CHECK_THROWS_MATCHES(
      cache.write(0, {0}, RowMatrix<double>::Zero(1, 3), RowMatrix<double>::Zero(1, 2)),
      kvlab::InvalidArgument, names("k.cols()", "2 (num_kv_heads * head_dim)", "3"));
  CHECK_THROWS_MATCHES(cache.tables({}), kvlab::InvalidArgument, names("seqs.size()", ">= 1", "0"));
  const int empty = cache.add_sequence();
  CHECK_THROWS_MATCHES(cache.tables({a, empty}), kvlab::InvalidArgument,
                       names("seqs[1]", "a non-empty sequence", "2 (empty)"));
  CHECK(read_tokens(cache, a) == std::vector<double>{1, 2, 3, 4, 5, 6});
  CHECK_THROWS_MATCHES(PagedKVCache<double>(1, 1, 1, 0, 4), kvlab::InvalidArgument,
                       names("block_size", ">= 1", "0"));
}

TEST_CASE(
    "truncate drops the blocks past the new end, and a shared block kept is copied on the next "
    "append") {
  const kvlab::KVLayout layout = GENERATE(kvlab::KVLayout::NHD, kvlab::KVLayout::HND);
  CAPTURE(kvlab::to_string(layout));
  PagedKVCache<double> cache(2, 2, 2, 4, 8, layout);
  const int a = cache.add_sequence();
  append_tokens(cache, a, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});  // 3 blocks
  const int b = cache.fork(a);
  const auto blocks = cache.blocks(a);
  cache.truncate(b, 6);  // b keeps 2 shared blocks, drops its hold on the third
  CHECK(cache.blocks(b) == std::vector<std::int32_t>{blocks[0], blocks[1]});
  CHECK(cache.allocator().ref_count(blocks[2]) == 1);
  CHECK(cache.allocator().ref_count(blocks[1]) == 2);
  append_tokens(cache, b, {60, 70});  // into the shared, now partly filled block 1: copied first
  CHECK(cache.blocks(b)[1] != blocks[1]);
  CHECK(read_tokens(cache, b) == std::vector<double>{1, 2, 3, 4, 5, 6, 60, 70});
  CHECK(read_tokens(cache, a) == std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  CHECK(read_tokens(cache, a, 1) == std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  cache.truncate(a, 0);  // an empty sequence holds no block
  CHECK(cache.blocks(a).empty());
  CHECK(cache.allocator().num_used() == 2);
  CHECK_THROWS_MATCHES(cache.truncate(b, 9), kvlab::InvalidArgument,
                       names("length", "in [0, 8]", "9"));
  CHECK_THROWS_MATCHES(cache.truncate(b, -1), kvlab::InvalidArgument,
                       names("length", "in [0, 8]", "-1"));
  CHECK_THROWS_MATCHES(cache.truncate(7, 0), kvlab::InvalidArgument,
                       names("seq", "a live sequence id", "7"));
  CHECK(cache.length(b) == 8);
}

TEST_CASE("10^5 random add / append / fork / truncate / free operations keep every invariant") {
  // Every invariant is checked after every operation (tests/stress/paged_cache_stress.hpp; a
  // broken one throws): lengths, block counts, reference counts, free + used, and every 97
  // operations each sequence's tokens read back; kvlab_stress runs the same for 10^7.
  const kvlab::KVLayout layout = GENERATE(kvlab::KVLayout::NHD, kvlab::KVLayout::HND);
  for (int block_size : {1, 3, 16}) {
    INFO("block_size " << block_size << ", layout " << kvlab::to_string(layout));
    const long ops = block_size == 16 ? 100000 : 20000;
    const kvlab_stress::PagedCacheRun run = kvlab_stress::paged_cache(
        ops, static_cast<std::uint64_t>(block_size) * 7919, layout, block_size);
    CHECK(run.operations == ops);
    CHECK(run.out_of_blocks > 0);  // the pool ran dry: the refused append was checked
    CHECK(run.contents_checked > 0);
    CHECK(run.forks > 0);
    CHECK(run.truncations > 0);
  }
}
