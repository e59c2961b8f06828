// Paged attention (cpu::paged_decode_attention, cpu::paged_prefill_attention) against the
// triple loop of test_support.hpp and against decode_attention on a contiguous cache holding
// the same rows: ragged batches, block sizes 1/3/16/32, lengths on and beside block boundaries,
// MHA/GQA/MQA, head_dim 64..256, both pool layouts (NHD, HND), block tables in random physical
// order, NaN in every slot no sequence owns (vLLM's padding test); the split-K path (fewer
// sequences than threads) against one pass; exact counters; argument checks.
//
// Tolerances (as test_attention.cpp, see test_support.hpp): the kernels and the long-double
// reference differ by rounding only: double 1e-12, float 1e-5 relative to max(1, row max).
// Paged and contiguous run the same arithmetic in the same order, but Eigen's vectorised dot
// product peels its first elements by the run-time alignment of the row, which differs between
// a pool slot and a contiguous row; so they too are compared with the same tolerance, not bits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#if defined(_OPENMP)
#include <omp.h>
#endif
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kvlab/cpu/paged_attention.hpp"
#include "kvlab/kvlab.hpp"
#include "ragged_batch.hpp"
#include "ran_counts.hpp"
#include "test_support.hpp"

using kvlab::AttentionShape;
using kvlab::RowMatrix;
using kvlab::cpu::reference_attention;
using kvlab_test::max_row_relative_error;
using kvlab_test::names;
using kvlab_test::RaggedBatch;
using kvlab_test::tolerance;

namespace {

// Lengths on, just before and just after the first two block boundaries, plus one longer.
std::vector<int> boundary_lengths(int block_size) {
  std::vector<int> lengths;
  for (int len : {1, block_size - 1, block_size, block_size + 1, 2 * block_size - 1, 2 * block_size,
                  2 * block_size + 1, 3 * block_size + 5})
    if (len >= 1 && std::find(lengths.begin(), lengths.end(), len) == lengths.end())
      lengths.push_back(len);
  return lengths;
}

}  // namespace

TEMPLATE_TEST_CASE(
    "paged_decode_attention equals a triple loop over ragged batches with NaN padding", "", float,
    double) {
  struct Heads {
    int num_heads, num_kv_heads;
  };
  const Heads layouts[] = {{4, 4}, {8, 2}, {4, 1}};  // MHA, GQA, MQA
  const kvlab::KVLayout layout = GENERATE(kvlab::KVLayout::NHD, kvlab::KVLayout::HND);
  std::uint64_t seed = 1;
  for (int block_size : {1, 3, 16, 32})
    for (const Heads& heads : layouts)
      for (int head_dim : {64, 80, 96, 112, 128, 256}) {
        const AttentionShape shape(heads.num_heads, heads.num_kv_heads, head_dim);
        std::vector<int> lengths = boundary_lengths(block_size);
        kvlab::Rng rng(seed++);
        std::shuffle(lengths.begin(), lengths.end(), std::mt19937(static_cast<unsigned>(seed)));
        const RaggedBatch<TestType> batch(shape, block_size, lengths, layout, rng);
        const RowMatrix<TestType> q =
            kvlab::random_matrix<TestType>(batch.view.batch, shape.q_width(), rng);
        const RowMatrix<TestType> got = kvlab::cpu::paged_decode_attention(shape, q, batch.view);
        for (int s = 0; s < batch.view.batch; ++s) {
          CAPTURE(kvlab::to_string(layout), block_size, heads.num_heads, heads.num_kv_heads,
                  head_dim, s, lengths[static_cast<std::size_t>(s)]);
          const RowMatrix<TestType> q_s = q.row(s);
          const RowMatrix<TestType> want =
              reference_attention(shape, q_s, batch.keys(s), batch.values(s));
          const RowMatrix<TestType> got_s = got.row(s);
          CHECK(max_row_relative_error(got_s, want) <= tolerance<TestType>());
        }
      }
}

TEST_CASE("paged_prefill_attention: ragged queries per sequence, causal within each") {
  const AttentionShape shape(8, 2, 64);
  const kvlab::KVLayout layout = GENERATE(kvlab::KVLayout::NHD, kvlab::KVLayout::HND);
  for (int block_size : {1, 3, 16, 32}) {
    kvlab::Rng rng(100 + static_cast<std::uint64_t>(block_size));
    const std::vector<int> lengths = {2 * block_size + 1, 37, 1, block_size + 1, 50};
    // whole prompt, none, ..., tile + 1
    const std::vector<int> q_lens = {2 * block_size + 1, 0, 1, 2, 17};
    const RaggedBatch<double> batch(shape, block_size, lengths, layout, rng);
    std::vector<std::int32_t> qo_indptr{0};
    for (int n : q_lens) qo_indptr.push_back(qo_indptr.back() + n);
    const RowMatrix<double> q =
        kvlab::random_matrix<double>(qo_indptr.back(), shape.q_width(), rng);
    kvlab::CostCounters counters;
    const RowMatrix<double> got =
        kvlab::cpu::paged_prefill_attention(shape, q, qo_indptr, batch.view, &counters);

    kvlab::CostCounters want_counters;
    for (std::size_t s = 0; s < lengths.size(); ++s) {
      CAPTURE(kvlab::to_string(layout), block_size, s);
      if (q_lens[s] == 0) continue;
      const RowMatrix<double> q_s = q.middleRows(qo_indptr[s], q_lens[s]);
      const RowMatrix<double> want =
          reference_attention(shape, q_s, batch.keys(s), batch.values(s));
      const RowMatrix<double> got_s = got.middleRows(qo_indptr[s], q_lens[s]);
      CHECK(max_row_relative_error(got_s, want) <= tolerance<double>());
      // decode_attention on a contiguous cache with the same rows: the same counts, the same
      // values.
      kvlab::ContiguousKVCache<double> contiguous(1, shape.num_kv_heads(), shape.head_dim(),
                                                  lengths[s]);
      contiguous.append(0, batch.keys(s), batch.values(s));
      const RowMatrix<double> flat =
          kvlab::cpu::decode_attention(shape, q_s, contiguous.view(0), &want_counters);
      CHECK(max_row_relative_error(got_s, flat) <= tolerance<double>());
    }
    CHECK(counters == want_counters);
  }
}

TEST_CASE("paged_decode_attention: the same counts as decode_attention per sequence") {
  const AttentionShape shape(32, 8, 128);
  const kvlab::KVLayout layout = GENERATE(kvlab::KVLayout::NHD, kvlab::KVLayout::HND);
  kvlab::Rng rng(7);
  const std::vector<int> lengths = {1, 15, 16, 17, 100};
  const RaggedBatch<float> batch(shape, 16, lengths, layout, rng);
  const RowMatrix<float> q = kvlab::random_matrix<float>(5, shape.q_width(), rng);
  kvlab::CostCounters counters;
  kvlab::cpu::paged_decode_attention(shape, q, batch.view, &counters);
  const std::uint64_t tokens = 1 + 15 + 16 + 17 + 100;
  // every head meets every key of its sequence
  CHECK(counters.qk_dots == 32 * tokens);
  CHECK(counters.macs == 2 * 128 * 32 * tokens);  // score and weighted sum, head_dim each
  CHECK(counters.kv_bytes_read == 2 * 4 * 8 * 128 * tokens);  // K and V, once per K/V head
  CHECK(counters.q_projections == 0);
  CHECK(counters.kv_projections == 0);
}

TEST_CASE("paged_decode_attention gives the same bits on 1 and 2 threads") {
#if defined(_OPENMP)
  const AttentionShape shape(8, 2, 128);
  const kvlab::KVLayout layout = GENERATE(kvlab::KVLayout::NHD, kvlab::KVLayout::HND);
  kvlab::Rng rng(11);
  const std::vector<int> lengths = {700, 3, 1200, 64, 999, 1};  // ragged: dynamic schedule
  const RaggedBatch<float> batch(shape, 16, lengths, layout, rng);
  const RowMatrix<float> q = kvlab::random_matrix<float>(6, shape.q_width(), rng);
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const RowMatrix<float> one = kvlab::cpu::paged_decode_attention(shape, q, batch.view);
  omp_set_num_threads(2);
  const kvlab_test::RanSince two_ran;
  const RowMatrix<float> two = kvlab::cpu::paged_decode_attention(shape, q, batch.view);
  omp_set_num_threads(before);
  CHECK(two_ran.threaded_loops() == 1);  // the items ran on both threads' team
  CHECK(two_ran.split_k_calls() == 0);   // more sequences than threads: no split-K
  CHECK((one.array() == two.array()).all());
#else
  WARN("built without OpenMP: only one thread to compare");
  SUCCEED();
#endif
}

// Split-K: an NHD batch with fewer sequences than threads cuts each sequence's blocks into
// partitions (one per thread and sequence) and merges them by the log-sum-exp rule. Its result
// differs from one pass by rounding only: compared with the triple loop at the usual tolerance,
// for partitions that end on, before and after block boundaries, uneven last partitions, a
// sequence shorter than one partition, and NaN in every unused slot. The counts do not change.
// Every case holds at least kDecodeParallelMinElements K/V elements, so the threads are used,
// and the test asserts from the kernel's execution counters (ran_counts.hpp) that the split-K
// path ran with `threads` threads — on several threads, each sequence cut into the partitions
// partition_count gives, every partition merged — and not with one; and that
// plan_paged_attention says so too.
TEMPLATE_TEST_CASE("split-K paged decode equals one pass for fewer sequences than threads", "",
                   float, double) {
#if defined(_OPENMP)
  const int before = omp_get_max_threads();
  std::uint64_t seed = 500;
  for (int block_size : {1, 3, 16})
    for (int threads : {2, 3, 8}) {
      const AttentionShape shape(8, 2, 64);
      for (const std::vector<int>& lengths :
           {std::vector<int>{1000}, std::vector<int>{5 * block_size + 600, 1},
            std::vector<int>{777, 2 * block_size, 64}}) {
        // split-K needs fewer sequences than threads
        if (static_cast<int>(lengths.size()) >= threads) continue;
        CAPTURE(block_size, threads, lengths);
        kvlab::Rng rng(seed++);
        const RaggedBatch<TestType> batch(shape, block_size, lengths, kvlab::KVLayout::NHD, rng);
        const RowMatrix<TestType> q =
            kvlab::random_matrix<TestType>(batch.view.batch, shape.q_width(), rng);
        std::vector<std::int32_t> one_each(lengths.size() + 1);  // one query per sequence
        std::iota(one_each.begin(), one_each.end(), 0);
        const kvlab::cpu::PagedAttentionPlan split_plan =
            kvlab::cpu::plan_paged_attention(shape, batch.view, one_each.data(), threads);
        REQUIRE(split_plan.split_k);
        REQUIRE(split_plan.parts == (threads + batch.view.batch - 1) / batch.view.batch);
        REQUIRE_FALSE(
            kvlab::cpu::plan_paged_attention(shape, batch.view, one_each.data(), 1).split_k);
        omp_set_num_threads(1);
        kvlab::CostCounters one_pass_counts;
        const kvlab_test::RanSince one_pass_ran;
        const RowMatrix<TestType> one_pass =
            kvlab::cpu::paged_decode_attention(shape, q, batch.view, &one_pass_counts);
        CHECK(one_pass_ran.split_k_calls() == 0);
        CHECK(one_pass_ran.threaded_loops() == 0);
        omp_set_num_threads(threads);
        kvlab::CostCounters split_counts;
        const kvlab_test::RanSince split_ran;
        const RowMatrix<TestType> split =
            kvlab::cpu::paged_decode_attention(shape, q, batch.view, &split_counts);
        omp_set_num_threads(before);
        std::uint64_t partitions = 0;  // what each sequence is cut into
        for (int len : lengths)
          partitions +=
              static_cast<std::uint64_t>(kvlab::partition_count(len, split_plan.parts, block_size));
        CHECK(split_ran.split_k_calls() == 1);
        CHECK(split_ran.threaded_loops() == 1);
        CHECK(split_ran.partitions() == partitions);
        CHECK(split_ran.partitions() > lengths.size());  // at least one sequence was cut
        CHECK(split_ran.merges() == partitions - lengths.size());
        CHECK(split_counts == one_pass_counts);
        CHECK(max_row_relative_error(split, one_pass) <= tolerance<TestType>());
        for (int s = 0; s < batch.view.batch; ++s) {
          const RowMatrix<TestType> q_s = q.row(s);
          const RowMatrix<TestType> want =
              reference_attention(shape, q_s, batch.keys(s), batch.values(s));
          CHECK(max_row_relative_error(RowMatrix<TestType>(split.row(s)), want) <=
                tolerance<TestType>());
        }
      }
    }
#else
  WARN("built without OpenMP: there is no split-K path");
  SUCCEED();
#endif
}

TEST_CASE("paged attention rejects bad arguments and views, naming them, and out stays unchanged") {
  using kvlab::InvalidArgument;
  const AttentionShape shape(4, 2, 8);
  kvlab::Rng rng(3);
  RaggedBatch<float> batch(shape, 4, {5, 9}, kvlab::KVLayout::NHD, rng);
  const RowMatrix<float> q = kvlab::random_matrix<float>(2, shape.q_width(), rng);
  RowMatrix<float> out = RowMatrix<float>::Constant(1, 1, 42.0f);
  kvlab::CostCounters counters;
  const auto decode = [&](const kvlab::PagedKVView<float>& view) {
    kvlab::cpu::paged_decode_attention(shape, q, view, out, &counters);
  };

  kvlab::PagedKVView<float> bad = batch.view;
  bad.num_kv_heads = 1;
  CHECK_THROWS_MATCHES(decode(bad), InvalidArgument, names("cache.num_kv_heads", "2", "1"));
  bad = batch.view;
  bad.head_dim = 16;
  CHECK_THROWS_MATCHES(decode(bad), InvalidArgument, names("cache.head_dim", "8", "16"));
  bad = batch.view;
  bad.k = nullptr;
  CHECK_THROWS_MATCHES(decode(bad), InvalidArgument,
                       names("cache.k / v / indptr / indices / last_page_len", "non-null pointers",
                             "a null pointer"));
  // Raw arrays that break the block-table invariants.
  std::vector<std::int32_t> indices = batch.tables.indices();
  indices[3] = bad.num_blocks;  // one past the pool
  bad = batch.view;
  bad.indices = indices.data();
  CHECK_THROWS_MATCHES(decode(bad), InvalidArgument,
                       names("cache.indices[3]", "in [0, " + std::to_string(bad.num_blocks) + ")",
                             std::to_string(bad.num_blocks)));
  std::vector<std::int32_t> last = batch.tables.last_page_len();
  last[1] = 5;  // above block_size 4
  bad = batch.view;
  bad.last_page_len = last.data();
  CHECK_THROWS_MATCHES(decode(bad), InvalidArgument,
                       names("cache.last_page_len[1]", "in [1, block_size (4)]", "5"));
  std::vector<std::int32_t> indptr = {0, 2, 2};
  bad = batch.view;
  bad.indptr = indptr.data();
  CHECK_THROWS_MATCHES(decode(bad), InvalidArgument,
                       names("cache.indptr[2]", "> cache.indptr[1] (2)", "2"));

  const RowMatrix<float> three = kvlab::random_matrix<float>(3, shape.q_width(), rng);
  CHECK_THROWS_MATCHES(kvlab::cpu::paged_decode_attention(shape, three, batch.view, out),
                       InvalidArgument, names("q.rows()", "2", "3"));
  const RowMatrix<float> narrow = kvlab::random_matrix<float>(2, 8, rng);
  CHECK_THROWS_MATCHES(kvlab::cpu::paged_decode_attention(shape, narrow, batch.view, out),
                       InvalidArgument, names("q.cols()", "32", "8"));
  RowMatrix<float> same = q;
  CHECK_THROWS_MATCHES(kvlab::cpu::paged_decode_attention(shape, same, batch.view, same),
                       InvalidArgument, names("out", "a matrix other than q", "q"));

  const auto prefill = [&](const std::vector<std::int32_t>& qo) {
    kvlab::cpu::paged_prefill_attention(shape, q, qo, batch.view, out, &counters);
  };
  CHECK_THROWS_MATCHES(prefill({0, 1}), InvalidArgument, names("qo_indptr.size()", "3", "2"));
  CHECK_THROWS_MATCHES(prefill({1, 1, 2}), InvalidArgument, names("qo_indptr[0]", "0", "1"));
  CHECK_THROWS_MATCHES(
      prefill({0, 6, 2}), InvalidArgument,
      names("qo_indptr[1]", "in [qo_indptr[0] (0), that + the sequence's length (5)]", "6"));
  CHECK_THROWS_MATCHES(
      prefill({0, 1, 0}), InvalidArgument,
      names("qo_indptr[2]", "in [qo_indptr[1] (1), that + the sequence's length (9)]", "0"));
  CHECK_THROWS_MATCHES(prefill({0, 1, 1}), InvalidArgument, names("qo_indptr[batch]", "2", "1"));

  // Nothing was written by any failed call.
  CHECK(out.rows() == 1);
  CHECK(out(0, 0) == 42.0f);
  CHECK(counters == kvlab::CostCounters{});
}
