// kvlab-gap: the O(n²)-vs-O(n) gap of decoding without and with a KV cache, as two tables —
// kvlab's naive-vs-cached experiment.
//
//  1. Generating n tokens: for n = 64, 128, ..., 2048, runs NaiveDecoder and CachedDecoder on
//     the same random model and the same random inputs (one prompt token through prefill, then
//     n - 1 decode steps) and prints, per n: the exact K/V projections and q·k dot products of
//     each decoder over the whole generation (from CostCounters), and the median wall time
//     (then the fastest and the slowest run, the spread).
//  2. One decode step at context n: for n = 256, 1024, 4096, each decoder holds n - 1 tokens
//     and decodes the n-th (then rewinds, so that every repetition is the same step); per n the
//     step's exact counts — Θ(t) K/V projections per step without a cache, Θ(1) with one — the
//     median time of the step and the ratio of multiply-adds beside the ratio of times.
// It checks that both decoders give the same output at every step and that every count equals
// its closed form, and exits non-zero if not.
//
// Build and run (Release):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build --target kvlab-gap
//   build/apps/kvlab-gap [--layers L] [--max-n N] [--reps R] [--threads T]
// (scripts/run.sh does both). --help lists the options. docs/gap_plot.py draws the tables as
// log-log plots (matplotlib) from the saved output: scripts/run.sh --plot FILE.svg.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <kvlab/kvlab.hpp>

#include "support/cli.hpp"
#include "support/stats.hpp"

namespace {

using kvlab_support::log_log_slope;
using kvlab_support::median;

// ---------------------------------------------------------------------------------------------
// The model and the run
// ---------------------------------------------------------------------------------------------

constexpr int kDModel = 64;
constexpr int kNumHeads = 4;
constexpr int kNumKvHeads = 2;
constexpr int kHeadDim = 16;
constexpr std::uint64_t kModelSeed = 2024;  // weights
constexpr std::uint64_t kInputSeed = 7;     // token inputs (drawn per n)
constexpr int kFirstN = 64;
constexpr int kFirstStepN = 256;  // the per-step table: 256, 1024, 4096, ...
// Per step, max |naive - cached| / max(1, max |naive|): the rule and the float tolerance of
// tests/model/test_decoders.cpp (same values, summed in different orders: rounding only).
constexpr double kTolerance = 1e-5;

struct Options {
  int layers = 1;
  int max_n = 2048;
  int step_max_n = 4096;
  int reps = 5;
  int threads = 1;
};

// The times of repeated runs: their median, the least and the most.
struct Times {
  double median = 0, least = 0, most = 0;
};

// One line of the table.
struct Row {
  int n = 0;
  kvlab::CostCounters naive;   // total over the n tokens
  kvlab::CostCounters cached;  // total over the n tokens
  Times naive_ms;              // wall time of one whole generation, over the runs
  Times cached_ms;
  int naive_reps = 0;
  int cached_reps = 0;
  double max_rel_diff = 0;  // over the n steps: max |naive - cached| / max |naive|
};

// Feeds `inputs` to `decoder` (row 0 as the prompt, through prefill; rows 1.. one decode step
// each) and stores every step's output. Returns the wall time in milliseconds.
double generate(kvlab::Decoder<float>& decoder, const kvlab::RowMatrix<float>& inputs,
                kvlab::RowMatrix<float>& outputs) {
  const auto start = std::chrono::steady_clock::now();
  decoder.reset();
  outputs.row(0) = decoder.prefill(inputs.topRows(1)).row(0);
  for (Eigen::Index t = 1; t < inputs.rows(); ++t) outputs.row(t) = decoder.decode(inputs.row(t));
  const auto stop = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(stop - start).count();
}

Times summarize(const std::vector<double>& times) {
  return {median(times), *std::min_element(times.begin(), times.end()),
          *std::max_element(times.begin(), times.end())};
}

// Runs `decoder` `reps` times on `inputs` and returns the times (ms); `outputs` holds the last
// run's outputs, `reps_done` the number of runs. Runs slower than 2 s stop after two (their
// median), which keeps the demo short with --layers > 1 or a large --max-n.
Times timed_runs(kvlab::Decoder<float>& decoder, const kvlab::RowMatrix<float>& inputs,
                 kvlab::RowMatrix<float>& outputs, int reps, int& reps_done) {
  constexpr double kSlowRunMs = 2000;
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    times.push_back(generate(decoder, inputs, outputs));
    if (times.back() > kSlowRunMs && times.size() >= 2) break;
  }
  reps_done = static_cast<int>(times.size());
  return summarize(times);
}

// Closed forms of the total counts (see CostCounters): n tokens, one prompt token then n - 1
// decode steps; step t (t tokens so far) re-projects t rows in every layer without a cache, one
// with it; without a cache the layers below the top recompute t queries over t keys.
struct ClosedForms {
  std::uint64_t naive_kv, cached_kv, naive_dots, cached_dots;
};
ClosedForms closed_forms(int n, int layers) {
  const std::uint64_t nn = static_cast<std::uint64_t>(n);
  const std::uint64_t tri = nn * (nn + 1) / 2;                     // sum of t, t = 1..n
  const std::uint64_t squares = nn * (nn + 1) * (2 * nn + 1) / 6;  // sum of t², t = 1..n
  const std::uint64_t l = static_cast<std::uint64_t>(layers);
  return {l * kNumKvHeads * tri, l * kNumKvHeads * nn, kNumHeads * ((l - 1) * squares + tri),
          l * kNumHeads * tri};
}

// Runs both decoders for n tokens. A disagreement is reported through the Row, not thrown.
Row run_one(int n, int reps, const std::shared_ptr<const kvlab::AttentionStack<float>>& stack) {
  kvlab::Rng rng(kInputSeed + static_cast<std::uint64_t>(n));
  // [n, d_model]
  const kvlab::RowMatrix<float> inputs = kvlab::random_matrix<float>(n, kDModel, rng);
  kvlab::RowMatrix<float> naive_out(n, kDModel);   // [n, d_model]: output of each step
  kvlab::RowMatrix<float> cached_out(n, kDModel);  // [n, d_model]

  kvlab::NaiveDecoder<float> naive(stack);
  kvlab::CachedDecoder<float> cached(stack, /*capacity=*/n);
  Row row;
  row.n = n;
  row.cached_ms = timed_runs(cached, inputs, cached_out, reps, row.cached_reps);
  row.naive_ms = timed_runs(naive, inputs, naive_out, reps, row.naive_reps);
  row.naive = naive.total();
  row.cached = cached.total();
  for (int t = 0; t < n; ++t) {
    const double scale = std::max(naive_out.row(t).cwiseAbs().maxCoeff(), 1.0f);
    const double diff = (naive_out.row(t) - cached_out.row(t)).cwiseAbs().maxCoeff();
    const double rel = diff / scale;
    // A NaN anywhere counts as the largest disagreement (std::max would drop it).
    row.max_rel_diff = std::isnan(rel) ? HUGE_VAL : std::max(row.max_rel_diff, rel);
  }
  return row;
}

// One line of the per-step table: the n-th token's decode step, n - 1 tokens held.
struct StepRow {
  int n = 0;
  kvlab::CostCounters naive;   // the step's work
  kvlab::CostCounters cached;  // the step's work
  Times naive_us;              // wall time of the step, over the repetitions
  Times cached_us;
  double rel_diff = 0;  // |naive - cached| / max(1, max |naive|) of the step's output
};

// Rows per prefill call while a decoder is filled to n - 1 tokens: the naive decoder computes a
// [chunk, t] score matrix per call, so the whole prefix at once would need n² floats.
constexpr int kPrefillChunk = 1024;

// Wall times, in microseconds, of `decoder` decoding `x` as its n-th token (it holds n - 1
// and is rewound after each step). Each repetition times enough steps to last 1 ms at least.
Times time_step(kvlab::Decoder<float>& decoder, const kvlab::RowVector<float>& x, int reps,
                kvlab::RowVector<float>& y) {
  using Clock = std::chrono::steady_clock;
  const int held = decoder.position();
  std::vector<double> per_step;
  int calls = 1;
  for (int r = 0; r < reps; ++r) {
    for (;;) {
      const auto start = Clock::now();
      for (int c = 0; c < calls; ++c) {
        y = decoder.decode(x);
        decoder.rewind(held);
      }
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      if (us >= 1000 || calls >= (1 << 16)) {
        per_step.push_back(us / calls);
        break;
      }
      calls *= 2;  // too short to time well: time more steps at once
    }
  }
  return summarize(per_step);
}

StepRow run_step(int n, int reps,
                 const std::shared_ptr<const kvlab::AttentionStack<float>>& stack) {
  kvlab::Rng rng(kInputSeed + 1000 + static_cast<std::uint64_t>(n));
  // [n, d_model]: n - 1 held tokens, then the timed one
  const kvlab::RowMatrix<float> inputs = kvlab::random_matrix<float>(n, kDModel, rng);
  kvlab::NaiveDecoder<float> naive(stack);
  kvlab::CachedDecoder<float> cached(stack, /*capacity=*/n);
  for (kvlab::Decoder<float>* d : {static_cast<kvlab::Decoder<float>*>(&naive),
                                   static_cast<kvlab::Decoder<float>*>(&cached)}) {
    for (int t0 = 0; t0 < n - 1; t0 += kPrefillChunk)
      d->prefill(inputs.middleRows(t0, std::min(kPrefillChunk, n - 1 - t0)));
  }
  StepRow row;
  row.n = n;
  kvlab::RowVector<float> y_naive, y_cached;  // [d_model]
  const kvlab::RowVector<float> x = inputs.row(n - 1);
  row.cached_us = time_step(cached, x, reps, y_cached);
  row.naive_us = time_step(naive, x, reps, y_naive);
  row.naive = naive.last_step();
  row.cached = cached.last_step();
  const double scale = std::max(y_naive.cwiseAbs().maxCoeff(), 1.0f);
  const double rel = (y_naive - y_cached).cwiseAbs().maxCoeff() / scale;
  row.rel_diff = std::isnan(rel) ? HUGE_VAL : rel;
  return row;
}

// Closed forms of one step's counts at context n: without a cache every layer re-projects n
// rows and the lower layers score n queries against n keys; with one, one row and n keys.
ClosedForms step_closed_forms(int n, int layers) {
  const std::uint64_t nn = static_cast<std::uint64_t>(n);
  const std::uint64_t l = static_cast<std::uint64_t>(layers);
  return {l * kNumKvHeads * nn, l * kNumKvHeads, kNumHeads * ((l - 1) * nn * nn + nn),
          l * kNumHeads * nn};
}

// True when the counted K/V projections and q·k dots equal the closed forms `f`; otherwise
// prints both on standard error, for `what` ("n = 64" or "step at n = 256").
bool counts_match(const std::string& what, const kvlab::CostCounters& naive,
                  const kvlab::CostCounters& cached, const ClosedForms& f) {
  if (naive.kv_projections == f.naive_kv && cached.kv_projections == f.cached_kv &&
      naive.qk_dots == f.naive_dots && cached.qk_dots == f.cached_dots)
    return true;
  std::fprintf(stderr,
               "kvlab-gap: %s: counts differ from the closed forms: K/V projections expected "
               "%llu / %llu, got %llu / %llu; q·k dots expected %llu / %llu, got %llu / %llu "
               "(naive / cached)\n",
               what.c_str(), static_cast<unsigned long long>(f.naive_kv),
               static_cast<unsigned long long>(f.cached_kv),
               static_cast<unsigned long long>(naive.kv_projections),
               static_cast<unsigned long long>(cached.kv_projections),
               static_cast<unsigned long long>(f.naive_dots),
               static_cast<unsigned long long>(f.cached_dots),
               static_cast<unsigned long long>(naive.qk_dots),
               static_cast<unsigned long long>(cached.qk_dots));
  return false;
}

// ---------------------------------------------------------------------------------------------
// Output: the tables
// ---------------------------------------------------------------------------------------------

void print_header(const Options& options) {
  std::printf(
      "kvlab-gap: generating n tokens without a KV cache (NaiveDecoder) and with one "
      "(CachedDecoder)\n");
  std::printf(
      "config: %d layer%s, d_model %d, %d query heads, %d K/V heads, head_dim %d, float; "
      "model seed %llu; 1 prompt token + n-1 decode steps; %d thread%s; times are the "
      "median of %d run%s\n",
      options.layers, options.layers == 1 ? "" : "s", kDModel, kNumHeads, kNumKvHeads, kHeadDim,
      static_cast<unsigned long long>(kModelSeed), options.threads, options.threads == 1 ? "" : "s",
      options.reps, options.reps == 1 ? "" : "s");
  std::printf(
      "Θ(n²): K/V projections without a cache, n(n+1)/2 per layer and K/V head (each "
      "step re-projects the whole prefix).\n");
  std::printf(
      "Θ(n):  K/V projections with a cache, n per layer and K/V head (each step "
      "projects only the new token).\n");
  if (options.layers == 1) {
    std::printf(
        "Not changed by the cache: q·k dot products, n(n+1)/2 per query head for both "
        "(every new query meets every past key).\n");
  } else {
    std::printf(
        "q·k dot products: n(n+1)/2 per layer and query head with a cache; without one "
        "the %s also recompute%s every position, Θ(n³).\n",
        options.layers == 2 ? "lower layer" : "lower layers", options.layers == 2 ? "s" : "");
  }
  std::printf("Counts are exact totals over all layers and heads (CostCounters).\n\n");
  std::printf("%6s | %37s | %25s | %28s | %9s\n", "", "K/V projections", "q·k dot products",
              "time (ms)", "agreement");
  std::printf("%6s | %12s %12s %11s | %12s %12s | %9s %9s %8s | %9s\n", "n", "naive", "cached",
              "ratio", "naive", "cached", "naive", "cached", "ratio", "max diff");
}

void print_row(const Row& r) {
  const double kv_ratio =
      static_cast<double>(r.naive.kv_projections) / static_cast<double>(r.cached.kv_projections);
  std::printf("%6d | %12llu %12llu %11.1f | %12llu %12llu | %9.3f %9.3f %8.1f | %9.1e\n", r.n,
              static_cast<unsigned long long>(r.naive.kv_projections),
              static_cast<unsigned long long>(r.cached.kv_projections), kv_ratio,
              static_cast<unsigned long long>(r.naive.qk_dots),
              static_cast<unsigned long long>(r.cached.qk_dots), r.naive_ms.median,
              r.cached_ms.median, r.naive_ms.median / r.cached_ms.median, r.max_rel_diff);
  std::fflush(stdout);
}

void print_step_header() {
  std::printf(
      "\nOne decode step at context n (the n-th token, n - 1 held): per step the cache turns "
      "Θ(t) K/V projections into one per layer and K/V head; the scores stay Θ(t).\n");
  std::printf("%6s | %25s | %25s | %28s | %10s | %17s\n", "", "K/V projections (step)",
              "q·k dot products (step)", "time (µs)", "MACs", "GMAC/s");
  std::printf("%6s | %12s %12s | %12s %12s | %9s %9s %8s | %10s | %8s %8s\n", "n", "naive",
              "cached", "naive", "cached", "naive", "cached", "ratio", "ratio", "naive", "cached");
}

void print_step_row(const StepRow& r) {
  std::printf("%6d | %12llu %12llu | %12llu %12llu | %9.1f %9.1f %8.1f | %10.1f | %8.2f %8.2f\n",
              r.n, static_cast<unsigned long long>(r.naive.kv_projections),
              static_cast<unsigned long long>(r.cached.kv_projections),
              static_cast<unsigned long long>(r.naive.qk_dots),
              static_cast<unsigned long long>(r.cached.qk_dots), r.naive_us.median,
              r.cached_us.median, r.naive_us.median / r.cached_us.median,
              static_cast<double>(r.naive.macs) / static_cast<double>(r.cached.macs),
              static_cast<double>(r.naive.macs) / r.naive_us.median * 1e-3,
              static_cast<double>(r.cached.macs) / r.cached_us.median * 1e-3);
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

// Returns false when --help was given (and printed). Integers at most 2^29, so that doubling n
// up to the limit never overflows an int.
bool parse_options(int argc, char** argv, Options& options) {
  using namespace kvlab_support;
  constexpr int kMax = 1 << 29;
  CLI::App app{
      "kvlab-gap: the O(n^2)-vs-O(n) gap of decoding without and with a KV cache: exact K/V "
      "projections and q.k dot products of whole generations and of single decode steps, and "
      "their median times, checked against their closed forms."};
  add_integer(app, "--layers", options.layers,
              "attention layers in the model (the naive decoder is Θ(n³) in q·k dots for L > 1, so "
              "keep --max-n small then)",
              1, kMax);
  add_integer(app, "--max-n", options.max_n,
              "largest n of the generation table; n runs over 64, 128, ... up to it", kFirstN,
              kMax);
  add_integer(app, "--step-max-n", options.step_max_n,
              "largest n of the per-step table; n runs over 256, 1024, ... up to it", kFirstStepN,
              kMax);
  add_integer(app, "--reps", options.reps, "runs per decoder and n; the median time is printed", 1,
              kMax);
  add_integer(app, "--threads", options.threads,
              "OpenMP threads: K/V heads, Eigen products (1 by default, so that the times do not "
              "depend on another core being free)",
              1, kMax);
  return kvlab_support::parse(app, argc, argv);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (const auto stop =
          kvlab_support::read_command_line("kvlab-gap", argc, argv, options, parse_options))
    return *stop;
  options.threads = kvlab_support::usable_threads("kvlab-gap", {options.threads}).front();
  kvlab_support::set_threads(options.threads);

  const auto start = std::chrono::steady_clock::now();
  const kvlab::AttentionShape shape(kNumHeads, kNumKvHeads, kHeadDim);
  const auto stack =
      kvlab::AttentionStack<float>::random(options.layers, shape, kDModel, kModelSeed);

  print_header(options);
  std::vector<Row> rows;
  bool counts_ok = true;
  double max_rel_diff = 0;
  for (int n = kFirstN; n <= options.max_n; n *= 2) {
    std::fprintf(stderr, "kvlab-gap: n = %d ...\n", n);
    const Row row = run_one(n, options.reps, stack);
    print_row(row);
    rows.push_back(row);
    max_rel_diff = std::max(max_rel_diff, row.max_rel_diff);
    if (!counts_match("n = " + std::to_string(n), row.naive, row.cached,
                      closed_forms(n, options.layers)))
      counts_ok = false;
  }
  // The spread of the times (docs/gap_plot.py draws it as bars): a median alone hides how far
  // the runs were apart.
  std::printf("\nSpread of the times (ms), the fastest and the slowest run of each decoder:\n");
  for (const Row& r : rows) {
    std::printf("  n = %d: naive %.3f to %.3f, cached %.3f to %.3f\n", r.n, r.naive_ms.least,
                r.naive_ms.most, r.cached_ms.least, r.cached_ms.most);
  }
  for (const Row& r : rows) {
    if (r.naive_reps < options.reps || r.cached_reps < options.reps) {
      std::printf("n = %d: median of %d naive and %d cached runs (a run took over 2 s)\n", r.n,
                  r.naive_reps, r.cached_reps);
    }
  }

  const Row& last = rows.back();
  std::printf(
      "\nAt n = %d the cache saves %.1fx the K/V projections ((n+1)/2 per layer) and "
      "%.1fx the time; the q·k dot products are %s.\n",
      last.n,
      static_cast<double>(last.naive.kv_projections) /
          static_cast<double>(last.cached.kv_projections),
      last.naive_ms.median / last.cached_ms.median,
      last.naive.qk_dots == last.cached.qk_dots ? "the same for both" : "fewer with it");
  const double macs_ratio =
      static_cast<double>(last.naive.macs) / static_cast<double>(last.cached.macs);
  if (options.layers == 1) {
    std::printf(
        "The time ratio stays below the K/V ratio because the attention itself (q·k and "
        "p·v, Θ(t) per step) remains with the cache: total multiply-adds differ %.1fx "
        "(naive %.3g, cached %.3g).\n",
        macs_ratio, static_cast<double>(last.naive.macs), static_cast<double>(last.cached.macs));
  } else {
    std::printf("Total multiply-adds differ %.1fx (naive %.3g, cached %.3g).\n", macs_ratio,
                static_cast<double>(last.naive.macs), static_cast<double>(last.cached.macs));
  }
  print_step_header();
  std::vector<StepRow> steps;  // for the spread below
  for (int n = kFirstStepN; n <= options.step_max_n; n *= 4) {
    std::fprintf(stderr, "kvlab-gap: step at n = %d ...\n", n);
    const StepRow row = run_step(n, options.reps, stack);
    steps.push_back(row);
    print_step_row(row);
    max_rel_diff = std::max(max_rel_diff, row.rel_diff);
    if (!counts_match("step at n = " + std::to_string(n), row.naive, row.cached,
                      step_closed_forms(n, options.layers)))
      counts_ok = false;
  }
  if (!steps.empty()) {
    std::printf("Spread of the times (µs), the fastest and the slowest repetition of each step:\n");
    for (const StepRow& r : steps) {
      std::printf("  step at n = %d: naive %.1f to %.1f, cached %.1f to %.1f\n", r.n,
                  r.naive_us.least, r.naive_us.most, r.cached_us.least, r.cached_us.most);
    }
  }
  if (options.step_max_n >= kFirstStepN) {
    std::printf(
        "Per step the K/V ratio is n (the cache projects one token, the naive decoder all n). "
        "The time ratio stays below even the ratio of multiply-adds: the naive step's work is "
        "large matrix products, which run at more multiply-adds per second (GMAC/s) than the "
        "cached step's matrix-vector products and its pass over the cache.\n\n");
  }
  std::printf(
      "Counts %s the closed forms. Outputs %s at every step: max |naive - cached| / "
      "max |naive| = %.1e (tolerance %.0e).\n",
      counts_ok ? "match" : "DO NOT match", max_rel_diff <= kTolerance ? "agree" : "DO NOT agree",
      max_rel_diff, kTolerance);

  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("Total run time: %.1f s.\n", seconds);

  if (max_rel_diff > kTolerance) {
    std::fprintf(stderr, "kvlab-gap: the decoders disagree: max relative difference %.2e > %.0e\n",
                 max_rel_diff, kTolerance);
    return 1;
  }
  return counts_ok ? 0 : 1;
}
