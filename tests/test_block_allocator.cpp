// BlockAllocator: allocation, sharing and release keep the reference counts equal to the
// number of holders, never leak or double-free a block, and fail without side effects.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "kvlab/cache/block_allocator.hpp"
#include "kvlab/core/random.hpp"
#include "test_support.hpp"

using kvlab::BlockAllocator;
using kvlab_test::names;

TEST_CASE("blocks are handed out, shared and returned") {
  BlockAllocator pool(4);
  CHECK(pool.num_free() == 4);
  const std::int32_t a = pool.allocate();
  const std::vector<std::int32_t> bc = pool.allocate(2);
  CHECK(a == 0);  // a fresh pool hands out ids in order
  CHECK(bc == std::vector<std::int32_t>{1, 2});
  CHECK(pool.num_used() == 3);
  pool.share(a);
  CHECK(pool.ref_count(a) == 2);
  pool.release(a);
  CHECK(pool.ref_count(a) == 1);
  CHECK(pool.num_free() == 1);
  pool.release(a);
  CHECK(pool.ref_count(a) == 0);
  CHECK(pool.num_free() == 2);
  CHECK(pool.allocate() == a);  // last freed, first reused
  CHECK(pool.allocate(0).empty());
}

TEST_CASE("exhaustion and misuse throw and change nothing") {
  BlockAllocator pool(3);
  const std::vector<std::int32_t> two = pool.allocate(2);
  CHECK_THROWS_MATCHES(pool.allocate(2), kvlab::OutOfBlocks,
                       names("n", "at most 1 (free blocks of 3)", "2"));
  CHECK(pool.num_free() == 1);
  const std::int32_t last = pool.allocate();
  CHECK_THROWS_AS(pool.allocate(), kvlab::OutOfBlocks);
  CHECK(pool.num_free() == 0);
  pool.release(last);
  CHECK_THROWS_MATCHES(pool.release(last), kvlab::InvalidArgument,
                       names("block", "a block in use", "2 (free)"));
  CHECK_THROWS_MATCHES(pool.share(last), kvlab::InvalidArgument,
                       names("block", "a block in use", "2 (free)"));
  CHECK_THROWS_MATCHES(pool.release(3), kvlab::InvalidArgument, names("block", "in [0, 3)", "3"));
  CHECK_THROWS_MATCHES(pool.ref_count(-1), kvlab::InvalidArgument,
                       names("block", "in [0, 3)", "-1"));
  CHECK_THROWS_MATCHES(pool.allocate(-1), kvlab::InvalidArgument, names("n", ">= 0", "-1"));
  CHECK_THROWS_MATCHES(BlockAllocator(0), kvlab::InvalidArgument, names("num_blocks", ">= 1", "0"));
  CHECK(pool.num_free() == 1);
  CHECK(pool.ref_count(two[0]) == 1);
  CHECK(pool.ref_count(two[1]) == 1);
}

TEST_CASE("10^5 random operations agree with a model of who holds what") {
  const int kBlocks = 37;
  BlockAllocator pool(kBlocks);
  kvlab::Rng rng(2024);
  // The model: each holder (think: a sequence's block table) is a list of the blocks it holds.
  std::vector<std::vector<std::int32_t>> holders;
  const auto expected_refs = [&] {
    std::vector<int> refs(kBlocks, 0);
    for (const auto& h : holders)
      for (std::int32_t b : h) ++refs[static_cast<std::size_t>(b)];
    return refs;
  };
  int exhausted = 0;
  for (int op = 0; op < 100000; ++op) {
    const double u = rng.uniform();
    if (u < 0.4 || holders.empty()) {  // a new holder takes 1..4 blocks
      const int n = 1 + static_cast<int>(rng.next_u64() % 4);
      const int free_before = pool.num_free();
      if (n > free_before) {
        REQUIRE_THROWS_AS(pool.allocate(n), kvlab::OutOfBlocks);
        REQUIRE(pool.num_free() == free_before);
        ++exhausted;
      } else {
        holders.push_back(pool.allocate(n));
      }
    } else if (u < 0.6) {  // a fork: a new holder shares all blocks of an existing one
      const auto& source = holders[rng.next_u64() % holders.size()];
      for (std::int32_t b : source) pool.share(b);
      holders.push_back(source);
    } else {  // a holder ends: it releases every block it holds
      const std::size_t i = rng.next_u64() % holders.size();
      for (std::int32_t b : holders[i]) pool.release(b);
      holders.erase(holders.begin() + static_cast<std::ptrdiff_t>(i));
    }
    // Invariants after every step.
    const std::vector<int> refs = expected_refs();
    int in_use = 0;
    for (std::int32_t b = 0; b < kBlocks; ++b) {
      REQUIRE(pool.ref_count(b) == refs[static_cast<std::size_t>(b)]);
      in_use += refs[static_cast<std::size_t>(b)] > 0;
    }
    REQUIRE(pool.num_used() == in_use);
    REQUIRE(pool.num_free() + pool.num_used() == kBlocks);
  }
  CHECK(exhausted > 0);  // the pool did run dry, so the failure path was exercised
  for (const auto& h : holders)
    for (std::int32_t b : h) pool.release(b);
  CHECK(pool.num_free() == kBlocks);
  // No block is on the free list twice: allocating everything gives each id exactly once.
  std::vector<std::int32_t> all = pool.allocate(kBlocks);
  std::sort(all.begin(), all.end());
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
  CHECK(all.front() == 0);
  CHECK(all.back() == kBlocks - 1);
}
