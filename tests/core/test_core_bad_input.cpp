// The bad-input cases of include/kvlab/core/: each calls a public function declared there with one
// bad argument. One loop also holds kvlab::fill_uniform (include/kvlab/matrix.hpp): it tries the
// same bounds on it as on Rng::uniform, as one group. The rules of the table are in
// tests/bad_input/ (entry_points.txt lists the entry points and is checked against the headers by
// the test bad_input_table; bad_input.hpp runs a case): each input class that applies — wrong
// shape, zero or negative size, empty, an index or id out of range, a call the object's state does
// not allow, overflow-sized arguments, values that cannot be stored — is tried, and each case
// asserts kvlab's exception type, a message naming the argument with the expected and the actual
// value, and the object's observable state unchanged (compared before and after).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
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

TEST_CASE("AttentionShape: bad input is refused") {
  const char* three =
      "kvlab::AttentionShape::AttentionShape(int num_heads, int num_kv_heads, int head_dim)";
  refuses<InvalidArgument>(
      three, input::kSize, no_state, [] { kvlab::AttentionShape s(0, 1, 4); },
      names("num_heads", ">= 1", "0"));
  refuses<InvalidArgument>(
      three, input::kSize, no_state, [] { kvlab::AttentionShape s(4, 0, 4); },
      names("num_kv_heads", ">= 1", "0"));
  refuses<InvalidArgument>(
      three, input::kSize, no_state, [] { kvlab::AttentionShape s(4, 2, -8); },
      names("head_dim", ">= 1", "-8"));
  refuses<InvalidArgument>(
      three, input::kShape, no_state, [] { kvlab::AttentionShape s(6, 4, 8); },
      names("num_heads", "a multiple of num_kv_heads (4)", "6"));
  refuses<InvalidArgument>(
      three, input::kOverflow, no_state, [] { kvlab::AttentionShape s(1 << 16, 1, 1 << 16); },
      names("num_heads * head_dim", "at most 2147483647", "4294967296"));
  const char* four =
      "kvlab::AttentionShape::AttentionShape(int num_heads, int num_kv_heads, int head_dim, double "
      "scale)";
  refuses<InvalidArgument>(
      four, input::kValue, no_state, [] { kvlab::AttentionShape s(4, 2, 8, std::nan("")); },
      names("scale", "a finite value > 0", "nan"));
  refuses<InvalidArgument>(
      four, input::kValue, no_state, [] { kvlab::AttentionShape s(4, 2, 8, -1.0); },
      names("scale", "a finite value > 0", "-1"));
  refuses<InvalidArgument>(
      four, input::kSize, no_state, [] { kvlab::AttentionShape s(0, 2, 8, 1.0); },
      names("num_heads", ">= 1", "0"));
}

TEST_CASE("The random numbers and the keys a window leaves visible refuse bad input") {
  // Uniform draws: bounds that are not finite or not in order; nothing drawn.
  kvlab::Rng rng(3);
  RowMatrix<double> m = RowMatrix<double>::Constant(1, 2, 7.0);
  const auto rng_state = [&] {
    kvlab::Rng copy = rng;
    return std::vector<double>{static_cast<double>(copy.next_u64()), m(0, 0), m(0, 1)};
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const char* e : {"kvlab::Rng::uniform(double lo, double hi)",
                        "kvlab::fill_uniform(Eigen::DenseBase< Derived > &m, Rng &rng, double lo, "
                        "double hi)"}) {
    const bool fill = std::string(e).find("fill_uniform") != std::string::npos;
    const auto call = [&](double lo, double hi) {
      if (fill)
        kvlab::fill_uniform(m, rng, lo, hi);
      else
        (void)rng.uniform(lo, hi);
    };
    refuses<InvalidArgument>(
        e, input::kValue, rng_state, [&] { call(nan, 1.0); },
        names("lo", "a finite number", "nan"));
    refuses<InvalidArgument>(
        e, input::kValue, rng_state, [&] { call(0.0, inf); },
        names("hi", "a finite number", "inf"));
    refuses<InvalidArgument>(
        e, input::kValue, rng_state, [&] { call(1.0, 0.5); },
        names("hi", "a number above lo (1)", "0.5"));
    refuses<InvalidArgument>(
        e, input::kValue, rng_state, [&] { call(2.0, 2.0); },
        names("hi", "a number above lo (2)", "2"));
  }

  const char* visible =
      "kvlab::visible_keys(int first_position, int q_len, int window, int sinks=0)";
  refuses<InvalidArgument>(
      visible, input::kRange, no_state, [] { (void)kvlab::visible_keys(-1, 2, 0); },
      names("first_position", ">= 0", "-1"));
  refuses<InvalidArgument>(
      visible, input::kSize, no_state, [] { (void)kvlab::visible_keys(0, -2, 0); },
      names("q_len", ">= 0", "-2"));
  refuses<InvalidArgument>(
      visible, input::kSize, no_state, [] { (void)kvlab::visible_keys(0, 2, -1); },
      names("window", ">= 0", "-1"));
  refuses<InvalidArgument>(
      visible, input::kSize, no_state, [] { (void)kvlab::visible_keys(0, 2, 4, -1); },
      names("sinks", ">= 0", "-1"));
}
