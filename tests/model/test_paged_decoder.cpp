// What only PagedDecoder does (its agreement with the other decoders at every step, over block
// sizes, layouts and head shapes, is in the one equivalence suite of test_decoders.cpp): several
// decoders interleaved in random order in one pool; forks that diverge; rewind; a dry pool; bad
// input.
//
// Tolerances (see test_support.hpp): the decoders compute the same sums in different orders,
// so outputs differ by rounding only: double 1e-12, float 1e-5 relative to max(1, row max).
// Paged and cached decoders do the same work, so their counters are compared exactly.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "kvlab/kvlab.hpp"
#include "test_support.hpp"

using kvlab::AttentionShape;
using kvlab::AttentionStack;
using kvlab::CachedDecoder;
using kvlab::NaiveDecoder;
using kvlab::PagedDecoder;
using kvlab::PagedKVCache;
using kvlab::RowMatrix;
using kvlab::RowVector;
using kvlab_test::max_row_relative_error;
using kvlab_test::names;
using kvlab_test::tolerance;

TEST_CASE("decoders interleaved in random order in one pool each equal their own cached decoder") {
  const AttentionShape shape(8, 2, 16);
  const auto stack = AttentionStack<double>::random(2, shape, 32, 5);
  const kvlab::KVLayout layout = GENERATE(kvlab::KVLayout::NHD, kvlab::KVLayout::HND);
  for (int block_size : {1, 3, 16}) {
    CAPTURE(kvlab::to_string(layout), block_size);
    constexpr int kDecoders = 5;
    const int num_blocks = kDecoders * ((200 + block_size - 1) / block_size);  // 200 tokens each
    auto pool = std::make_shared<PagedKVCache<double>>(2, 2, 16, block_size, num_blocks, layout);
    std::vector<std::unique_ptr<PagedDecoder<double>>> paged;
    std::vector<std::unique_ptr<CachedDecoder<double>>> cached;
    for (int i = 0; i < kDecoders; ++i) {
      paged.push_back(std::make_unique<PagedDecoder<double>>(stack, pool));
      cached.push_back(std::make_unique<CachedDecoder<double>>(stack, 200));
    }
    kvlab::Rng rng(17 + static_cast<std::uint64_t>(block_size));
    for (int step = 0; step < 300; ++step) {
      const auto i = static_cast<std::size_t>(rng.next_u64() % kDecoders);
      // some chunks
      const int p = rng.next_u64() % 4 == 0 ? 1 + static_cast<int>(rng.next_u64() % 5) : 1;
      if (paged[i]->position() + p > 200) continue;
      const RowMatrix<double> x = kvlab::random_matrix<double>(p, 32, rng);
      CAPTURE(step, i, p);
      CHECK(max_row_relative_error(paged[i]->prefill(x), cached[i]->prefill(x)) <=
            tolerance<double>());
    }
    // No block is held by two sequences, and the pool holds exactly what the lengths need.
    std::vector<int> holders(static_cast<std::size_t>(num_blocks), 0);
    int needed = 0;
    for (const auto& d : paged) {
      needed += (d->position() + block_size - 1) / block_size;
      for (std::int32_t b : pool->blocks(d->sequence())) ++holders[static_cast<std::size_t>(b)];
    }
    for (int h : holders) CHECK(h <= 1);
    CHECK(pool->allocator().num_used() == needed);
    paged.clear();  // every decoder frees its sequence
    CHECK(pool->allocator().num_free() == num_blocks);
  }
}

TEST_CASE("forked decoders share the prompt's blocks and diverge after the fork") {
  const AttentionShape shape(4, 2, 8);
  const auto stack = AttentionStack<double>::random(2, shape, 16, 9);
  kvlab::Rng rng(21);
  const RowMatrix<double> prompt = kvlab::random_matrix<double>(10, 16, rng);  // 2.5 blocks of 4
  const kvlab::KVLayout layout = GENERATE(kvlab::KVLayout::NHD, kvlab::KVLayout::HND);
  CAPTURE(kvlab::to_string(layout));
  auto a = std::make_unique<PagedDecoder<double>>(stack, 4, 32, layout);
  a->prefill(prompt);
  std::unique_ptr<PagedDecoder<double>> b = a->fork();
  CHECK(b->position() == 10);
  CHECK(b->total() == kvlab::CostCounters{});
  CHECK(b->cache().blocks(b->sequence()) == a->cache().blocks(a->sequence()));
  for (std::int32_t block : a->cache().blocks(a->sequence()))
    CHECK(a->cache().allocator().ref_count(block) == 2);

  // Each branch against a cached decoder fed the prompt and that branch's tokens.
  CachedDecoder<double> want_a(stack, 64), want_b(stack, 64), want_c(stack, 64);
  want_a.prefill(prompt);
  want_b.prefill(prompt);
  std::unique_ptr<PagedDecoder<double>> c;  // a fork of b, made after b's sixth token
  std::vector<RowVector<double>> b_tokens;  // b's decoded tokens, to replay into c's reference
  const auto next = [&] {
    return RowVector<double>(kvlab::random_matrix<double>(1, 16, rng).row(0));
  };
  const auto agree = [](const RowVector<double>& got, const RowVector<double>& want) {
    return max_row_relative_error(RowMatrix<double>(got), RowMatrix<double>(want)) <=
           tolerance<double>();
  };
  for (int step = 0; step < 20; ++step) {
    CAPTURE(step);
    if (a) {
      const RowVector<double> x = next();
      CHECK(agree(a->decode(x), want_a.decode(x)));
    }
    const RowVector<double> x = next();
    CHECK(agree(b->decode(x), want_b.decode(x)));
    b_tokens.push_back(x);
    // copy on write: b's first token went into a private copy of the shared last block
    if (step == 0) {
      CHECK(a->cache().blocks(a->sequence())[2] != b->cache().blocks(b->sequence())[2]);
      CHECK(a->cache().blocks(a->sequence())[1] == b->cache().blocks(b->sequence())[1]);
      CHECK(a->cache().allocator().ref_count(a->cache().blocks(a->sequence())[1]) == 2);
    }
    if (step == 5) {  // c continues from b's 16 tokens: replay them into c's reference
      c = b->fork();
      want_c.prefill(prompt);
      for (const RowVector<double>& x_b : b_tokens) want_c.decode(x_b);
      CHECK(c->position() == 16);
    } else if (c) {
      const RowVector<double> y = next();
      CHECK(agree(c->decode(y), want_c.decode(y)));
    }
    if (step == 10) a.reset();  // the parent goes away; its forks keep the blocks they share
  }
  CHECK(b->position() == 30);
  CHECK(c->position() == 30);
}

TEST_CASE("a paged decoder rewinds and replays like a cached one") {
  const AttentionShape shape(4, 1, 8);
  const auto stack = AttentionStack<float>::random(2, shape, 16, 4);
  kvlab::Rng rng(8);
  const RowMatrix<float> inputs = kvlab::random_matrix<float>(20, 16, rng);
  PagedDecoder<float> paged(stack, 3, 8);
  const RowMatrix<float> first = paged.prefill(inputs);
  const int used = paged.cache().allocator().num_used();  // 7 blocks of 3 for 20 tokens
  paged.rewind(7);                                        // 3 blocks kept
  CHECK(paged.cache().allocator().num_used() == 3);
  CHECK(paged.cache().length(paged.sequence()) == 7);
  const RowMatrix<float> again = paged.prefill(inputs.bottomRows(13));
  CHECK(max_row_relative_error(again, first.bottomRows(13)) <= tolerance<float>());
  CHECK(paged.cache().allocator().num_used() == used);
  paged.reset();
  CHECK(paged.cache().allocator().num_free() == 8);
}

TEST_CASE("a paged decoder whose pool runs dry is unchanged and goes on after a rewind") {
  const AttentionShape shape(4, 2, 8);
  const auto stack = AttentionStack<double>::random(1, shape, 16, 6);
  kvlab::Rng rng(12);
  const RowMatrix<double> inputs = kvlab::random_matrix<double>(9, 16, rng);
  PagedDecoder<double> paged(stack, 4, 2);  // room for 8 tokens
  CachedDecoder<double> cached(stack, 9);
  paged.prefill(inputs.topRows(8));
  cached.prefill(inputs.topRows(8));
  const kvlab::CostCounters total = paged.total();
  CHECK_THROWS_MATCHES(paged.decode(inputs.row(8)), kvlab::OutOfBlocks,
                       names("free blocks", "at least 1 for 1 tokens of sequence 0", "0"));
  CHECK(paged.position() == 8);
  CHECK(paged.total() == total);
  CHECK(paged.cache().length(paged.sequence()) == 8);
  CHECK(paged.cache().allocator().num_free() == 0);
  // Drop the last token and decode a different one: the freed slot is reused.
  paged.rewind(7);
  cached.rewind(7);
  CHECK(max_row_relative_error(RowMatrix<double>(paged.decode(inputs.row(8))),
                               RowMatrix<double>(cached.decode(inputs.row(8)))) <=
        tolerance<double>());
}

TEST_CASE("PagedDecoder rejects a pool that does not fit its stack") {
  const AttentionShape shape(4, 2, 8);
  const auto stack = AttentionStack<double>::random(2, shape, 16, 1);
  CHECK_THROWS_MATCHES(PagedDecoder<double>(stack, nullptr), kvlab::InvalidArgument,
                       names("pool", "a non-null pool", "nullptr"));
  CHECK_THROWS_MATCHES(
      PagedDecoder<double>(stack, std::make_shared<PagedKVCache<double>>(1, 2, 8, 4, 4)),
      kvlab::InvalidArgument, names("pool->num_layers()", "2 (stack's num_layers)", "1"));
  CHECK_THROWS_MATCHES(
      PagedDecoder<double>(stack, std::make_shared<PagedKVCache<double>>(2, 4, 8, 4, 4)),
      kvlab::InvalidArgument, names("pool->num_kv_heads()", "2 (stack's num_kv_heads)", "4"));
  CHECK_THROWS_MATCHES(
      PagedDecoder<double>(stack, std::make_shared<PagedKVCache<double>>(2, 2, 4, 4, 4)),
      kvlab::InvalidArgument, names("pool->head_dim()", "8 (stack's head_dim)", "4"));
  CHECK_THROWS_MATCHES(PagedDecoder<double>(stack, 0, 4), kvlab::InvalidArgument,
                       names("block_size", ">= 1", "0"));
  PagedDecoder<double> paged(stack, 4, 4);
  CHECK_THROWS_MATCHES(paged.prefill(RowMatrix<double>::Zero(2, 15)), kvlab::InvalidArgument,
                       names("x.cols()", "16 (d_model)", "15"));
  CHECK(paged.position() == 0);
  CHECK(paged.cache().allocator().num_free() == 4);
}
