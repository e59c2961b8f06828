// One suite over every way of keeping K/V (every KVStore: recompute, contiguous, paged with
// block sizes 1, 7 and 16 in both pool layouts, the contiguous and paged stores keeping K/V
// as fp16, bf16, int8 and int4, every store with a sliding window — the contiguous one a
// ring that wraps, the paged one giving blocks back — and with attention sinks besides — the
// ring keeping them in its first slots, the pool keeping their blocks — and the SelectiveStore
// with a policy per head: every token, a window, sinks, heavy hitters, K and V in different
// types; a new variant is one line of kKinds): a
// ragged batch — sequences of different
// lengths, prompt chunks and decode tokens in one step, sequences joining and leaving between
// steps — gives each sequence exactly what it gets alone; forks continue as their parents
// would; a step is all or nothing (a sequence without room fails the whole step, and nothing
// changes); an aborted step leaves every sequence as it was; bad arguments are named. A window
// with sinks in the contiguous and paged stores gives what SelectiveStore gives with that
// policy on every head (its reference path, checked against reference_attention in
// test_selective_store.cpp), and keeps exactly S + W − 1 tokens' blocks or slots in use.
//
// Tolerance (test_support.hpp): a sequence in a batch shares its matrix products with the
// other sequences' rows, so its sums may be computed in another order than alone — double
// 1e-12, float 1e-5, relative to max(1, row max). Measured with g++ 12 (x86-64, Release, 1
// thread): float at most 1.8e-7, double at most 3.0e-16 — the matrix products of a different
// number of rows round differently; the attention of each sequence is the same arithmetic.
// The reduced-precision stores run these cases in double: a K value computed by a batch and by
// a lone sequence may differ by rounding, and in float (1e-7) that is enough, now and then, to
// land a value one fp16 step or quantization level apart — a difference of the storage's step,
// not of the bookkeeping tested here (in double, 1e-16, it does not happen in these cases).
// How far each storage is from fp32 is tested, with its derived bound, in test_kv_storage.cpp.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kvlab/kvlab.hpp"
#include "test_support.hpp"

using kvlab::AttentionShape;
using kvlab::AttentionStack;
using kvlab::KVStore;
using kvlab::RowMatrix;
using kvlab_test::max_row_relative_error;
using kvlab_test::names;
using kvlab_test::tolerance;

namespace {

// A store of one kind for `stack`, with room for `sequences` sequences of `max_len` tokens.
struct StoreKind {
  const char* name;
  int block_size;  // paged only
  kvlab::KVLayout layout;
  kvlab::KVDtype dtype;  // contiguous and paged: how K/V are stored (fp32: as computed)
  int window = 0;        // a sliding window (contiguous: a ring; paged: blocks given back)
  int selective = 0;     // SelectiveStore: 1 every head full, 2 every head windowed, 3 mixed
  int sinks = 0;         // attention sinks besides the window (contiguous and paged)
};

using kvlab::KVDtype;
using kvlab::KVLayout;
const StoreKind kKinds[] = {{"recompute", 0, KVLayout::NHD, KVDtype::fp32},
                            {"contiguous", 0, KVLayout::NHD, KVDtype::fp32},
                            {"paged", 1, KVLayout::NHD, KVDtype::fp32},
                            {"paged", 7, KVLayout::NHD, KVDtype::fp32},
                            {"paged", 16, KVLayout::NHD, KVDtype::fp32},
                            {"paged", 7, KVLayout::HND, KVDtype::fp32},
                            {"contiguous", 0, KVLayout::NHD, KVDtype::fp16},
                            {"contiguous", 0, KVLayout::NHD, KVDtype::bf16},
                            {"contiguous", 0, KVLayout::NHD, KVDtype::int8},
                            {"contiguous", 0, KVLayout::NHD, KVDtype::int4},
                            {"paged", 7, KVLayout::NHD, KVDtype::fp16},
                            {"paged", 16, KVLayout::HND, KVDtype::bf16},
                            {"paged", 7, KVLayout::HND, KVDtype::int8},
                            {"paged", 1, KVLayout::NHD, KVDtype::int4},
                            {"recompute", 0, KVLayout::NHD, KVDtype::fp32, 6},
                            {"contiguous", 0, KVLayout::NHD, KVDtype::fp32, 6},
                            {"contiguous", 0, KVLayout::NHD, KVDtype::int8, 6},
                            {"paged", 7, KVLayout::NHD, KVDtype::fp32, 6},
                            {"paged", 3, KVLayout::HND, KVDtype::bf16, 6},
                            {"contiguous", 0, KVLayout::NHD, KVDtype::fp32, 6, 0, 2},
                            {"contiguous", 0, KVLayout::NHD, KVDtype::int4, 6, 0, 1},
                            {"paged", 7, KVLayout::NHD, KVDtype::fp32, 6, 0, 2},
                            {"paged", 3, KVLayout::HND, KVDtype::fp16, 6, 0, 4},
                            {"selective", 0, KVLayout::NHD, KVDtype::fp32, 0, 1},
                            {"selective", 0, KVLayout::NHD, KVDtype::fp32, 6, 2},
                            {"selective", 0, KVLayout::NHD, KVDtype::int8, 6, 3}};

// The head policies of a SelectiveStore kind: every head full at fp32, every head a window of
// W, or four policies in turn — K fp16 and V int4 with every token; a window with 2 sinks; a
// window with 3 heavy hitters, K int8; a window with a sink and 2 heavy hitters, K bf16, V int8.
std::vector<kvlab::HeadPolicy> selective_heads(const StoreKind& kind, int heads) {
  using kvlab::HeadPolicy;
  const int w = kind.window;
  const HeadPolicy mixed[] = {{KVDtype::fp16, KVDtype::int4, 0, 0, 0},
                              {KVDtype::fp32, KVDtype::fp32, w, 2, 0},
                              {KVDtype::int8, KVDtype::fp32, w, 0, 3},
                              {KVDtype::bf16, KVDtype::int8, w, 1, 2}};
  std::vector<HeadPolicy> policies;
  for (int i = 0; i < heads; ++i) {
    if (kind.selective == 1) policies.push_back(HeadPolicy{});
    if (kind.selective == 2) policies.push_back(HeadPolicy{KVDtype::fp32, KVDtype::fp32, w});
    if (kind.selective == 3) policies.push_back(mixed[i % 4]);
  }
  return policies;
}

// The kinds that a test in T runs: all of them in double, the fp32 ones in float (see above).
template <typename T>
std::vector<StoreKind> kinds_for() {
  std::vector<StoreKind> kinds;
  for (const StoreKind& kind : kKinds)
    if (std::is_same<T, double>::value || kind.dtype == KVDtype::fp32) kinds.push_back(kind);
  return kinds;
}

template <typename T>
std::shared_ptr<KVStore<T>> make_store(const StoreKind& kind, const AttentionStack<T>& stack,
                                       int max_len, int sequences) {
  const int layers = stack.num_layers(), kv_heads = stack.shape().num_kv_heads(),
            head_dim = stack.shape().head_dim();
  const std::string name = kind.name;
  if (name == "selective") {
    return std::make_shared<kvlab::SelectiveStore<T>>(layers, kv_heads, head_dim,
                                                      selective_heads(kind, layers * kv_heads));
  }
  if (name == "recompute") {
    return std::make_shared<kvlab::RecomputeStore<T>>(layers, kv_heads, head_dim, stack.d_model(),
                                                      kind.window);
  }
  const auto of = [&](auto tag) -> std::shared_ptr<KVStore<T>> {
    using S = std::conditional_t<std::is_same<typename decltype(tag)::type, float>::value, T,
                                 typename decltype(tag)::type>;  // fp32: T itself
    if (name == "contiguous" && kind.window > 0) {  // a ring for steps of up to 16 tokens
      return std::make_shared<kvlab::ContiguousStore<T, S>>(
          layers, kv_heads, head_dim, kind.sinks + kind.window - 1 + 16, kind.window, kind.sinks);
    }
    if (name == "contiguous")
      return std::make_shared<kvlab::ContiguousStore<T, S>>(layers, kv_heads, head_dim, max_len);
    const int blocks = sequences * ((max_len - 1) / kind.block_size + 1);
    return std::make_shared<kvlab::PagedStore<T, S>>(layers, kv_heads, head_dim, kind.block_size,
                                                     blocks, kind.layout, kind.window, kind.sinks);
  };
  return kvlab::visit_kv_dtype(kind.dtype, of);
}

// One chunk of a step: `tokens` new rows of sequence `who` (an index into the script's
// sequences), taken from its input rows in order.
struct Chunk {
  int who, tokens;
};

}  // namespace

TEMPLATE_TEST_CASE("every store: a ragged batch gives each sequence what it gets alone", "", float,
                   double) {
  using T = TestType;
  const StoreKind kind = GENERATE(from_range(kinds_for<T>()));
  CAPTURE(kind.name, kind.block_size, kvlab::to_string(kind.layout), kvlab::dtype_name(kind.dtype),
          kind.window, kind.selective, kind.sinks);
  const AttentionShape shape(8, 2, 32);  // GQA
  const auto stack = AttentionStack<T>::random(3, shape, 32, 11);
  constexpr int kSequences = 5, kMaxLen = 40;
  kvlab::Rng rng(3);
  std::vector<RowMatrix<T>> inputs;  // [sequence][kMaxLen, d_model]
  for (int s = 0; s < kSequences; ++s) inputs.push_back(kvlab::random_matrix<T>(kMaxLen, 32, rng));

  // The steps: prompts in one or more chunks of different sizes, decode tokens, sequences that
  // sit a step out, sequence 4 joining at step 2, sequence 1 leaving after step 3.
  const std::vector<std::vector<Chunk>> script = {
      {{0, 5}, {1, 1}, {2, 12}, {3, 3}}, {{0, 1}, {1, 1}, {3, 4}},
      {{0, 1}, {2, 7}, {3, 1}, {4, 9}},  {{1, 1}, {0, 2}, {4, 1}, {2, 1}, {3, 1}},
      {{4, 1}, {0, 1}, {2, 1}},          {{3, 16}, {2, 1}, {0, 1}, {4, 1}},
  };
  const auto batched = make_store<T>(kind, *stack, kMaxLen, kSequences);
  std::vector<std::shared_ptr<KVStore<T>>> alone;  // one store per sequence, that sequence only
  std::vector<int> in_batch(kSequences, -1), in_alone(kSequences, -1), fed(kSequences, 0);
  for (int s = 0; s < kSequences; ++s) alone.push_back(make_store<T>(kind, *stack, kMaxLen, 1));
  double worst = 0;
  for (std::size_t step = 0; step < script.size(); ++step) {
    CAPTURE(step);
    if (step == 4) {  // sequence 1 leaves: its blocks or cache go back
      batched->free_sequence(in_batch[1]);
      in_batch[1] = -1;
    }
    std::vector<int> seqs;
    std::vector<std::int32_t> indptr{0};
    std::vector<RowMatrix<T>> rows;
    for (const Chunk& c : script[step]) {
      if (in_batch[static_cast<std::size_t>(c.who)] < 0) {  // a sequence joins
        in_batch[static_cast<std::size_t>(c.who)] = batched->add_sequence();
        in_alone[static_cast<std::size_t>(c.who)] =
            alone[static_cast<std::size_t>(c.who)]->add_sequence();
      }
      seqs.push_back(in_batch[static_cast<std::size_t>(c.who)]);
      indptr.push_back(indptr.back() + c.tokens);
      rows.push_back(inputs[static_cast<std::size_t>(c.who)].middleRows(
          fed[static_cast<std::size_t>(c.who)], c.tokens));
    }
    RowMatrix<T> x(indptr.back(), 32);  // [new tokens, d_model], sequence after sequence
    for (std::size_t i = 0; i < rows.size(); ++i) x.middleRows(indptr[i], rows[i].rows()) = rows[i];
    kvlab::CostCounters batch_work;
    const RowMatrix<T> y = kvlab::run_stack(*stack, *batched, seqs, indptr, x, &batch_work);
    REQUIRE(y.rows() == x.rows());
    kvlab::CostCounters alone_work;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const int who = script[step][i].who;
      const RowMatrix<T> want = kvlab::run_stack(
          *stack, *alone[static_cast<std::size_t>(who)], {in_alone[static_cast<std::size_t>(who)]},
          {0, static_cast<std::int32_t>(rows[i].rows())}, rows[i], &alone_work);
      const double error =
          max_row_relative_error(RowMatrix<T>(y.middleRows(indptr[i], rows[i].rows())), want);
      worst = std::max(worst, error);
      CHECK(error <= tolerance<T>());
      fed[static_cast<std::size_t>(who)] += script[step][i].tokens;
      CHECK(batched->length(in_batch[static_cast<std::size_t>(who)]) ==
            fed[static_cast<std::size_t>(who)]);
    }
    CHECK(batch_work == alone_work);  // the same work, done in one step
  }
  INFO("largest difference batched vs alone: " << worst);
  CHECK(worst <= tolerance<T>());
  CHECK(batched->sequences().size() == static_cast<std::size_t>(kSequences - 1));
}

TEST_CASE("every store: a fork continues as its parent would, and the parent is unchanged") {
  const StoreKind kind = GENERATE(from_range(std::begin(kKinds), std::end(kKinds)));
  CAPTURE(kind.name, kind.block_size, kvlab::to_string(kind.layout), kvlab::dtype_name(kind.dtype),
          kind.window, kind.selective, kind.sinks);
  const auto stack = AttentionStack<double>::random(2, AttentionShape(4, 2, 32), 16, 2);
  kvlab::Rng rng(9);
  const RowMatrix<double> prompt = kvlab::random_matrix<double>(10, 16, rng);
  const RowMatrix<double> a_tail = kvlab::random_matrix<double>(4, 16, rng);
  const RowMatrix<double> b_tail = kvlab::random_matrix<double>(3, 16, rng);
  const auto store = make_store<double>(kind, *stack, 20, 3);
  const int a = store->add_sequence();
  kvlab::run_stack(*stack, *store, {a}, {0, 10}, prompt);
  const int b = store->fork(a);
  CHECK(store->length(b) == 10);
  // Both continue in one step with different tokens; each equals a fresh sequence fed the same
  // history.
  RowMatrix<double> x(7, 16);
  x << a_tail, b_tail;
  const RowMatrix<double> y = kvlab::run_stack(*stack, *store, {a, b}, {0, 4, 7}, x);
  for (const auto& [tail, rows_at] :
       std::vector<std::pair<RowMatrix<double>, int>>{{a_tail, 0}, {b_tail, 4}}) {
    // (in the same steps: heavy hitters are chosen at the end of each step)
    const auto fresh = make_store<double>(kind, *stack, 20, 1);
    const int f = fresh->add_sequence();
    kvlab::run_stack(*stack, *fresh, {f}, {0, 10}, prompt);
    const RowMatrix<double> want =
        kvlab::run_stack(*stack, *fresh, {f}, {0, static_cast<std::int32_t>(tail.rows())}, tail);
    CHECK(max_row_relative_error(RowMatrix<double>(y.middleRows(rows_at, tail.rows())), want) <=
          tolerance<double>());
  }
  CHECK(store->length(a) == 14);
  CHECK(store->length(b) == 13);
  // Truncating the fork back and freeing it leaves the parent as it was.
  // (a windowed store keeps only the window's keys: a ring can go back one token, not to 5; a
  // SelectiveStore keeps the next token's W - 1 keys only, so it stays at 13)
  const int keep = kind.selective > 1 ? 13 : kind.window > 0 ? 12 : 5;
  store->truncate(b, keep);
  CHECK(store->length(b) == keep);
  store->free_sequence(b);
  CHECK(store->sequences() == std::vector<int>{a});
  CHECK(store->length(a) == 14);
}

TEST_CASE(
    "a window with sinks: the contiguous and paged stores give SelectiveStore's outputs, and "
    "keep the sinks and the window only") {
  // Every head of the SelectiveStore keeps the window of W keys and S sinks at fp32: its
  // reference path is the oracle. The tuned stores run the same steps: prompts in chunks that
  // cross the point where the sinks leave the window, then decode far past the ring's wraps.
  const int window = GENERATE(3, 6);
  const int sinks = GENERATE(1, 2);
  const AttentionShape shape(4, 2, 16);
  const auto stack = AttentionStack<double>::random(2, shape, 16, 21);
  const int layers = 2, kv_heads = 2, head_dim = 16, max_len = 60;
  kvlab::Rng rng(22);
  const RowMatrix<double> inputs = kvlab::random_matrix<double>(max_len, 16, rng);
  const std::vector<int> chunks = {4, 1, 7, 1, 1, 9, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                   1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  const std::vector<kvlab::HeadPolicy> every_head(layers * kv_heads,
                                                  {KVDtype::fp32, KVDtype::fp32, window, sinks, 0});
  for (const char* name : {"contiguous", "paged"}) {
    for (int block_size : {1, 4}) {
      if (std::string(name) == "contiguous" && block_size > 1) continue;
      CAPTURE(window, sinks, name, block_size);
      std::shared_ptr<KVStore<double>> store;
      if (std::string(name) == "contiguous") {
        store = std::make_shared<kvlab::ContiguousStore<double>>(
            layers, kv_heads, head_dim, sinks + window - 1 + 9, window, sinks);
      } else {
        store = std::make_shared<kvlab::PagedStore<double>>(layers, kv_heads, head_dim, block_size,
                                                            max_len / block_size + 1, KVLayout::NHD,
                                                            window, sinks);
      }
      CHECK(store->window() == window);
      CHECK(store->sinks() == sinks);
      kvlab::SelectiveStore<double> fresh_oracle(layers, kv_heads, head_dim, every_head);
      const int seq = store->add_sequence();
      const int want_seq = fresh_oracle.add_sequence();
      int fed = 0;
      double worst = 0;
      for (int n : chunks) {
        if (fed + n > max_len) break;
        CAPTURE(fed, n);
        const RowMatrix<double> x = inputs.middleRows(fed, n);
        const RowMatrix<double> got = kvlab::run_stack(*stack, *store, {seq}, {0, n}, x);
        const RowMatrix<double> want =
            kvlab::run_stack(*stack, fresh_oracle, {want_seq}, {0, n}, x);
        worst = std::max(worst, max_row_relative_error(got, want));
        fed += n;
        // what the store keeps: the contiguous one its whole ring; the paged one the blocks of
        // the sinks and of the next token's window (from fed - W + 1) to its end
        if (std::string(name) == "paged") {
          const int from = kvlab::first_visible_key(fed, window);
          int blocks = 0;
          for (int b = 0; b * block_size < fed; ++b)
            if (b * block_size < sinks || (b + 1) * block_size > from) ++blocks;
          CHECK(store->paged_pool()->held_blocks(seq) == blocks);
        }
      }
      CHECK(fed > 40);  // the ring wrapped, blocks went back
      CHECK(worst <= tolerance<double>());
    }
  }
}

TEST_CASE("every store: bytes reserved and used follow the sequences") {
  const auto stack = AttentionStack<float>::random(2, AttentionShape(4, 2, 8), 16, 2);
  const std::size_t token_kv = 2 * 2 * 2 * 8 * sizeof(float);  // K and V, 2 layers, 2 heads, 8
  kvlab::Rng rng(4);
  const RowMatrix<float> x = kvlab::random_matrix<float>(9, 16, rng);
  SECTION("recompute keeps the inputs: 16 floats per token") {
    kvlab::RecomputeStore<float> store(2, 2, 8, 16);
    const int s = store.add_sequence();
    kvlab::run_stack(*stack, store, {s}, {0, 9}, x);
    CHECK(store.bytes_used() == 9 * 16 * sizeof(float));
    CHECK(store.bytes_reserved() == store.bytes_used());
  }
  SECTION("contiguous reserves its capacity per sequence") {
    kvlab::ContiguousStore<float> store(2, 2, 8, 12);
    const int s = store.add_sequence();
    store.add_sequence();  // empty, but reserved
    kvlab::run_stack(*stack, store, {s}, {0, 9}, x);
    CHECK(store.bytes_reserved() == 2 * 12 * token_kv);
    CHECK(store.bytes_used() == 9 * token_kv);
  }
  SECTION("paged reserves whole blocks as sequences grow, shared blocks once") {
    kvlab::PagedStore<float> store(2, 2, 8, 4, 10);
    const int s = store.add_sequence();
    store.add_sequence();  // empty: no block
    kvlab::run_stack(*stack, store, {s}, {0, 9}, x);
    CHECK(store.bytes_reserved() == 3 * 4 * token_kv);  // 9 tokens in 3 blocks of 4
    CHECK(store.bytes_used() == 9 * token_kv);
    store.fork(s);  // shares all three blocks
    CHECK(store.bytes_reserved() == 3 * 4 * token_kv);
    CHECK(store.bytes_used() == 9 * token_kv);
  }
  SECTION("reduced precision: the bytes as stored, 2, 2, 34/32 and 18/32 bytes per value") {
    const auto wide = AttentionStack<float>::random(2, AttentionShape(4, 2, 32), 16, 2);
    // per token: K and V, 2 layers, 2 heads of 32 values
    const std::size_t values = 2 * 2 * 2 * 32;
    kvlab::ContiguousStore<float, Eigen::half> fp16(2, 2, 32, 12);
    kvlab::PagedStore<float, Eigen::bfloat16> bf16(2, 2, 32, 4, 10);
    kvlab::ContiguousStore<float, kvlab::BlockQ8_0> int8(2, 2, 32, 12);
    kvlab::PagedStore<float, kvlab::BlockQ4_0> int4(2, 2, 32, 4, 10);
    CHECK(fp16.bytes_per_token() == values * 2);
    CHECK(bf16.bytes_per_token() == values * 2);
    CHECK(int8.bytes_per_token() == values / 32 * 34);
    CHECK(int4.bytes_per_token() == values / 32 * 18);
    for (KVStore<float>* store : std::vector<KVStore<float>*>{&fp16, &bf16, &int8, &int4}) {
      CAPTURE(store->storage_name());
      const int s = store->add_sequence();
      kvlab::run_stack(*wide, *store, {s}, {0, 9}, x);
      CHECK(store->bytes_used() == 9 * store->bytes_per_token());
    }
    CHECK(fp16.bytes_reserved() == 12 * fp16.bytes_per_token());
    CHECK(int4.bytes_reserved() == 3 * 4 * int4.bytes_per_token());
  }
}

TEST_CASE("a step is all or nothing: no room for one sequence fails the step, nothing changes") {
  const auto stack = AttentionStack<float>::random(2, AttentionShape(4, 2, 8), 16, 3);
  kvlab::Rng rng(6);
  const RowMatrix<float> x = kvlab::random_matrix<float>(13, 16, rng);
  SECTION("paged: the blocks of the whole step are counted before any is taken") {
    kvlab::PagedStore<float> store(2, 2, 8, 4, 4);  // 16 tokens in all
    const int a = store.add_sequence(), b = store.add_sequence();
    kvlab::run_stack(*stack, store, {a}, {0, 3}, RowMatrix<float>(x.topRows(3)));
    // a needs 1 more block for 3 tokens (4 + 2), b needs 3 for 10: 4 > 3 free.
    CHECK_THROWS_MATCHES(kvlab::run_stack(*stack, store, {a, b}, {0, 3, 13}, x), kvlab::OutOfBlocks,
                         names("free blocks", "at least 4 for 13 new tokens of 2 sequences", "3"));
    CHECK(store.length(a) == 3);
    CHECK(store.length(b) == 0);
    CHECK(store.cache().allocator().num_free() == 3);
    CHECK_NOTHROW(
        kvlab::run_stack(*stack, store, {a, b}, {0, 3, 9}, RowMatrix<float>(x.topRows(9))));
    CHECK(store.cache().allocator().num_free() == 0);
  }
  SECTION("paged: a forked pair decoding together copies their shared last block once") {
    kvlab::PagedStore<float> store(2, 2, 8, 4, 3);  // 12 tokens in all
    const int a = store.add_sequence();
    kvlab::run_stack(*stack, store, {a}, {0, 6}, RowMatrix<float>(x.topRows(6)));  // 2 blocks
    const int b = store.fork(a);  // shares both; the last is 2/4 full
    CHECK(store.cache().allocator().num_free() == 1);
    // One new token each: a copy for the first of them; the second then holds the block alone.
    CHECK_NOTHROW(
        kvlab::run_stack(*stack, store, {a, b}, {0, 1, 2}, RowMatrix<float>(x.topRows(2))));
    CHECK(store.cache().allocator().num_free() == 0);
    CHECK(store.length(a) == 7);
    CHECK(store.length(b) == 7);
  }
  SECTION("contiguous: a sequence past its capacity fails the step") {
    kvlab::ContiguousStore<float> store(2, 2, 8, 8);
    const int a = store.add_sequence(), b = store.add_sequence();
    CHECK_THROWS_MATCHES(
        kvlab::run_stack(*stack, store, {a, b}, {0, 2, 11}, RowMatrix<float>(x.topRows(11))),
        kvlab::CapacityError,
        names("new tokens of sequence 1", "at most 8 (capacity 8, length 0)", "9"));
    CHECK(store.length(a) == 0);
    CHECK_NOTHROW(
        kvlab::run_stack(*stack, store, {a, b}, {0, 2, 10}, RowMatrix<float>(x.topRows(10))));
  }
}

TEST_CASE("every store: an aborted step leaves every sequence as it was") {
  const StoreKind kind = GENERATE(from_range(std::begin(kKinds), std::end(kKinds)));
  CAPTURE(kind.name, kind.block_size, kvlab::dtype_name(kind.dtype), kind.window, kind.selective,
          kind.sinks);
  const auto stack = AttentionStack<double>::random(2, AttentionShape(4, 2, 32), 16, 4);
  kvlab::Rng rng(8);
  const RowMatrix<double> x = kvlab::random_matrix<double>(8, 16, rng);
  const auto store = make_store<double>(kind, *stack, 16, 2);
  const auto twin = make_store<double>(kind, *stack, 16, 2);
  const int a = store->add_sequence(), b = store->add_sequence();
  const int ta = twin->add_sequence(), tb = twin->add_sequence();
  kvlab::run_stack(*stack, *store, {a, b}, {0, 3, 5}, RowMatrix<double>(x.topRows(5)));
  kvlab::run_stack(*stack, *twin, {ta, tb}, {0, 3, 5}, RowMatrix<double>(x.topRows(5)));
  // A step that fails after layer 0 kept its K and V (a wrong query shape in attend).
  RowMatrix<double> inputs;
  const kvlab::StepBatch& step =
      store->begin_step({b, a}, {0, 1, 3}, RowMatrix<double>(x.bottomRows(3)), inputs);
  CHECK(step.size() == 2);
  RowMatrix<double> k = RowMatrix<double>::Zero(step.rows(), 64), v = k, out;
  store->append(0, k, v);
  CHECK_THROWS_MATCHES(store->attend(0, stack->shape(), RowMatrix<double>::Zero(step.rows(), 127),
                                     step.row_indptr, out, nullptr),
                       kvlab::InvalidArgument,
                       names("q.cols()", "128 (num_heads * head_dim)", "127"));
  CHECK_THROWS_MATCHES(store->free_sequence(a), kvlab::InvalidArgument,
                       names("step", "no step open (end_step or abort_step first)", "a step open"));
  store->abort_step();
  CHECK(store->length(a) == 3);
  CHECK(store->length(b) == 2);
  // It goes on exactly as the twin that never saw the failed step.
  const RowMatrix<double> y =
      kvlab::run_stack(*stack, *store, {b, a}, {0, 1, 3}, RowMatrix<double>(x.bottomRows(3)));
  const RowMatrix<double> want =
      kvlab::run_stack(*stack, *twin, {tb, ta}, {0, 1, 3}, RowMatrix<double>(x.bottomRows(3)));
  CHECK(y == want);
}

TEST_CASE("KVStore checks every argument and names it") {
  kvlab::PagedStore<float> store(1, 2, 8, 4, 8);
  const int a = store.add_sequence();
  RowMatrix<float> inputs;
  const RowMatrix<float> two = RowMatrix<float>::Zero(2, 16);
  CHECK_THROWS_MATCHES(store.begin_step({}, {0}, two, inputs), kvlab::InvalidArgument,
                       names("seqs.size()", ">= 1", "0"));
  CHECK_THROWS_MATCHES(store.begin_step({a}, {0, 1, 2}, two, inputs), kvlab::InvalidArgument,
                       names("new_indptr.size()", "2 (seqs.size() + 1)", "3"));
  CHECK_THROWS_MATCHES(store.begin_step({7}, {0, 2}, two, inputs), kvlab::InvalidArgument,
                       names("seqs[0]", "a live sequence id", "7"));
  CHECK_THROWS_MATCHES(store.begin_step({a, a}, {0, 1, 2}, two, inputs), kvlab::InvalidArgument,
                       names("seqs[1]", "a sequence not already in the batch", "0"));
  CHECK_THROWS_MATCHES(
      store.begin_step({a}, {0, 0}, RowMatrix<float>(0, 16), inputs), kvlab::InvalidArgument,
      names("new_indptr[1]", "> new_indptr[0] (0): every sequence adds at least one token", "0"));
  CHECK_THROWS_MATCHES(store.begin_step({a}, {0, 3}, two, inputs), kvlab::InvalidArgument,
                       names("new_inputs.rows()", "3 (new_indptr[batch])", "2"));
  CHECK_THROWS_MATCHES(store.append(0, two, two), kvlab::InvalidArgument,
                       names("step", "a step open (begin_step first)", "none"));
  CHECK(store.length(a) == 0);
  CHECK(store.cache().allocator().num_free() == 8);
  store.begin_step({a}, {0, 2}, two, inputs);
  CHECK_THROWS_MATCHES(store.begin_step({a}, {0, 2}, two, inputs), kvlab::InvalidArgument,
                       names("step", "no step open (end_step or abort_step first)", "a step open"));
  CHECK_THROWS_MATCHES(store.append(1, two, two), kvlab::InvalidArgument,
                       names("layer", "in [0, 1)", "1"));
  CHECK_THROWS_MATCHES(store.append(0, RowMatrix<float>::Zero(3, 16), two), kvlab::InvalidArgument,
                       names("k.rows()", "2 (the step's rows)", "3"));
  store.append(0, two, two);
  RowMatrix<float> out;
  CHECK_THROWS_MATCHES(
      store.attend(0, AttentionShape(4, 2, 8), RowMatrix<float>::Zero(3, 32), {0, 3}, out, nullptr),
      kvlab::InvalidArgument,
      names("q_indptr[1]", "q_indptr[0] + [1, 2] (the rows of sequence 0)", "3"));
  CHECK_THROWS_MATCHES(
      store.attend(0, AttentionShape(4, 4, 8), RowMatrix<float>::Zero(2, 32), {0, 2}, out, nullptr),
      kvlab::InvalidArgument, names("shape.num_kv_heads()", "2 (the store's num_kv_heads)", "4"));
  store.end_step();
  CHECK(store.length(a) == 2);
  CHECK_THROWS_MATCHES(store.truncate(a, 3), kvlab::InvalidArgument,
                       names("length", "in [0, 2]", "3"));
  CHECK_THROWS_MATCHES(store.fork(5), kvlab::InvalidArgument,
                       names("seq", "a live sequence id", "5"));
  CHECK_THROWS_MATCHES(kvlab::PagedStore<float>(nullptr), kvlab::InvalidArgument,
                       names("pool", "a non-null pool", "nullptr"));
  CHECK_THROWS_MATCHES(kvlab::ContiguousStore<float>(1, 2, 8, 0), kvlab::InvalidArgument,
                       names("capacity", ">= 1", "0"));
  CHECK_THROWS_MATCHES(kvlab::RecomputeStore<float>(1, 2, 8, 0), kvlab::InvalidArgument,
                       names("input_width", ">= 1", "0"));
}
