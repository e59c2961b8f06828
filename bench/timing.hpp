/// \file
/// \brief How the plain (non Google Benchmark) decode-step benchmarks run: their common
/// options, the read bandwidth they compare against, the head of their JSON file, the mean time
/// of a call run back to back for a minimum time, the median of repetitions, and the
/// row-relative difference of two outputs (the tolerance rule of tests/test_support.hpp).
/// Shared by bench_paged_decode and bench_kv_dtype.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include <kvlab/kvlab.hpp>

#include "cli.hpp"
#include "read_bandwidth.hpp"

namespace kvlab_bench {

/// Mean seconds per call of `call`, run back to back for at least `min_time` seconds (3 calls
/// at least).
template <typename F>
double time_per_call(F&& call, double min_time) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  int calls = 0;
  double elapsed = 0;
  do {
    call();
    ++calls;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < min_time || calls < 3);
  return elapsed / calls;
}

/// The median of `values` (the mean of the middle two for an even count); `values` not empty.
inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t m = values.size() / 2;
  return values.size() % 2 == 1 ? values[m] : 0.5 * (values[m - 1] + values[m]);
}

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
  int max_n = 16384;                 ///< largest n: n runs over 1024, 2048, ... up to it
  int reps = 7;                      ///< repetitions; medians are printed
  double min_time = 0.05;            ///< seconds each path runs per repetition
  std::vector<int> threads = {1, 2};  ///< OpenMP thread counts
  int read_mib = 1024;               ///< the read-bandwidth buffer, MiB
  std::string json;                  ///< also write the results there (empty: no JSON)
};

/// The usage text of `program`, whose timed things are `paths` ("path", "storage"), with the
/// defaults of `defaults`.
inline std::string step_bench_usage(const char* program, const char* paths,
                                    const StepBenchOptions& defaults) {
  char text[1024];
  std::snprintf(
      text, sizeof text,
      "usage: %s [--max-n N] [--reps R] [--min-time S] [--threads T,...] [--read-mib M] "
      "[--json FILE] [--help]\n"
      "  --max-n N       largest n; n runs over 1024, 2048, ... up to N (default %d, N >= 1024)\n"
      "  --reps R        repetitions; medians are printed (default %d)\n"
      "  --min-time S    seconds each %s runs per repetition (default %g)\n"
      "  --threads T,... OpenMP thread counts (default 1,2)\n"
      "  --read-mib M    size of the read-bandwidth buffer in MiB (default %d)\n"
      "  --json FILE     also write the results as JSON\n"
      "  --help          print this and exit\n",
      program, defaults.max_n, defaults.reps, paths, defaults.min_time, defaults.read_mib);
  return text;
}

/// Reads the options of a decode-step benchmark; returns false when --help was given (and
/// `usage` printed).
/// \throws UsageError for a bad or unknown option.
inline bool parse_step_bench_options(const std::string& usage, int argc, char** argv,
                                     StepBenchOptions& options) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (arg == "--help" || arg == "-h") {
      std::printf("%s", usage.c_str());
      return false;
    } else if (arg == "--max-n") {
      options.max_n = parse_int(arg, value, 1024, 1 << 20);
    } else if (arg == "--reps") {
      options.reps = parse_int(arg, value, 1, 1000);
    } else if (arg == "--min-time") {
      options.min_time = parse_double(arg, value, 0.0, 60.0);
    } else if (arg == "--threads") {
      options.threads = parse_int_list(arg, value, 1, 256);
    } else if (arg == "--read-mib") {
      options.read_mib = parse_int(arg, value, 1, 1 << 16);
    } else if (arg == "--json") {
      options.json = parse_file_name(arg, value);
    } else {
      throw UsageError("unknown option '" + arg +
                       "': expected one of --max-n, --reps, --min-time, --threads, "
                       "--read-mib, --json, --help");
    }
    ++i;
  }
  return true;
}

/// The machine's read bandwidth (GB/s) at each of `options.threads`: a vectorised sum over
/// `options.read_mib` MiB, median of 15 runs.
inline std::vector<double> measure_read_bandwidth(const StepBenchOptions& options) {
  std::vector<float> buffer((static_cast<std::size_t>(options.read_mib) << 20) / sizeof(float),
                            1.0f);  // [read_mib MiB / 4]
  std::vector<double> gbps;         // [threads]
  for (int t : options.threads) gbps.push_back(read_bandwidth({{buffer.data(), buffer.size()}}, t, 15));
  return gbps;
}

/// Writes the head of a decode-step benchmark's JSON file, up to and including `"results": [`.
inline void write_step_bench_json_head(std::ostream& file, const char* program,
                                       const StepBenchOptions& options,
                                       const std::vector<double>& read_gbps) {
  file << "{\n  \"program\": \"" << program << "\",\n  \"reps\": " << options.reps
       << ",\n  \"min_time_s\": " << options.min_time << ",\n  \"l3_MiB\": " << (l3_bytes() >> 20)
       << ",\n  \"read_bandwidth_buffer_MiB\": " << options.read_mib
       << ",\n  \"read_bandwidth_GBps\": {";
  for (std::size_t t = 0; t < options.threads.size(); ++t)
    file << (t ? ", " : "") << "\"" << options.threads[t] << "\": " << read_gbps[t];
  file << "},\n  \"results\": [\n";
}

/// The `main` of a decode-step benchmark `program`, whose timed things are `paths`: reads the
/// options (defaults: `options`), measures the read bandwidth, runs `run_case(config, n,
/// options, read_gbps, results)` for every config of `configs` (each with a `name`) and n =
/// 1024, 2048, ... up to --max-n, then `print(results, options, read_gbps)` and, with --json,
/// `write(path, results, options, read_gbps)`. Returns the exit status (2: a bad command line,
/// 1: a failed run).
template <class Result, class Configs, class RunCase, class Print, class Write>
int step_bench_main(const char* program, const char* paths, int argc, char** argv,
                    StepBenchOptions options, const Configs& configs, RunCase run_case,
                    Print print, Write write) {
  const std::string usage = step_bench_usage(program, paths, options);
  const auto parse = [&usage](int c, char** v, StepBenchOptions& o) {
    return parse_step_bench_options(usage, c, v, o);
  };
  if (const auto stop = read_command_line(program, argc, argv, options, parse)) return *stop;
  if (!can_write(program, "--json", options.json)) return 2;
  options.threads = usable_threads(program, options.threads);
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
