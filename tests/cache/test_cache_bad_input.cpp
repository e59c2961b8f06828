// The bad-input cases of include/kvlab/cache/: each calls a public function declared there with one
// bad argument. The rules of the table are in tests/bad_input/ (entry_points.txt lists the entry
// points and is checked against the headers by the test bad_input_table; bad_input.hpp runs a
// case): each input class that applies — wrong shape, zero or negative size, empty, an index or id
// out of range, a call the object's state does not allow, overflow-sized arguments, values that
// cannot be stored — is tried, and each case asserts kvlab's exception type, a message naming the
// argument with the expected and the actual value, and the object's observable state unchanged
// (compared before and after).
#include <catch2/catch.hpp>

#include <climits>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bad_input/bad_input.hpp"
#include "bad_input/states.hpp"
#include "kvlab/kvlab.hpp"

using kvlab::InvalidArgument;
using kvlab::RowMatrix;
using kvlab_test::names;
using kvlab_test::refuses;
using kvlab_test::bad_input_states::no_state;
using kvlab_test::bad_input_states::small_paged_cache;
using kvlab_test::bad_input_states::state_of;
namespace input = kvlab_test::input;

TEST_CASE("BlockAllocator: bad input is refused and changes nothing") {
  kvlab::BlockAllocator pool(3);
  const std::int32_t used = pool.allocate();
  const std::int32_t freed = pool.allocate();
  pool.release(freed);
  const auto state = [&] { return state_of(pool); };
  const char* ctor = "kvlab::BlockAllocator::BlockAllocator(int num_blocks)";
  refuses<InvalidArgument>(
      ctor, input::kSize, no_state, [] { kvlab::BlockAllocator a(0); },
      names("num_blocks", ">= 1", "0"));
  refuses<InvalidArgument>(
      ctor, input::kSize, no_state, [] { kvlab::BlockAllocator a(-5); },
      names("num_blocks", ">= 1", "-5"));
  const char* allocate = "kvlab::BlockAllocator::allocate(int n)";
  refuses<InvalidArgument>(
      allocate, input::kSize, state, [&] { (void)pool.allocate(-1); }, names("n", ">= 0", "-1"));
  refuses<kvlab::OutOfBlocks>(
      allocate, input::kOverflow, state, [&] { (void)pool.allocate(INT_MAX); },
      names("n", "at most 2 (free blocks of 3)", std::to_string(INT_MAX)));
  for (const char* entry : {"kvlab::BlockAllocator::share(std::int32_t block)",
                            "kvlab::BlockAllocator::release(std::int32_t block)"}) {
    const bool share = std::string(entry).find("share") != std::string::npos;
    const auto call = [&](std::int32_t b) {
      if (share)
        pool.share(b);
      else
        pool.release(b);
    };
    refuses<InvalidArgument>(
        entry, input::kRange, state, [&] { call(3); }, names("block", "in [0, 3)", "3"));
    refuses<InvalidArgument>(
        entry, input::kRange, state, [&] { call(-1); }, names("block", "in [0, 3)", "-1"));
    refuses<InvalidArgument>(
        entry, input::kState, state, [&] { call(freed); },
        names("block", "a block in use", std::to_string(freed) + " (free)"));
  }
  const char* ref_count = "kvlab::BlockAllocator::ref_count(std::int32_t block) const";
  refuses<InvalidArgument>(
      ref_count, input::kRange, state, [&] { (void)pool.ref_count(3); },
      names("block", "in [0, 3)", "3"));
  refuses<InvalidArgument>(
      ref_count, input::kRange, state, [&] { (void)pool.ref_count(INT32_MIN); },
      names("block", "in [0, 3)", std::to_string(INT32_MIN)));
  CHECK(pool.ref_count(used) == 1);
}

TEST_CASE("BlockTables: bad arrays and arguments are refused") {
  using V = std::vector<std::int32_t>;
  const char* ctor =
      "kvlab::BlockTables::BlockTables(std::vector< std::int32_t > indptr, std::vector< "
      "std::int32_t > indices, std::vector< std::int32_t > last_page_len, BlockSize block_size, "
      "NumBlocks num_blocks, int window=0)";
  const auto make = [](V indptr, V indices, V last, int block_size, int num_blocks,
                       int window = 0) {
    return [=] {
      kvlab::BlockTables t(indptr, indices, last, kvlab::BlockSize{block_size},
                           kvlab::NumBlocks{num_blocks}, window);
    };
  };
  refuses<InvalidArgument>(ctor, input::kValue, no_state, make({0, 1}, {0}, {1}, 4, 4, -3),
                           names("window", ">= 0", "-3"));
  refuses<InvalidArgument>(
      ctor, input::kState, no_state, make({0, 1}, {kvlab::kReleasedBlock}, {1}, 4, 4),
      names("indices[0]", "in [0, 4) (kReleasedBlock only in tables with a window)", "-1"));
  refuses<InvalidArgument>(ctor, input::kSize, no_state, make({0, 1}, {0}, {1}, 4, 0),
                           names("num_blocks", ">= 1", "0"));
  refuses<InvalidArgument>(ctor, input::kSize, no_state, make({0, 1}, {0}, {1}, 0, 4),
                           names("block_size", ">= 1", "0"));
  refuses<InvalidArgument>(ctor, input::kEmpty, no_state, make({0}, {}, {}, 4, 4),
                           names("indptr.size()", ">= 2", "1"));
  refuses<InvalidArgument>(ctor, input::kShape, no_state, make({1, 2}, {0}, {1}, 4, 4),
                           names("indptr[0]", "0", "1"));
  refuses<InvalidArgument>(
      ctor, input::kShape, no_state, make({0, 1, 1}, {0}, {1, 1}, 4, 4),
      names("indptr[2]", "> indptr[1] (1): every sequence holds at least one block", "1"));
  refuses<InvalidArgument>(ctor, input::kShape, no_state, make({0, 2}, {0}, {1}, 4, 4),
                           names("indices.size()", "2 (indptr[batch])", "1"));
  refuses<InvalidArgument>(
      ctor, input::kRange, no_state, make({0, 1}, {4}, {1}, 4, 4),
      names("indices[0]", "in [0, 4) (kReleasedBlock only in tables with a window)", "4"));
  refuses<InvalidArgument>(ctor, input::kShape, no_state, make({0, 1}, {0}, {1, 1}, 4, 4),
                           names("last_page_len.size()", "1 (batch)", "2"));
  refuses<InvalidArgument>(ctor, input::kRange, no_state, make({0, 1}, {0}, {5}, 4, 4),
                           names("last_page_len[0]", "in [1, block_size (4)]", "5"));
  refuses<InvalidArgument>(ctor, input::kRange, no_state, make({0, 1}, {0}, {0}, 4, 4),
                           names("last_page_len[0]", "in [1, block_size (4)]", "0"));
  refuses<InvalidArgument>(ctor, input::kOverflow, no_state,
                           make({0, 3}, {0, 1, 2}, {1}, INT_MAX / 2, 4),
                           names("indptr[1]", "a sequence of at most 2 blocks", "3 blocks"));

  const char* from_lists =
      "kvlab::BlockTables::from_lists(const std::vector< std::vector< std::int32_t > > &blocks, "
      "const std::vector< int > &lengths, BlockSize block_size, NumBlocks num_blocks, int "
      "window=0)";
  refuses<InvalidArgument>(
      from_lists, input::kShape, no_state,
      [] {
        (void)kvlab::BlockTables::from_lists({{0, 1}}, {4}, kvlab::BlockSize{4},
                                             kvlab::NumBlocks{4});
      },
      names("blocks[0].size()", "1 (ceil(lengths[0] / block_size))", "2"));
  refuses<InvalidArgument>(
      from_lists, input::kShape, no_state,
      [] {
        (void)kvlab::BlockTables::from_lists({{0}}, {4, 4}, kvlab::BlockSize{4},
                                             kvlab::NumBlocks{4});
      },
      names("lengths.size()", "1 (blocks.size())", "2"));
  refuses<InvalidArgument>(
      from_lists, input::kSize, no_state,
      [] {
        (void)kvlab::BlockTables::from_lists({{0}}, {0}, kvlab::BlockSize{4}, kvlab::NumBlocks{4});
      },
      names("lengths[0]", ">= 1", "0"));

  const char* shuffled =
      "kvlab::BlockTables::shuffled(const std::vector< int > &lengths, int block_size, int "
      "spare_blocks, Rng &rng)";
  kvlab::Rng rng(1);
  refuses<InvalidArgument>(
      shuffled, input::kEmpty, no_state, [&] { (void)kvlab::BlockTables::shuffled({}, 4, 0, rng); },
      names("lengths.size()", ">= 1", "0"));
  refuses<InvalidArgument>(
      shuffled, input::kSize, no_state,
      [&] {
        (void)kvlab::BlockTables::shuffled({3, -1}, 4, 0, rng);
      },
      names("lengths[1]", ">= 1", "-1"));
  refuses<InvalidArgument>(
      shuffled, input::kSize, no_state, [&] { (void)kvlab::BlockTables::shuffled({3}, 0, 0, rng); },
      names("block_size", ">= 1", "0"));
  refuses<InvalidArgument>(
      shuffled, input::kSize, no_state,
      [&] { (void)kvlab::BlockTables::shuffled({3}, 4, -1, rng); },
      names("spare_blocks", ">= 0", "-1"));

  const kvlab::BlockTables tables({0, 1, 3}, {2, 0, 1}, {3, 2}, kvlab::BlockSize{4},
                                  kvlab::NumBlocks{4});
  const char* seq_len = "kvlab::BlockTables::seq_len(int seq) const";
  refuses<InvalidArgument>(
      seq_len, input::kRange, no_state, [&] { (void)tables.seq_len(2); },
      names("seq", "in [0, 2)", "2"));
  refuses<InvalidArgument>(
      seq_len, input::kRange, no_state, [&] { (void)tables.seq_len(-1); },
      names("seq", "in [0, 2)", "-1"));
}

TEST_CASE("PagedKVCache: bad input is refused and changes nothing") {
  const char* ctor =
      "kvlab::PagedKVCache::PagedKVCache(int num_layers, int num_kv_heads, int head_dim, int "
      "block_size, int num_blocks, KVLayout layout=KVLayout::NHD, int window=0, int sinks=0)";
  refuses<InvalidArgument>(
      ctor, input::kSize, no_state, [] { kvlab::PagedKVCache<double> c(0, 2, 2, 4, 6); },
      names("num_layers", ">= 1", "0"));
  refuses<InvalidArgument>(
      ctor, input::kSize, no_state, [] { kvlab::PagedKVCache<double> c(1, 2, 2, 4, 0); },
      names("num_blocks", ">= 1", "0"));
  refuses<InvalidArgument>(
      ctor, input::kSize, no_state, [] { kvlab::PagedKVCache<double> c(1, 2, 2, 0, 6); },
      names("block_size", ">= 1", "0"));
  refuses<InvalidArgument>(
      ctor, input::kSize, no_state,
      [] { kvlab::PagedKVCache<double> c(1, 2, 2, 4, 6, kvlab::KVLayout::NHD, -1); },
      names("window", ">= 0", "-1"));
  refuses<InvalidArgument>(
      ctor, input::kRange, no_state,
      [] { kvlab::PagedKVCache<double> c(1, 2, 2, 4, 6, kvlab::KVLayout::NHD, 4, 4); },
      names("sinks", "below the window (4)", "4"));
  refuses<InvalidArgument>(
      ctor, input::kShape, no_state,
      [] { kvlab::PagedKVCache<float, kvlab::BlockQ8_0> c(1, 2, 16, 4, 6); },
      names("head_dim", "a multiple of 32 (the values of one int8 block)", "16"));
  refuses<InvalidArgument>(
      ctor, input::kOverflow, no_state,
      [] { kvlab::PagedKVCache<double> c(1, 1, 1, INT_MAX, INT_MAX); },
      names("num_blocks * block_size", "at most 576460752303423487 tokens", "4611686014132420609"));

  const auto cache = small_paged_cache();
  const auto state = [&] { return state_of(*cache); };
  const int live = 0, shared = 1, empty = 2;
  for (const char* entry :
       {"kvlab::PagedKVCacheBase::length(int seq) const",
        "kvlab::PagedKVCacheBase::blocks(int seq) const",
        "kvlab::PagedKVCacheBase::held_blocks(int seq) const",
        "kvlab::PagedKVCacheBase::free_sequence(int seq)", "kvlab::PagedKVCacheBase::fork(int seq)",
        "kvlab::PagedKVCacheBase::release_out_of_window(int seq)"}) {
    const std::string e = entry;
    const auto call = [&](int seq) {
      if (e.find("::length") != std::string::npos) (void)cache->length(seq);
      if (e.find("::blocks") != std::string::npos) (void)cache->blocks(seq);
      if (e.find("::held_blocks") != std::string::npos) (void)cache->held_blocks(seq);
      if (e.find("::free_sequence") != std::string::npos) cache->free_sequence(seq);
      if (e.find("::fork") != std::string::npos) (void)cache->fork(seq);
      if (e.find("::release_out_of_window") != std::string::npos)
        (void)cache->release_out_of_window(seq);
    };
    refuses<InvalidArgument>(
        entry, input::kRange, state, [&] { call(7); }, names("seq", "a live sequence id", "7"));
    refuses<InvalidArgument>(
        entry, input::kRange, state, [&] { call(-1); }, names("seq", "a live sequence id", "-1"));
  }
  const char* contains = "kvlab::PagedKVCacheBase::contains(int seq) const";
  CHECK_FALSE(cache->contains(-1));  // a question, not an error: any id may be asked about
  (void)contains;

  const char* reserve = "kvlab::PagedKVCacheBase::reserve(int seq, int n)";
  refuses<InvalidArgument>(
      reserve, input::kRange, state, [&] { (void)cache->reserve(9, 1); },
      names("seq", "a live sequence id", "9"));
  refuses<InvalidArgument>(
      reserve, input::kSize, state, [&] { (void)cache->reserve(live, 0); },
      names("n", ">= 1", "0"));
  refuses<kvlab::OutOfBlocks>(
      reserve, input::kOverflow, state, [&] { (void)cache->reserve(empty, INT_MAX); },
      names("free blocks", "at least 536870912 for 2147483647 tokens of sequence 2", "4"));
  const char* needed = "kvlab::PagedKVCacheBase::blocks_needed(int seq, int n) const";
  refuses<InvalidArgument>(
      needed, input::kSize, state, [&] { (void)cache->blocks_needed(live, -3); },
      names("n", ">= 1", "-3"));
  refuses<InvalidArgument>(
      needed, input::kRange, state, [&] { (void)cache->blocks_needed(5, 1); },
      names("seq", "a live sequence id", "5"));
  const char* needed_batch =
      "kvlab::PagedKVCacheBase::blocks_needed(const std::vector< int > &seqs, const std::vector< "
      "int > &tokens) const";
  refuses<InvalidArgument>(
      needed_batch, input::kShape, state,
      [&] {
        (void)cache->blocks_needed({live, shared}, {1});
      },
      names("tokens.size()", "2 (seqs.size())", "1"));
  refuses<InvalidArgument>(
      needed_batch, input::kSize, state,
      [&] { (void)cache->blocks_needed(std::vector<int>{live}, std::vector<int>{0}); },
      names("tokens[0]", ">= 1", "0"));
  refuses<InvalidArgument>(
      needed_batch, input::kRange, state,
      [&] {
        (void)cache->blocks_needed({live, 8}, {1, 1});
      },
      names("seqs[1]", "a live sequence id", "8"));
  const char* truncate = "kvlab::PagedKVCacheBase::truncate(int seq, int length)";
  refuses<InvalidArgument>(
      truncate, input::kRange, state, [&] { cache->truncate(live, 6); },
      names("length", "in [0, 5]", "6"));
  refuses<InvalidArgument>(
      truncate, input::kRange, state, [&] { cache->truncate(live, -1); },
      names("length", "in [0, 5]", "-1"));
  refuses<InvalidArgument>(
      truncate, input::kRange, state, [&] { cache->truncate(4, 0); },
      names("seq", "a live sequence id", "4"));
  const char* tables = "kvlab::PagedKVCacheBase::tables(const std::vector< int > &seqs) const";
  refuses<InvalidArgument>(
      tables, input::kEmpty, state, [&] { (void)cache->tables({}); },
      names("seqs.size()", ">= 1", "0"));
  refuses<InvalidArgument>(
      tables, input::kState, state, [&] { (void)cache->tables({empty}); },
      names("seqs[0]", "a non-empty sequence", "2 (empty)"));
  refuses<InvalidArgument>(
      tables, input::kRange, state,
      [&] {
        (void)cache->tables({live, 3});
      },
      names("seqs[1]", "a live sequence id", "3"));
  const char* add =
      "kvlab::PagedKVCacheBase::add_sequence(const std::vector< std::int32_t > &blocks)";
  refuses<InvalidArgument>(
      add, input::kRange, state, [&] { (void)cache->add_sequence({6}); },
      names("blocks[0]", "a block in use in [0, 6)", "6"));
  refuses<InvalidArgument>(
      add, input::kState, state, [&] { (void)cache->add_sequence({5}); },
      names("blocks[0]", "a block in use in [0, 6)", "5"));
  for (const char* entry : {"kvlab::PagedKVCacheBase::retain_block(std::int32_t block)",
                            "kvlab::PagedKVCacheBase::release_block(std::int32_t block)"}) {
    const bool retain = std::string(entry).find("retain") != std::string::npos;
    const auto call = [&](std::int32_t b) {
      if (retain)
        cache->retain_block(b);
      else
        cache->release_block(b);
    };
    refuses<InvalidArgument>(
        entry, input::kRange, state, [&] { call(6); }, names("block", "in [0, 6)", "6"));
    refuses<InvalidArgument>(
        entry, input::kState, state, [&] { call(5); },
        names("block", "a block in use", "5 (free)"));
  }

  const char* write =
      "kvlab::PagedKVCache::write(int layer, const std::vector< std::int64_t > &slots, const "
      "Eigen::Ref< const RowMatrix< T > > &k, const Eigen::Ref< const RowMatrix< T > > &v)";
  const RowMatrix<double> row = RowMatrix<double>::Ones(1, 4);
  refuses<InvalidArgument>(
      write, input::kRange, state, [&] { cache->write(2, {0}, row, row); },
      names("layer", "in [0, 2)", "2"));
  refuses<InvalidArgument>(
      write, input::kRange, state, [&] { cache->write(0, {24}, row, row); },
      names("slots[0]", "in [0, 24)", "24"));
  refuses<InvalidArgument>(
      write, input::kShape, state,
      [&] { cache->write(0, {0}, RowMatrix<double>::Ones(1, 3), row); },
      names("k.cols()", "4 (num_kv_heads * head_dim)", "3"));
  refuses<InvalidArgument>(
      write, input::kShape, state,
      [&] {
        cache->write(0, {0, 1}, row, row);
      },
      names("k.rows()", "2 (slots.size())", "1"));
  const char* view = "kvlab::PagedKVCache::view(int layer, const BlockTables &tables) const";
  const kvlab::BlockTables live_tables = cache->tables({live});
  refuses<InvalidArgument>(
      view, input::kRange, state, [&] { (void)cache->view(-1, live_tables); },
      names("layer", "in [0, 2)", "-1"));
  const kvlab::BlockTables other({0, 1}, {0}, {1}, kvlab::BlockSize{4}, kvlab::NumBlocks{7});
  refuses<InvalidArgument>(
      view, input::kShape, state, [&] { (void)cache->view(0, other); },
      names("tables.num_blocks()", "6 (num_blocks)", "7"));

  kvlab::PagedKVCache<double> one_layer(1, 2, 2, 4, 2);
  const int s = one_layer.add_sequence();
  const auto one_state = [&] { return state_of(one_layer); };
  const char* append =
      "kvlab::PagedKVCache::append(int seq, const Eigen::Ref< const RowMatrix< T > > &k, const "
      "Eigen::Ref< const RowMatrix< T > > &v)";
  refuses<InvalidArgument>(
      append, input::kRange, one_state, [&] { (void)one_layer.append(5, row, row); },
      names("seq", "a live sequence id", "5"));
  refuses<InvalidArgument>(
      append, input::kShape, one_state,
      [&] { (void)one_layer.append(s, row, RowMatrix<double>::Ones(2, 4)); },
      names("v.rows()", "1 (k.rows())", "2"));
  refuses<kvlab::OutOfBlocks>(
      append, input::kOverflow, one_state,
      [&] {
        (void)one_layer.append(s, RowMatrix<double>::Ones(9, 4), RowMatrix<double>::Ones(9, 4));
      },
      names("free blocks", "at least 3 for 9 tokens of sequence 0", "2"));
  refuses<InvalidArgument>(
      append, input::kState, state, [&] { (void)cache->append(live, row, row); },
      names("num_layers()", "1 (a cache of one layer; with more, reserve then write each layer)",
            "2"));

  // A checkpoint: values of blocks outside the pool; one of another pool, or one put back while
  // a reserved slot is unwritten.
  kvlab::PagedKVCacheBase::Checkpoint saved = cache->checkpoint();
  const auto saved_state = [&] {
    std::vector<double> values = state_of(*cache);
    values.push_back(static_cast<double>(saved.blocks.size()));
    values.push_back(static_cast<double>(saved.values.size()));
    return values;
  };
  refuses<InvalidArgument>(
      "kvlab::PagedKVCacheBase::save_values(Checkpoint &saved, const std::vector< std::int32_t > "
      "&blocks) const",
      input::kRange, saved_state,
      [&] {
        cache->save_values(saved, {0, 6});
      },
      names("blocks[1]", "in [0, 6)", "6"));
  const char* restore = "kvlab::PagedKVCacheBase::restore(Checkpoint &&saved)";
  for (int other_size : {7, 0}) {  // another block count, then another block size
    const kvlab::PagedKVCache<double> another(2, 2, 2, other_size == 0 ? 2 : 4,
                                              other_size == 0 ? 6 : other_size);
    refuses<InvalidArgument>(
        restore, input::kShape, saved_state, [&] { cache->restore(another.checkpoint()); },
        other_size == 0 ? names("saved.book.block_size()", "4 (block_size)", "2")
                        : names("saved.book.allocator().num_blocks()", "6 (num_blocks)", "7"));
  }
  kvlab::PagedKVCacheBase::Checkpoint short_values = cache->checkpoint();
  cache->save_values(short_values, {0});
  short_values.values.pop_back();
  refuses<InvalidArgument>(
      restore, input::kShape, saved_state, [&] { cache->restore(std::move(short_values)); },
      names("saved.values.size()",
            std::to_string(cache->block_bytes()) + " (saved.blocks.size() * block bytes)",
            std::to_string(cache->block_bytes() - 1)));
  (void)cache->reserve(live, 1);  // a slot reserved, not written (so the values cannot be read)
  refuses<InvalidArgument>(
      restore, input::kState,
      [&] { return state_of(static_cast<const kvlab::PagedKVCacheBase&>(*cache)); },
      [&] { cache->restore(std::move(saved)); },
      names("pool", "every reserved slot written (no step open)", "1 unwritten in layer 0"));
}

TEST_CASE("ContiguousKVCache: bad input is refused and changes nothing") {
  const char* ctor =
      "kvlab::ContiguousKVCache::ContiguousKVCache(int num_layers, int num_kv_heads, int "
      "head_dim, int capacity, int window=0, int sinks=0)";
  refuses<InvalidArgument>(
      ctor, input::kSize, no_state, [] { kvlab::ContiguousKVCache<double> c(1, 2, 2, 0); },
      names("capacity", ">= 1", "0"));
  refuses<InvalidArgument>(
      ctor, input::kSize, no_state, [] { kvlab::ContiguousKVCache<double> c(1, 0, 2, 8); },
      names("num_kv_heads", ">= 1", "0"));
  refuses<InvalidArgument>(
      ctor, input::kRange, no_state, [] { kvlab::ContiguousKVCache<double> c(1, 2, 2, 8, 9); },
      names("window", "at most capacity (8): a decode step needs its W keys in the ring", "9"));
  refuses<InvalidArgument>(
      ctor, input::kRange, no_state, [] { kvlab::ContiguousKVCache<double> c(1, 2, 2, 8, 6, 4); },
      names("window", "at most capacity - sinks (4): a decode step needs its W keys in the ring",
            "6"));
  refuses<InvalidArgument>(
      ctor, input::kValue, no_state, [] { kvlab::ContiguousKVCache<double> c(1, 2, 2, 8, 0, 2); },
      names("sinks", "0 without a window (every key is seen)", "2"));
  refuses<InvalidArgument>(
      ctor, input::kOverflow, no_state,
      [] { kvlab::ContiguousKVCache<double> c(1, 1 << 16, 1 << 16, 8); },
      names("num_kv_heads * head_dim", "at most 2147483647", "4294967296"));

  kvlab::ContiguousKVCache<double> cache(2, 2, 2, 4);
  RowMatrix<double> k(3, 4);
  for (Eigen::Index i = 0; i < k.size(); ++i) k.data()[i] = static_cast<double>(i);
  for (int l = 0; l < 2; ++l) cache.append(l, k, -k);
  const auto state = [&] { return state_of(cache); };
  const char* append =
      "kvlab::ContiguousKVCache::append(int layer, const Eigen::Ref< const RowMatrix< T > > &k, "
      "const Eigen::Ref< const RowMatrix< T > > &v)";
  const RowMatrix<double> row = RowMatrix<double>::Ones(1, 4);
  refuses<InvalidArgument>(
      append, input::kRange, state, [&] { cache.append(2, row, row); },
      names("layer", "in [0, 2)", "2"));
  refuses<InvalidArgument>(
      append, input::kShape, state, [&] { cache.append(0, RowMatrix<double>::Ones(1, 5), row); },
      names("k.cols()", "4 (num_kv_heads * head_dim)", "5"));
  refuses<kvlab::CapacityError>(
      append, input::kOverflow, state,
      [&] { cache.append(0, RowMatrix<double>::Ones(2, 4), RowMatrix<double>::Ones(2, 4)); },
      names("k.rows()", "at most 1 (capacity 4, length 3)", "2"));
  for (const char* entry : {"kvlab::ContiguousKVCache::length(int layer) const",
                            "kvlab::ContiguousKVCache::view(int layer) const",
                            "kvlab::ContiguousKVCache::max_chunk(int layer) const"}) {
    const std::string e = entry;
    const auto call = [&](int layer) {
      if (e.find("::length") != std::string::npos) (void)cache.length(layer);
      if (e.find("::view") != std::string::npos) (void)cache.view(layer);
      if (e.find("::max_chunk") != std::string::npos) (void)cache.max_chunk(layer);
    };
    refuses<InvalidArgument>(
        entry, input::kRange, state, [&] { call(2); }, names("layer", "in [0, 2)", "2"));
    refuses<InvalidArgument>(
        entry, input::kRange, state, [&] { call(-1); }, names("layer", "in [0, 2)", "-1"));
  }
  for (const char* entry : {"kvlab::ContiguousKVCache::keys(int layer, int kv_head) const",
                            "kvlab::ContiguousKVCache::values(int layer, int kv_head) const"}) {
    const bool keys = std::string(entry).find("keys") != std::string::npos;
    const auto call = [&](int layer, int head) {
      if (keys)
        (void)cache.keys(layer, head);
      else
        (void)cache.values(layer, head);
    };
    refuses<InvalidArgument>(
        entry, input::kRange, state, [&] { call(2, 0); }, names("layer", "in [0, 2)", "2"));
    refuses<InvalidArgument>(
        entry, input::kRange, state, [&] { call(0, 2); }, names("kv_head", "in [0, 2)", "2"));
  }
  const char* truncate = "kvlab::ContiguousKVCache::truncate(int length)";
  refuses<InvalidArgument>(
      truncate, input::kRange, state, [&] { cache.truncate(4); },
      names("length", "at most the length of layer 0 (3)", "4"));
  refuses<InvalidArgument>(
      truncate, input::kRange, state, [&] { cache.truncate(-2); }, names("length", ">= 0", "-2"));
}

TEST_CASE("PagedSequences: bad input is refused and changes nothing") {
  const char* ctor =
      "kvlab::PagedSequences::PagedSequences(int block_size, int num_blocks, std::string owner)";
  refuses<InvalidArgument>(
      ctor, input::kSize, no_state, [] { kvlab::PagedSequences s(0, 4, "x"); },
      names("block_size", ">= 1", "0"));
  refuses<InvalidArgument>(
      ctor, input::kSize, no_state, [] { kvlab::PagedSequences s(4, -1, "x"); },
      names("num_blocks", ">= 1", "-1"));
  kvlab::PagedSequences book(4, 6, "kvlab::Test");
  const int live = book.add_sequence();
  (void)book.reserve(live, 5, [](std::int32_t, std::int32_t, int) {});
  const int empty = book.add_sequence();
  const auto state = [&] {
    std::vector<long> s;
    for (int seq : book.sequences()) {
      s.push_back(seq);
      s.push_back(book.length(seq));
      for (std::int32_t b : book.blocks(seq)) s.push_back(b);
    }
    for (int x : state_of(book.allocator())) s.push_back(x);
    return s;
  };
  const std::vector<std::string> by_seq = {"kvlab::PagedSequences::length(int seq) const",
                                           "kvlab::PagedSequences::blocks(int seq) const",
                                           "kvlab::PagedSequences::held_blocks(int seq) const",
                                           "kvlab::PagedSequences::free_sequence(int seq)",
                                           "kvlab::PagedSequences::fork(int seq)"};
  for (const std::string& e : by_seq) {
    const auto call = [&](int seq) {
      if (e.find("::length") != std::string::npos) (void)book.length(seq);
      if (e.find("::blocks") != std::string::npos) (void)book.blocks(seq);
      if (e.find("::held_blocks") != std::string::npos) (void)book.held_blocks(seq);
      if (e.find("::free_sequence") != std::string::npos) book.free_sequence(seq);
      if (e.find("::fork") != std::string::npos) (void)book.fork(seq);
    };
    refuses<InvalidArgument>(
        e, input::kRange, state, [&] { call(9); }, names("seq", "a live sequence id", "9"));
  }
  const char* reserve =
      "kvlab::PagedSequences::reserve(int seq, int n, CopyBlock &&copy_block, const char "
      "*function=\"reserve\")";
  const auto no_copy = [](std::int32_t, std::int32_t, int) {};
  refuses<InvalidArgument>(
      reserve, input::kSize, state, [&] { (void)book.reserve(live, 0, no_copy); },
      names("n", ">= 1", "0"));
  refuses<InvalidArgument>(
      reserve, input::kRange, state, [&] { (void)book.reserve(-4, 1, no_copy); },
      names("seq", "a live sequence id", "-4"));
  refuses<kvlab::OutOfBlocks>(
      reserve, input::kOverflow, state, [&] { (void)book.reserve(empty, 17, no_copy); },
      names("free blocks", "at least 5 for 17 tokens of sequence 1", "4"));
  const char* needed = "kvlab::PagedSequences::blocks_needed(int seq, int n) const";
  refuses<InvalidArgument>(
      needed, input::kSize, state, [&] { (void)book.blocks_needed(live, 0); },
      names("n", ">= 1", "0"));
  const char* needed_batch =
      "kvlab::PagedSequences::blocks_needed(const std::vector< int > &seqs, const std::vector< int "
      "> &tokens) const";
  refuses<InvalidArgument>(
      needed_batch, input::kShape, state,
      [&] {
        (void)book.blocks_needed(std::vector<int>{live}, std::vector<int>{1, 1});
      },
      names("tokens.size()", "1 (seqs.size())", "2"));
  refuses<InvalidArgument>(
      needed_batch, input::kRange, state,
      [&] {
        (void)book.blocks_needed(std::vector<int>{live, 7}, std::vector<int>{1, 1});
      },
      names("seqs[1]", "a live sequence id", "7"));
  const char* truncate = "kvlab::PagedSequences::truncate(int seq, int length)";
  refuses<InvalidArgument>(
      truncate, input::kRange, state, [&] { book.truncate(live, 6); },
      names("length", "in [0, 5]", "6"));
  const char* tables =
      "kvlab::PagedSequences::tables(const std::vector< int > &seqs, int window=0) const";
  refuses<InvalidArgument>(
      tables, input::kState, state,
      [&] {
        (void)book.tables({live, empty});
      },
      names("seqs[1]", "a non-empty sequence", "1 (empty)"));
  refuses<InvalidArgument>(
      tables, input::kEmpty, state, [&] { (void)book.tables({}); },
      names("seqs.size()", ">= 1", "0"));
  const char* add =
      "kvlab::PagedSequences::add_sequence(const std::vector< std::int32_t > &blocks)";
  refuses<InvalidArgument>(
      add, input::kRange, state, [&] { (void)book.add_sequence({-2}); },
      names("blocks[0]", "a block in use in [0, 6)", "-2"));
  for (const std::string e : {"kvlab::PagedSequences::retain(std::int32_t block)",
                              "kvlab::PagedSequences::release(std::int32_t block)"}) {
    const bool retain = e.find("retain") != std::string::npos;
    const auto call = [&](std::int32_t b) {
      if (retain)
        book.retain(b);
      else
        book.release(b);
    };
    refuses<InvalidArgument>(
        e, input::kRange, state, [&] { call(6); }, names("block", "in [0, 6)", "6"));
    refuses<InvalidArgument>(
        e, input::kState, state, [&] { call(5); }, names("block", "a block in use", "5 (free)"));
  }
  const char* front =
      "kvlab::PagedSequences::release_front(int seq, int keep_from, int keep_before=0)";
  refuses<InvalidArgument>(
      front, input::kRange, state, [&] { (void)book.release_front(live, 6); },
      names("keep_from", "in [0, 5]", "6"));
  refuses<InvalidArgument>(
      front, input::kRange, state, [&] { (void)book.release_front(8, 0); },
      names("seq", "a live sequence id", "8"));
  {  // tables without a window, of a sequence whose first block went back out of one
    kvlab::PagedSequences windowed(4, 4, "kvlab::PagedSequences");
    const int seq = windowed.add_sequence();
    (void)windowed.reserve(seq, 6, no_copy);
    (void)windowed.release_front(seq, 4);
    refuses<InvalidArgument>(
        tables, input::kState, [&] { return windowed.blocks(seq); },
        [&] { (void)windowed.tables({seq}); },
        names("seqs[0]", "a sequence that holds all its blocks (window is 0)",
              "0 (its first block went back out of a window)"));
    CHECK(windowed.tables({seq}, 4).indices()[0] == kvlab::kReleasedBlock);
  }
  const char* window =
      "kvlab::PagedSequences::release_out_of_window(int seq, int window, int sinks=0)";
  refuses<InvalidArgument>(
      window, input::kSize, state, [&] { (void)book.release_out_of_window(live, -1); },
      names("window", ">= 0", "-1"));
  refuses<InvalidArgument>(
      window, input::kSize, state, [&] { (void)book.release_out_of_window(live, 2, -1); },
      names("sinks", ">= 0", "-1"));
  refuses<InvalidArgument>(
      window, input::kRange, state, [&] { (void)book.release_out_of_window(8, 2); },
      names("seq", "a live sequence id", "8"));
  const char* check =
      "kvlab::PagedSequences::check_window_truncate(int seq, int length, int window) const";
  refuses<InvalidArgument>(
      check, input::kRange, state, [&] { book.check_window_truncate(8, 0, 2); },
      names("seq", "a live sequence id", "8"));
  refuses<InvalidArgument>(
      check, input::kSize, state, [&] { book.check_window_truncate(live, 0, -2); },
      names("window", ">= 0", "-2"));
}

TEST_CASE("BlockTables::view refuses a head_dim of 0") {
  const kvlab::BlockTables tables({0, 1}, {0}, {1}, kvlab::BlockSize{4}, kvlab::NumBlocks{8});
  std::vector<float> k(64), v(64);
  const char* view =
      "kvlab::BlockTables::view(const T *k, const T *v, int num_kv_heads, int head_dim, KVLayout "
      "layout=KVLayout::NHD) const &";
  refuses<InvalidArgument>(
      view, input::kSize, no_state, [&] { (void)tables.view(k.data(), v.data(), 1, 0); },
      names("head_dim", ">= 1", "0"));
}

TEST_CASE("Refusals that no case had reached: a windowed cache read in order") {
  // Found by scripts/coverage.sh: each check below was written, and no test had ever taken it.
  // A windowed contiguous cache keeps a ring: its rows cannot be read back in order.
  kvlab::Rng rng(5);
  kvlab::ContiguousKVCache<double> ring(1, 1, 4, 8, 4);
  ring.append(0, kvlab::random_matrix<double>(2, 4, rng), kvlab::random_matrix<double>(2, 4, rng));
  refuses<InvalidArgument>(
      "kvlab::ContiguousKVCache::keys(int layer, int kv_head) const", input::kState,
      [&] { return ring.length(0); }, [&] { (void)ring.keys(0, 0); },
      names("window", "0 (a windowed cache keeps its rows in a ring, not in order)", "4"));
}
