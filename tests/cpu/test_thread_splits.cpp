// Every CPU path that divides its work by the thread count, at thread counts that do not divide
// the work: 3 threads over 8 K/V heads, 3 over 2 sequences, more threads than heads or rows.
// The thread count is set inside each test (ScopedThreads), not taken from the environment, and
// each test asserts from the kernels' execution counters (ran_counts.hpp) that the divided path
// ran: its loop on several threads, and for the paged kernels the split and the items run.
//
// Tolerances: a split that only changes which thread computes which query (decode over heads,
// paged items over sequences and head ranges) leaves every query's arithmetic as it is, so the
// result must equal the one-thread result bit for bit (head_dim 64: every scratch row starts on
// the same vector alignment whatever the split). Against the reference loops, and for `linear`
// (Eigen's product over a column block may group the sums differently), the suite's rule:
// float 1e-5 relative to max(1, row max) (test_support.hpp).
#include <catch2/catch.hpp>

#include <cstdint>
#include <numeric>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kvlab/cpu/layer_ops.hpp"
#include "kvlab/kvlab.hpp"
#include "ragged_batch.hpp"
#include "ran_counts.hpp"
#include "test_support.hpp"

using kvlab::AttentionShape;
using kvlab::KVLayout;
using kvlab::RowMatrix;
using kvlab_test::max_row_relative_error;
using kvlab_test::RaggedBatch;
using kvlab_test::tolerance;

namespace {

#if defined(_OPENMP)
// Sets the OpenMP thread count for its lifetime, then restores the one before.
class ScopedThreads {
 public:
  explicit ScopedThreads(int threads) : before_(omp_get_max_threads()) {
    omp_set_num_threads(threads);
  }
  ~ScopedThreads() { omp_set_num_threads(before_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int before_;
};

// What `f()` returns when run with `threads` OpenMP threads.
template <typename F>
auto with_threads(int threads, F&& f) {
  ScopedThreads scoped(threads);
  return f();
}
#endif

// True when every element of a equals the same element of b (NaN never equals).
bool same_bits(const RowMatrix<float>& a, const RowMatrix<float>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && (a.array() == b.array()).all();
}

// Each sequence's queries against the reference loops, at the suite's float tolerance.
void check_against_reference(const AttentionShape& shape, const RaggedBatch<float>& batch,
                             const RowMatrix<float>& q, const std::vector<std::int32_t>& qo_indptr,
                             const RowMatrix<float>& out) {
  for (int s = 0; s < batch.view.batch; ++s) {
    const auto i = static_cast<std::size_t>(s);
    const int row0 = qo_indptr[i], rows = qo_indptr[i + 1] - qo_indptr[i];
    if (rows == 0) continue;
    const RowMatrix<float> want =
        kvlab::cpu::reference_attention(shape, q.middleRows(row0, rows), batch.keys(s),
                                        batch.values(s), batch.view.seq_len(s) - rows);
    CHECK(max_row_relative_error(RowMatrix<float>(out.middleRows(row0, rows)), want) <=
          tolerance<float>());
  }
}

}  // namespace

TEST_CASE("paged prefill over fewer sequences than threads splits the K/V heads unevenly") {
#if defined(_OPENMP)
  struct Case {
    int threads, kv_heads;
    std::vector<int> lengths;  // one prompt chunk of 9 queries (or fewer) per sequence
    int head_chunks;           // what plan_paged_attention must choose
  };
  // 3 threads over 8 K/V heads (chunks of 2, 3, 3); 3 threads over 2 sequences of 5 heads
  // (2 chunks each: 2 and 3 heads); 8 threads over 2 heads (more threads than heads).
  const Case cases[] = {{3, 8, {1100}, 3}, {3, 5, {700, 650}, 2}, {8, 2, {2100}, 2}};
  std::uint64_t seed = 1;
  for (const Case& c : cases) {
    const AttentionShape shape(2 * c.kv_heads, c.kv_heads, 64);
    CAPTURE(c.threads, c.kv_heads, c.lengths);
    kvlab::Rng rng(seed++);
    const RaggedBatch<float> batch(shape, 16, c.lengths, KVLayout::NHD, rng);
    std::vector<std::int32_t> qo_indptr{0};
    for (std::size_t s = 0; s < c.lengths.size(); ++s) qo_indptr.push_back(qo_indptr.back() + 9);
    const RowMatrix<float> q = kvlab::random_matrix<float>(qo_indptr.back(), shape.q_width(), rng);

    const kvlab::cpu::PagedAttentionPlan plan =
        kvlab::cpu::plan_paged_attention(shape, batch.view, qo_indptr.data(), c.threads);
    REQUIRE(plan.parallel);
    REQUIRE_FALSE(plan.split_k);  // prefill: the heads are split, not the context
    REQUIRE(plan.head_chunks == c.head_chunks);
    // uneven, or more threads than heads
    REQUIRE((c.kv_heads % plan.head_chunks != 0 || c.threads > c.kv_heads));
    const RowMatrix<float> one = with_threads(
        1, [&] { return kvlab::cpu::paged_prefill_attention(shape, q, qo_indptr, batch.view); });
    const kvlab_test::RanSince ran;
    const RowMatrix<float> split = with_threads(c.threads, [&] {
      return kvlab::cpu::paged_prefill_attention(shape, q, qo_indptr, batch.view);
    });
    CHECK(ran.threaded_loops() == 1);
    CHECK(ran.split_k_calls() == 0);
    CHECK(ran.by_heads_calls() == 1);
    CHECK(ran.head_items() == c.lengths.size() * static_cast<std::size_t>(c.head_chunks));
    CHECK(same_bits(split, one));
    check_against_reference(shape, batch, q, qo_indptr, split);
  }
#else
  WARN("built without OpenMP: one thread, nothing is split");
  SUCCEED();
#endif
}

TEST_CASE("paged decode splits uneven work: HND heads, NHD sequences, and split-K partitions") {
#if defined(_OPENMP)
  const AttentionShape shape(16, 8, 64);
  kvlab::Rng rng(21);
  // 2 sequences: with 3 threads NHD decode takes split-K (2 partitions each, of uneven sizes),
  // HND makes 2 · 8 (sequence, head) items for 3 threads.
  const std::vector<int> lengths{1000, 333};
  const std::vector<std::int32_t> one_each{0, 1, 2};
  for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
    CAPTURE(kvlab::to_string(layout));
    const RaggedBatch<float> batch(shape, 16, lengths, layout, rng);
    const RowMatrix<float> q = kvlab::random_matrix<float>(2, shape.q_width(), rng);
    const kvlab::cpu::PagedAttentionPlan plan =
        kvlab::cpu::plan_paged_attention(shape, batch.view, one_each.data(), 3);
    REQUIRE(plan.parallel);
    const RowMatrix<float> one =
        with_threads(1, [&] { return kvlab::cpu::paged_decode_attention(shape, q, batch.view); });
    const kvlab_test::RanSince ran;
    const RowMatrix<float> split =
        with_threads(3, [&] { return kvlab::cpu::paged_decode_attention(shape, q, batch.view); });
    CHECK(ran.threaded_loops() == 1);
    if (layout == KVLayout::NHD) {
      CHECK(plan.split_k);
      CHECK(ran.split_k_calls() == 1);
      CHECK(ran.partitions() == 4);  // 2 each: 1000 tokens as 512 + 488, 333 as 176 + 157
      CHECK(ran.merges() == 2);
      // split-K merges partial sums: rounding differs, so the tolerance, not the bits
      CHECK(max_row_relative_error(split, one) <= tolerance<float>());
    } else {
      CHECK(plan.head_chunks == 8);
      CHECK(ran.by_heads_calls() == 1);
      CHECK(ran.head_items() == 16);  // every (sequence, head) an item
      CHECK(same_bits(split, one));
    }
    check_against_reference(shape, batch, q, one_each, split);
  }
#else
  WARN("built without OpenMP: one thread, nothing is split");
  SUCCEED();
#endif
}

TEST_CASE("decode_attention splits its K/V heads over 3 threads and over more threads than heads") {
#if defined(_OPENMP)
  std::uint64_t seed = 31;
  for (int kv_heads : {8, 2}) {
    for (int threads : {3, 8}) {
      const AttentionShape shape(4 * kv_heads, kv_heads, 64);
      CAPTURE(kv_heads, threads);
      kvlab::Rng rng(seed++);
      const int n = 1200;
      // the kernel starts threads only for at least kDecodeParallelMinElements K/V elements
      REQUIRE(1LL * n * kv_heads * shape.head_dim() >= kvlab::cpu::kDecodeParallelMinElements);
      kvlab::ContiguousKVCache<float> cache(1, kv_heads, shape.head_dim(), n);
      cache.append(0, kvlab::random_matrix<float>(n, shape.kv_width(), rng),
                   kvlab::random_matrix<float>(n, shape.kv_width(), rng));
      const RowMatrix<float> q = kvlab::random_matrix<float>(3, shape.q_width(), rng);
      RowMatrix<float> one, split;
      {
        ScopedThreads scoped(1);
        one = kvlab::cpu::decode_attention(shape, q, cache.view(0));
      }
      const kvlab_test::RanSince ran;
      {
        ScopedThreads scoped(threads);
        split = kvlab::cpu::decode_attention(shape, q, cache.view(0));
      }
      CHECK(ran.threaded_loops() == 1);  // the K/V heads ran on several threads
      CHECK(same_bits(split, one));
    }
  }
#else
  WARN("built without OpenMP: one thread, nothing is split");
  SUCCEED();
#endif
}

TEST_CASE("a prefill chunk over a short cache runs on threads: K/V counted once per query row") {
#if defined(_OPENMP)
  // SmolLM2's heads (9 over 3 K/V heads of 64) and a 64-token chunk over a 100-token cache:
  // 100 * 3 * 64 = 19200 K/V elements per tensor, below kDecodeParallelMinElements, but 64 query
  // rows read them: 1228800, above. Before the rows were counted, such a chunk ran on one thread
  // and its fp32 matrix products started Eigen's threads one short product at a time
  // (bench/results/cpu-prefill-chunk-threads-ab.txt). One decode row over the same cache reads
  // too little for threads.
  const AttentionShape shape(9, 3, 64);
  const int n = 100, chunk = 64;
  REQUIRE(1LL * n * 3 * 64 < kvlab::cpu::kDecodeParallelMinElements);
  REQUIRE(1LL * chunk * n * 3 * 64 >= kvlab::cpu::kDecodeParallelMinElements);
  kvlab::Rng rng(41);
  kvlab::ContiguousKVCache<float> cache(1, 3, 64, n);
  cache.append(0, kvlab::random_matrix<float>(n, shape.kv_width(), rng),
               kvlab::random_matrix<float>(n, shape.kv_width(), rng));
  const RaggedBatch<float> paged(shape, 16, {n}, KVLayout::NHD, rng);
  for (int rows : {chunk, 1}) {
    CAPTURE(rows);
    const RowMatrix<float> q = kvlab::random_matrix<float>(rows, shape.q_width(), rng);
    const std::vector<std::int32_t> qo_indptr{0, rows};
    RowMatrix<float> one, split, paged_one, paged_split;
    {
      ScopedThreads scoped(1);
      one = kvlab::cpu::decode_attention(shape, q, cache.view(0));
      paged_one = kvlab::cpu::paged_prefill_attention(shape, q, qo_indptr, paged.view);
    }
    const kvlab_test::RanSince ran;
    {
      ScopedThreads scoped(2);
      split = kvlab::cpu::decode_attention(shape, q, cache.view(0));
    }
    CHECK(ran.threaded_loops() == (rows > 1 ? 1u : 0u));  // contiguous: threads for the chunk only
    const kvlab_test::RanSince ran_paged;
    {
      ScopedThreads scoped(2);
      paged_split = kvlab::cpu::paged_prefill_attention(shape, q, qo_indptr, paged.view);
    }
    CHECK(ran_paged.threaded_loops() == (rows > 1 ? 1u : 0u));  // paged: the same
    CHECK(same_bits(split, one));
    CHECK(same_bits(paged_split, paged_one));
    check_against_reference(shape, paged, q, qo_indptr, paged_split);
  }
#else
  WARN("built without OpenMP: one thread, nothing is split");
  SUCCEED();
#endif
}

TEST_CASE("cpu::linear splits the weight rows over 3 and 8 threads, unevenly") {
#if defined(_OPENMP)
  kvlab::Rng rng(41);
  // 172 and 11 output rows: 3 threads take 57/57/58 and 3/4/4 rows, 8 threads 21 or 22 and (11
  // rows) 1 or 2 each.
  for (int out_rows : {172, 11}) {
    for (int threads : {3, 8}) {
      CAPTURE(out_rows, threads);
      const int in = 64;
      const int rows =
          static_cast<int>(2 * kvlab::cpu::kLinearParallelMinMacs / (out_rows * in)) + 1;
      const RowMatrix<float> x = kvlab::random_matrix<float>(rows, in, rng);
      const RowMatrix<float> w = kvlab::random_matrix<float>(out_rows, in, rng);
      // the conditions under which linear splits W's rows between the threads
      REQUIRE(1LL * x.rows() * w.size() >= kvlab::cpu::kLinearParallelMinMacs);
      REQUIRE(w.rows() >= threads);
      REQUIRE(w.rows() % threads != 0);
      RowMatrix<float> got;
      const kvlab_test::RanSince ran;
      {
        ScopedThreads scoped(threads);
        kvlab::cpu::linear(x, w, got);
      }
      CHECK(ran.threaded_loops() == 1);           // W's rows ran on several threads
      RowMatrix<float> want(x.rows(), w.rows());  // [rows, out]: plain dot products in double
      for (Eigen::Index r = 0; r < x.rows(); ++r)
        for (Eigen::Index o = 0; o < w.rows(); ++o) {
          double sum = 0;
          for (Eigen::Index i = 0; i < in; ++i) sum += double(x(r, i)) * double(w(o, i));
          want(r, o) = static_cast<float>(sum);
        }
      CHECK(max_row_relative_error(got, want) <= tolerance<float>());
    }
  }
#else
  WARN("built without OpenMP: one thread, nothing is split");
  SUCCEED();
#endif
}
