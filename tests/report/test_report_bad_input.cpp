// The bad-input cases of include/kvlab/report/: each calls a public function declared there with
// one bad argument. The rules of the table are in tests/bad_input/ (entry_points.txt lists the
// entry points and is checked against the headers by the test bad_input_table; bad_input.hpp runs a
// case): each input class that applies — wrong shape, zero or negative size, empty, an index or id
// out of range, a call the object's state does not allow, overflow-sized arguments, values that
// cannot be stored — is tried, and each case asserts kvlab's exception type, a message naming the
// argument with the expected and the actual value, and the object's observable state unchanged
// (compared before and after).
#include <catch2/catch.hpp>

#include <memory>
#include <sstream>
#include <vector>

#include "bad_input/bad_input.hpp"
#include "bad_input/states.hpp"
#include "kvlab/kvlab.hpp"
#include "kvlab/report/state_dot.hpp"

using kvlab::InvalidArgument;
using kvlab_test::names;
using kvlab_test::refuses;
using kvlab_test::bad_input_states::request_of;
using kvlab_test::bad_input_states::state_of;
namespace input = kvlab_test::input;

TEST_CASE("step_dot refuses an engine that has run no step") {
  const auto weights = std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin());
  kvlab::EngineConfig c;
  c.clock = kvlab::EngineClock::Steps;
  kvlab::Engine engine(weights, c);
  engine.submit(request_of({1, 2, 3}, 2));
  const auto engine_state = [&] {
    std::vector<long> s = state_of(engine.scheduler());
    s.push_back(engine.steps());
    return s;
  };
  refuses<InvalidArgument>(
      "kvlab::step_dot(const Engine &engine, const ServingDotOptions &options={})", input::kState,
      engine_state, [&] { (void)kvlab::step_dot(engine); },
      names("engine", "an engine that has run a step", "no step yet"));
}

TEST_CASE("write_run_json refuses more ids than requests") {
  // The run report's ids.
  kvlab::EngineConfig config;
  config.clock = kvlab::EngineClock::Steps;
  kvlab::Engine engine(std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin()),
                       config);
  engine.submit(request_of({1, 2, 3}, 2));
  std::ostringstream json;
  refuses<InvalidArgument>(
      "kvlab::write_run_json(std::ostream &out, const Engine &engine, const std::vector< "
      "std::string > &ids={})",
      input::kShape, [&] { return json.str(); },
      [&] {
        kvlab::write_run_json(json, engine, {"\"a\"", "\"b\""});
      },
      names("ids.size()", "0 or 1 (the requests)", "2"));
}
