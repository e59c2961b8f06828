/// \file
/// \brief How the plain (non Google Benchmark) decode-step benchmarks run: their common
/// options, the read bandwidth they compare against, the head of their JSON file and the
/// row-relative difference of two outputs (the tolerance rule of tests/test_support.hpp).
/// Shared by bench_paged_decode and bench_kv_dtype.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <kvlab/kvlab.hpp>

#include "read_bandwidth.hpp"
#include "support/cli.hpp"
#include "support/json.hpp"

namespace kvlab_bench {

/// Max over rows of max |a - b| / max(1, max |b|): the rule of tests/test_support.hpp.
inline double row_relative_difference(const kvlab::RowMatrix<float>& a,
                                      const kvlab::RowMatrix<float>& b) {
  double worst = 0;
  for (Eigen::Index r = 0; r < b.rows(); ++r) {
    const double scale = std::max(1.0, static_cast<double>(b.row(r).cwiseAbs().maxCoeff()));
    worst =
        std::max(worst, static_cast<double>((a.row(r) - b.row(r)).cwiseAbs().maxCoeff()) / scale);
  }
  return worst;
}

/// The options of a decode-step benchmark.
struct StepBenchOptions {
  int max_n = 16384;                  ///< largest n: n runs over 1024, 2048, ... up to it
  int reps = 7;                       ///< repetitions; medians are printed
  double min_time = 0.05;             ///< seconds each path runs per repetition
  std::vector<int> threads = {1, 2};  ///< OpenMP thread counts
  int read_mib = 1024;                ///< the read-bandwidth buffer, MiB
  std::string json;                   ///< also write the results there (empty: no JSON)
};

/// Declares the options of a decode-step benchmark, whose timed things are `paths` ("path",
/// "storage"), on `app`; their defaults are those in `options`.
inline void add_step_bench_options(CLI::App& app, const char* paths, StepBenchOptions& options) {
  using namespace kvlab_support;
  add_integer(app, "--max-n", options.max_n, "largest n; n runs over 1024, 2048, ... up to it",
              1024, 1 << 20);
  add_integer(app, "--reps", options.reps, "repetitions; medians are printed", 1, 1000);
  add_number(app, "--min-time", options.min_time,
             std::string("seconds each ") + paths + " runs per repetition", 0.0, 60.0);
  add_integer_list(app, "--threads", options.threads, "OpenMP thread counts", 1, 256);
  add_integer(app, "--read-mib", options.read_mib, "size of the read-bandwidth buffer in MiB", 1,
              1 << 16);
  add_file(app, "--json", options.json, "also write the results as JSON");
}

/// Reads the options of a decode-step benchmark `program` (description `about`); returns false
/// when --help was given (and the help printed).
/// \throws kvlab_support::UsageError for a bad or unknown option.
inline bool parse_step_bench_options(const char* about, const char* paths, int argc, char** argv,
                                     StepBenchOptions& options) {
  CLI::App app{about};
  add_step_bench_options(app, paths, options);
  return kvlab_support::parse(app, argc, argv);
}

/// The machine's read bandwidth (GB/s) at each of `options.threads`: a vectorised sum over
/// `options.read_mib` MiB, median of 15 runs.
inline std::vector<double> measure_read_bandwidth(const StepBenchOptions& options) {
  std::vector<float> buffer((static_cast<std::size_t>(options.read_mib) << 20) / sizeof(float),
                            1.0f);  // [read_mib MiB / 4]
  std::vector<double> gbps;         // [threads]
  for (int t : options.threads)
    gbps.push_back(read_bandwidth({{buffer.data(), buffer.size()}}, t, 15));
  return gbps;
}

/// The head of a decode-step benchmark's JSON file: the program, its options, the L3 size and
/// the read bandwidth at each thread count; the caller adds "results".
inline kvlab_support::Json step_bench_json_head(const char* program,
                                                const StepBenchOptions& options,
                                                const std::vector<double>& read_gbps) {
  kvlab_support::Json head;
  head["program"] = program;
  head["reps"] = options.reps;
  head["min_time_s"] = options.min_time;
  head["l3_MiB"] = l3_bytes() >> 20;
  head["read_bandwidth_buffer_MiB"] = options.read_mib;
  head["read_bandwidth_GBps"] = kvlab_support::Json::object();
  for (std::size_t t = 0; t < options.threads.size(); ++t)
    head["read_bandwidth_GBps"][std::to_string(options.threads[t])] = read_gbps[t];
  return head;
}

/// The `main` of a decode-step benchmark `program` (described by `about` in its --help), whose
/// timed things are `paths`: reads the
/// options (defaults: `options`), measures the read bandwidth, runs `run_case(config, n,
/// options, read_gbps, results)` for every config of `configs` (each with a `name`) and n =
/// 1024, 2048, ... up to --max-n, then `print(results, options, read_gbps)` and, with --json,
/// `write(path, results, options, read_gbps)`. Returns the exit status (2: a bad command line,
/// 1: a failed run).
template <class Result, class Configs, class RunCase, class Print, class Write>
int step_bench_main(const char* program, const char* about, const char* paths, int argc,
                    char** argv, StepBenchOptions options, const Configs& configs, RunCase run_case,
                    Print print, Write write) {
  const auto parse = [about, paths](int c, char** v, StepBenchOptions& o) {
    return parse_step_bench_options(about, paths, c, v, o);
  };
  if (const auto stop = kvlab_support::read_command_line(program, argc, argv, options, parse))
    return *stop;
  if (!kvlab_support::can_write(program, "--json", options.json)) return 2;
  options.threads = kvlab_support::usable_threads(program, options.threads);
  try {
    const std::vector<double> read_gbps = measure_read_bandwidth(options);  // [threads]
    std::vector<Result> results;
    for (const auto& c : configs)
      for (int n = 1024; n <= options.max_n; n *= 2) {
        std::fprintf(stderr, "%s: %s n = %d ...\n", program, c.name, n);
        run_case(c, n, options, read_gbps, results);
      }
    print(results, options, read_gbps);
    if (!options.json.empty()) write(options.json, results, options, read_gbps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
  return 0;
}

}  // namespace kvlab_bench
