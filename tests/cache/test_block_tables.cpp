// BlockTables and PagedKVView: the CSR arrays round-trip, token addresses follow the
// documented NHD and HND pool layouts through arbitrary (non-monotonic) block tables, and malformed
// tables are rejected with the offending element named.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "kvlab/cache/block_allocator.hpp"
#include "kvlab/cache/block_tables.hpp"
#include "kvlab/core/random.hpp"
#include "test_support.hpp"

using kvlab::BlockSize;
using kvlab::BlockTables;
using kvlab::InvalidArgument;
using kvlab::NumBlocks;
using kvlab_test::names;

TEST_CASE("from_lists builds the CSR arrays") {
  // Block size 4: lengths 4 (one full block), 5 (one full + 1), 3 (one partial block).
  const BlockTables t =
      BlockTables::from_lists({{7}, {2, 9}, {0}}, {4, 5, 3}, BlockSize{4}, NumBlocks{10});
  CHECK(t.batch() == 3);
  CHECK(t.indptr() == std::vector<std::int32_t>{0, 1, 3, 4});
  CHECK(t.indices() == std::vector<std::int32_t>{7, 2, 9, 0});
  CHECK(t.last_page_len() == std::vector<std::int32_t>{4, 1, 3});
  CHECK(t.seq_len(0) == 4);
  CHECK(t.seq_len(1) == 5);
  CHECK(t.seq_len(2) == 3);
  CHECK_THROWS_MATCHES(BlockTables::from_lists({{1, 2}}, {4}, BlockSize{4}, NumBlocks{10}),
                       InvalidArgument,
                       names("blocks[0].size()", "1 (ceil(lengths[0] / block_size))", "2"));
  CHECK_THROWS_MATCHES(BlockTables::from_lists({{1}}, {0}, BlockSize{4}, NumBlocks{10}),
                       InvalidArgument, names("lengths[0]", ">= 1", "0"));
}

TEST_CASE(
    "shuffled tables: every block at most once, spare blocks free, the same for the same seed") {
  const std::vector<int> lengths{5, 1, 16, 17};  // blocks of 4: 2 + 1 + 4 + 5 = 12
  kvlab::Rng a(3), b(3), c(4);
  const BlockTables t = BlockTables::shuffled(lengths, 4, 3, a);
  CHECK(t.num_blocks() == 15);
  CHECK(t.block_size() == 4);
  for (int s = 0; s < 4; ++s) CHECK(t.seq_len(s) == lengths[static_cast<std::size_t>(s)]);
  std::vector<int> uses(15, 0);
  for (std::int32_t block : t.indices()) ++uses[static_cast<std::size_t>(block)];
  CHECK(std::count(uses.begin(), uses.end(), 1) == 12);
  CHECK(std::count(uses.begin(), uses.end(), 0) == 3);
  CHECK(!std::is_sorted(t.indices().begin(), t.indices().end()));
  CHECK(BlockTables::shuffled(lengths, 4, 3, b).indices() == t.indices());
  CHECK(BlockTables::shuffled(lengths, 4, 3, c).indices() != t.indices());
  CHECK_THROWS_MATCHES(BlockTables::shuffled({3, 0}, 4, 0, a), InvalidArgument,
                       names("lengths[1]", ">= 1", "0"));
  CHECK_THROWS_MATCHES(BlockTables::shuffled({3}, 4, -1, a), InvalidArgument,
                       names("spare_blocks", ">= 0", "-1"));
}

TEST_CASE(
    "a token's address: ((block * block_size + slot) * num_kv_heads + head) * head_dim in NHD, "
    "((block * num_kv_heads + head) * block_size + slot) * head_dim in HND") {
  const int num_blocks = 16, kv_heads = 3, head_dim = 5;
  const kvlab::KVLayout layout = GENERATE(kvlab::KVLayout::NHD, kvlab::KVLayout::HND);
  const bool hnd = layout == kvlab::KVLayout::HND;
  for (int block_size : {1, 3, 16}) {
    INFO("block_size " << block_size << ", layout " << kvlab::to_string(layout));
    // Take blocks from a pool in a shuffled order so that the tables are non-monotonic.
    kvlab::BlockAllocator pool(num_blocks);
    kvlab::Rng rng(static_cast<std::uint64_t>(block_size));
    std::vector<std::int32_t> order = pool.allocate(num_blocks);
    kvlab::shuffle(order, rng);
    const std::vector<int> lengths = {1, block_size, block_size + 1, 2 * block_size - 1};
    std::vector<std::vector<std::int32_t>> lists;
    std::size_t next = 0;
    for (int len : lengths) {
      const int pages = (len - 1) / block_size + 1;
      lists.emplace_back(
          order.begin() + static_cast<std::ptrdiff_t>(next),
          order.begin() + static_cast<std::ptrdiff_t>(next + static_cast<std::size_t>(pages)));
      next += static_cast<std::size_t>(pages);
    }
    const BlockTables tables =
        BlockTables::from_lists(lists, lengths, BlockSize{block_size}, NumBlocks{num_blocks});
    std::vector<float> pool_k(
        static_cast<std::size_t>(num_blocks * block_size * kv_heads * head_dim), -1.0f);
    const auto view = tables.view(pool_k.data(), pool_k.data(), kv_heads, head_dim, layout);
    REQUIRE(view.batch == 4);
    REQUIRE(view.layout == layout);
    REQUIRE(view.token_stride() == (hnd ? head_dim : kv_heads * head_dim));
    REQUIRE(view.head_stride() == (hnd ? block_size * head_dim : head_dim));
    std::vector<int> hits(pool_k.size(), 0);  // every element of the pool is addressed exactly once
    for (int s = 0; s < 4; ++s) {
      REQUIRE(view.seq_len(s) == lengths[static_cast<std::size_t>(s)]);
      for (int pos = 0; pos < lengths[static_cast<std::size_t>(s)]; ++pos) {
        const int block =
            lists[static_cast<std::size_t>(s)][static_cast<std::size_t>(pos / block_size)];
        REQUIRE(view.block_of(s, pos) == block);
        for (int h = 0; h < kv_heads; ++h) {
          const std::ptrdiff_t slot = pos % block_size;
          const std::ptrdiff_t want =
              hnd ? ((static_cast<std::ptrdiff_t>(block) * kv_heads + h) * block_size + slot) *
                        head_dim
                  : ((static_cast<std::ptrdiff_t>(block) * block_size + slot) * kv_heads + h) *
                        head_dim;
          REQUIRE(view.offset(s, pos, h) == want);
          REQUIRE(view.slot_offset(static_cast<std::int64_t>(block) * block_size + slot, h) ==
                  want);
          REQUIRE(view.key(s, pos, h) == pool_k.data() + want);
          if (slot > 0) REQUIRE(view.offset(s, pos - 1, h) + view.token_stride() == want);
          if (h > 0) REQUIRE(view.offset(s, pos, h - 1) + view.head_stride() == want);
        }
      }
    }
    // Over every slot of every block: the rows of all (slot, head) pairs tile the pool.
    for (std::int64_t slot = 0; slot < static_cast<std::int64_t>(num_blocks) * block_size; ++slot)
      for (int h = 0; h < kv_heads; ++h)
        for (int c = 0; c < head_dim; ++c)
          ++hits[static_cast<std::size_t>(view.slot_offset(slot, h) + c)];
    REQUIRE(std::all_of(hits.begin(), hits.end(), [](int n) { return n == 1; }));
  }
}

TEST_CASE("malformed tables are rejected, naming the element") {
  const auto make = [](std::vector<std::int32_t> indptr, std::vector<std::int32_t> indices,
                       std::vector<std::int32_t> last, int num_blocks = 8, int block_size = 4,
                       int window = 0) {
    return BlockTables(std::move(indptr), std::move(indices), std::move(last),
                       BlockSize{block_size}, NumBlocks{num_blocks}, window);
  };
  CHECK_NOTHROW(make({0, 2, 3}, {5, 1, 7}, {4, 1}));
  CHECK_THROWS_MATCHES(make({0, 2, 3}, {5, 1, 7}, {4, 5}), InvalidArgument,
                       names("last_page_len[1]", "in [1, block_size (4)]", "5"));
  CHECK_THROWS_MATCHES(make({0, 2, 3}, {5, 1, 7}, {0, 1}), InvalidArgument,
                       names("last_page_len[0]", "in [1, block_size (4)]", "0"));
  CHECK_THROWS_MATCHES(
      make({0, 2, 3}, {5, 8, 7}, {4, 1}), InvalidArgument,
      names("indices[1]", "in [0, 8) (kReleasedBlock only in tables with a window)", "8"));
  CHECK_THROWS_MATCHES(make({0, 2, 3}, {5, -2, 7}, {4, 1}, 8, 4, 6), InvalidArgument,
                       names("indices[1]", "in [0, 8) or kReleasedBlock (-1)", "-2"));
  // -1 is a block given back out of a sliding window: tables with a window may hold it (the
  // kernels check that no query's window reaches one), and the views carry the window; tables
  // without one refuse it where they are made, not in a kernel later.
  const BlockTables windowed = make({0, 2, 3}, {kvlab::kReleasedBlock, 1, 7}, {4, 1}, 8, 4, 6);
  CHECK(windowed.window() == 6);
  CHECK(windowed.view<float>(nullptr, nullptr, 1, 1).window == 6);
  CHECK_THROWS_MATCHES(
      make({0, 2, 3}, {kvlab::kReleasedBlock, 1, 7}, {4, 1}), InvalidArgument,
      names("indices[0]", "in [0, 8) (kReleasedBlock only in tables with a window)", "-1"));
  CHECK_THROWS_MATCHES(make({0, 2, 3}, {5, 1, 7}, {4, 1}, 8, 4, -1), InvalidArgument,
                       names("window", ">= 0", "-1"));
  CHECK_THROWS_MATCHES(make({0, 2, 2}, {5, 1}, {4, 1}), InvalidArgument,
                       names("indptr[2]", "> indptr[1] (2)", "2"));
  CHECK_THROWS_MATCHES(make({1, 2}, {5, 1}, {4}), InvalidArgument, names("indptr[0]", "0", "1"));
  CHECK_THROWS_MATCHES(make({0, 2}, {5, 1, 7}, {4}), InvalidArgument,
                       names("indices.size()", "2 (indptr[batch])", "3"));
  CHECK_THROWS_MATCHES(make({0, 2}, {5, 1}, {4, 4}), InvalidArgument,
                       names("last_page_len.size()", "1 (batch)", "2"));
  CHECK_THROWS_MATCHES(make({0}, {}, {}), InvalidArgument, names("indptr.size()", ">= 2", "1"));
  CHECK_THROWS_MATCHES(make({0, 1}, {0}, {1}, 8, 0), InvalidArgument,
                       names("block_size", ">= 1", "0"));
}
