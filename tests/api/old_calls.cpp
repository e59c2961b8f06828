// Calls of kvlab's API as written before it changed in a way that would otherwise compile into
// something else: each must now fail to compile. tests/CMakeLists.txt builds this file once per
// KVLAB_OLD_CALL (the CTests api_old_call_N, each expecting the compiler's refusal) and once
// without it, where the new spelling must compile (api_new_call).
#include <kvlab/cache/block_tables.hpp>
#include <kvlab/cache/paged_kv_cache.hpp>

int main() {
#if KVLAB_OLD_CALL == 1
  // BlockTables' sizes as two plain ints (before 0.2.0; once in the order num_blocks, block_size).
  const kvlab::BlockTables t({0, 1}, {0}, {1}, 4, 8);
#elif KVLAB_OLD_CALL == 2
  // The two sizes swapped.
  const kvlab::BlockTables t({0, 1}, {0}, {1}, kvlab::NumBlocks{8}, kvlab::BlockSize{4});
#elif KVLAB_OLD_CALL == 3
  // from_lists with two plain ints.
  const kvlab::BlockTables t = kvlab::BlockTables::from_lists({{0}}, {1}, 4, 8);
#elif KVLAB_OLD_CALL == 4
  // PagedKVCache::append(seq, n), which made room for n tokens (before 0.2.0): now reserve.
  kvlab::PagedKVCache<float> cache(1, 1, 4, 4, 8);
  (void)cache.append(cache.add_sequence(), 3);
  const kvlab::BlockTables t({0, 1}, {0}, {1}, kvlab::BlockSize{4}, kvlab::NumBlocks{8});
#else
  kvlab::PagedKVCache<float> cache(1, 1, 4, 4, 8);
  (void)cache.reserve(cache.add_sequence(), 3);
  const kvlab::BlockTables t({0, 1}, {0}, {1}, kvlab::BlockSize{4}, kvlab::NumBlocks{8});
#endif
  return t.num_blocks() == 8 ? 0 : 1;
}
