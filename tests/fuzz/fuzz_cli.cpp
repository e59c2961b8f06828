// Fuzz target: the command-line parser of one of kvlab's programs (kvlab-gap, kvlab-generate,
// kvlab-serve, kvlab_stress and the plain benchmarks that read their options with
// `kvlab_bench::read_command_line`, the step benchmarks' shared parser among them), on arbitrary
// arguments. This file is compiled once per program (tests/fuzz/CMakeLists.txt): the program's
// source is included with its `main` renamed (and left out of the object code), so that its own
// option parser (KVLAB_FUZZ_PARSE) is called on each input. An input is split into arguments at
// its zero bytes (at most 16). The parser may accept the arguments,
// print --help, or throw its UsageError; anything else (another exception, a crash, a sanitizer
// report) is a finding.
//
//   build-fuzz/tests/fuzz/fuzz_cli_kvlab_generate build-fuzz/tests/fuzz/corpus/cli -runs=1000000
//       -close_fd_mask=1
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

// main becomes a static function that nothing calls, so the compiler emits neither it nor what
// only it uses: the parser's code alone is compiled (4 s instead of 20 for kvlab-generate).
#define main static kvlab_fuzz_program_main
#include KVLAB_FUZZ_PROGRAM_SOURCE
#undef main

namespace {

#if defined(KVLAB_FUZZ_STEP_BENCH)
// The parser of the step benchmarks (bench/timing.hpp), in the shape of the others.
bool parse_step_bench(int argc, char** argv, kvlab_bench::StepBenchOptions& options) {
  return kvlab_bench::parse_step_bench_options("usage: step benchmark\n", argc, argv, options);
}
#endif

// The options type of a parser `bool parse(int argc, char** argv, Options& options)`.
template <class O>
O options_of(bool (*)(int, char**, O&));

}  // namespace

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

  decltype(options_of(&KVLAB_FUZZ_PARSE)) options;
  try {
    (void)KVLAB_FUZZ_PARSE(static_cast<int>(args.size()), argv.data(), options);
  } catch (const kvlab_bench::UsageError&) {}
  return 0;
}
