// SelectiveStore: a policy per layer and K/V head. What it computes is checked against what
// already computes it — the contiguous store where one policy covers every head (full, a window,
// one storage type), `cpu::reference_attention` over the decoded rows where keys and values
// differ in type — and what it holds against the closed forms of `HeadPolicy`: the sinks and the
// window are never dropped, heavy hitters are the rows that received the most attention, bytes
// are the rows held times their row bytes. (The suite over every store, test_kv_store.cpp, runs
// its batching, fork and abort cases over it too.)
//
// Tolerances: against the contiguous store, float 1e-5 and double 1e-12 relative to max(1, row
// max) (test_support.hpp: the same scores summed in another order — matrix products here, the
// tuned kernel's row loops there; measured below 3e-7 in float); against reference_attention in
// double, 1e-12 likewise.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "kvlab/kvlab.hpp"
#include "test_support.hpp"

using kvlab::AttentionShape;
using kvlab::AttentionStack;
using kvlab::HeadPolicy;
using kvlab::KVDtype;
using kvlab::KVStore;
using kvlab::RowMatrix;
using kvlab::SelectiveStore;
using kvlab_test::max_row_relative_error;
using kvlab_test::names;
using kvlab_test::tolerance;

namespace {

// Feeds `x` (one sequence's inputs) to `store` in steps of the given sizes; returns the outputs.
template <typename T>
RowMatrix<T> feed(const AttentionStack<T>& stack, KVStore<T>& store, int seq, const RowMatrix<T>& x,
                  const std::vector<int>& steps) {
  RowMatrix<T> y(x.rows(), x.cols());
  int at = 0;
  for (int n : steps) {
    y.middleRows(at, n) =
        kvlab::run_stack(stack, store, {seq}, {0, n}, RowMatrix<T>(x.middleRows(at, n)));
    at += n;
  }
  REQUIRE(at == x.rows());
  return y;
}

const std::vector<int> kSteps = {7, 1, 1, 12, 1, 3, 1, 1, 16, 1, 2, 1};  // 47 tokens

// Every head of a 3-layer, 2-K/V-head stack on `policy`.
std::vector<HeadPolicy> every_head(const HeadPolicy& policy) {
  return std::vector<HeadPolicy>(6, policy);
}

// `x` stored as `S` and read back.
template <typename S>
RowMatrix<double> round_trip(const RowMatrix<double>& x) {
  RowMatrix<double> y(x.rows(), x.cols());
  std::vector<S> row(kvlab::storage_row_bytes<S>(static_cast<int>(x.cols())) / sizeof(S));
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    kvlab::KVStorage<S>::encode(x.row(r).data(), static_cast<int>(x.cols()), row.data());
    kvlab::KVStorage<S>::decode(row.data(), static_cast<int>(x.cols()), y.row(r).data());
  }
  return y;
}

}  // namespace

TEST_CASE("SelectiveStore: one policy on every head computes what the contiguous store does") {
  const AttentionShape shape(8, 2, 32);
  const auto stack = AttentionStack<float>::random(3, shape, 32, 5);
  kvlab::Rng rng(7);
  const RowMatrix<float> x = kvlab::random_matrix<float>(47, 32, rng);
  SECTION("every token at fp32: the full cache") {
    SelectiveStore<float> selective(3, 2, 32, every_head(HeadPolicy{}));
    kvlab::ContiguousStore<float> full(3, 2, 32, 47);
    const RowMatrix<float> got = feed(*stack, selective, selective.add_sequence(), x, kSteps);
    const RowMatrix<float> want = feed(*stack, full, full.add_sequence(), x, kSteps);
    CHECK(max_row_relative_error(got, want) <= tolerance<float>());
    CHECK(selective.bytes_used() == full.bytes_used());
    CHECK(std::string(selective.storage_name()) == "fp32");
  }
  SECTION("a window of 6: the ring, query by query within a step") {
    SelectiveStore<float> selective(3, 2, 32,
                                    every_head(HeadPolicy{KVDtype::fp32, KVDtype::fp32, 6}));
    kvlab::ContiguousStore<float> ring(3, 2, 32, 6 - 1 + 16, 6);
    const RowMatrix<float> got = feed(*stack, selective, selective.add_sequence(), x, kSteps);
    const RowMatrix<float> want = feed(*stack, ring, ring.add_sequence(), x, kSteps);
    CHECK(max_row_relative_error(got, want) <= tolerance<float>());
    CHECK(selective.bytes_used() == 5 * selective.bytes_per_token());  // the next query's W - 1
  }
  SECTION("heavy hitters that cover every token drop nothing: the full cache") {
    SelectiveStore<float> selective(3, 2, 32,
                                    every_head(HeadPolicy{KVDtype::fp32, KVDtype::fp32, 4, 1, 47}));
    kvlab::ContiguousStore<float> full(3, 2, 32, 47);
    const RowMatrix<float> got = feed(*stack, selective, selective.add_sequence(), x, kSteps);
    const RowMatrix<float> want = feed(*stack, full, full.add_sequence(), x, kSteps);
    CHECK(max_row_relative_error(got, want) <= tolerance<float>());
  }
}

TEST_CASE(
    "SelectiveStore: each storage type on every head computes what that contiguous store does") {
  const AttentionShape shape(4, 2, 32);
  const auto stack = AttentionStack<double>::random(3, shape, 16, 6);
  kvlab::Rng rng(8);
  const RowMatrix<double> x = kvlab::random_matrix<double>(47, 16, rng);
  for (KVDtype dtype : {KVDtype::fp16, KVDtype::bf16, KVDtype::int8, KVDtype::int4}) {
    CAPTURE(kvlab::dtype_name(dtype));
    SelectiveStore<double> selective(3, 2, 32, every_head(HeadPolicy{dtype, dtype}));
    kvlab::visit_kv_dtype(dtype, [&](auto tag) {
      using S = typename decltype(tag)::type;
      kvlab::ContiguousStore<double, S> contiguous(3, 2, 32, 47);
      const RowMatrix<double> got = feed(*stack, selective, selective.add_sequence(), x, kSteps);
      const RowMatrix<double> want = feed(*stack, contiguous, contiguous.add_sequence(), x, kSteps);
      CHECK(max_row_relative_error(got, want) <= tolerance<double>());
      CHECK(selective.bytes_used() == contiguous.bytes_used());
      CHECK(std::string(selective.storage_name()) == kvlab::dtype_name(dtype));
    });
  }
}

TEST_CASE("SelectiveStore: keys and values each in their own type") {
  // One layer, 2 K/V heads of 4 query heads: head 0 keeps K fp16 and V int4, head 1 K int8 and V
  // fp32. One step of 9 tokens and a decode step; the oracle is reference_attention over the
  // rows each head's types give back.
  const AttentionShape shape(4, 2, 32);
  SelectiveStore<double> store(
      1, 2, 32,
      {HeadPolicy{KVDtype::fp16, KVDtype::int4}, HeadPolicy{KVDtype::int8, KVDtype::fp32}});
  CHECK(std::string(store.storage_name()) == "mixed");
  CHECK(store.bytes_per_token() == (2 * 32) + 18 + 34 + 8 * 32);
  kvlab::Rng rng(9);
  const RowMatrix<double> k = kvlab::random_matrix<double>(10, 64, rng);  // [tokens, kv_width]
  const RowMatrix<double> v = kvlab::random_matrix<double>(10, 64, rng);
  const RowMatrix<double> q = kvlab::random_matrix<double>(10, 128, rng);  // [tokens, q_width]
  RowMatrix<double> stored_k(10, 64), stored_v(10, 64);  // what the heads give back
  stored_k << round_trip<Eigen::half>(k.leftCols(32)),
      round_trip<kvlab::BlockQ8_0>(k.rightCols(32));
  stored_v << round_trip<kvlab::BlockQ4_0>(v.leftCols(32)), v.rightCols(32);
  const int seq = store.add_sequence();
  RowMatrix<double> out, inputs;
  int at = 0;
  for (int n : {9, 1}) {
    store.begin_step({seq}, {0, n}, RowMatrix<double>::Zero(n, 1), inputs);
    store.append(0, k.middleRows(at, n), v.middleRows(at, n));
    kvlab::CostCounters counters;
    store.attend(0, shape, q.middleRows(at, n), {0, n}, out, &counters);
    store.end_step();
    const RowMatrix<double> want = kvlab::cpu::reference_attention(
        shape, q.middleRows(at, n), stored_k.topRows(at + n), stored_v.topRows(at + n), at);
    CHECK(max_row_relative_error(out, want) <= tolerance<double>());
    // every held row read once per K/V head, and scored by every query of its group, masked
    // ones too (the store computes the whole score matrix)
    CHECK(counters.kv_bytes_read == static_cast<std::uint64_t>(at + n) * store.bytes_per_token());
    CHECK(counters.qk_dots ==
          static_cast<std::uint64_t>(n) * 4 * static_cast<std::uint64_t>(at + n));
    at += n;
  }
  CHECK(store.bytes_used() == 10 * store.bytes_per_token());
}

TEST_CASE("SelectiveStore: sinks and the window are never dropped, and bytes are the rows held") {
  const auto stack = AttentionStack<float>::random(3, AttentionShape(8, 2, 32), 32, 5);
  kvlab::Rng rng(10);
  const RowMatrix<float> x = kvlab::random_matrix<float>(47, 32, rng);
  const HeadPolicy sinks{KVDtype::fp32, KVDtype::int8, 8, 3};
  const HeadPolicy h2o{KVDtype::int4, KVDtype::fp32, 5, 1, 4};
  std::vector<HeadPolicy> heads = {HeadPolicy{}, sinks, h2o, sinks, h2o, HeadPolicy{}};
  SelectiveStore<float> store(3, 2, 32, heads);
  const int seq = store.add_sequence();
  int length = 0;
  for (int n : kSteps) {
    kvlab::run_stack(*stack, store, {seq}, {0, n}, RowMatrix<float>(x.middleRows(length, n)));
    length += n;
    CAPTURE(length);
    std::size_t bytes = 0;
    for (int l = 0; l < 3; ++l) {
      for (int h = 0; h < 2; ++h) {
        const HeadPolicy& p = store.policy(l, h);
        const std::vector<int> held = store.held_positions(seq, l, h);
        REQUIRE(static_cast<long long>(held.size()) == p.rows_held(length));
        CHECK(std::is_sorted(held.begin(), held.end()));
        std::vector<int> must;  // the sinks and the next query's W - 1 keys (or every token)
        for (int pos = 0; pos < length; ++pos) {
          if (p.window == 0 || pos < p.sinks || pos > length - p.window) must.push_back(pos);
        }
        CHECK(std::includes(held.begin(), held.end(), must.begin(), must.end()));
        bytes += held.size() *
                 (kvlab::storage_row_bytes<float>(32) * (p.key == KVDtype::fp32) +
                  kvlab::storage_row_bytes<kvlab::BlockQ4_0>(32) * (p.key == KVDtype::int4) +
                  kvlab::storage_row_bytes<float>(32) * (p.value == KVDtype::fp32) +
                  kvlab::storage_row_bytes<kvlab::BlockQ8_0>(32) * (p.value == KVDtype::int8));
      }
    }
    CHECK(store.bytes_used() == bytes);
    CHECK(store.bytes_reserved() == bytes);
  }
  // Going back: the window store can stay, not reach below what it dropped.
  CHECK_THROWS_MATCHES(store.truncate(seq, 40), kvlab::InvalidArgument,
                       names("length",
                             "at least 47 (layer 0, K/V head 1 has dropped position 39, "
                             "which the next token's window would see)",
                             "40"));
  CHECK(store.length(seq) == 47);
  store.truncate(seq, 47);
}

TEST_CASE("SelectiveStore: the heavy hitters are the keys that received the most attention") {
  // One layer, one head of 32 values; every query is e0, position 3's key is 40·e0 (a score of
  // 40/sqrt(32) = 7.1 against 0 for the others, whose keys are orthogonal to e0): position 3
  // takes 0.998 of each later query's attention — more in two queries than position 0 gathers
  // in its first five (1 + 1/2 + 1/3 + ...) — so a head of window 2 and one
  // heavy hitter holds {3, n - 1} once it has dropped anything — decoded one token at a time,
  // H2O's own definition. With no heavy hitter it holds {n - 1}.
  const AttentionShape shape(1, 1, 32);
  for (int heavy : {0, 1}) {
    CAPTURE(heavy);
    SelectiveStore<double> store(1, 1, 32, {HeadPolicy{KVDtype::fp32, KVDtype::fp32, 2, 0, heavy}});
    const int seq = store.add_sequence();
    kvlab::Rng rng(11);
    RowMatrix<double> out, inputs;
    for (int n = 0; n < 12; ++n) {
      RowMatrix<double> k = kvlab::random_matrix<double>(1, 32, rng);
      k(0, 0) = n == 3 ? 40.0 : 0.0;
      const RowMatrix<double> v = kvlab::random_matrix<double>(1, 32, rng);
      RowMatrix<double> q = RowMatrix<double>::Zero(1, 32);
      q(0, 0) = 1.0;
      store.begin_step({seq}, {0, 1}, RowMatrix<double>::Zero(1, 1), inputs);
      store.append(0, k, v);
      store.attend(0, shape, q, {0, 1}, out, nullptr);
      store.end_step();
    }
    const std::vector<int> want = heavy == 1 ? std::vector<int>{3, 11} : std::vector<int>{11};
    CHECK(store.held_positions(seq, 0, 0) == want);
  }
}

TEST_CASE("SelectiveStore: the attention a window with sinks would leave out, per head") {
  // Keys all zero: every query spreads its attention evenly, 1 / (p + 1) on each key up to
  // itself, so the query at p puts (p − W + 1 − S) / (p + 1) on the keys at or before p − W
  // that are not sinks. Decoded one token at a time, W = 3, S = 1, two query heads per K/V
  // head: both heads' means are the mean of that over p.
  const AttentionShape grouped(4, 2, 32);
  SelectiveStore<double> store(1, 2, 32, {HeadPolicy{}, HeadPolicy{}});
  CHECK_THROWS_MATCHES(store.attention_outside(), kvlab::InvalidArgument,
                       names("measure_outside", "called first", "not called"));
  store.measure_outside(3, 1);
  const int seq = store.add_sequence();
  kvlab::Rng rng(12);
  RowMatrix<double> out, inputs;
  double want = 0;
  for (int p = 0; p < 10; ++p) {
    store.begin_step({seq}, {0, 1}, RowMatrix<double>::Zero(1, 1), inputs);
    store.append(0, RowMatrix<double>::Zero(1, 64), kvlab::random_matrix<double>(1, 64, rng));
    store.attend(0, grouped, kvlab::random_matrix<double>(1, 128, rng), {0, 1}, out, nullptr);
    store.end_step();
    want += std::max(0, p - 3 + 1 - 1) / static_cast<double>(p + 1);
  }
  want /= 10;
  const std::vector<double> outside = store.attention_outside();
  REQUIRE(outside.size() == 2);
  CHECK(std::abs(outside[0] - want) <= 1e-12);
  CHECK(std::abs(outside[1] - want) <= 1e-12);
}
