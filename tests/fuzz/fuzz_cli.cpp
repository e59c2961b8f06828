// Fuzz target: the command-line parsers of kvlab's programs (kvlab-gap, kvlab-generate,
// kvlab-serve, kvlab-chat, kvlab-eval, kvlab_stress, the plain benchmarks, and the step benchmarks'
// shared parser), each declared with CLI11 (support/cli.hpp), on arbitrary arguments. One program
// holds them all: the environment variable KVLAB_FUZZ_PARSER names the one a run fuzzes (one CTest
// per parser, tests/fuzz/CMakeLists.txt), so that CLI11, most of the compile, is compiled once.
// Each program's source is included in a namespace of its own with its `main` renamed (a static
// function nothing calls, left out of the object code), after every header any of them
// includes (so that their own includes are already done: no header lands inside a namespace).
// An input is split into arguments at its zero bytes (at most 16). The parser may accept the
// arguments, print --help, or throw kvlab_support::UsageError (CLI11's errors become it);
// anything else (another exception, a crash, a sanitizer report) is a finding.
//
//   KVLAB_FUZZ_PARSER=kvlab_serve build-fuzz/tests/fuzz/fuzz_cli build-fuzz/tests/fuzz/corpus/cli
//       -runs=1000000 -close_fd_mask=1
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include <kvlab/analysis/memory_accounting.hpp>
#include <kvlab/kvlab.hpp>
#include <kvlab/model/bpe_tokenizer.hpp>
#include <kvlab/model/cache_policy.hpp>
#include <kvlab/model/chat.hpp>
#include <kvlab/report/state_dot.hpp>

#include "allocator_stress.hpp"    // tests/stress
#include "engine_stress.hpp"       // tests/stress
#include "paged_cache_stress.hpp"  // tests/stress
#include "read_bandwidth.hpp"      // bench
#include "serve_workload.hpp"      // apps
#include "support/builtin_model.hpp"
#include "support/cli.hpp"
#include "support/json.hpp"
#include "support/policy_option.hpp"
#include "support/stats.hpp"
#include "timing.hpp"  // bench: the step benchmarks' parser

#define main static kvlab_fuzz_program_main
namespace fuzz_kvlab_gap {
#include "apps/kvlab_gap.cpp"
}
namespace fuzz_kvlab_generate {
#include "apps/kvlab_generate.cpp"
}
namespace fuzz_kvlab_serve {
#include "apps/kvlab_serve.cpp"
}
namespace fuzz_kvlab_chat {
#include "apps/kvlab_chat.cpp"
}
namespace fuzz_kvlab_eval {
#include "apps/kvlab_eval.cpp"
}
namespace fuzz_bench_generate {
#include "bench/bench_generate.cpp"
}
namespace fuzz_bench_kv_accuracy {
#include "bench/bench_kv_accuracy.cpp"
}
namespace fuzz_bench_memory_waste {
#include "bench/bench_memory_waste.cpp"
}
namespace fuzz_bench_serving {
#include "bench/bench_serving.cpp"
}
namespace fuzz_bench_window {
#include "bench/bench_window.cpp"
}
namespace fuzz_kvlab_stress {
#include "tests/stress/kvlab_stress.cpp"
}
#undef main

namespace {

// The parser of the step benchmarks (bench/timing.hpp), in the shape of the others.
bool parse_step_bench(int argc, char** argv, kvlab_bench::StepBenchOptions& options) {
  return kvlab_bench::parse_step_bench_options("step benchmark", "path", argc, argv, options);
}

// Runs the parser `parse` (`bool parse(int argc, char** argv, Options& options)`) on fresh
// options; its UsageError is an expected outcome.
template <class Options>
void run(bool (*parse)(int, char**, Options&), int argc, char** argv) {
  Options options;
  try {
    (void)parse(argc, argv, options);
  } catch (const kvlab_support::UsageError&) {}
}

using Runner = void (*)(int, char**);

struct Parser {
  const char* name;
  Runner runner;
};

// Every parser, by the name KVLAB_FUZZ_PARSER gives.
const Parser kParsers[] = {
    {"kvlab_gap", [](int c, char** v) { run(&fuzz_kvlab_gap::parse_options, c, v); }},
    {"kvlab_generate", [](int c, char** v) { run(&fuzz_kvlab_generate::parse_options, c, v); }},
    {"kvlab_serve", [](int c, char** v) { run(&fuzz_kvlab_serve::parse, c, v); }},
    {"kvlab_chat", [](int c, char** v) { run(&fuzz_kvlab_chat::parse_options, c, v); }},
    {"kvlab_eval", [](int c, char** v) { run(&fuzz_kvlab_eval::parse_options, c, v); }},
    {"bench_generate", [](int c, char** v) { run(&fuzz_bench_generate::parse_options, c, v); }},
    {"bench_kv_accuracy",
     [](int c, char** v) { run(&fuzz_bench_kv_accuracy::parse_options, c, v); }},
    {"bench_memory_waste",
     [](int c, char** v) { run(&fuzz_bench_memory_waste::parse_options, c, v); }},
    {"bench_serving", [](int c, char** v) { run(&fuzz_bench_serving::parse, c, v); }},
    {"bench_window", [](int c, char** v) { run(&fuzz_bench_window::parse, c, v); }},
    {"kvlab_stress", [](int c, char** v) { run(&fuzz_kvlab_stress::parse_options, c, v); }},
    {"step_bench", [](int c, char** v) { run(&parse_step_bench, c, v); }},
};

Runner g_runner = nullptr;  // the parser this run fuzzes

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* name = std::getenv("KVLAB_FUZZ_PARSER");
  for (const Parser& p : kParsers)
    if (name != nullptr && std::strcmp(name, p.name) == 0) g_runner = p.runner;
  if (g_runner == nullptr) {
    std::fprintf(stderr, "fuzz_cli: KVLAB_FUZZ_PARSER: expected one of");
    for (const Parser& p : kParsers) std::fprintf(stderr, " %s", p.name);
    std::fprintf(stderr, ", got '%s'\n", name != nullptr ? name : "");
    std::exit(2);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args{"program"};  // [argc]: argv[0], then the input's pieces
  std::string piece;
  for (std::size_t i = 0; i < size && args.size() <= 16; ++i) {
    if (data[i] == 0) {
      args.push_back(piece);
      piece.clear();
    } else {
      piece.push_back(static_cast<char>(data[i]));
    }
  }
  if (!piece.empty() && args.size() <= 16) args.push_back(piece);
  std::vector<char*> argv;  // [argc + 1], null-terminated as a real argv
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  g_runner(static_cast<int>(args.size()), argv.data());
  return 0;
}
