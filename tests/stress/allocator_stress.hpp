// A long random sequence of block-allocator operations, checked after every operation against
// a model of who holds which block. Run short by tests/cache/test_block_allocator.cpp, long by
// kvlab_stress.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvlab/cache/block_allocator.hpp"
#include "kvlab/core/random.hpp"
#include "stress_support.hpp"

namespace kvlab_stress {

// --- the block allocator --------------------------------------------------------------------

/// What an allocator run did.
struct AllocatorRun {
  long operations = 0;
  long exhausted = 0;  ///< allocations refused because the pool had too few free blocks
  long forks = 0;      ///< holders that shared every block of another
  long ends = 0;       ///< holders that released every block they held
};

/// `operations` random operations on a pool of `num_blocks` blocks: a new holder (think: a
/// sequence's block table) takes 1..4 blocks (40 %), a fork shares every block of a holder
/// (20 %), a holder ends and releases its blocks (40 %). After every operation each block's
/// reference count equals its holders in the model, a block is in use exactly when someone holds
/// it, and free + used = total; a refused allocation changes nothing. At the end every holder
/// releases and the pool hands out each id exactly once.
inline AllocatorRun allocator(long operations, std::uint64_t seed, int num_blocks = 37) {
  kvlab::BlockAllocator pool(num_blocks);
  kvlab::Rng rng(seed);
  std::vector<std::vector<std::int32_t>> holders;               // [holders][blocks held] the model
  std::vector<int> refs(static_cast<std::size_t>(num_blocks));  // [num_blocks] from the model
  AllocatorRun run;
  for (long op = 0; op < operations; ++op) {
    const double u = rng.uniform();
    if (u < 0.4 || holders.empty()) {  // a new holder takes 1..4 blocks
      const int n = 1 + static_cast<int>(rng.next_u64() % 4);
      const int free_before = pool.num_free();
      if (n > free_before) {
        bool refused = false;
        try {
          (void)pool.allocate(n);
        } catch (const kvlab::OutOfBlocks&) {
          refused = true;
        }
        check(refused && pool.num_free() == free_before, op,
              "an allocation of more blocks than are free was not refused, or changed the pool");
        ++run.exhausted;
      } else {
        holders.push_back(pool.allocate(n));
      }
    } else if (u < 0.6) {  // a fork: a new holder shares all blocks of an existing one
      const std::vector<std::int32_t> source = holders[rng.next_u64() % holders.size()];
      for (std::int32_t b : source) pool.share(b);
      holders.push_back(source);
      ++run.forks;
    } else {  // a holder ends: it releases every block it holds
      const std::size_t i = rng.next_u64() % holders.size();
      for (std::int32_t b : holders[i]) pool.release(b);
      holders.erase(holders.begin() + static_cast<std::ptrdiff_t>(i));
      ++run.ends;
    }
    // Invariants after every operation.
    std::fill(refs.begin(), refs.end(), 0);
    for (const auto& h : holders)
      for (std::int32_t b : h) ++refs[static_cast<std::size_t>(b)];
    int in_use = 0;
    for (std::int32_t b = 0; b < num_blocks; ++b) {
      const int expected = refs[static_cast<std::size_t>(b)];
      if (pool.ref_count(b) != expected)
        check(false, op,
              "block " + std::to_string(b) + " has reference count " +
                  std::to_string(pool.ref_count(b)) + ", holders " + std::to_string(expected));
      in_use += expected > 0;
    }
    check(pool.num_used() == in_use, op, "blocks in use differ from the blocks someone holds");
    check(pool.num_free() + pool.num_used() == num_blocks, op, "free + used != total");
    ++run.operations;
  }
  for (const auto& h : holders)
    for (std::int32_t b : h) pool.release(b);
  check(pool.num_free() == num_blocks, operations, "blocks leaked after every holder released");
  // No block is on the free list twice: allocating everything gives each id exactly once.
  std::vector<std::int32_t> all = pool.allocate(num_blocks);
  std::sort(all.begin(), all.end());
  for (std::int32_t b = 0; b < num_blocks; ++b)
    check(all[static_cast<std::size_t>(b)] == b, operations,
          "a block id is on the free list twice");
  return run;
}

}  // namespace kvlab_stress
