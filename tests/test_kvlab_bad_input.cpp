// The bad-input cases of the headers directly in include/kvlab/ (kv_storage.hpp, matrix.hpp): each
// calls a public function declared there with one bad argument. The rules of the table are in
// tests/bad_input/ (entry_points.txt lists the entry points and is checked against the headers by
// the test bad_input_table; bad_input.hpp runs a case): each input class that applies — wrong
// shape, zero or negative size, empty, an index or id out of range, a call the object's state does
// not allow, overflow-sized arguments, values that cannot be stored — is tried, and each case
// asserts kvlab's exception type, a message naming the argument with the expected and the actual
// value, and the object's observable state unchanged (compared before and after).
#include <catch2/catch.hpp>

#include <string>

#include "bad_input/bad_input.hpp"
#include "bad_input/states.hpp"
#include "kvlab/kvlab.hpp"

using kvlab::InvalidArgument;
using kvlab_test::names;
using kvlab_test::refuses;
using kvlab_test::bad_input_states::no_state;
namespace input = kvlab_test::input;

TEST_CASE("parse_kv_dtype refuses a name it does not know") {
  refuses<InvalidArgument>(
      "kvlab::parse_kv_dtype(const std::string &name)", input::kValue, no_state,
      [] { (void)kvlab::parse_kv_dtype("fp8"); },
      names("name", "fp32, fp16, bf16, int8 or int4", "'fp8'"));
}

TEST_CASE("The K/V dtype functions refuse a dtype out of range, random_matrix a negative size") {
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
  kvlab::Rng rng(1);
  refuses<InvalidArgument>(
      "kvlab::random_matrix(Eigen::Index rows, Eigen::Index cols, Rng &rng, double lo=-1.0, double "
      "hi=1.0)",
      input::kSize, no_state, [&] { (void)kvlab::random_matrix<float>(-1, 2, rng); },
      names("rows", ">= 0", "-1"));
}
