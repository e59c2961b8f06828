// Attention sinks (StreamingLLM) in the oracle, the CPU kernels and the caches: with a window of W
// keys and S sinks the query at position p sees keys [0, min(S, p − W + 1)) and (p − W, p]. The
// oracle equals the oracle without a window over exactly those keys; the contiguous kernel over a
// ring whose first S slots keep the sinks, and the paged kernels over tables that released every
// block but the sinks' and the window's, give the oracle's answer — for sequences shorter than
// W, around W and W + S, long ones, prefill chunks that cross the point where the sinks leave
// the window, every read path (GQA groups of 3 and 4, MHA), decode split along the context — and
// count the keys the closed form says; the caches keep the sinks through every wrap of the ring,
// and refuse sinks they cannot keep.
//
// Tolerance: test_support.hpp's rule (float 1e-5): the kernels compute the oracle's sums in
// another order, and merge the sinks' partial sums into the window's by the log-sum-exp rule.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kvlab/kvlab.hpp"
#include "ragged_batch.hpp"
#include "ran_counts.hpp"
#include "test_support.hpp"

using kvlab::AttentionShape;
using kvlab::RowMatrix;
using kvlab_test::max_row_relative_error;
using kvlab_test::names;

namespace {

// The keys the query at `position` sees, by the definition: the sinks [0, S) that are outside
// its band, then the band (p - W, p].
std::vector<int> seen_keys(int position, int window, int sinks) {
  std::vector<int> keys;
  const int first = std::max(0, position - window + 1);
  for (int j = 0; j < std::min(sinks, first); ++j) keys.push_back(j);
  for (int j = first; j <= position; ++j) keys.push_back(j);
  return keys;
}

// Σ over the queries at positions first_position .. first_position + q_len - 1 of the keys each
// sees, by the definition.
std::uint64_t seen_total(int first_position, int q_len, int window, int sinks) {
  std::uint64_t total = 0;
  for (int i = 0; i < q_len; ++i) total += seen_keys(first_position + i, window, sinks).size();
  return total;
}

// The rows `keys` of `m`, in that order.
RowMatrix<double> gather(const RowMatrix<double>& m, const std::vector<int>& keys) {
  RowMatrix<double> out(static_cast<Eigen::Index>(keys.size()), m.cols());
  for (std::size_t n = 0; n < keys.size(); ++n)
    out.row(static_cast<Eigen::Index>(n)) = m.row(keys[n]);
  return out;
}

}  // namespace

TEST_CASE("the oracle with sinks is the oracle over the sinks and the band") {
  const AttentionShape shape(4, 2, 8);
  kvlab::Rng rng(11);
  const RowMatrix<double> k = kvlab::random_matrix<double>(30, shape.kv_width(), rng);
  const RowMatrix<double> v = kvlab::random_matrix<double>(30, shape.kv_width(), rng);
  const RowMatrix<double> q = kvlab::random_matrix<double>(30, shape.q_width(), rng);
  for (int window : {1, 2, 5, 29, 40})
    for (int sinks : {1, 3, 4}) {
      CAPTURE(window, sinks);
      const RowMatrix<double> got =
          kvlab::cpu::reference_attention(shape, q, k, v, 0, window, sinks);
      for (int i = 0; i < 30; ++i) {
        const std::vector<int> keys = seen_keys(i, window, sinks);
        // the same query over exactly its keys, with no window: the last of them is its own
        const RowMatrix<double> alone = kvlab::cpu::reference_attention(
            shape, q.row(i), gather(k, keys), gather(v, keys), static_cast<int>(keys.size()) - 1);
        CHECK(max_row_relative_error(RowMatrix<double>(got.row(i)), alone) <= 1e-14);
        // the closed form the kernels count by
        CHECK(kvlab::visible_keys(i, 1, window, sinks) == keys.size());
      }
      // sinks the window still holds change nothing
      if (window >= 30) CHECK(got == kvlab::cpu::reference_attention(shape, q, k, v, 0, window));
    }
  CHECK_THROWS_MATCHES(kvlab::cpu::reference_attention(shape, q, k, v, 0, 0, 4),
                       kvlab::InvalidArgument,
                       names("sinks", "0 without a window (every key is seen)", "4"));
  CHECK_THROWS_MATCHES(kvlab::cpu::reference_attention(shape, q, k, v, 0, 5, -1),
                       kvlab::InvalidArgument, names("sinks", ">= 0", "-1"));
}

TEST_CASE("decode_attention over a ring that keeps its sinks gives the oracle's answer") {
  // GQA groups of 3 (rows one by one, or matrix products for a prefill tile) and 4 (rows read
  // in runs), and MHA
  const AttentionShape shape =
      GENERATE(AttentionShape(6, 2, 16), AttentionShape(8, 2, 32), AttentionShape(2, 2, 32));
  CAPTURE(shape.num_heads(), shape.num_kv_heads(), shape.head_dim());
  kvlab::Rng rng(12);
  const int n_max = 90;
  const RowMatrix<double> k = kvlab::random_matrix<double>(n_max, shape.kv_width(), rng);
  const RowMatrix<double> v = kvlab::random_matrix<double>(n_max, shape.kv_width(), rng);
  int cases = 0;
  for (int window : {2, 5, 16})
    for (int sinks : {1, 4}) {
      if (sinks >= window) continue;
      for (int chunk : {1, 3, 20}) {
        CAPTURE(window, sinks, chunk);
        // the smallest ring for chunks of `chunk` tokens: the sinks' slots, the window's W - 1
        // keys before a chunk, and the chunk
        kvlab::ContiguousKVCache<float> ring(1, shape.num_kv_heads(), shape.head_dim(),
                                             sinks + window - 1 + chunk, window, sinks);
        CHECK(ring.sinks() == sinks);
        CHECK(ring.max_chunk(0) == chunk);
        for (int pos = 0; pos < n_max;) {
          const int n = std::min(chunk, n_max - pos);
          ring.append(0, k.middleRows(pos, n).cast<float>(), v.middleRows(pos, n).cast<float>());
          const RowMatrix<double> q = kvlab::random_matrix<double>(n, shape.q_width(), rng);
          kvlab::CostCounters counters;
          const RowMatrix<float> got = kvlab::cpu::decode_attention(
              shape, RowMatrix<float>(q.cast<float>()), ring.view(0), &counters);
          const RowMatrix<double> want = kvlab::cpu::reference_attention(
              shape, q, k.topRows(pos + n), v.topRows(pos + n), pos, window, sinks);
          CAPTURE(pos, n);
          CHECK(max_row_relative_error(got, RowMatrix<float>(want.cast<float>())) <=
                kvlab_test::tolerance<float>());
          CHECK(counters.qk_dots ==
                seen_total(pos, n, window, sinks) * static_cast<std::uint64_t>(shape.num_heads()));
          pos += n;
          ++cases;
        }
      }
    }
  CHECK(cases > 200);
}

TEST_CASE("a ring with sinks keeps them through every wrap, and refuses what it cannot keep") {
  const AttentionShape shape(2, 1, 8);
  kvlab::ContiguousKVCache<float> ring(1, 1, 8, 10, 6, 3);  // 3 sinks' slots, a ring of 7
  kvlab::ContiguousKVView<float> view = ring.view(0);
  CHECK(view.sinks == 3);
  // positions below the capacity in their own slot; then the sinks stay and the rest wrap
  for (int pos = 0; pos < 10; ++pos) CHECK(view.slot(pos) == pos);
  CHECK(view.slot(10) == 3);
  CHECK(view.slot(16) == 9);
  CHECK(view.slot(17) == 3);
  for (int pos = 0; pos < 40; ++pos) CHECK((pos < 3 ? view.slot(pos) == pos : view.slot(pos) >= 3));
  CHECK(ring.max_chunk(0) == 10 - 3 - 6 + 1);
  const RowMatrix<float> rows = RowMatrix<float>::Ones(3, 8);
  CHECK_THROWS_MATCHES(ring.append(0, rows, rows), kvlab::CapacityError,
                       names("k.rows()", "at most capacity - sinks - window + 1 = 2", "3"));
  // the sequence grows past the ring: truncating back to where the next token's window would
  // reach overwritten rows is refused, and what the window still holds is not
  for (int i = 0; i < 20; ++i) ring.append(0, rows.topRows(1), rows.topRows(1));
  // the ring holds positions 13 .. 19: a next token at 20 sees 15 .. 20 and the sinks; one at 17
  // would see 12 .. 17, and 12 is gone
  CHECK_NOTHROW(ring.truncate(20));
  CHECK_THROWS_AS(ring.truncate(17), kvlab::InvalidArgument);
  using Cache = kvlab::ContiguousKVCache<float>;
  CHECK_THROWS_MATCHES(Cache(1, 1, 8, 10, 6, 6), kvlab::InvalidArgument,
                       names("sinks", "below the window (6)", "6"));
  CHECK_THROWS_MATCHES(Cache(1, 1, 8, 10, 0, 2), kvlab::InvalidArgument,
                       names("sinks", "0 without a window (every key is seen)", "2"));
  CHECK_THROWS_MATCHES(Cache(1, 1, 8, 10, 8, 3), kvlab::InvalidArgument,
                       names("window",
                             "at most capacity - sinks (7): a decode step needs its W keys in "
                             "the ring",
                             "8"));
  // a view whose sinks have no window is refused by the kernel
  view = ring.view(0);
  view.window = 0;
  view.length = 5;
  RowMatrix<float> out;
  CHECK_THROWS_MATCHES(
      kvlab::cpu::decode_attention(shape, RowMatrix<float>::Ones(1, 16), view, out),
      kvlab::InvalidArgument, names("cache.sinks", "0 without a window (every key is seen)", "3"));
}

TEST_CASE(
    "the paged kernels give the oracle's answer with every block but the sinks' and the window's "
    "released") {
  const AttentionShape shape(8, 2, 16);
  kvlab::Rng rng(13);
  const int window = GENERATE(5, 8, 13);
  const int sinks = GENERATE(1, 4);
  const int block_size = GENERATE(1, 3, 8);
  const auto layout = GENERATE(kvlab::KVLayout::NHD, kvlab::KVLayout::HND);
  CAPTURE(window, sinks, block_size, kvlab::to_string(layout));
  // ragged, across block boundaries; every slot no sequence owns is NaN
  kvlab_test::RaggedBatch<float> batch(shape, block_size, {3, 17, 40, 64, 9}, layout, rng);
  // a decode token, chunks shorter and longer than the window
  const std::vector<int> q_lens = {1, 4, 20, 1, 9};
  std::vector<std::int32_t> qo_indptr{0};
  for (int n : q_lens) qo_indptr.push_back(qo_indptr.back() + n);
  const RowMatrix<double> q = kvlab::random_matrix<double>(qo_indptr.back(), shape.q_width(), rng);
  kvlab::PagedKVView<float> view = batch.view;
  // Release every block wholly before the first query's window that holds no sink, as a pool
  // with sinks does; the released blocks are poisoned, so reading one shows.
  std::vector<std::int32_t> indices(view.indices, view.indices + view.indptr[view.batch]);
  std::vector<RowMatrix<double>> ks, vs;  // [sequence][length, kv_width], before the poison
  int released = 0;
  for (int s = 0; s < view.batch; ++s) {
    ks.push_back(batch.keys(s).cast<double>());
    vs.push_back(batch.values(s).cast<double>());
    const int first =
        kvlab::first_visible_key(view.seq_len(s) - q_lens[static_cast<std::size_t>(s)], window);
    for (int page = 0; (page + 1) * block_size <= first; ++page) {
      if (page * block_size < sinks) continue;  // holds a sink
      for (int pos = page * block_size; pos < (page + 1) * block_size; ++pos)
        for (int h = 0; h < 2; ++h) {
          const auto at = static_cast<std::ptrdiff_t>(view.offset(s, pos, h));
          std::fill(batch.k.begin() + at, batch.k.begin() + at + 16, NAN);
          std::fill(batch.v.begin() + at, batch.v.begin() + at + 16, NAN);
        }
      indices[static_cast<std::size_t>(view.indptr[s] + page)] = kvlab::kReleasedBlock;
      ++released;
    }
  }
  view.indices = indices.data();
  view.window = window;
  view.sinks = sinks;
  kvlab::CostCounters counters;
  const RowMatrix<float> got = kvlab::cpu::paged_prefill_attention(
      shape, RowMatrix<float>(q.cast<float>()), qo_indptr, view, &counters);
  std::uint64_t keys = 0;
  for (int s = 0; s < view.batch; ++s) {
    const auto i = static_cast<std::size_t>(s);
    const int length = view.seq_len(s);
    const RowMatrix<double> want =
        kvlab::cpu::reference_attention(shape, q.middleRows(qo_indptr[i], q_lens[i]), ks[i], vs[i],
                                        length - q_lens[i], window, sinks);
    CAPTURE(s);
    CHECK(max_row_relative_error(RowMatrix<float>(got.middleRows(qo_indptr[i], q_lens[i])),
                                 RowMatrix<float>(want.cast<float>())) <=
          kvlab_test::tolerance<float>());
    keys += seen_total(length - q_lens[i], q_lens[i], window, sinks);
  }
  CHECK(counters.qk_dots == keys * static_cast<std::uint64_t>(shape.num_heads()));
  if (block_size <= 3) CHECK(released > 0);  // released blocks were skipped
  SECTION("a released block holding a sink a query sees is refused") {
    // sequence 3 (64 tokens, its query at 63) sees its sinks, in page 0
    indices[static_cast<std::size_t>(view.indptr[3])] = kvlab::kReleasedBlock;
    CHECK_THROWS_MATCHES(
        kvlab::cpu::paged_prefill_attention(shape, RowMatrix<float>(q.cast<float>()), qo_indptr,
                                            view),
        kvlab::InvalidArgument,
        names("cache.indices[" + std::to_string(view.indptr[3]) + "]",
              "a block of the pool (page 0 of sequence 3 holds sinks)", "kReleasedBlock (-1)"));
  }
}

TEST_CASE("paged decode split along the context attends the sinks as one more partition") {
  const AttentionShape shape(4, 2, 64);
  kvlab::Rng rng(14);
  const int n = 700, window = 100, sinks = 4;
  const kvlab_test::RaggedBatch<float> batch(shape, 16, {n}, kvlab::KVLayout::NHD, rng);
  const RowMatrix<double> q = kvlab::random_matrix<double>(1, shape.q_width(), rng);
  kvlab::PagedKVView<float> view = batch.view;
  view.window = window;
  view.sinks = sinks;
  const std::int32_t one[] = {0, 1};
  const kvlab::cpu::PagedAttentionPlan plan = kvlab::cpu::plan_paged_attention(shape, view, one, 2);
  REQUIRE(plan.split_k);
#if defined(_OPENMP)
  const int before = omp_get_max_threads();
  omp_set_num_threads(2);
#endif
  kvlab::CostCounters counters;
  const kvlab_test::RanSince ran;
  const RowMatrix<float> got =
      kvlab::cpu::paged_decode_attention(shape, RowMatrix<float>(q.cast<float>()), view, &counters);
#if defined(_OPENMP)
  omp_set_num_threads(before);
  // it ran split-K: the sinks' 4 keys, then the window's 100 in 2 partitions, merged twice
  CHECK(ran.split_k_calls() == 1);
  CHECK(ran.partitions() == 3);
  CHECK(ran.merges() == 2);
#else
  WARN("built without OpenMP: one thread, the context is not split");
  CHECK(ran.split_k_calls() == 0);
#endif
  const RowMatrix<double> want = kvlab::cpu::reference_attention(
      shape, q, RowMatrix<double>(batch.keys(0).cast<double>()),
      RowMatrix<double>(batch.values(0).cast<double>()), n - 1, window, sinks);
  CHECK(max_row_relative_error(got, RowMatrix<float>(want.cast<float>())) <=
        kvlab_test::tolerance<float>());
  CHECK(counters.qk_dots == static_cast<std::uint64_t>((window + sinks) * shape.num_heads()));
}
