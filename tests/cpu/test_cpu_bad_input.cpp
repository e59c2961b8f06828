// The bad-input cases of include/kvlab/cpu/: each calls a public function declared there with one
// bad argument. The rules of the table are in tests/bad_input/ (entry_points.txt lists the entry
// points and is checked against the headers by the test bad_input_table; bad_input.hpp runs a
// case): each input class that applies — wrong shape, zero or negative size, empty, an index or id
// out of range, a call the object's state does not allow, overflow-sized arguments, values that
// cannot be stored — is tried, and each case asserts kvlab's exception type, a message naming the
// argument with the expected and the actual value, and the object's observable state unchanged
// (compared before and after).
#include <catch2/catch.hpp>

#include <cstdint>
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
namespace input = kvlab_test::input;

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
      "int window=0, int sinks=0)";
  refuses<InvalidArgument>(
      ref6, input::kRange, no_state,
      [&] { (void)kvlab::cpu::reference_attention(shape, q, k, v, 3); },
      names("first_position", "in [0, k.rows() - q.rows()] = [0, 2]", "3"));
  refuses<InvalidArgument>(
      ref6, input::kSize, no_state,
      [&] { (void)kvlab::cpu::reference_attention(shape, q, k, v, 2, -3); },
      names("window", ">= 0", "-3"));
  refuses<InvalidArgument>(
      ref6, input::kValue, no_state,
      [&] { (void)kvlab::cpu::reference_attention(shape, q, k, v, 2, 0, 1); },
      names("sinks", "0 without a window (every key is seen)", "1"));

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

TEST_CASE("softmax_inplace, rmsnorm, linear and the paged attention plan refuse bad input") {
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
  const kvlab::BlockTables tables({0, 1}, {0}, {1}, kvlab::BlockSize{4}, kvlab::NumBlocks{8});
  std::vector<float> k(64), v(64);
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
}

TEST_CASE("cpu::linear with several products refuses bad shapes and shared outputs") {
  // cpu::linear with several products.
  const RowMatrix<double> x = RowMatrix<double>::Ones(2, 4);
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
}

TEST_CASE("Refusals that no case had reached: a paged prefill whose output is its queries") {
  // Found by scripts/coverage.sh: each check below was written, and no test had ever taken it.
  // A paged prefill whose output is its queries.
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
}

TEST_CASE("cpu::reference_linear refuses a weight of another width and an output that is x") {
  // One row of one Q8_0 block (zeros): a weight [1, 32].
  const kvlab::GgmlMatrix w(kvlab::GgmlType::Q8_0, 1, 32, std::vector<unsigned char>(34));
  RowMatrix<float> x = RowMatrix<float>::Ones(2, 32), out = RowMatrix<float>::Constant(2, 3, 7.f);
  const auto out_state = [&] { return std::vector<float>(out.data(), out.data() + out.size()); };
  const auto x_state = [&] { return std::vector<float>(x.data(), x.data() + x.size()); };
  const char* reference_linear =
      "kvlab::cpu::reference_linear(const RowMatrix< float > &x, const GgmlMatrix &w, "
      "RowMatrix< float > &out)";
  refuses<InvalidArgument>(
      reference_linear, input::kShape, out_state,
      [&] {
        kvlab::cpu::reference_linear(RowMatrix<float>(RowMatrix<float>::Ones(2, 64)), w, out);
      },
      names("x.cols()", "32 (w.cols())", "64"));
  refuses<InvalidArgument>(
      reference_linear, input::kState, x_state, [&] { kvlab::cpu::reference_linear(x, w, x); },
      names("out", "a matrix other than x", "x"));
}
