// The bad-input cases of include/kvlab/store/: each calls a public function declared there with one
// bad argument. The rules of the table are in tests/bad_input/ (entry_points.txt lists the entry
// points and is checked against the headers by the test bad_input_table; bad_input.hpp runs a
// case): each input class that applies — wrong shape, zero or negative size, empty, an index or id
// out of range, a call the object's state does not allow, overflow-sized arguments, values that
// cannot be stored — is tried, and each case asserts kvlab's exception type, a message naming the
// argument with the expected and the actual value, and the object's observable state unchanged
// (compared before and after).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "bad_input/bad_input.hpp"
#include "bad_input/states.hpp"
#include "kvlab/kvlab.hpp"

using kvlab::InvalidArgument;
using kvlab::RowMatrix;
using kvlab_test::names;
using kvlab_test::refuses;
using kvlab_test::bad_input_states::no_state;
namespace input = kvlab_test::input;

TEST_CASE("The stores refuse bad sizes, sequences they do not hold and an append without a step") {
  const char* contiguous =
      "kvlab::ContiguousStore::ContiguousStore(int num_layers, int num_kv_heads, int head_dim, int "
      "capacity, int window=0, int sinks=0)";
  refuses<InvalidArgument>(
      contiguous, input::kSize, no_state, [] { kvlab::ContiguousStore<double> s(1, 1, 2, 0); },
      names("capacity", ">= 1", "0"));
  refuses<InvalidArgument>(
      contiguous, input::kRange, no_state,
      [] { kvlab::ContiguousStore<double> s(1, 1, 2, 8, 6, 3); },
      names("window", "at most capacity - sinks (5)", "6"));
  const char* paged =
      "kvlab::PagedStore::PagedStore(int num_layers, int num_kv_heads, int head_dim, int "
      "block_size, int num_blocks, KVLayout layout=KVLayout::NHD, int window=0, int sinks=0)";
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
}

TEST_CASE(
    "The recompute store's inputs, a step's new inputs and attend without a step are refused") {
  kvlab::RecomputeStore<double> recompute(1, 1, 4, 8);
  refuses<InvalidArgument>(
      "kvlab::RecomputeStore::inputs(int seq) const", input::kRange, no_state,
      [&] { (void)recompute.inputs(9); }, names("seq", "a live sequence id", "9"));
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

TEST_CASE("A step opened while one is open, and the open step's batch, refuse bad input") {
  // A contiguous store with one step open: one sequence adding 2 tokens.
  const RowMatrix<double> x = RowMatrix<double>::Ones(2, 4);
  kvlab::ContiguousStore<double> store(1, 1, 2, 8);
  const int seq = store.add_sequence();
  RowMatrix<double> inputs;
  const kvlab::StepBatch& batch = store.begin_step({seq}, {0, 2}, x, inputs, nullptr);
  // A step opened while one is open: refused, naming the caller, and the open one stays open.
  RowMatrix<double> more_inputs;
  refuses<InvalidArgument>(
      "kvlab::OpenStep::OpenStep(KVStore< T > &store, const std::vector< int > &seqs, const "
      "std::vector< std::int32_t > &new_indptr, const RowMatrix< T > &new_inputs, RowMatrix< T > "
      "&inputs, const char *caller)",
      input::kState,
      [&] {
        return std::vector<int>{store.length(seq), batch.rows()};
      },
      [&] {
        kvlab::OpenStep<double> again(store, {seq}, {0, 2}, x, more_inputs, "kvlab::MyModel");
      },
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
}

TEST_CASE("Refusals that no case had reached: a step whose inputs are its new inputs") {
  // Found by scripts/coverage.sh: each check below was written, and no test had ever taken it.
  // A step whose inputs are its new inputs.
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
}

TEST_CASE("SelectiveStore refuses bad head policies, heads out of range and a bad measurement") {
  using kvlab::HeadPolicy;
  using kvlab::KVDtype;
  const char* ctor =
      "kvlab::SelectiveStore::SelectiveStore(int num_layers, int num_kv_heads, int head_dim, "
      "std::vector< HeadPolicy > heads)";
  const auto make = [](int head_dim, std::vector<HeadPolicy> heads) {
    return [head_dim, heads] { kvlab::SelectiveStore<double> s(1, 2, head_dim, heads); };
  };
  const HeadPolicy full;
  refuses<InvalidArgument>(ctor, input::kShape, no_state, make(32, {full}),
                           names("heads.size()", "2 (num_layers * num_kv_heads)", "1"));
  refuses<InvalidArgument>(ctor, input::kSize, no_state, make(0, {full, full}),
                           names("head_dim", ">= 1", "0"));
  refuses<InvalidArgument>(ctor, input::kValue, no_state,
                           make(32, {full, HeadPolicy{KVDtype::fp32, KVDtype::fp32, -1}}),
                           names("heads[1] (layer 0, K/V head 1).window", ">= 0", "-1"));
  refuses<InvalidArgument>(
      ctor, input::kState, no_state,
      make(32, {HeadPolicy{KVDtype::fp32, KVDtype::fp32, 0, 0, 4}, full}),
      names("heads[0] (layer 0, K/V head 0).window",
            "at least 1 with sinks or heavy hitters (without a window every token is kept)", "0"));
  refuses<InvalidArgument>(
      ctor, input::kValue, no_state,
      make(32, {full, HeadPolicy{KVDtype::fp32, KVDtype::fp32, 4, 4}}),
      names("heads[1] (layer 0, K/V head 1).sinks", "below the window (4)", "4"));
  refuses<InvalidArgument>(
      ctor, input::kShape, no_state, make(16, {full, HeadPolicy{KVDtype::fp16, KVDtype::int4}}),
      names("head_dim", "a multiple of 32 (the values of one int4 block)", "16"));
  kvlab::SelectiveStore<double> store(1, 2, 32, {full, full});
  const int seq = store.add_sequence();
  const auto state = [&] { return store.sequences(); };
  refuses<InvalidArgument>(
      "kvlab::SelectiveStore::policy(int layer, int kv_head) const", input::kRange, state,
      [&] { (void)store.policy(0, 2); }, names("kv_head", "in [0, 2)", "2"));
  refuses<InvalidArgument>(
      "kvlab::SelectiveStore::held_positions(int seq, int layer, int kv_head) const", input::kRange,
      state, [&] { (void)store.held_positions(seq, 1, 0); }, names("layer", "in [0, 1)", "1"));
  refuses<InvalidArgument>(
      "kvlab::SelectiveStore::held_positions(int seq, int layer, int kv_head) const", input::kRange,
      state, [&] { (void)store.held_positions(seq + 1, 0, 0); },
      names("seq", "a live sequence id", std::to_string(seq + 1)));
  refuses<InvalidArgument>(
      "kvlab::SelectiveStore::measure_outside(int window, int sinks)", input::kSize, state,
      [&] { store.measure_outside(0, 0); }, names("window", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::SelectiveStore::measure_outside(int window, int sinks)", input::kValue, state,
      [&] { store.measure_outside(4, 4); }, names("sinks", "below the window (4)", "4"));
}
