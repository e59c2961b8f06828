// The bad-input table: for the public functions of kvlab (the list is
// tests/bad_input/entry_points.txt, checked against the headers by the test bad_input_table),
// each input class that applies — wrong shape, zero or negative size, empty, an index or id out
// of range, a call the object's state does not allow, overflow-sized arguments, values that
// cannot be stored — is tried, and each case asserts kvlab's exception type, a message naming the
// argument with the expected and the actual value, and the object's observable state unchanged
// (compared before and after; bad_input/bad_input.hpp). The docs page "Bad input, entry point by
// entry point" is made from this file's run.
#include <catch2/catch.hpp>

#include <climits>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "bad_input/bad_input.hpp"
#include "gguf_writer.hpp"
#include "kvlab/model/bpe_tokenizer.hpp"
#include "kvlab/model/chat.hpp"
#include "model_writers.hpp"
#include "kvlab/kvlab.hpp"
#include "kvlab/report/state_dot.hpp"

using kvlab::InvalidArgument;
using kvlab::RowMatrix;
using kvlab_test::names;
using kvlab_test::refuses;
namespace input = kvlab_test::input;

namespace {

// --- observable state ---------------------------------------------------------------------

// Free blocks and every block's reference count.
std::vector<int> state_of(const kvlab::BlockAllocator& a) {
  std::vector<int> s{a.num_free()};
  for (std::int32_t b = 0; b < a.num_blocks(); ++b) s.push_back(a.ref_count(b));
  return s;
}

// The pool's sequences (id, length, held blocks, table), then the allocator's state.
std::vector<long> state_of(const kvlab::PagedKVCacheBase& c) {
  std::vector<long> s;
  for (int seq : c.sequences()) {
    s.push_back(seq);
    s.push_back(c.length(seq));
    s.push_back(c.held_blocks(seq));
    for (std::int32_t b : c.blocks(seq)) s.push_back(b);
    s.push_back(-2);
  }
  for (int x : state_of(c.allocator())) s.push_back(x);
  return s;
}

// A paged cache's bookkeeping and every key and value of every live sequence, all layers.
std::vector<double> state_of(const kvlab::PagedKVCache<double>& c) {
  std::vector<double> s;
  for (long x : state_of(static_cast<const kvlab::PagedKVCacheBase&>(c)))
    s.push_back(static_cast<double>(x));
  for (int seq : c.sequences()) {
    if (c.length(seq) == 0) continue;
    const kvlab::BlockTables t = c.tables({seq});
    for (int l = 0; l < c.num_layers(); ++l) {
      const kvlab::PagedKVView<double> view = c.view(l, t);
      for (int pos = 0; pos < view.seq_len(0); ++pos)
        for (int h = 0; h < view.num_kv_heads; ++h)
          for (int d = 0; d < view.head_dim; ++d) {
            s.push_back(view.key(0, pos, h)[d]);
            s.push_back(view.value(0, pos, h)[d]);
          }
    }
  }
  return s;
}

// A contiguous cache's lengths and every stored key and value.
std::vector<double> state_of(const kvlab::ContiguousKVCache<double>& c) {
  std::vector<double> s;
  for (int l = 0; l < c.num_layers(); ++l) {
    s.push_back(c.length(l));
    for (int h = 0; h < c.num_kv_heads(); ++h) {
      const auto k = c.keys(l, h);
      const auto v = c.values(l, h);
      s.insert(s.end(), k.data(), k.data() + k.size());
      s.insert(s.end(), v.data(), v.data() + v.size());
    }
  }
  return s;
}

// Nothing to compare: a constructor or a function of no object.
int no_state() { return 0; }

// A paged cache of 2 layers, 2 K/V heads of 2 values, blocks of 4 tokens, 6 blocks: sequence 0
// holds 5 written tokens (2 blocks), sequence 1 is a fork of it, sequence 2 is empty.
std::unique_ptr<kvlab::PagedKVCache<double>> small_paged_cache() {
  auto c = std::make_unique<kvlab::PagedKVCache<double>>(2, 2, 2, 4, 6);
  const int a = c->add_sequence();
  const std::vector<std::int64_t> slots = c->reserve(a, 5);
  RowMatrix<double> k(5, 4);
  for (Eigen::Index i = 0; i < k.size(); ++i) k.data()[i] = static_cast<double>(i);
  for (int l = 0; l < 2; ++l) c->write(l, slots, k, -k);
  c->fork(a);
  c->add_sequence();
  return c;
}

}  // namespace

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

TEST_CASE("AttentionShape: bad input is refused") {
  const char* three =
      "kvlab::AttentionShape::AttentionShape(int num_heads, int num_kv_heads, int head_dim)";
  refuses<InvalidArgument>(
      three, input::kSize, no_state, [] { kvlab::AttentionShape s(0, 1, 4); },
      names("num_heads", ">= 1", "0"));
  refuses<InvalidArgument>(
      three, input::kSize, no_state, [] { kvlab::AttentionShape s(4, 0, 4); },
      names("num_kv_heads", ">= 1", "0"));
  refuses<InvalidArgument>(
      three, input::kSize, no_state, [] { kvlab::AttentionShape s(4, 2, -8); },
      names("head_dim", ">= 1", "-8"));
  refuses<InvalidArgument>(
      three, input::kShape, no_state, [] { kvlab::AttentionShape s(6, 4, 8); },
      names("num_heads", "a multiple of num_kv_heads (4)", "6"));
  refuses<InvalidArgument>(
      three, input::kOverflow, no_state, [] { kvlab::AttentionShape s(1 << 16, 1, 1 << 16); },
      names("num_heads * head_dim", "at most 2147483647", "4294967296"));
  const char* four =
      "kvlab::AttentionShape::AttentionShape(int num_heads, int num_kv_heads, int head_dim, double "
      "scale)";
  refuses<InvalidArgument>(
      four, input::kValue, no_state, [] { kvlab::AttentionShape s(4, 2, 8, std::nan("")); },
      names("scale", "a finite value > 0", "nan"));
  refuses<InvalidArgument>(
      four, input::kValue, no_state, [] { kvlab::AttentionShape s(4, 2, 8, -1.0); },
      names("scale", "a finite value > 0", "-1"));
  refuses<InvalidArgument>(
      four, input::kSize, no_state, [] { kvlab::AttentionShape s(0, 2, 8, 1.0); },
      names("num_heads", ">= 1", "0"));
}

TEST_CASE("BlockTables: bad arrays and arguments are refused") {
  using V = std::vector<std::int32_t>;
  const char* ctor =
      "kvlab::BlockTables::BlockTables(std::vector< std::int32_t > indptr, std::vector< "
      "std::int32_t > indices, std::vector< std::int32_t > last_page_len, BlockSize block_size, "
      "NumBlocks num_blocks, int window=0)";
  const auto make = [](V indptr, V indices, V last, int block_size, int num_blocks,
                       int window = 0) {
    return [=] { kvlab::BlockTables t(indptr, indices, last, kvlab::BlockSize{block_size},
                              kvlab::NumBlocks{num_blocks}, window); };
  };
  refuses<InvalidArgument>(ctor, input::kValue, no_state, make({0, 1}, {0}, {1}, 4, 4, -3),
                           names("window", ">= 0", "-3"));
  refuses<InvalidArgument>(ctor, input::kState, no_state,
                           make({0, 1}, {kvlab::kReleasedBlock}, {1}, 4, 4),
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
  refuses<InvalidArgument>(ctor, input::kRange, no_state, make({0, 1}, {4}, {1}, 4, 4),
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
        (void)kvlab::BlockTables::from_lists({{0, 1}}, {4}, kvlab::BlockSize{4}, kvlab::NumBlocks{4});
      },
      names("blocks[0].size()", "1 (ceil(lengths[0] / block_size))", "2"));
  refuses<InvalidArgument>(
      from_lists, input::kShape, no_state,
      [] {
        (void)kvlab::BlockTables::from_lists({{0}}, {4, 4}, kvlab::BlockSize{4}, kvlab::NumBlocks{4});
      },
      names("lengths.size()", "1 (blocks.size())", "2"));
  refuses<InvalidArgument>(
      from_lists, input::kSize, no_state,
      [] { (void)kvlab::BlockTables::from_lists({{0}}, {0}, kvlab::BlockSize{4}, kvlab::NumBlocks{4}); },
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
      "block_size, int num_blocks, KVLayout layout=KVLayout::NHD, int window=0)";
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
      input::kRange, saved_state, [&] { cache->save_values(saved, {0, 6}); },
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
      "head_dim, int capacity, int window=0)";
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
  const char* front = "kvlab::PagedSequences::release_front(int seq, int keep_from)";
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
  const char* window = "kvlab::PagedSequences::release_out_of_window(int seq, int window)";
  refuses<InvalidArgument>(
      window, input::kSize, state, [&] { (void)book.release_out_of_window(live, -1); },
      names("window", ">= 0", "-1"));
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

namespace {

// The scheduler's observable state: requests, queues, the pool.
std::vector<long> state_of(const kvlab::Scheduler& s) {
  std::vector<long> out{s.num_requests(),
                        s.unfinished(),
                        s.kept_records(),
                        static_cast<long>(s.waiting().size()),
                        static_cast<long>(s.running().size()),
                        s.promised_blocks(),
                        s.preemptions()};
  for (long x : state_of(s.pool())) out.push_back(x);
  return out;
}

kvlab::Request request_of(std::vector<int> prompt, int max_new_tokens = 4) {
  kvlab::Request r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = max_new_tokens;
  return r;
}

}  // namespace

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
      names("config.policy",
            "static (this class's; make_scheduler builds the class of any policy)", "continuous"));
  refuses<InvalidArgument>(
      "kvlab::ContiguousScheduler::ContiguousScheduler(std::shared_ptr< PagedKVCacheBase > pool, "
      "SchedulerConfig config, int max_tokens, int vocab_size, PrefixCache::HashFunction "
      "hash=PrefixCache::chain_hash)",
      input::kState, no_state,
      [&] { kvlab::ContiguousScheduler s(pool, static_config, 32, 10); },
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
  refuses<InvalidArgument>(
      "kvlab::step_dot(const Engine &engine, const ServingDotOptions &options={})", input::kState,
      engine_state, [&] { (void)kvlab::step_dot(engine); },
      names("engine", "an engine that has run a step", "no step yet"));
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

TEST_CASE("Sampler, Tokenizer, PrefixCache and the name parsers: bad input is refused") {
  const char* ctor =
      "kvlab::Sampler::Sampler(int vocab_size, float temperature, float top_p, std::uint64_t seed)";
  refuses<InvalidArgument>(
      ctor, input::kSize, no_state, [] { kvlab::Sampler s(0, 0.0f, 1.0f, 1); },
      names("vocab_size", ">= 1", "0"));
  refuses<InvalidArgument>(
      ctor, input::kValue, no_state, [] { kvlab::Sampler s(4, std::nanf(""), 1.0f, 1); },
      names("temperature", "a finite value >= 0", "nan"));
  refuses<InvalidArgument>(
      ctor, input::kValue, no_state, [] { kvlab::Sampler s(4, 1.0f, 0.0f, 1); },
      names("top_p", "a value in (0, 1]", "0"));
  refuses<InvalidArgument>(
      ctor, input::kValue, no_state, [] { kvlab::Sampler s(4, 1.0f, 1.5f, 1); },
      names("top_p", "a value in (0, 1]", "1.5"));
  kvlab::Sampler sampler(4, 1.0f, 0.9f, 7);
  const kvlab::RowVector<float> logits = kvlab::RowVector<float>::LinSpaced(4, 0.0f, 1.0f);
  // The state: the token the sampler draws next (a refused call must not have moved its
  // generator).
  const auto next_draw = [&] { return kvlab::Sampler(sampler).sample(logits); };
  refuses<InvalidArgument>(
      "kvlab::Sampler::sample(const RowVector< float > &logits)", input::kShape, next_draw,
      [&] { (void)sampler.sample(kvlab::RowVector<float>::Zero(5)); },
      names("logits.size()", "4 (vocab_size)", "5"));

  const kvlab::Tokenizer tok({"<unk>", "<s>", "</s>", "a", "b", "ab"}, {0, 0, 0, -1, -1, 1});
  const char* tok_ctor =
      "kvlab::Tokenizer::Tokenizer(std::vector< std::string > pieces, std::vector< float > scores)";
  refuses<InvalidArgument>(
      tok_ctor, input::kShape, no_state,
      [] {
        kvlab::Tokenizer t({"<unk>", "<s>", "</s>"}, {0, 0});
      },
      names("scores.size()", "3 (one score per piece)", "2"));
  refuses<InvalidArgument>(
      tok_ctor, input::kSize, no_state,
      [] {
        kvlab::Tokenizer t({"<unk>", "<s>"}, {0, 0});
      },
      names("pieces.size()", "3 to 2^31-1 (ids 0, 1, 2 are <unk>, BOS, EOS)", "2"));
  refuses<InvalidArgument>(
      tok_ctor, input::kEmpty, no_state,
      [] {
        kvlab::Tokenizer t({"<unk>", "<s>", "</s>", ""}, {0, 0, 0, 0});
      },
      names("pieces[3]", "a non-empty string without NUL bytes", "an empty string"));
  refuses<InvalidArgument>(
      tok_ctor, input::kValue, no_state,
      [] {
        kvlab::Tokenizer t({"<unk>", "<s>", "</s>"}, {0, 0, INFINITY});
      },
      names("scores[2]", "a finite number", "inf"));
  const char* tok_ctor3 =
      "kvlab::Tokenizer::Tokenizer(std::vector< std::string > pieces, std::vector< float > scores, "
      "int max_token_length)";
  refuses<InvalidArgument>(
      tok_ctor3, input::kShape, no_state,
      [] {
        kvlab::Tokenizer t({"<unk>", "<s>", "</s>"}, {0, 0, 0}, 3);
      },
      names("max_token_length", ">= 5 (the longest piece)", "3"));
  for (const char* e :
       {"kvlab::Tokenizer::piece(int id) const", "kvlab::Tokenizer::score(int id) const"}) {
    const bool piece = std::string(e).find("piece") != std::string::npos;
    const auto call = [&](int id) {
      if (piece)
        (void)tok.piece(id);
      else
        (void)tok.score(id);
    };
    refuses<InvalidArgument>(
        e, input::kRange, no_state, [&] { call(6); }, names("id", "an id in [0, 6)", "6"));
    refuses<InvalidArgument>(
        e, input::kRange, no_state, [&] { call(-1); }, names("id", "an id in [0, 6)", "-1"));
  }
  refuses<InvalidArgument>(
      "kvlab::Tokenizer::decode(int prev_token, int token) const", input::kRange, no_state,
      [&] { (void)tok.decode(1, 6); }, names("token", "an id in [0, 6)", "6"));
  refuses<InvalidArgument>(
      "kvlab::Tokenizer::decode(int prev_token, int token) const", input::kRange, no_state,
      [&] { (void)tok.decode(-1, 3); }, names("prev_token", "an id in [0, 6)", "-1"));
  refuses<InvalidArgument>(
      "kvlab::Tokenizer::decode(const std::vector< int > &tokens) const override", input::kRange, no_state,
      [&] {
        (void)tok.decode(std::vector<int>{3, 9});
      },
      names("tokens[1]", "an id in [0, 6)", "9"));
  refuses<InvalidArgument>(
      "kvlab::Tokenizer::encode(const std::string &text, bool bos, bool eos) const", input::kValue,
      no_state, [&] { (void)tok.encode("c", false, false); },
      names("byte fallback token of byte 32", "an id below vocab_size 6", "35"));
  refuses<InvalidArgument>(
      "kvlab::Tokenizer::load(const std::string &path)", input::kEmpty, no_state,
      [] { (void)kvlab::Tokenizer::load("/nonexistent/tokenizer.bin"); },
      names("/nonexistent/tokenizer.bin", "an existing, readable tokenizer.bin file",
            "a path that cannot be opened"));
  refuses<InvalidArgument>(
      "kvlab::Tokenizer::load(const std::string &path, int vocab_size)", input::kSize, no_state,
      [] { (void)kvlab::Tokenizer::load("/nonexistent/tokenizer.bin", 2); },
      names("vocab_size", ">= 3 (ids 0, 1, 2 are <unk>, BOS, EOS)", "2"));

  const char* cache_ctor =
      "kvlab::PrefixCache::PrefixCache(int block_size, HashFunction hash=chain_hash)";
  refuses<InvalidArgument>(
      cache_ctor, input::kSize, no_state, [] { kvlab::PrefixCache c(0); },
      names("block_size", ">= 1", "0"));
  refuses<InvalidArgument>(
      cache_ctor, input::kEmpty, no_state, [] { kvlab::PrefixCache c(4, nullptr); },
      names("hash", "a function", "nullptr"));

  refuses<InvalidArgument>(
      "kvlab::parse_kv_dtype(const std::string &name)", input::kValue, no_state,
      [] { (void)kvlab::parse_kv_dtype("fp8"); },
      names("name", "fp32, fp16, bf16, int8 or int4", "'fp8'"));
  refuses<InvalidArgument>(
      "kvlab::parse_batching_policy(const std::string &name)", input::kValue, no_state,
      [] { (void)kvlab::parse_batching_policy(""); },
      names("name", "continuous, static or contiguous", "''"));
  refuses<InvalidArgument>(
      "kvlab::parse_llama_backend(const std::string &name)", input::kValue, no_state,
      [] { (void)kvlab::parse_llama_backend("Paged"); },
      names("name", "naive, cached or paged", "'Paged'"));
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

TEST_CASE("The CPU attention functions refuse wrong shapes and leave the output unchanged") {
  const kvlab::AttentionShape shape(4, 2, 2);  // q width 8, K/V width 4
  kvlab::Rng rng(3);
  const RowMatrix<double> q = kvlab::random_matrix<double>(3, 8, rng);
  const RowMatrix<double> k = kvlab::random_matrix<double>(5, 4, rng), v = k;
  RowMatrix<double> out = RowMatrix<double>::Constant(3, 8, 7.0);
  const auto out_state = [&] { return std::vector<double>(out.data(), out.data() + out.size()); };
  const RowMatrix<double> q_bad = RowMatrix<double>::Zero(3, 6);
  const RowMatrix<double> k_bad = RowMatrix<double>::Zero(5, 5);
  const char* naive_out =
      "kvlab::cpu::naive_attention(const AttentionShape &shape, const Eigen::MatrixBase< Q > &q, "
      "const Eigen::MatrixBase< K > &k, const Eigen::MatrixBase< V > &v, RowMatrix< T > &out, "
      "CostCounters *counters=nullptr, int window=0)";
  refuses<InvalidArgument>(
      naive_out, input::kShape, out_state,
      [&] { kvlab::cpu::naive_attention(shape, q_bad, k, v, out); },
      names("q.cols()", "8 (num_heads * head_dim)", "6"));
  refuses<InvalidArgument>(
      naive_out, input::kShape, out_state,
      [&] { kvlab::cpu::naive_attention(shape, q, k_bad, v, out); },
      names("k.cols()", "4 (num_kv_heads * head_dim)", "5"));
  refuses<InvalidArgument>(
      naive_out, input::kShape, out_state,
      [&] { kvlab::cpu::naive_attention(shape, q, k, RowMatrix<double>(v.topRows(4)), out); },
      names("v.rows()", "5 (k.rows())", "4"));
  refuses<InvalidArgument>(
      naive_out, input::kSize, out_state,
      [&] { kvlab::cpu::naive_attention(shape, q, k, v, out, nullptr, -1); },
      names("window", ">= 0", "-1"));
  const char* naive =
      "kvlab::cpu::naive_attention(const AttentionShape &shape, const Eigen::MatrixBase< Q > &q, "
      "const Eigen::MatrixBase< K > &k, const Eigen::MatrixBase< V > &v, CostCounters "
      "*counters=nullptr, int window=0)";
  refuses<InvalidArgument>(
      naive, input::kShape, no_state,
      [&] {
        (void)kvlab::cpu::naive_attention(shape, q, RowMatrix<double>(k.topRows(2)),
                                          RowMatrix<double>(v.topRows(2)));
      },
      names("k.rows()", ">= q.rows() (3)", "2"));
  const char* ref4 =
      "kvlab::cpu::reference_attention(const AttentionShape &shape, const Eigen::MatrixBase< Q > "
      "&q, const Eigen::MatrixBase< K > &k, const Eigen::MatrixBase< V > &v)";
  refuses<InvalidArgument>(
      ref4, input::kShape, no_state,
      [&] { (void)kvlab::cpu::reference_attention(shape, q_bad, k, v); },
      names("q.cols()", "8 (num_heads * head_dim)", "6"));
  const char* ref6 =
      "kvlab::cpu::reference_attention(const AttentionShape &shape, const Eigen::MatrixBase< Q > "
      "&q, const Eigen::MatrixBase< K > &k, const Eigen::MatrixBase< V > &v, int first_position, "
      "int window=0)";
  refuses<InvalidArgument>(
      ref6, input::kRange, no_state,
      [&] { (void)kvlab::cpu::reference_attention(shape, q, k, v, 3); },
      names("first_position", "in [0, k.rows() - q.rows()] = [0, 2]", "3"));
  refuses<InvalidArgument>(
      ref6, input::kSize, no_state,
      [&] { (void)kvlab::cpu::reference_attention(shape, q, k, v, 2, -3); },
      names("window", ">= 0", "-3"));

  kvlab::ContiguousKVCache<double> cache(1, 2, 2, 8);
  cache.append(0, k, v);
  const RowMatrix<double> q1 = q.topRows(1);
  RowMatrix<double> out1 = RowMatrix<double>::Constant(1, 8, 7.0);
  const auto out1_state = [&] {
    return std::vector<double>(out1.data(), out1.data() + out1.size());
  };
  const char* decode_out =
      "kvlab::cpu::decode_attention(const AttentionShape &shape, const Eigen::MatrixBase< Q > &q, "
      "const ContiguousKVView< S > &cache, RowMatrix< T > &out, CostCounters *counters=nullptr)";
  refuses<InvalidArgument>(
      decode_out, input::kShape, out1_state,
      [&] {
        kvlab::cpu::decode_attention(shape, RowMatrix<double>(q_bad.topRows(1)), cache.view(0),
                                     out1);
      },
      names("q.cols()", "8 (num_heads * head_dim)", "6"));
  refuses<InvalidArgument>(
      decode_out, input::kOverflow, out1_state,
      [&] {
        kvlab::cpu::decode_attention(shape, RowMatrix<double>::Zero(6, 8), cache.view(0), out1);
      },
      names("cache.length", "in [q.rows() (6), cache.capacity (8)]", "5"));
  refuses<InvalidArgument>(
      decode_out, input::kShape, out1_state,
      [&] {
        kvlab::cpu::decode_attention(kvlab::AttentionShape(4, 4, 2), q1, cache.view(0), out1);
      },
      names("cache.num_kv_heads", "4 (shape.num_kv_heads())", "2"));
  const char* decode =
      "kvlab::cpu::decode_attention(const AttentionShape &shape, const Eigen::MatrixBase< Q > &q, "
      "const ContiguousKVView< S > &cache, CostCounters *counters=nullptr)";
  kvlab::ContiguousKVCache<double> empty_cache(1, 2, 2, 8);
  refuses<InvalidArgument>(
      decode, input::kEmpty, no_state,
      [&] { (void)kvlab::cpu::decode_attention(shape, q1, empty_cache.view(0)); },
      names("cache.length", "in [q.rows() (1), cache.capacity (8)]", "0"));

  const auto pool = small_paged_cache();
  const kvlab::BlockTables tables = pool->tables({0, 1});
  const kvlab::PagedKVView<double> view = pool->view(0, tables);
  const RowMatrix<double> q2 = q.topRows(2);
  const char* paged_decode =
      "kvlab::cpu::paged_decode_attention(const AttentionShape &shape, const Eigen::MatrixBase< Q "
      "> &q, const PagedKVView< S > &cache, CostCounters *counters=nullptr)";
  refuses<InvalidArgument>(
      paged_decode, input::kShape, no_state,
      [&] { (void)kvlab::cpu::paged_decode_attention(shape, q, view); },
      names("q.rows()", "2 (cache.batch (one query per sequence))", "3"));
  const char* paged_decode_out =
      "kvlab::cpu::paged_decode_attention(const AttentionShape &shape, const Eigen::MatrixBase< Q "
      "> &q, const PagedKVView< S > &cache, RowMatrix< T > &out, CostCounters *counters=nullptr)";
  RowMatrix<double> out2 = RowMatrix<double>::Constant(2, 8, 7.0);
  const auto out2_state = [&] {
    return std::vector<double>(out2.data(), out2.data() + out2.size());
  };
  refuses<InvalidArgument>(
      paged_decode_out, input::kShape, out2_state,
      [&] {
        kvlab::cpu::paged_decode_attention(shape, RowMatrix<double>(q_bad.topRows(2)), view, out2);
      },
      names("q.cols()", "8 (num_heads * head_dim)", "6"));
  const char* prefill =
      "kvlab::cpu::paged_prefill_attention(const AttentionShape &shape, const Eigen::MatrixBase< "
      "Q > &q, const std::vector< std::int32_t > &qo_indptr, const PagedKVView< S > &cache, "
      "CostCounters *counters=nullptr)";
  refuses<InvalidArgument>(
      prefill, input::kShape, no_state,
      [&] {
        (void)kvlab::cpu::paged_prefill_attention(shape, q, {0, 3}, view);
      },
      names("qo_indptr.size()", "3 (cache.batch + 1)", "2"));
  refuses<InvalidArgument>(
      prefill, input::kShape, no_state,
      [&] {
        (void)kvlab::cpu::paged_prefill_attention(shape, q, {0, 1, 2}, view);
      },
      names("qo_indptr[batch]", "3 (q.rows())", "2"));
  const char* prefill_out =
      "kvlab::cpu::paged_prefill_attention(const AttentionShape &shape, const Eigen::MatrixBase< "
      "Q > &q, const std::vector< std::int32_t > &qo_indptr, const PagedKVView< S > &cache, "
      "RowMatrix< T > &out, CostCounters *counters=nullptr)";
  refuses<InvalidArgument>(
      prefill_out, input::kRange, out_state,
      [&] {
        kvlab::cpu::paged_prefill_attention(shape, q, {0, 4, 3}, view, out);
      },
      names("qo_indptr[2]", "in [qo_indptr[1] (4), that + the sequence's length (5)]", "3"));
}

TEST_CASE("LlamaConfig setters, the model and the decoders refuse bad sizes") {
  const auto weights = std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin());
  const char* model_ctor =
      "kvlab::LlamaModel::LlamaModel(std::shared_ptr< const LlamaWeights > weights, LlamaBackend "
      "backend, int block_size=16, int max_tokens=0, KVDtype kv_dtype=KVDtype::fp32, int window=0)";
  refuses<InvalidArgument>(
      model_ctor, input::kEmpty, no_state,
      [] { kvlab::LlamaModel m(nullptr, kvlab::LlamaBackend::Cached); },
      names("weights", "non-null weights", "nullptr"));
  refuses<InvalidArgument>(
      model_ctor, input::kRange, no_state,
      [&] { kvlab::LlamaModel m(weights, kvlab::LlamaBackend::Cached, 16, 513); },
      names("max_tokens", "in [0, seq_len (512)]", "513"));
  refuses<InvalidArgument>(
      model_ctor, input::kSize, no_state,
      [&] { kvlab::LlamaModel m(weights, kvlab::LlamaBackend::Paged, 0); },
      names("block_size", ">= 1", "0"));
  kvlab::LlamaModel model(weights, kvlab::LlamaBackend::Cached, 16, 8);
  model.prefill({1, 2, 3});
  const auto model_state = [&] { return model.tokens(); };
  refuses<InvalidArgument>(
      "kvlab::LlamaModel::decode(int token)", input::kRange, model_state,
      [&] { (void)model.decode(256); }, names("token", "an id in [0, 256)", "256"));
  kvlab::LlamaModel full(weights, kvlab::LlamaBackend::Cached, 16, 3);
  full.prefill({1, 2, 3});
  refuses<kvlab::CapacityError>(
      "kvlab::LlamaModel::decode(int token)", input::kOverflow, [&] { return full.tokens(); },
      [&] { (void)full.decode(4); },
      names("position()", "below max_tokens (3): a position for the token", "3"));
  refuses<InvalidArgument>(
      "kvlab::LlamaModel::forward(const std::vector< int > &tokens)", input::kEmpty, model_state,
      [&] { (void)model.forward({}); }, names("tokens.size()", ">= 1", "0"));
  refuses<kvlab::CapacityError>(
      "kvlab::LlamaModel::forward(const std::vector< int > &tokens)", input::kOverflow, model_state,
      [&] {
        (void)model.forward({1, 2, 3, 4, 5, 6});
      },
      names("tokens.size()", "at most 5 (max_tokens 8, position 3)", "6"));
  refuses<InvalidArgument>(
      "kvlab::LlamaModel::prefill(const std::vector< int > &tokens)", input::kRange, model_state,
      [&] { (void)model.prefill({-1}); }, names("tokens[0]", "an id in [0, 256)", "-1"));

  const auto stack = kvlab::AttentionStack<double>::random(1, kvlab::AttentionShape(2, 1, 4), 8, 5);
  refuses<InvalidArgument>(
      "kvlab::CachedDecoder::CachedDecoder(std::shared_ptr< const AttentionStack< T > > stack, int "
      "capacity, int window=0)",
      input::kSize, no_state, [&] { kvlab::CachedDecoder<double> d(stack, 0); },
      names("capacity", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::NaiveDecoder::NaiveDecoder(std::shared_ptr< const AttentionStack< T > > stack, int "
      "window=0)",
      input::kEmpty, no_state, [] { kvlab::NaiveDecoder<double> d(nullptr); },
      names("stack", "a non-null stack", "nullptr"));
  refuses<InvalidArgument>(
      "kvlab::PagedDecoder::PagedDecoder(std::shared_ptr< const AttentionStack< T > > stack, int "
      "block_size, int num_blocks, KVLayout layout=KVLayout::NHD, int window=0)",
      input::kSize, no_state, [&] { kvlab::PagedDecoder<double> d(stack, 4, 0); },
      names("num_blocks", ">= 1", "0"));
  kvlab::CachedDecoder<double> decoder(stack, 4);
  decoder.prefill(RowMatrix<double>::Ones(2, 8));
  const auto decoder_state = [&] { return decoder.position(); };
  refuses<InvalidArgument>(
      "kvlab::Decoder::decode(const RowVector< T > &x)", input::kShape, decoder_state,
      [&] { (void)decoder.decode(kvlab::RowVector<double>::Ones(7)); },
      names("x.cols()", "8 (d_model)", "7"));
  refuses<kvlab::CapacityError>(
      "kvlab::Decoder::prefill(const RowMatrix< T > &x)", input::kOverflow, decoder_state,
      [&] { (void)decoder.prefill(RowMatrix<double>::Ones(3, 8)); },
      names("new tokens of sequence 0", "at most 2 (capacity 4, length 2)", "3"));
  refuses<InvalidArgument>(
      "kvlab::Decoder::rewind(int position)", input::kRange, decoder_state,
      [&] { decoder.rewind(3); }, names("position", "in [0, 2]", "3"));
}

TEST_CASE(
    "The analysis functions, the stores, RoPE, the loaders and the workload refuse bad input") {
  refuses<InvalidArgument>(
      "kvlab::blocks_needed(std::int64_t tokens, int block_size)", input::kSize, no_state,
      [] { (void)kvlab::blocks_needed(-1, 16); }, names("tokens", ">= 0", "-1"));
  refuses<InvalidArgument>(
      "kvlab::blocks_needed(std::int64_t tokens, int block_size)", input::kSize, no_state,
      [] { (void)kvlab::blocks_needed(5, 0); }, names("block_size", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::max_contiguous_sequences(std::uint64_t budget_bytes, std::int64_t max_len, "
      "std::uint64_t bytes_per_token)",
      input::kSize, no_state, [] { (void)kvlab::max_contiguous_sequences(1024, 0, 4); },
      names("max_len", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::blocks_in_budget(std::uint64_t budget_bytes, int block_size, std::uint64_t "
      "bytes_per_token)",
      input::kSize, no_state, [] { (void)kvlab::blocks_in_budget(1024, 16, 0); },
      names("bytes_per_token", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::paged_footprint(const std::vector< std::int64_t > &lengths, int block_size, "
      "std::uint64_t bytes_per_token)",
      input::kSize, no_state,
      [] {
        (void)kvlab::paged_footprint({3, -2}, 16, 4);
      },
      names("lengths[1]", ">= 0", "-2"));
  refuses<InvalidArgument>(
      "kvlab::contiguous_footprint(const std::vector< std::int64_t > &lengths, std::int64_t "
      "max_len, std::uint64_t bytes_per_token)",
      input::kRange, no_state,
      [] {
        (void)kvlab::contiguous_footprint({3, 9}, 8, 4);
      },
      names("lengths[1]", "in [0, max_len (8)]", "9"));
  refuses<InvalidArgument>(
      "kvlab::max_paged_sequences(const std::vector< std::int64_t > &lengths, int block_size, "
      "std::uint64_t bytes_per_token, std::uint64_t budget_bytes)",
      input::kSize, no_state, [] { (void)kvlab::max_paged_sequences({3}, 0, 4, 1024); },
      names("block_size", ">= 1", "0"));
  const kvlab::ModelConfig model = kvlab::to_model_config(kvlab::LlamaConfig::tiny());
  refuses<InvalidArgument>(
      "kvlab::kv_cache_bytes(const ModelConfig &config, std::int64_t tokens, std::int64_t batch, "
      "KVDtype dtype, std::int64_t window=0)",
      input::kSize, no_state,
      [&] { (void)kvlab::kv_cache_bytes(model, -1, 1, kvlab::KVDtype::fp32); },
      names("tokens", ">= 0", "-1"));
  refuses<InvalidArgument>(
      "kvlab::kv_cache_bytes(const ModelConfig &config, std::int64_t tokens, std::int64_t batch, "
      "KVDtype dtype, std::int64_t window=0)",
      input::kOverflow, no_state,
      [&] { (void)kvlab::kv_cache_bytes(model, INT64_MAX, INT64_MAX, kvlab::KVDtype::fp32); },
      names("tokens", "at most 48038396025285290 (so that the size fits in std::uint64_t)",
            "9223372036854775807"));

  const char* contiguous =
      "kvlab::ContiguousStore::ContiguousStore(int num_layers, int num_kv_heads, int head_dim, int "
      "capacity, int window=0)";
  refuses<InvalidArgument>(
      contiguous, input::kSize, no_state, [] { kvlab::ContiguousStore<double> s(1, 1, 2, 0); },
      names("capacity", ">= 1", "0"));
  const char* paged =
      "kvlab::PagedStore::PagedStore(int num_layers, int num_kv_heads, int head_dim, int "
      "block_size, int num_blocks, KVLayout layout=KVLayout::NHD, int window=0)";
  refuses<InvalidArgument>(
      paged, input::kSize, no_state, [] { kvlab::PagedStore<double> s(1, 1, 2, 4, 0); },
      names("num_blocks", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::PagedStore::PagedStore(std::shared_ptr< PagedKVCache< T, S > > pool)", input::kEmpty,
      no_state, [] { kvlab::PagedStore<double> s(nullptr); },
      names("pool", "a non-null pool", "nullptr"));
  const char* recompute =
      "kvlab::RecomputeStore::RecomputeStore(int num_layers, int num_kv_heads, int head_dim, int "
      "input_width, int window=0)";
  refuses<InvalidArgument>(
      recompute, input::kSize, no_state, [] { kvlab::RecomputeStore<double> s(1, 1, 2, 0); },
      names("input_width", ">= 1", "0"));
  kvlab::ContiguousStore<double> store(1, 1, 2, 8);
  const int seq = store.add_sequence();
  const auto store_state = [&] { return store.sequences(); };
  refuses<InvalidArgument>(
      "kvlab::ContiguousStore::cache(int seq) const", input::kRange, store_state,
      [&] { (void)store.cache(seq + 1); },
      names("seq", "a live sequence id", std::to_string(seq + 1)));
  for (const char* e : {"kvlab::KVStore::length(int seq) const", "kvlab::KVStore::fork(int seq)",
                        "kvlab::KVStore::free_sequence(int seq)"}) {
    const std::string name = e;
    kvlab::KVStore<double>& base = store;
    const auto call = [&](int s) {
      if (name.find("::length") != std::string::npos) (void)base.length(s);
      if (name.find("::fork") != std::string::npos) (void)base.fork(s);
      if (name.find("::free_sequence") != std::string::npos) base.free_sequence(s);
    };
    refuses<InvalidArgument>(
        e, input::kRange, store_state, [&] { call(7); }, names("seq", "a live sequence id", "7"));
  }
  refuses<InvalidArgument>(
      "kvlab::KVStore::truncate(int seq, int length)", input::kRange, store_state,
      [&] { store.truncate(seq, 1); }, names("length", "in [0, 0]", "1"));
  refuses<InvalidArgument>(
      "kvlab::KVStore::append(int layer, const RowMatrix< T > &k, const RowMatrix< T > &v)",
      input::kState, store_state,
      [&] { store.append(0, RowMatrix<double>::Zero(1, 2), RowMatrix<double>::Zero(1, 2)); },
      names("step", "a step open (begin_step first)", "none"));

  const char* rope =
      "kvlab::RotaryEmbedding::RotaryEmbedding(int head_dim, int max_positions, float "
      "base=10000.0f)";
  refuses<InvalidArgument>(
      rope, input::kShape, no_state, [] { kvlab::RotaryEmbedding r(3, 8); },
      names("head_dim", "an even number", "3"));
  refuses<InvalidArgument>(
      rope, input::kSize, no_state, [] { kvlab::RotaryEmbedding r(4, 0); },
      names("max_positions", ">= 1", "0"));
  refuses<InvalidArgument>(
      rope, input::kValue, no_state, [] { kvlab::RotaryEmbedding r(4, 8, 1.0f); },
      names("base", "a finite number > 1", "1"));
  const kvlab::RotaryEmbedding r(4, 8);
  RowMatrix<float> x = RowMatrix<float>::Ones(2, 8);
  const auto x_state = [&] { return std::vector<float>(x.data(), x.data() + x.size()); };
  refuses<InvalidArgument>(
      "kvlab::RotaryEmbedding::apply(Eigen::Ref< RowMatrix< float > > x, int first_position) const",
      input::kRange, x_state, [&] { r.apply(x, 7); },
      names("first_position", "positions within [0, 8)", "7 + 2 rows"));
  RowMatrix<double> xd = RowMatrix<double>::Ones(2, 6);
  const auto xd_state = [&] { return std::vector<double>(xd.data(), xd.data() + xd.size()); };
  refuses<InvalidArgument>(
      "kvlab::RotaryEmbedding::apply(Eigen::Ref< RowMatrix< double > > x, int first_position) "
      "const",
      input::kShape, xd_state, [&] { r.apply(xd, 0); },
      names("x.cols()", "a multiple of head_dim (4)", "6"));

  refuses<InvalidArgument>(
      "kvlab::load_llama_checkpoint(const std::string &path)", input::kEmpty, no_state,
      [] { (void)kvlab::load_llama_checkpoint("/nonexistent/model.bin"); },
      names("/nonexistent/model.bin", "an existing, readable llama2.c checkpoint",
            "a path that cannot be opened"));
  refuses<InvalidArgument>(
      "kvlab::read_llama_config(const std::string &path)", input::kEmpty, no_state,
      [] { (void)kvlab::read_llama_config(""); },
      names("path", "the name of a llama2.c checkpoint", "''"));
  refuses<InvalidArgument>(
      "kvlab::Tokenizer::load(const std::string &path)", input::kEmpty, no_state,
      [] { (void)kvlab::Tokenizer::load(""); },
      names("path", "the name of a tokenizer.bin file", "''"));
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

  const float probs[3] = {0.2f, 0.3f, 0.5f};
  refuses<InvalidArgument>(
      "kvlab::sample_argmax(const float *values, int n)", input::kSize, no_state,
      [&] { (void)kvlab::sample_argmax(probs, 0); }, names("n", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::sample_mult(const float *probs, int n, float coin)", input::kSize, no_state,
      [&] { (void)kvlab::sample_mult(probs, -1, 0.5f); }, names("n", ">= 1", "-1"));
  std::vector<kvlab::ProbIndex> scratch;
  // n from a volatile: with a constant 0, GCC follows the inlined call past its check and warns
  // about the read of element -1 that the check prevents (-Warray-bounds).
  volatile int zero = 0;
  refuses<InvalidArgument>(
      "kvlab::sample_topp(const float *probs, int n, float top_p, float coin, std::vector< "
      "ProbIndex > &scratch)",
      input::kSize, no_state, [&] { (void)kvlab::sample_topp(probs, zero, 0.9f, 0.5f, scratch); },
      names("n", ">= 1", "0"));
}

TEST_CASE("More of the library: layers, weights, stores, the model's batch, generation, planning") {
  const kvlab::AttentionShape shape(2, 1, 4);
  refuses<InvalidArgument>(
      "kvlab::AttentionLayer::AttentionLayer(const AttentionShape &shape, int d_model, RowMatrix< "
      "T > wq, RowMatrix< T > wk, RowMatrix< T > wv, RowMatrix< T > wo)",
      input::kShape, no_state,
      [&] {
        kvlab::AttentionLayer<double> l(
            shape, 8, RowMatrix<double>::Zero(8, 7), RowMatrix<double>::Zero(8, 4),
            RowMatrix<double>::Zero(8, 4), RowMatrix<double>::Zero(8, 8));
      },
      names("wq shape", "[8, 8]", "[8, 7]"));
  kvlab::Rng rng(1);
  refuses<InvalidArgument>(
      "kvlab::AttentionLayer::random(const AttentionShape &shape, int d_model, Rng &rng)",
      input::kSize, no_state, [&] { (void)kvlab::AttentionLayer<double>::random(shape, 0, rng); },
      names("d_model", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::AttentionStack::AttentionStack(std::vector< AttentionLayer< T > > layers)",
      input::kEmpty, no_state,
      [] { kvlab::AttentionStack<double> s(std::vector<kvlab::AttentionLayer<double>>{}); },
      names("layers.size()", ">= 1", "0"));
  const auto stack = kvlab::AttentionStack<double>::random(1, shape, 8, 1);
  refuses<InvalidArgument>(
      "kvlab::AttentionStack::layer(int l) const", input::kRange, no_state,
      [&] { (void)stack->layer(5); }, names("l", "in [0, 1)", "5"));
  refuses<InvalidArgument>(
      "kvlab::AttentionStack::random(int num_layers, const AttentionShape &shape, int d_model, "
      "std::uint64_t seed)",
      input::kSize, no_state, [&] { (void)kvlab::AttentionStack<double>::random(0, shape, 8, 1); },
      names("num_layers", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::LlamaWeights::zeros(const LlamaConfig &config)", input::kSize, no_state,
      [] { (void)kvlab::LlamaWeights::zeros(kvlab::LlamaConfig::tiny().with_dim(0)); },
      names("dim", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::LlamaWeights::random(const LlamaConfig &config, std::uint64_t seed)", input::kShape,
      no_state,
      [] { (void)kvlab::LlamaWeights::random(kvlab::LlamaConfig::tiny().with_heads(6, 4), 1); },
      names("n_heads", "a multiple of n_kv_heads (4)", "6"));
  refuses<InvalidArgument>(
      "kvlab::LlamaWeights::builtin(const LlamaConfig &config=LlamaConfig::tiny())", input::kSize,
      no_state,
      [] { (void)kvlab::LlamaWeights::builtin(kvlab::LlamaConfig::tiny().with_vocab_size(0)); },
      names("vocab_size", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::LlamaWeights::check(const char *where=\"kvlab::LlamaWeights::check\") const",
      input::kShape, no_state,
      [] {
        kvlab::LlamaWeights w = kvlab::LlamaWeights::builtin();
        w.token_embedding.resize(3, 3);
        w.check();
      },
      names("token_embedding shape", "[256, 48]", "[3, 3]"));
  refuses<InvalidArgument>(
      "kvlab::LlamaConfig::validate(const char *where, const std::string &prefix=\"\") const",
      input::kSize, no_state, [] { kvlab::LlamaConfig::tiny().with_layers(0).validate("here"); },
      names("n_layers", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::LlamaConfig::num_parameters(const char "
      "*where=\"kvlab::LlamaConfig::num_parameters\", const std::string &prefix=\"\") const",
      input::kOverflow, no_state,
      [] {
        (void)kvlab::LlamaConfig::tiny()
            .with_dim(1 << 30)
            .with_hidden_dim(1 << 30)
            .with_vocab_size(1 << 30)
            .num_parameters();
      },
      names("n_layers", "at most 1 (so that the size fits in std::int64_t)", "3"));
  refuses<InvalidArgument>(
      "kvlab::make_llama_store(LlamaBackend backend, const LlamaConfig &config, int max_tokens, "
      "int block_size=16, int sequences=1, KVDtype dtype=KVDtype::fp32, int window=0)",
      input::kSize, no_state,
      [] {
        (void)kvlab::make_llama_store(kvlab::LlamaBackend::Paged, kvlab::LlamaConfig::tiny(), 16,
                                      0);
      },
      names("block_size", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::cpu::softmax_inplace(T *row, Eigen::Index n)", input::kSize, no_state,
      [] {
        float r[1] = {0};
        kvlab::cpu::softmax_inplace(r, 0);
      },
      names("n", ">= 1", "0"));
  RowMatrix<float> x = RowMatrix<float>::Ones(2, 4), out = RowMatrix<float>::Constant(2, 4, 7.0f);
  const auto out_state = [&] { return std::vector<float>(out.data(), out.data() + out.size()); };
  refuses<InvalidArgument>(
      "kvlab::cpu::rmsnorm(const RowMatrix< T > &x, const RowVector< T > &weight, RowMatrix< T > "
      "&out, T eps=T(1e-5f))",
      input::kShape, out_state,
      [&] {
        kvlab::cpu::rmsnorm(x, kvlab::RowVector<float>(kvlab::RowVector<float>::Ones(3)), out);
      },
      names("weight.size()", "4 (x.cols())", "3"));
  refuses<InvalidArgument>(
      "kvlab::cpu::linear(const RowMatrix< T > &x, const RowMatrix< T > &w, RowMatrix< T > &out)",
      input::kShape, out_state,
      [&] { kvlab::cpu::linear(x, RowMatrix<float>(RowMatrix<float>::Ones(3, 3)), out); },
      names("x.cols()", "3 (w.cols())", "4"));
  for (const char* e :
       {"kvlab::dtype_name(KVDtype dtype)", "kvlab::bits_per_element(KVDtype dtype)"}) {
    const bool name = std::string(e).find("dtype_name") != std::string::npos;
    refuses<InvalidArgument>(
        e, input::kValue, no_state,
        [&] {
          const auto bad = static_cast<kvlab::KVDtype>(9);
          if (name)
            (void)kvlab::dtype_name(bad);
          else
            (void)kvlab::bits_per_element(bad);
        },
        names("dtype", "one of fp32, fp16, bf16, int8, int4", "9"));
  }
  refuses<InvalidArgument>(
      "kvlab::stored_bits_per_value(KVDtype dtype)", input::kValue, no_state,
      [] { (void)kvlab::stored_bits_per_value(static_cast<kvlab::KVDtype>(9)); },
      names("dtype", "one of fp32, fp16, bf16, int8, int4", "9"));
  refuses<InvalidArgument>(
      "kvlab::visit_kv_dtype(KVDtype dtype, F &&f)", input::kValue, no_state,
      [] { kvlab::visit_kv_dtype(static_cast<kvlab::KVDtype>(9), [](auto) {}); },
      names("dtype", "fp32, fp16, bf16, int8 or int4", "9"));
  const kvlab::ModelConfig model_config = kvlab::to_model_config(kvlab::LlamaConfig::tiny());
  refuses<InvalidArgument>(
      "kvlab::bytes_per_token(const ModelConfig &config, KVDtype dtype)", input::kValue, no_state,
      [&] { (void)kvlab::bytes_per_token(model_config, static_cast<kvlab::KVDtype>(9)); },
      names("dtype", "one of fp32, fp16, bf16, int8, int4", "9"));
  refuses<InvalidArgument>(
      "kvlab::stored_bytes_per_token(const ModelConfig &config, KVDtype dtype)", input::kShape,
      no_state, [&] { (void)kvlab::stored_bytes_per_token(model_config, kvlab::KVDtype::int8); },
      names("config.head_dim", "a multiple of 32 (the values of one int8 block)", "8"));
  refuses<InvalidArgument>(
      "kvlab::random_matrix(Eigen::Index rows, Eigen::Index cols, Rng &rng, double lo=-1.0, double "
      "hi=1.0)",
      input::kSize, no_state, [&] { (void)kvlab::random_matrix<float>(-1, 2, rng); },
      names("rows", ">= 0", "-1"));

  const auto weights = std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin());
  const char* store_ctor =
      "kvlab::LlamaModel::LlamaModel(std::shared_ptr< const LlamaWeights > weights, "
      "std::shared_ptr< KVStore< float > > store, int max_tokens=0)";
  refuses<InvalidArgument>(
      store_ctor, input::kEmpty, no_state,
      [&] { kvlab::LlamaModel m(weights, std::shared_ptr<kvlab::KVStore<float>>()); },
      names("store", "a non-null store", "nullptr"));
  refuses<InvalidArgument>(
      store_ctor, input::kShape, no_state,
      [&] {
        kvlab::LlamaModel m(weights, std::make_shared<kvlab::ContiguousStore<float>>(1, 1, 8, 16));
      },
      names("store->num_layers()", "3 (n_layers)", "1"));
  auto store = std::make_shared<kvlab::PagedStore<float>>(3, 2, 8, 4, 16);
  kvlab::LlamaModel batched(weights, store);
  const int s = store->add_sequence();
  const auto store_state = [&] { return state_of(*store->paged_pool()); };
  const char* batch =
      "kvlab::LlamaModel::forward_batch(const std::vector< SequenceChunk > &batch, bool "
      "every_token=false)";
  refuses<InvalidArgument>(
      batch, input::kEmpty, store_state, [&] { (void)batched.forward_batch({}); },
      names("batch.size()", ">= 1", "0"));
  refuses<InvalidArgument>(
      batch, input::kRange, store_state,
      [&] {
        (void)batched.forward_batch({kvlab::SequenceChunk{s + 5, {1}}});
      },
      names("batch[0].seq", "a live sequence of the store", std::to_string(s + 5)));
  refuses<InvalidArgument>(
      batch, input::kRange, store_state,
      [&] {
        (void)batched.forward_batch({kvlab::SequenceChunk{s, {999}}});
      },
      names("batch[0].tokens[0]", "an id in [0, 256)", "999"));
  kvlab::LlamaModel model(weights, kvlab::LlamaBackend::Cached, 16, 16);
  kvlab::Sampler sampler(256, 0.0f, 1.0f, 1);
  const auto model_state = [&] { return model.tokens(); };
  const char* generate =
      "kvlab::generate(LlamaModel &model, Sampler &sampler, const std::vector< int > &prompt, int "
      "steps, const std::function< void(int)> &on_token=nullptr, int stop_token=-1)";
  refuses<InvalidArgument>(
      generate, input::kEmpty, model_state, [&] { (void)kvlab::generate(model, sampler, {}, 4); },
      names("prompt.size()", ">= 1", "0"));
  refuses<InvalidArgument>(
      generate, input::kSize, model_state, [&] { (void)kvlab::generate(model, sampler, {1}, -1); },
      names("steps", ">= 1", "-1"));
  refuses<InvalidArgument>(
      generate, input::kRange, model_state,
      [&] { (void)kvlab::generate(model, sampler, {1}, 2, nullptr, 999); },
      names("stop_token", "-1 (none) or an id in [0, 256)", "999"));
  const char* paged_decoder =
      "kvlab::PagedDecoder::PagedDecoder(std::shared_ptr< const AttentionStack< T > > stack, "
      "std::shared_ptr< PagedKVCache< T, S > > pool)";
  refuses<InvalidArgument>(
      paged_decoder, input::kEmpty, no_state,
      [&] { kvlab::PagedDecoder<double> d(stack, std::shared_ptr<kvlab::PagedKVCache<double>>()); },
      names("pool", "a non-null pool", "nullptr"));
  refuses<InvalidArgument>(
      paged_decoder, input::kShape, no_state,
      [&] {
        kvlab::PagedDecoder<double> d(stack,
                                      std::make_shared<kvlab::PagedKVCache<double>>(2, 1, 4, 4, 8));
      },
      names("pool->num_layers()", "1 (stack's num_layers)", "2"));
  kvlab::RecomputeStore<double> recompute(1, 1, 4, 8);
  refuses<InvalidArgument>(
      "kvlab::RecomputeStore::inputs(int seq) const", input::kRange, no_state,
      [&] { (void)recompute.inputs(9); }, names("seq", "a live sequence id", "9"));
  auto pool = std::make_shared<kvlab::PagedKVCache<float>>(1, 1, 2, 4, 8);
  kvlab::Scheduler scheduler(pool, kvlab::SchedulerConfig{}, 32, 10);
  const auto scheduler_state = [&] { return state_of(scheduler); };
  refuses<InvalidArgument>(
      "kvlab::Scheduler::schedule(double now)", input::kValue, scheduler_state,
      [&] { (void)scheduler.schedule(std::nan("")); }, names("now", "a finite time", "nan"));
  refuses<InvalidArgument>(
      "kvlab::paged_cache_footprint(const PagedKVCacheBase &cache, std::uint64_t bytes_per_token)",
      input::kSize, no_state, [&] { (void)kvlab::paged_cache_footprint(*pool, 0); },
      names("bytes_per_token", ">= 1", "0"));
  const kvlab::BlockTables tables({0, 1}, {0}, {1}, kvlab::BlockSize{4}, kvlab::NumBlocks{8});
  std::vector<float> k(64), v(64);
  const char* view =
      "kvlab::BlockTables::view(const T *k, const T *v, int num_kv_heads, int head_dim, KVLayout "
      "layout=KVLayout::NHD) const &";
  refuses<InvalidArgument>(
      view, input::kSize, no_state, [&] { (void)tables.view(k.data(), v.data(), 1, 0); },
      names("head_dim", ">= 1", "0"));
  const kvlab::PagedKVView<float> pool_view = tables.view(k.data(), v.data(), 1, 2);
  const std::int32_t qo[2] = {0, 1};
  refuses<InvalidArgument>(
      "kvlab::cpu::plan_paged_attention(const AttentionShape &shape, const PagedKVView< T > "
      "&cache, const std::int32_t *qo_indptr, int threads)",
      input::kSize, no_state,
      [&] {
        (void)kvlab::cpu::plan_paged_attention(kvlab::AttentionShape(1, 1, 2), pool_view, qo, 0);
      },
      names("threads", ">= 1", "0"));
  kvlab::ContiguousStore<double> cs(1, 1, 2, 8);
  const int cseq = cs.add_sequence();
  RowMatrix<double> inputs, attn;
  const auto cs_state = [&] { return cs.length(cseq); };
  refuses<InvalidArgument>(
      "kvlab::KVStore::begin_step(const std::vector< int > &seqs, const std::vector< std::int32_t "
      "> &new_indptr, const RowMatrix< T > &new_inputs, RowMatrix< T > &inputs, const char "
      "*caller=nullptr)",
      input::kShape, cs_state,
      [&] {
        cs.begin_step({cseq}, {0, 2}, RowMatrix<double>::Zero(1, 2), inputs, nullptr);
      },
      names("new_inputs.rows()", "2 (new_indptr[batch])", "1"));
  refuses<InvalidArgument>(
      "kvlab::KVStore::attend(int layer, const AttentionShape &shape, const RowMatrix< T > &q, "
      "const std::vector< std::int32_t > &q_indptr, RowMatrix< T > &out, CostCounters *counters)",
      input::kState, cs_state,
      [&] {
        cs.attend(0, kvlab::AttentionShape(1, 1, 2), RowMatrix<double>::Zero(1, 2), {0, 1}, attn,
                  nullptr);
      },
      names("step", "a step open (begin_step first)", "none"));
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

TEST_CASE("The model's steps, the random numbers and the reports refuse bad input") {
  // A layer of 1 head of 2 values over d_model 4, and a contiguous store with one step open:
  // one sequence adding 2 tokens.
  const kvlab::AttentionShape shape(1, 1, 2);
  const auto stack = kvlab::AttentionStack<double>::random(1, shape, 4, 1);
  const kvlab::AttentionLayer<double>& layer = stack->layer(0);
  const RowMatrix<double> x = RowMatrix<double>::Ones(2, 4);
  const RowMatrix<double> narrow = RowMatrix<double>::Ones(2, 3);
  RowMatrix<double> k = RowMatrix<double>::Constant(1, 2, 5.0), v = k;
  const auto kv_state = [&] { return std::vector<double>{k(0, 0), v(0, 0), double(k.rows())}; };
  refuses<InvalidArgument>(
      "kvlab::AttentionLayer::project_q(const RowMatrix< T > &x, CostCounters "
      "*counters=nullptr) const",
      input::kShape, no_state, [&] { (void)layer.project_q(narrow); },
      names("x.cols()", "4 (d_model)", "3"));
  const char* project_kv =
      "kvlab::AttentionLayer::project_kv(const RowMatrix< T > &x, RowMatrix< T > &k, RowMatrix< T "
      "> &v, CostCounters *counters=nullptr) const";
  refuses<InvalidArgument>(
      project_kv, input::kShape, kv_state, [&] { layer.project_kv(narrow, k, v); },
      names("x.cols()", "4 (d_model)", "3"));
  refuses<InvalidArgument>(
      project_kv, input::kState, kv_state, [&] { layer.project_kv(x, k, k); },
      names("k, v", "two matrices distinct from x and each other", "an alias"));
  refuses<InvalidArgument>(
      "kvlab::AttentionLayer::project_out(const RowMatrix< T > &attn, CostCounters "
      "*counters=nullptr) const",
      input::kShape, no_state, [&] { (void)layer.project_out(narrow); },
      names("attn.cols()", "2 (num_heads * head_dim)", "3"));
  refuses<InvalidArgument>(
      "kvlab::Decoder::Decoder(std::shared_ptr< const AttentionStack< T > > stack)", input::kEmpty,
      no_state, [] { kvlab::CachedDecoder<double> d(nullptr, 8); },
      names("stack", "a non-null stack", "nullptr"));

  // run_stack: a store of the wrong depth, inputs of the wrong width.
  const char* run_stack =
      "kvlab::run_stack(const AttentionStack< T > &stack, KVStore< T > &store, const std::vector< "
      "int > &seqs, const std::vector< std::int32_t > &x_indptr, const RowMatrix< T > &x, "
      "CostCounters *counters=nullptr, const char *caller=\"kvlab::run_stack\")";
  kvlab::ContiguousStore<double> deep(2, 1, 2, 8);
  const int deep_seq = deep.add_sequence();
  refuses<InvalidArgument>(
      run_stack, input::kShape, [&] { return deep.length(deep_seq); },
      [&] {
        (void)kvlab::run_stack(*stack, deep, {deep_seq}, {0, 2}, x);
      },
      names("store.num_layers()", "1 (the stack's num_layers)", "2"));
  kvlab::ContiguousStore<double> store(1, 1, 2, 8);
  const int seq = store.add_sequence();
  refuses<InvalidArgument>(
      run_stack, input::kShape, [&] { return store.length(seq); },
      [&] {
        (void)kvlab::run_stack(*stack, store, {seq}, {0, 2}, narrow);
      },
      names("x.cols()", "4 (d_model)", "3"));

  // attention_step with a step open, and new_token_rows.
  RowMatrix<double> inputs;
  const kvlab::StepBatch& batch = store.begin_step({seq}, {0, 2}, x, inputs, nullptr);
  RowMatrix<double> out = RowMatrix<double>::Constant(1, 4, 7.0);
  const auto out_state = [&] {
    std::vector<double> s(out.data(), out.data() + out.size());
    s.push_back(store.length(seq));
    return s;
  };
  kvlab::StepScratch<double> scratch;
  kvlab::CostCounters counters;
  refuses<InvalidArgument>(
      "kvlab::attention_step(const AttentionShape &shape, const AttentionWeights< T > &w, const "
      "RotaryEmbedding *rope, KVStore< T > &store, int layer, bool top, const RowMatrix< T > &xb, "
      "RowMatrix< T > &out, StepScratch< T > &scratch, CostCounters &counters, PhaseTimes "
      "*times=nullptr)",
      input::kShape, out_state,
      [&] {
        kvlab::attention_step(shape, layer.weights(), nullptr, store, 0, true,
                              RowMatrix<double>(RowMatrix<double>::Ones(3, 4)), out, scratch,
                              counters);
      },
      names("xb.rows()", "2 (the step's rows)", "3"));
  const char* new_token_rows =
      "kvlab::new_token_rows(const StepBatch &batch, const RowMatrix< T > &x, RowMatrix< T > &out)";
  refuses<InvalidArgument>(
      new_token_rows, input::kShape, out_state,
      [&] { kvlab::new_token_rows(batch, RowMatrix<double>(RowMatrix<double>::Ones(3, 4)), out); },
      names("x.rows()", "2 (batch.rows())", "3"));
  RowMatrix<double> rows = RowMatrix<double>::Ones(2, 4);
  refuses<InvalidArgument>(
      new_token_rows, input::kState, [&] { return rows.rows(); },
      [&] { kvlab::new_token_rows(batch, rows, rows); },
      names("out", "a matrix other than x", "x"));
  const char* add_residual =
      "kvlab::add_residual(const StepBatch &batch, RowMatrix< T > &x, const RowMatrix< T > &out)";
  const auto rows_state = [&] { return std::vector<double>(rows.data(), rows.data() + rows.size()); };
  refuses<InvalidArgument>(
      add_residual, input::kShape, rows_state,
      [&] { kvlab::add_residual(batch, rows, RowMatrix<double>(RowMatrix<double>::Ones(3, 4))); },
      names("out.rows()", "2 (x.rows() or the step's new rows)", "3"));
  refuses<InvalidArgument>(
      add_residual, input::kShape, rows_state,
      [&] { kvlab::add_residual(batch, rows, RowMatrix<double>(RowMatrix<double>::Ones(2, 3))); },
      names("out.cols()", "4 (x.cols())", "3"));
  // A step opened while one is open: refused, naming the caller, and the open one stays open.
  RowMatrix<double> more_inputs;
  refuses<InvalidArgument>(
      "kvlab::OpenStep::OpenStep(KVStore< T > &store, const std::vector< int > &seqs, const "
      "std::vector< std::int32_t > &new_indptr, const RowMatrix< T > &new_inputs, RowMatrix< T > "
      "&inputs, const char *caller)",
      input::kState, [&] { return std::vector<int>{store.length(seq), batch.rows()}; },
      [&] { kvlab::OpenStep<double> again(store, {seq}, {0, 2}, x, more_inputs, "kvlab::MyModel"); },
      names("step", "no step open (end_step or abort_step first)", "a step open"));
  CHECK_NOTHROW(store.step());  // still open: a refused OpenStep does not abort another's step
  // Every per-sequence member of the step's batch checks its index.
  for (const char* e :
       {"kvlab::StepBatch::seq(int i) const", "kvlab::StepBatch::first(int i) const",
        "kvlab::StepBatch::row_begin(int i) const", "kvlab::StepBatch::new_begin(int i) const",
        "kvlab::StepBatch::new_tokens(int i) const", "kvlab::StepBatch::computed(int i) const"}) {
    const std::string name = e;
    const auto call = [&](int i) {
      if (name.find("::seq(") != std::string::npos) (void)batch.seq(i);
      if (name.find("::first(") != std::string::npos) (void)batch.first(i);
      if (name.find("::row_begin(") != std::string::npos) (void)batch.row_begin(i);
      if (name.find("::new_begin(") != std::string::npos) (void)batch.new_begin(i);
      if (name.find("::new_tokens(") != std::string::npos) (void)batch.new_tokens(i);
      if (name.find("::computed(") != std::string::npos) (void)batch.computed(i);
    };
    refuses<InvalidArgument>(
        e, input::kRange, no_state, [&] { call(1); }, names("i", "in [0, 1)", "1"));
    refuses<InvalidArgument>(
        e, input::kRange, no_state, [&] { call(-1); }, names("i", "in [0, 1)", "-1"));
  }
  store.abort_step();

  // cpu::linear with several products.
  const RowMatrix<double> w3 = RowMatrix<double>::Ones(3, 4), w5 = RowMatrix<double>::Ones(3, 5);
  RowMatrix<double> o1 = RowMatrix<double>::Constant(1, 1, 7.0), o2 = o1;
  RowMatrix<double> xm = x;
  const auto outs = [&] { return std::vector<double>{o1(0, 0), o2(0, 0), double(o1.size())}; };
  const char* linear =
      "kvlab::cpu::linear(const RowMatrix< T > &x, std::initializer_list< LinearProduct< T > > "
      "products)";
  refuses<InvalidArgument>(
      linear, input::kShape, outs,
      [&] {
        kvlab::cpu::linear(x, {{w3, o1}, {w5, o2}});
      },
      names("x.cols()", "5 (products[1].w.cols())", "4"));
  refuses<InvalidArgument>(
      linear, input::kState, outs,
      [&] {
        kvlab::cpu::linear(x, {{w3, o1}, {w3, o1}});
      },
      names("products[0].out", "a matrix of its own", "product 1's"));
  refuses<InvalidArgument>(
      linear, input::kState, outs,
      [&] {
        kvlab::cpu::linear(xm, {{w3, o1}, {w3, xm}});
      },
      names("products[1].out", "a matrix other than x and w", "one of them"));

  // Uniform draws: bounds that are not finite or not in order; nothing drawn.
  kvlab::Rng rng(3);
  RowMatrix<double> m = RowMatrix<double>::Constant(1, 2, 7.0);
  const auto rng_state = [&] {
    kvlab::Rng copy = rng;
    return std::vector<double>{static_cast<double>(copy.next_u64()), m(0, 0), m(0, 1)};
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const char* e : {"kvlab::Rng::uniform(double lo, double hi)",
                        "kvlab::fill_uniform(Eigen::DenseBase< Derived > &m, Rng &rng, double lo, "
                        "double hi)"}) {
    const bool fill = std::string(e).find("fill_uniform") != std::string::npos;
    const auto call = [&](double lo, double hi) {
      if (fill)
        kvlab::fill_uniform(m, rng, lo, hi);
      else
        (void)rng.uniform(lo, hi);
    };
    refuses<InvalidArgument>(
        e, input::kValue, rng_state, [&] { call(nan, 1.0); },
        names("lo", "a finite number", "nan"));
    refuses<InvalidArgument>(
        e, input::kValue, rng_state, [&] { call(0.0, inf); },
        names("hi", "a finite number", "inf"));
    refuses<InvalidArgument>(
        e, input::kValue, rng_state, [&] { call(1.0, 0.5); },
        names("hi", "a number above lo (1)", "0.5"));
    refuses<InvalidArgument>(
        e, input::kValue, rng_state, [&] { call(2.0, 2.0); },
        names("hi", "a number above lo (2)", "2"));
  }

  const char* visible = "kvlab::visible_keys(int first_position, int q_len, int window)";
  refuses<InvalidArgument>(
      visible, input::kRange, no_state, [] { (void)kvlab::visible_keys(-1, 2, 0); },
      names("first_position", ">= 0", "-1"));
  refuses<InvalidArgument>(
      visible, input::kSize, no_state, [] { (void)kvlab::visible_keys(0, -2, 0); },
      names("q_len", ">= 0", "-2"));
  refuses<InvalidArgument>(
      visible, input::kSize, no_state, [] { (void)kvlab::visible_keys(0, 2, -1); },
      names("window", ">= 0", "-1"));

  // The model's size functions and its size calculator's terms.
  const kvlab::LlamaConfig huge =
      kvlab::LlamaConfig::tiny().with_dim(1 << 30).with_hidden_dim(1 << 30).with_vocab_size(1
                                                                                            << 30);
  refuses<InvalidArgument>(
      "kvlab::LlamaConfig::num_weights(const char *where=\"kvlab::LlamaConfig::num_weights\", "
      "const std::string &prefix=\"\") const",
      input::kOverflow, no_state, [&] { (void)huge.num_weights(); },
      names("n_layers", "at most 1 (so that the size fits in std::int64_t)", "3"));
  // 2^61 and more weights fit in std::int64_t, their 4-byte floats do not.
  const kvlab::LlamaConfig wide = kvlab::LlamaConfig::tiny()
                                      .with_layers(1)
                                      .with_dim(1 << 30)
                                      .with_hidden_dim(1)
                                      .with_vocab_size(1);
  const std::uint64_t floats = wide.num_weights();
  refuses<InvalidArgument>(
      "kvlab::LlamaConfig::checkpoint_bytes(const char "
      "*where=\"kvlab::LlamaConfig::checkpoint_bytes\", const std::string &prefix=\"\") const",
      input::kOverflow, no_state, [&] { (void)wide.checkpoint_bytes(); },
      names("weight count", "at most 2305843009213693951 (so that the size fits in std::int64_t)",
            std::to_string(floats)));
  refuses<InvalidArgument>(
      "kvlab::to_model_config(const LlamaConfig &config, const std::string &name=\"llama\")",
      input::kShape, no_state,
      [] { (void)kvlab::to_model_config(kvlab::LlamaConfig::tiny().with_heads(6, 4)); },
      names("n_heads", "a multiple of n_kv_heads (4)", "6"));

  // The scheduler's block count, and the run report's ids.
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
      input::kSize, no_state, [&] { (void)budget.blocks_for(-2); },
      names("tokens", ">= 0", "-2"));
  CHECK_THROWS_WITH(budget.blocks_for(-2), Catch::StartsWith("kvlab::BlockBudget::blocks_for: "));
  CHECK_THROWS_WITH(scheduler.blocks_for(-2), Catch::StartsWith("kvlab::Scheduler::blocks_for: "));
  kvlab::EngineConfig config;
  config.clock = kvlab::EngineClock::Steps;
  kvlab::Engine engine(std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin()),
                       config);
  engine.submit(request_of({1, 2, 3}, 2));
  std::ostringstream json;
  refuses<InvalidArgument>(
      "kvlab::write_run_json(std::ostream &out, const Engine &engine, const std::vector< "
      "std::string > &ids={})",
      input::kShape, [&] { return json.str(); },
      [&] {
        kvlab::write_run_json(json, engine, {"\"a\"", "\"b\""});
      },
      names("ids.size()", "0 or 1 (the requests)", "2"));
}

TEST_CASE(
    "Refusals that no case had reached: sampling, context and an open step, workload "
    "ranges, a store's backend and dtype, aliased outputs, a windowed cache read in order") {
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

  const char* store =
      "kvlab::make_llama_store(LlamaBackend backend, const LlamaConfig &config, int max_tokens, "
      "int block_size=16, int sequences=1, KVDtype dtype=KVDtype::fp32, int window=0)";
  const kvlab::LlamaConfig tiny = kvlab::LlamaConfig::tiny();
  refuses<InvalidArgument>(
      store, input::kValue, no_state,
      [&] {
        (void)kvlab::make_llama_store(kvlab::LlamaBackend::Naive, tiny, 16, 16, 1,
                                      kvlab::KVDtype::fp16);
      },
      names("dtype", "fp32 for the naive backend (it keeps no K/V to store)", "fp16"));
  refuses<InvalidArgument>(
      store, input::kOverflow, no_state,
      [&] {
        (void)kvlab::make_llama_store(kvlab::LlamaBackend::Paged, tiny, 16, 1, INT_MAX / 16 + 1);
      },
      names("sequences", "at most " + std::to_string(INT_MAX / 16) + " (blocks fit in an int)",
            std::to_string(INT_MAX / 16 + 1)));
  refuses<InvalidArgument>(
      store, input::kRange, no_state,
      [&] { (void)kvlab::make_llama_store(static_cast<kvlab::LlamaBackend>(7), tiny, 16); },
      names("backend", "naive, cached or paged", "7"));

  refuses<InvalidArgument>(
      "kvlab::LlamaWeights::check(const char *where=\"kvlab::LlamaWeights::check\") const",
      input::kShape, no_state,
      [] {
        kvlab::LlamaWeights w = kvlab::LlamaWeights::builtin();
        w.layers.pop_back();
        w.check();
      },
      names("layers.size()", std::to_string(kvlab::LlamaConfig::tiny().n_layers),
            std::to_string(kvlab::LlamaConfig::tiny().n_layers - 1)));

  // A paged prefill whose output is its queries; a step whose inputs are its new inputs.
  const kvlab::AttentionShape shape(2, 1, 4);
  kvlab::Rng rng(5);
  kvlab::PagedKVCache<double> cache(1, 1, 4, 4, 4);
  const int seq = cache.add_sequence();
  cache.append(seq, kvlab::random_matrix<double>(3, 4, rng),
               kvlab::random_matrix<double>(3, 4, rng));
  const kvlab::BlockTables tables = cache.tables({seq});
  RowMatrix<double> q = kvlab::random_matrix<double>(3, 8, rng);
  const auto q_state = [&] { return std::vector<double>(q.data(), q.data() + q.size()); };
  refuses<InvalidArgument>(
      "kvlab::cpu::paged_prefill_attention(const AttentionShape &shape, const Eigen::MatrixBase< "
      "Q > &q, const std::vector< std::int32_t > &qo_indptr, const PagedKVView< S > &cache, "
      "RowMatrix< T > &out, CostCounters *counters=nullptr)",
      input::kState, q_state,
      [&] {
        kvlab::cpu::paged_prefill_attention(shape, q, {0, 3}, cache.view(0, tables), q);
      },
      names("out", "a matrix other than q", "q"));
  kvlab::ContiguousStore<double> cs(1, 1, 2, 8);
  const int cseq = cs.add_sequence();
  RowMatrix<double> rows = RowMatrix<double>::Zero(2, 2);
  refuses<InvalidArgument>(
      "kvlab::KVStore::begin_step(const std::vector< int > &seqs, const std::vector< std::int32_t "
      "> &new_indptr, const RowMatrix< T > &new_inputs, RowMatrix< T > &inputs, const char "
      "*caller=nullptr)",
      input::kState, [&] { return cs.length(cseq); },
      [&] {
        cs.begin_step({cseq}, {0, 2}, rows, rows, nullptr);
      },
      names("inputs", "a matrix other than new_inputs", "new_inputs"));

  // A windowed contiguous cache keeps a ring: its rows cannot be read back in order.
  kvlab::ContiguousKVCache<double> ring(1, 1, 4, 8, 4);
  ring.append(0, kvlab::random_matrix<double>(2, 4, rng), kvlab::random_matrix<double>(2, 4, rng));
  refuses<InvalidArgument>(
      "kvlab::ContiguousKVCache::keys(int layer, int kv_head) const", input::kState,
      [&] { return ring.length(0); }, [&] { (void)ring.keys(0, 0); },
      names("window", "0 (a windowed cache keeps its rows in a ring, not in order)", "4"));
}

TEST_CASE("GGUF files, the model read from one, and the tokenizers behind TextTokenizer") {
  // A small GGUF file of every tensor type the reader needs here, written by the tests' writer.
  kvlab_test::GgufWriter w;
  w.str("s", "text");
  w.u32("n", 7);
  w.strings("list", {"a"});
  w.tensor("t", {2}, 0, std::string(8, '\0'));
  const std::string path = "kvlab_bad_input.gguf";
  kvlab_test::write_bytes(path, w.bytes());
  const kvlab::GgufFile g(path);
  const char* ctor = "kvlab::GgufFile::GgufFile(const std::string &path)";
  refuses<InvalidArgument>(ctor, input::kEmpty, no_state, [] { kvlab::GgufFile f(""); },
                           names("path", "the name of a GGUF file", "''"));
  refuses<InvalidArgument>(ctor, input::kValue, no_state,
                           [] { kvlab::GgufFile f("/nonexistent/model.gguf"); },
                           names("/nonexistent/model.gguf", "an existing, readable GGUF file",
                                 "a path that cannot be opened"));
  refuses<InvalidArgument>("kvlab::GgufFile::at(const std::string &key) const", input::kRange,
                           no_state, [&] { (void)g.at("nope"); },
                           names(path + ": key 'nope'", "present", "missing"));
  refuses<InvalidArgument>("kvlab::GgufFile::get_int(const std::string &key) const", input::kValue,
                           no_state, [&] { (void)g.get_int("s"); },
                           names(path + ": key 's'", "an integer", "a string"));
  refuses<InvalidArgument>("kvlab::GgufFile::get_float(const std::string &key) const",
                           input::kValue, no_state, [&] { (void)g.get_float("n"); },
                           names(path + ": key 'n'", "a float32 or float64", "a uint32"));
  refuses<InvalidArgument>("kvlab::GgufFile::get_string(const std::string &key) const",
                           input::kValue, no_state, [&] { (void)g.get_string("n"); },
                           names(path + ": key 'n'", "a string", "a uint32"));
  refuses<InvalidArgument>("kvlab::GgufFile::get_strings(const std::string &key) const",
                           input::kValue, no_state, [&] { (void)g.get_strings("s"); },
                           names(path + ": key 's'", "an array of strings", "a string"));
  refuses<InvalidArgument>("kvlab::GgufFile::get_ints(const std::string &key) const",
                           input::kValue, no_state, [&] { (void)g.get_ints("list"); },
                           names(path + ": key 'list'", "an array of integers", "an array of string"));
  refuses<InvalidArgument>("kvlab::GgufFile::tensor(const std::string &name) const", input::kRange,
                           no_state, [&] { (void)g.tensor("x"); },
                           names(path + ": tensor 'x'", "present", "missing"));
  refuses<InvalidArgument>(
      "kvlab::GgufFile::read_matrix(const std::string &name, const std::vector< std::uint64_t > "
      "&expected_dims={}) const",
      input::kShape, no_state, [&] { (void)g.read_matrix("t", {3}); },
      names(path + ": tensor 't': dims", "[3]", "[2]"));
  kvlab_test::GgufWriter nan;
  nan.tensor("t", {1}, 0, std::string("\x00\x00\xC0\x7F", 4));
  kvlab_test::write_bytes(path, nan.bytes());
  const kvlab::GgufFile gn(path);
  float value = 0;
  const auto value_state = [&] { return value; };
  refuses<InvalidArgument>(
      "kvlab::GgufFile::read_tensor(const GgufTensorInfo &info, float *out) const", input::kValue,
      value_state, [&] { gn.read_tensor(gn.tensor("t"), &value); },
      names(path + ": tensor 't'", "finite values", "nan at index 0"));
  refuses<InvalidArgument>("kvlab::llama_config_from_gguf(const GgufFile &file)", input::kEmpty,
                           no_state, [&] { (void)kvlab::llama_config_from_gguf(gn); },
                           names(path + ": key 'general.architecture'", "present", "missing"));
  refuses<InvalidArgument>("kvlab::load_gguf_weights(const GgufFile &file)", input::kEmpty,
                           no_state, [&] { (void)kvlab::load_gguf_weights(gn); },
                           names(path + ": key 'general.architecture'", "present", "missing"));
  refuses<InvalidArgument>("kvlab::load_gguf_weights(const std::string &path)", input::kEmpty,
                           no_state, [] { (void)kvlab::load_gguf_weights(""); },
                           names("path", "the name of a GGUF file", "''"));
  refuses<InvalidArgument>("kvlab::BpeTokenizer::from_gguf(const GgufFile &file)", input::kEmpty,
                           no_state, [&] { (void)kvlab::BpeTokenizer::from_gguf(gn); },
                           names(path + ": key 'tokenizer.ggml.model'", "present", "missing"));

  const unsigned char bytes[34] = {};
  float out[32] = {};
  const auto out_state = [&] { return std::vector<float>(out, out + 32); };
  refuses<InvalidArgument>(
      "kvlab::dequantize_row(GgmlType type, const unsigned char *data, std::int64_t n, float *out)",
      input::kShape, out_state, [&] { kvlab::dequantize_row(kvlab::GgmlType::Q8_0, bytes, 31, out); },
      names("n", "a multiple of 32 (a Q8_0 block)", "31"));
  refuses<InvalidArgument>(
      "kvlab::dequantize_row(GgmlType type, const unsigned char *data, std::int64_t n, float *out)",
      input::kSize, out_state, [&] { kvlab::dequantize_row(kvlab::GgmlType::F32, bytes, -1, out); },
      names("n", ">= 0", "-1"));
  refuses<InvalidArgument>("kvlab::ggml_row_bytes(GgmlType type, std::uint64_t n)", input::kShape,
                           no_state, [] { (void)kvlab::ggml_row_bytes(kvlab::GgmlType::Q4_1, 33); },
                           names("n", "a multiple of 32 (a Q4_1 block)", "33"));
  refuses<InvalidArgument>("kvlab::ggml_block_bytes(GgmlType type)", input::kRange, no_state,
                           [] { (void)kvlab::ggml_block_bytes(static_cast<kvlab::GgmlType>(12)); },
                           names("type", "F32, F16, BF16, Q8_0, Q4_0 or Q4_1", "Q4_K"));

  // A byte-level vocabulary: the 256 byte characters, then <|im_end|> (control).
  std::vector<std::string> tokens = kvlab_test::gpt2_byte_chars();
  tokens.push_back("<|im_end|>");
  std::vector<std::int64_t> types(257, 1);
  types[256] = 3;
  refuses<InvalidArgument>(
      "kvlab::BpeTokenizer::BpeTokenizer(std::vector< std::string > tokens, const std::vector< "
      "std::int64_t > &types, const std::vector< std::string > &merges, const std::string &pre, "
      "int bos, int eos)",
      input::kValue, no_state,
      [&] { kvlab::BpeTokenizer t(tokens, types, {"a zz"}, "smollm", -1, 256); },
      names("merges[0]", "a known right token", "'zz'"));
  refuses<InvalidArgument>(
      "kvlab::BpeTokenizer::BpeTokenizer(std::vector< std::string > tokens, const std::vector< "
      "std::int64_t > &types, const std::vector< std::string > &merges, const std::string &pre, "
      "int bos, int eos)",
      input::kRange, no_state, [&] { kvlab::BpeTokenizer t(tokens, types, {}, "smollm", 257, 256); },
      names("bos", "-1 or an id in [0, 257)", "257"));
  const kvlab::BpeTokenizer bpe(tokens, types, {}, "smollm", -1, 256);
  refuses<InvalidArgument>("kvlab::BpeTokenizer::token(int id) const", input::kRange, no_state,
                           [&] { (void)bpe.token(257); },
                           names("id", "an id in [0, 257)", "257"));
  refuses<InvalidArgument>("kvlab::BpeTokenizer::type(int id) const", input::kRange, no_state,
                           [&] { (void)bpe.type(-1); }, names("id", "an id in [0, 257)", "-1"));
  refuses<InvalidArgument>("kvlab::BpeTokenizer::token_bytes(int id, int=-1) const override",
                           input::kRange, no_state, [&] { (void)bpe.token_bytes(300); },
                           names("id", "an id in [0, 257)", "300"));
  refuses<InvalidArgument>("kvlab::BpeTokenizer::is_special(int id) const override", input::kRange,
                           no_state, [&] { (void)bpe.is_special(257); },
                           names("id", "an id in [0, 257)", "257"));
  refuses<InvalidArgument>("kvlab::TextTokenizer::decode(const std::vector< int > &ids) const",
                           input::kRange, no_state, [&] { (void)bpe.decode({0, 999}); },
                           names("id", "an id in [0, 257)", "999"));
  std::vector<std::string> missing = tokens;
  missing[4] = "unused";  // byte 0x04 has no token
  const kvlab::BpeTokenizer holes(missing, types, {}, "smollm", -1, 256);
  refuses<InvalidArgument>(
      "kvlab::BpeTokenizer::encode_text(const std::string &text, bool parse_special) const override",
      input::kValue, no_state, [&] { (void)holes.encode_text("a\x04", true); },
      names("text", "bytes this vocabulary can encode", "byte 0x04 at offset 1, which has no token"));

  refuses<InvalidArgument>(
      "kvlab::BpeTokenizer::encode_parts(const std::vector< TextPart > &parts) const override",
      input::kValue, no_state,
      [&] { (void)holes.encode_parts({{"<|im_end|>", true}, {"\x04", false}}); },
      names("text", "bytes this vocabulary can encode", "byte 0x04 at offset 10, which has no token"));

  // A chat over a random model whose vocabulary is the byte tokenizer's (257 ids).
  auto chat_weights = std::make_shared<const kvlab::LlamaWeights>(
      kvlab::LlamaWeights::random(kvlab::LlamaConfig::tiny().with_vocab_size(257), 5));
  auto small_weights = std::make_shared<const kvlab::LlamaWeights>(
      kvlab::LlamaWeights::random(kvlab::LlamaConfig::tiny(), 5));  // 256 ids
  kvlab::LlamaModel small_model(small_weights, kvlab::LlamaBackend::Cached, 16, 64);
  refuses<InvalidArgument>(
      "kvlab::ChatSession::ChatSession(LlamaModel &model, const TextTokenizer &tokenizer, "
      "ChatTemplate chat_template, Sampler sampler, std::string system)",
      input::kShape, no_state,
      [&] {
        kvlab::ChatSession c(small_model, bpe, kvlab::ChatTemplate(), kvlab::Sampler(257, 0, 1, 1), "");
      },
      names("tokenizer.vocab_size()", "256 (the model's vocab_size)", "257"));
  kvlab::LlamaModel chat_model(chat_weights, kvlab::LlamaBackend::Cached, 16, 24);
  kvlab::ChatSession chat(chat_model, bpe, kvlab::ChatTemplate("sys"), kvlab::Sampler(257, 0, 1, 1), "sys");
  const auto chat_state = [&] { return chat_model.tokens(); };
  const char* turn =
      "kvlab::ChatSession::turn(const std::string &user, int max_new_tokens, const std::function< "
      "void(const std::string &)> &on_text={})";
  refuses<InvalidArgument>(turn, input::kSize, chat_state, [&] { (void)chat.turn("hi", 0); },
                           names("max_new_tokens", ">= 1", "0"));
  refuses<kvlab::CapacityError>(
      turn, input::kState, chat_state, [&] { (void)chat.turn("a long message, too long", 4); },
      names("the conversation",
            "room for this turn's 89 tokens and a reply in the context of 24 tokens",
            "0 tokens held (start a new conversation)"));
  kvlab_test::GgufWriter no_template;
  no_template.str("tokenizer.chat_template", "{{ messages }}");
  kvlab_test::write_bytes(path, no_template.bytes());
  const kvlab::GgufFile gt(path);
  refuses<InvalidArgument>("kvlab::ChatTemplate::from_gguf(const GgufFile &file)", input::kValue,
                           no_state, [&] { (void)kvlab::ChatTemplate::from_gguf(gt); },
                           names(path + ": key 'tokenizer.chat_template'",
                                 "a ChatML template (<|im_start|> role, content, <|im_end|>)",
                                 "a template without those markers"));
  std::remove(path.c_str());

  refuses<InvalidArgument>("kvlab::encode_utf8(char32_t c)", input::kRange, no_state,
                           [&] { (void)kvlab::encode_utf8(0xD800); },
                           names("c", "a Unicode scalar value (at most U+10FFFF, no surrogate)", "U+D800"));
  refuses<InvalidArgument>("kvlab::encode_utf8(char32_t c)", input::kRange, no_state,
                           [&] { (void)kvlab::encode_utf8(0x110000); },
                           names("c", "a Unicode scalar value (at most U+10FFFF, no surrogate)", "U+110000"));
  CHECK(kvlab::encode_utf8(0x10FFFF) == "\xF4\x8F\xBF\xBF");  // the largest is encoded
  const kvlab::Tokenizer llama({"<unk>", "\n<s>\n", "\n</s>\n", "a"}, {0, 0, 0, 0});
  refuses<InvalidArgument>("kvlab::Tokenizer::token_bytes(int id, int prev=-1) const override",
                           input::kRange, no_state, [&] { (void)llama.token_bytes(4); },
                           names("token", "an id in [0, 4)", "4"));
  refuses<InvalidArgument>("kvlab::Tokenizer::is_special(int id) const override", input::kRange,
                           no_state, [&] { (void)llama.is_special(-1); },
                           names("id", "an id in [0, 4)", "-1"));
  refuses<InvalidArgument>("kvlab::LlamaConfig::with_rope_theta(float value)", input::kValue,
                           no_state,
                           [] { kvlab::LlamaConfig::tiny().with_rope_theta(0.5f).validate("v"); },
                           names("rope_theta", "a finite base > 1", "0.5"));
  refuses<InvalidArgument>("kvlab::LlamaConfig::with_norm_eps(float value)", input::kValue,
                           no_state,
                           [] { kvlab::LlamaConfig::tiny().with_norm_eps(-1.f).validate("v"); },
                           names("norm_eps", "a finite epsilon > 0", "-1"));
}
