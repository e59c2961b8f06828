/// \file
/// \brief `MedianReporter`: a Google Benchmark display reporter that prints as the default one
/// does and keeps, per benchmark, the median of its repetitions (or its only run), so that a
/// program can print its own summary table after `RunSpecifiedBenchmarks`.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

namespace kvlab_bench {

/// One benchmark's result, as the summary tables use it.
struct Measured {
  double seconds = 0;                ///< real time per iteration (median over repetitions)
  benchmark::UserCounters counters;  ///< the user counters of the same run
  int repetitions = 1;               ///< runs the median was taken over
};

/// Forwards everything to the default display reporter (console, or whatever
/// `--benchmark_format` chose) and records each benchmark's median.
///
/// With `--benchmark_repetitions=R` (R > 1) the median aggregate is kept; without repetitions,
/// the single run. Benchmarks are keyed by `name/args`, e.g. `decode_step/naive/n:128`.
class MedianReporter : public benchmark::BenchmarkReporter {
 public:
  MedianReporter() : display_(benchmark::CreateDefaultDisplayReporter()) {}

  bool ReportContext(const Context& context) override { return display_->ReportContext(context); }

  void ReportRuns(const std::vector<Run>& runs) override {
    display_->ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const std::string key = run.run_name.function_name + "/" + run.run_name.args;
      const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      const bool single = run.run_type == Run::RT_Iteration;
      if (!median && !(single && results_.count(key) == 0)) continue;
      Measured m;
      m.seconds = run.GetAdjustedRealTime() / benchmark::GetTimeUnitMultiplier(run.time_unit);
      m.counters = run.counters;
      m.repetitions = median ? static_cast<int>(run.repetitions) : 1;
      results_[key] = m;
    }
  }

  void Finalize() override { display_->Finalize(); }

  /// The result recorded for `key` (`name/args`), or null if that benchmark did not run.
  const Measured* find(const std::string& key) const {
    const auto it = results_.find(key);
    return it == results_.end() ? nullptr : &it->second;
  }

  /// The value of counter `name` in `m` (0 if absent).
  static double counter(const Measured& m, const std::string& name) {
    const auto it = m.counters.find(name);
    return it == m.counters.end() ? 0.0 : it->second.value;
  }

 private:
  benchmark::BenchmarkReporter* display_;  // owned by Google Benchmark
  std::map<std::string, Measured> results_;
};

}  // namespace kvlab_bench
