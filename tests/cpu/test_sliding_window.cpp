// Sliding-window attention in the oracle and the CPU kernels: the query at position p sees the W
// keys (p − W, p] (the convention of transformers, vLLM, llama.cpp and FlashInfer's
// window_left = W − 1). The oracle's band agrees with the oracle without a window over the
// band's keys, and W = 1 returns each token's own value; the contiguous kernel reading a ring of
// W − 1 + q slots, and the paged kernels reading tables whose blocks before the window went back
// to the pool, give the oracle's band — for sequences shorter than W, equal to W, W ± 1, W = 1,
// windows across block boundaries, prefill chunks longer and shorter than W, GQA, decode split
// along the context (asserted to have run) — and count only the keys they read; a released block
// inside a window, or a ring too small for its queries, is refused.
//
// Tolerance: test_support.hpp's rule (float 1e-5): the kernels compute the oracle's sums in
// another order.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kvlab/kvlab.hpp"
#include "ran_counts.hpp"
#include "test_support.hpp"

using kvlab::AttentionShape;
using kvlab::RowMatrix;
using kvlab_test::max_row_relative_error;
using kvlab_test::names;

namespace {

// A contiguous ring of `capacity` slots holding the rows of `k` and `v` ([n, kv_width]) in
// order, each row pos in slot pos % capacity (the later rows overwrite the earlier ones).
struct Ring {
  std::vector<float> k, v;  // [num_kv_heads, capacity, head_dim] each
  kvlab::ContiguousKVView<float> view;

  Ring(const AttentionShape& shape, const RowMatrix<float>& keys, const RowMatrix<float>& values,
       int capacity, int window) {
    const int hd = shape.head_dim(), heads = shape.num_kv_heads();
    k.assign(static_cast<std::size_t>(heads * capacity * hd), -1e30f);  // never read
    v = k;
    view.k = k.data();
    view.v = v.data();
    view.num_kv_heads = heads;
    view.head_dim = hd;
    view.capacity = capacity;
    view.length = static_cast<int>(keys.rows());
    view.window = window;
    for (int pos = 0; pos < keys.rows(); ++pos)
      for (int h = 0; h < heads; ++h)
        for (int c = 0; c < hd; ++c) {
          k[static_cast<std::size_t>(view.offset(h, pos) + c)] = keys(pos, h * hd + c);
          v[static_cast<std::size_t>(view.offset(h, pos) + c)] = values(pos, h * hd + c);
        }
  }
};

}  // namespace

TEST_CASE(
    "the oracle's band: W = 1 is the token's own value, the band equals the oracle over its keys") {
  const AttentionShape shape(4, 2, 8);
  kvlab::Rng rng(1);
  const RowMatrix<double> k = kvlab::random_matrix<double>(20, shape.kv_width(), rng);
  const RowMatrix<double> v = kvlab::random_matrix<double>(20, shape.kv_width(), rng);
  const RowMatrix<double> q = kvlab::random_matrix<double>(20, shape.q_width(), rng);
  // W = 1: each query sees its own key only, so its output is its own value row
  const RowMatrix<double> own = kvlab::cpu::reference_attention(shape, q, k, v, 0, 1);
  for (int i = 0; i < 20; ++i)
    for (int h = 0; h < shape.num_heads(); ++h)
      for (int c = 0; c < 8; ++c) CHECK(own(i, h * 8 + c) == v(i, shape.kv_head_of(h) * 8 + c));
  for (int window : {2, 5, 19, 20, 50}) {
    CAPTURE(window);
    const RowMatrix<double> band = kvlab::cpu::reference_attention(shape, q, k, v, 0, window);
    for (int i = 0; i < 20; ++i) {
      const int first = std::max(0, i - window + 1);
      // the same query over the band's keys alone, with no window: it is their last key
      const RowMatrix<double> alone =
          kvlab::cpu::reference_attention(shape, q.row(i), k.middleRows(first, i - first + 1),
                                          v.middleRows(first, i - first + 1), i - first);
      CHECK(max_row_relative_error(RowMatrix<double>(band.row(i)), alone) <= 1e-14);
    }
    if (window >= 20) CHECK(band == kvlab::cpu::reference_attention(shape, q, k, v, 0));
  }
  CHECK_THROWS_MATCHES(kvlab::cpu::reference_attention(shape, q, k, v, 0, -1),
                       kvlab::InvalidArgument, names("window", ">= 0", "-1"));
}

TEST_CASE("decode_attention over a ring of W - 1 + q slots gives the oracle's band") {
  const AttentionShape shape(6, 2, 16);  // GQA
  kvlab::Rng rng(2);
  const RowMatrix<float> k = kvlab::random_matrix<float>(80, shape.kv_width(), rng);
  const RowMatrix<float> v = kvlab::random_matrix<float>(80, shape.kv_width(), rng);
  const RowMatrix<float> q = kvlab::random_matrix<float>(24, shape.q_width(), rng);
  int cases = 0;
  for (int window : {1, 4, 7, 16}) {
    for (int q_len : {1, 3, window, window + 5, 20}) {
      // sequences shorter than W, equal, W ± 1, longer; the ring as small as it may be, and larger
      for (int n : {q_len, window - 1, window, window + 1, 3 * window + 5, 80}) {
        if (n < q_len || n > 80) continue;
        for (int capacity : {window - 1 + q_len, window + q_len + 6}) {
          CAPTURE(window, q_len, n, capacity);
          const Ring ring(shape, k.topRows(n), v.topRows(n), capacity, window);
          kvlab::CostCounters counters;
          const RowMatrix<float> got =
              kvlab::cpu::decode_attention(shape, q.topRows(q_len), ring.view, &counters);
          const RowMatrix<float> want = kvlab::cpu::reference_attention(
              shape, q.topRows(q_len), k.topRows(n), v.topRows(n), n - q_len, window);
          CHECK(max_row_relative_error(got, want) <= kvlab_test::tolerance<float>());
          std::uint64_t keys = 0;  // each query's band
          for (int i = 0; i < q_len; ++i)
            keys += static_cast<std::uint64_t>(std::min(window, n - q_len + i + 1));
          CHECK(counters.qk_dots == keys * static_cast<std::uint64_t>(shape.num_heads()));
          ++cases;
        }
      }
    }
  }
  CHECK(cases > 80);
  SECTION("a ring too small for its queries and their window is refused") {
    const Ring ring(shape, k.topRows(40), v.topRows(40), 10, 7);  // 10 slots: q <= 4
    RowMatrix<float> out;
    CHECK_NOTHROW(kvlab::cpu::decode_attention(shape, q.topRows(4), ring.view, out));
    CHECK_THROWS_MATCHES(kvlab::cpu::decode_attention(shape, q.topRows(5), ring.view, out),
                         kvlab::InvalidArgument,
                         names("q.rows()", "at most cache.capacity - cache.window + 1 = 4", "5"));
  }
}

TEST_CASE("the paged kernels give the oracle's band, with the blocks before each window released") {
  const AttentionShape shape(8, 2, 16);
  kvlab::Rng rng(3);
  const std::vector<int> lengths = {3, 17, 40, 64, 9};  // ragged, across block boundaries
  const int window = GENERATE(1, 5, 8, 13);
  const int block_size = GENERATE(1, 3, 8);
  const auto layout = GENERATE(kvlab::KVLayout::NHD, kvlab::KVLayout::HND);
  CAPTURE(window, block_size, kvlab::to_string(layout));
  std::vector<RowMatrix<float>> ks, vs;  // [sequence][length, kv_width]
  for (int n : lengths) {
    ks.push_back(kvlab::random_matrix<float>(n, shape.kv_width(), rng));
    vs.push_back(kvlab::random_matrix<float>(n, shape.kv_width(), rng));
  }
  // the sequences' queries: a decode token, a chunk shorter and one longer than the window
  const std::vector<int> q_lens = {1, 4, 20, 1, 9};
  std::vector<std::int32_t> qo_indptr{0};
  for (int n : q_lens) qo_indptr.push_back(qo_indptr.back() + n);
  const RowMatrix<float> q = kvlab::random_matrix<float>(qo_indptr.back(), shape.q_width(), rng);
  kvlab::BlockTables tables = kvlab::BlockTables::shuffled(lengths, block_size, 2, rng);
  const int num_blocks = tables.num_blocks();
  const std::size_t block_values =
      static_cast<std::size_t>(block_size) * static_cast<std::size_t>(shape.kv_width());
  std::vector<float> k(static_cast<std::size_t>(num_blocks) * block_values, -1e30f), v = k;
  kvlab::PagedKVView<float> view = tables.view(k.data(), v.data(), 2, 16, layout);
  for (int s = 0; s < view.batch; ++s)
    for (int pos = 0; pos < lengths[static_cast<std::size_t>(s)]; ++pos)
      for (int h = 0; h < 2; ++h)
        for (int c = 0; c < 16; ++c) {
          k[static_cast<std::size_t>(view.offset(s, pos, h) + c)] =
              ks[static_cast<std::size_t>(s)](pos, h * 16 + c);
          v[static_cast<std::size_t>(view.offset(s, pos, h) + c)] =
              vs[static_cast<std::size_t>(s)](pos, h * 16 + c);
        }
  // Release every block wholly before its sequence's first query's window, as a windowed pool
  // does: the tables keep their entries, which now point nowhere.
  std::vector<std::int32_t> indices(view.indices, view.indices + view.indptr[view.batch]);
  int released = 0;
  for (int s = 0; s < view.batch; ++s) {
    const int first = kvlab::first_visible_key(
        lengths[static_cast<std::size_t>(s)] - q_lens[static_cast<std::size_t>(s)], window);
    for (int page = 0; (page + 1) * block_size <= first; ++page, ++released)
      indices[static_cast<std::size_t>(view.indptr[s] + page)] = kvlab::kReleasedBlock;
  }
  view.indices = indices.data();
  view.window = window;
  const RowMatrix<float> got = kvlab::cpu::paged_prefill_attention(shape, q, qo_indptr, view);
  for (int s = 0; s < view.batch; ++s) {
    const auto i = static_cast<std::size_t>(s);
    const RowMatrix<float> want = kvlab::cpu::reference_attention(
        shape, q.middleRows(qo_indptr[i], q_lens[i]), ks[i], vs[i], lengths[i] - q_lens[i], window);
    CHECK(max_row_relative_error(RowMatrix<float>(got.middleRows(qo_indptr[i], q_lens[i])), want) <=
          kvlab_test::tolerance<float>());
  }
  if (window <= 5 && block_size <= 3) CHECK(released > 0);  // the released entries were skipped
  SECTION("a released block inside a query's window is refused") {
    // sequence 2 (40 tokens, 20 queries): its first query at 20 sees key 20 - W + 1
    const int page = kvlab::first_visible_key(20, window) / block_size;
    indices[static_cast<std::size_t>(view.indptr[2] + page)] = kvlab::kReleasedBlock;
    CHECK_THROWS_MATCHES(kvlab::cpu::paged_prefill_attention(shape, q, qo_indptr, view),
                         kvlab::InvalidArgument,
                         names("cache.indices[" + std::to_string(view.indptr[2] + page) + "]",
                               "a block of the pool (page " + std::to_string(page) +
                                   " of sequence 2 is within its queries' window)",
                               "kReleasedBlock (-1)"));
  }
}

TEST_CASE("paged decode split along the context keeps each query's window") {
  const AttentionShape shape(4, 2, 64);
  kvlab::Rng rng(4);
  const int n = 700, window = 100, block_size = 16;
  const RowMatrix<float> keys = kvlab::random_matrix<float>(n, shape.kv_width(), rng);
  const RowMatrix<float> values = kvlab::random_matrix<float>(n, shape.kv_width(), rng);
  const RowMatrix<float> q = kvlab::random_matrix<float>(1, shape.q_width(), rng);
  kvlab::BlockTables tables = kvlab::BlockTables::shuffled({n}, block_size, 0, rng);
  std::vector<float> k(
      static_cast<std::size_t>(tables.num_blocks() * block_size * shape.kv_width())),
      v = k;
  kvlab::PagedKVView<float> view = tables.view(k.data(), v.data(), 2, 64);
  for (int pos = 0; pos < n; ++pos)
    for (int h = 0; h < 2; ++h)
      for (int c = 0; c < 64; ++c) {
        k[static_cast<std::size_t>(view.offset(0, pos, h) + c)] = keys(pos, h * 64 + c);
        v[static_cast<std::size_t>(view.offset(0, pos, h) + c)] = values(pos, h * 64 + c);
      }
  view.window = window;
  const std::int32_t one[] = {0, 1};
  // the split this call takes with 2 threads: the context cut into partitions (split-K)
  const kvlab::cpu::PagedAttentionPlan plan = kvlab::cpu::plan_paged_attention(shape, view, one, 2);
  REQUIRE(plan.parallel);
  REQUIRE(plan.split_k);
#if defined(_OPENMP)
  const int before = omp_get_max_threads();
  omp_set_num_threads(2);
#endif
  kvlab::CostCounters counters;
  const kvlab_test::RanSince ran;
  const RowMatrix<float> got = kvlab::cpu::paged_decode_attention(shape, q, view, &counters);
#if defined(_OPENMP)
  omp_set_num_threads(before);
  // it ran split-K: the window's 100 keys, from the start of their first block (key 592), cut
  // into 2 partitions of whole blocks (64 + 44 keys), merged once
  CHECK(ran.split_k_calls() == 1);
  CHECK(ran.partitions() == 2);
  CHECK(ran.merges() == 1);
#else
  WARN("built without OpenMP: one thread, the context is not split");
  CHECK(ran.split_k_calls() == 0);
#endif
  const RowMatrix<float> want =
      kvlab::cpu::reference_attention(shape, q, keys, values, n - 1, window);
  CHECK(max_row_relative_error(got, want) <= kvlab_test::tolerance<float>());
  CHECK(counters.qk_dots == static_cast<std::uint64_t>(window * shape.num_heads()));
}

TEST_CASE("naive_attention's band equals the oracle's") {
  const AttentionShape shape(6, 3, 8);
  kvlab::Rng rng(5);
  const RowMatrix<double> k = kvlab::random_matrix<double>(30, shape.kv_width(), rng);
  const RowMatrix<double> v = kvlab::random_matrix<double>(30, shape.kv_width(), rng);
  const RowMatrix<double> q = kvlab::random_matrix<double>(12, shape.q_width(), rng);
  for (int window : {1, 4, 11, 40}) {
    CAPTURE(window);
    const RowMatrix<double> got = kvlab::cpu::naive_attention(shape, q, k, v, nullptr, window);
    const RowMatrix<double> want = kvlab::cpu::reference_attention(shape, q, k, v, 18, window);
    CHECK(max_row_relative_error(got, want) <= kvlab_test::tolerance<double>());
  }
}

TEST_CASE(
    "a windowed contiguous store, a ring of W - 1 + C slots, gives the windowed recompute store's "
    "outputs") {
  // Three layers: a layer's keys are the outputs of the one below, so a wrong window anywhere
  // changes every later output.
  const AttentionShape shape(4, 2, 8);
  const auto stack = kvlab::AttentionStack<double>::random(3, shape, 16, 6);
  kvlab::Rng rng(7);
  const RowMatrix<double> x = kvlab::random_matrix<double>(60, 16, rng);  // [tokens, d_model]
  const int window = GENERATE(1, 3, 8);
  const int chunk = GENERATE(1, 5, 12);  // the largest step: shorter and longer than the window
  CAPTURE(window, chunk);
  const int capacity = window - 1 + chunk;  // the smallest ring for steps of `chunk` tokens
  kvlab::ContiguousStore<double> ring(3, 2, 8, capacity, window);
  kvlab::RecomputeStore<double> oracle(3, 2, 8, 16, window);
  const int a = ring.add_sequence(), b = oracle.add_sequence();
  CHECK(ring.window() == window);
  // a prompt of `chunk` tokens, decode steps, a shorter chunk, decode to 60 tokens in all
  std::vector<int> steps{chunk};
  while (std::accumulate(steps.begin(), steps.end(), 0) < 60) {
    const int left = 60 - std::accumulate(steps.begin(), steps.end(), 0);
    steps.push_back(std::min(left, steps.size() % 7 == 3 ? std::max(1, chunk - 1) : 1));
  }
  int fed = 0;
  double worst = 0;
  for (int n : steps) {
    const RowMatrix<double> in = x.middleRows(fed, n);
    const RowMatrix<double> got = kvlab::run_stack(*stack, ring, {a}, {0, n}, in);
    const RowMatrix<double> want = kvlab::run_stack(*stack, oracle, {b}, {0, n}, in);
    worst = std::max(worst, max_row_relative_error(got, want));
    fed += n;
    CHECK(ring.length(a) == fed);
  }
  INFO("largest difference: " << worst);
  CHECK(worst <= kvlab_test::tolerance<double>());
  CHECK(fed > capacity);  // the ring wrapped
  // memory: the ring, however long the sequence
  CHECK(ring.bytes_reserved() ==
        2 * 3 * 2 * static_cast<std::size_t>(capacity) * 8 * sizeof(double));
  // a step larger than the ring allows changes nothing
  const RowMatrix<double> too_many = x.topRows(chunk + 1);
  CHECK_THROWS_MATCHES(
      kvlab::run_stack(*stack, ring, {a}, {0, chunk + 1}, too_many), kvlab::CapacityError,
      names("new tokens of sequence 0", "at most capacity - window + 1 = " + std::to_string(chunk),
            std::to_string(chunk + 1)));
  CHECK(ring.length(a) == fed);
  // truncating so far back that the next token's window reaches overwritten rows is refused
  const int oldest = fed - capacity;  // the ring holds positions [fed - capacity, fed)
  CHECK_THROWS_MATCHES(ring.truncate(a, oldest + window - 2), kvlab::InvalidArgument,
                       names("length", "at least " + std::to_string(oldest + window - 1),
                             std::to_string(oldest + window - 2)));
  CHECK_NOTHROW(ring.truncate(a, oldest + window - 1));
}

TEST_CASE(
    "a windowed paged store gives back the blocks before the window and holds at most ceil((W - 1 "
    "+ C) / B) + 1") {
  const AttentionShape shape(4, 2, 8);
  const auto stack = kvlab::AttentionStack<double>::random(2, shape, 16, 8);
  kvlab::Rng rng(9);
  const RowMatrix<double> x = kvlab::random_matrix<double>(70, 16, rng);  // [tokens, d_model]
  const int window = GENERATE(1, 5, 16);
  const int block_size = GENERATE(1, 4, 7);
  const int chunk = 9;  // the largest step
  CAPTURE(window, block_size);
  kvlab::PagedStore<double> paged(2, 2, 8, block_size, 200, kvlab::KVLayout::NHD, window);
  kvlab::RecomputeStore<double> oracle(2, 2, 8, 16, window);
  const int a = paged.add_sequence(), b = oracle.add_sequence();
  const int bound = (window - 1 + chunk + block_size - 1) / block_size + 1;
  int fed = 0, most_held = 0;
  double worst = 0;
  for (int step = 0; fed < 70; ++step) {
    const int n = std::min(70 - fed, step % 4 == 0 ? chunk : 1);
    const RowMatrix<double> in = x.middleRows(fed, n);
    worst =
        std::max(worst, max_row_relative_error(kvlab::run_stack(*stack, paged, {a}, {0, n}, in),
                                               kvlab::run_stack(*stack, oracle, {b}, {0, n}, in)));
    fed += n;
    const int held = paged.cache().held_blocks(a);
    most_held = std::max(most_held, held);
    CHECK(held <= bound);
    // the pool's own count agrees: every block not held is free
    CHECK(paged.cache().allocator().num_used() == held);
  }
  INFO("largest difference " << worst << ", most blocks held " << most_held << " of " << bound);
  CHECK(worst <= kvlab_test::tolerance<double>());
  // the table stays append-only: every position keeps its page, released ones point nowhere
  const std::vector<std::int32_t>& table = paged.cache().blocks(a);
  CHECK(table.size() == static_cast<std::size_t>((70 + block_size - 1) / block_size));
  CHECK(table.front() == (window + block_size <= 70 ? kvlab::kReleasedBlock : table.front()));
  // a fork shares the held blocks only, and continues as its parent would
  const int f = paged.fork(a);
  CHECK(paged.cache().allocator().num_used() == paged.cache().held_blocks(a));
  CHECK_NOTHROW(kvlab::run_stack(*stack, paged, {f}, {0, 1}, RowMatrix<double>(x.topRows(1))));
  paged.free_sequence(f);
  // truncating so far back that the next token's window reaches a released block is refused
  std::size_t first_held = 0;  // the first page still held (table.size() when none is)
  while (first_held < table.size() && table[first_held] == kvlab::kReleasedBlock) ++first_held;
  const int lowest = static_cast<int>(first_held) * block_size + window - 1;
  if (first_held > 0 && lowest <= 70) {
    CHECK_THROWS_MATCHES(
        paged.truncate(a, lowest - 1), kvlab::InvalidArgument,
        names("length", "at least " + std::to_string(lowest), std::to_string(lowest - 1)));
    CHECK(paged.length(a) == 70);
    CHECK_NOTHROW(paged.truncate(a, lowest));
  }
  paged.free_sequence(a);
  CHECK(paged.cache().allocator().num_used() == 0);  // nothing leaked
}

TEST_CASE(
    "a ring refuses a chunk that would overwrite its first query's keys, and a window larger than "
    "itself") {
  kvlab::ContiguousKVCache<float> ring(1, 1, 4, 6, 4);  // W = 4 in 6 slots: chunks of up to 3
  const RowMatrix<float> three = RowMatrix<float>::Ones(3, 4), four = RowMatrix<float>::Ones(4, 4);
  CHECK(ring.max_chunk(0) == 3);
  CHECK_NOTHROW(ring.append(0, three, three));
  CHECK_THROWS_MATCHES(
      ring.append(0, four, four), kvlab::CapacityError,
      names("k.rows()",
            "at most capacity - window + 1 = 3 (a ring of 6 slots holds a chunk and the window's "
            "keys before it)",
            "4"));
  CHECK(ring.length(0) == 3);
  for (int i = 0; i < 10; ++i) ring.append(0, three.topRows(1), three.topRows(1));
  CHECK(ring.length(0) == 13);  // past the ring's 6 slots
  CHECK(ring.bytes_used() == 2 * 6 * 4 * sizeof(float));
  CHECK_THROWS_MATCHES(
      (kvlab::ContiguousKVCache<float>(1, 1, 4, 3, 4)), kvlab::InvalidArgument,
      names("window", "at most capacity (3): a decode step needs its W keys in the ring", "4"));
}
