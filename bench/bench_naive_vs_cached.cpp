// bench_naive_vs_cached: measured time of decoding without a KV cache (NaiveDecoder) and with
// one (CachedDecoder), beside the exact work of each (CostCounters).
//
//  decode_step/<naive|cached>/n:N   one decode step at context n: the decoder holds n - 1
//                                   tokens, the timed call feeds token n, and rewind(n - 1)
//                                   (inside the timed loop: O(1) for the cache, a shrinking
//                                   realloc of the inputs for naive) makes every iteration the
//                                   same step. n = 128 ... 16384.
//  generate/<naive|cached>/n:N      a whole generation: reset, one prompt token through
//                                   prefill, then n - 1 decode steps. n = 128 ... 2048.
//
// Model: 1 layer, d_model 256, 4 query heads, 4 K/V heads, head_dim 64, float, fixed seeds; one
// thread (both decoders), so the ratios compare work, not parallel efficiency. Each benchmark
// reports its exact counts as user counters: per step for decode_step, per generation for
// generate. After the run a table puts the measured time ratio naive/cached beside the exact
// ratios of multiply-accumulates and of K/V projections, from the medians.
//
// Run (Release build, from the repository root):
//   build/bench/bench_naive_vs_cached --benchmark_repetitions=5
//   --benchmark_report_aggregates_only=true --benchmark_min_time=0.1
//   --benchmark_out=bench/results/cpu-naive-vs-cached.json --benchmark_out_format=json
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include <benchmark/benchmark.h>

#include <kvlab/kvlab.hpp>

#include "median_reporter.hpp"

namespace {

constexpr int kLayers = 1;
constexpr int kDModel = 256;
constexpr int kNumHeads = 4;
constexpr int kNumKvHeads = 4;
constexpr int kHeadDim = 64;
constexpr std::uint64_t kModelSeed = 11;
constexpr std::uint64_t kInputSeed = 12;
// Rows per prefill call when a decoder is filled to n - 1 tokens: the naive decoder computes a
// [chunk, t] score matrix per call, so the whole prefix at once would need n² floats.
constexpr int kPrefillChunk = 1024;

const std::vector<int> kStepNs = {128, 256, 512, 1024, 2048, 4096, 8192, 16384};
const std::vector<int> kGenerateNs = {128, 256, 512, 1024, 2048};

enum class Kind { kNaive = 0, kCached = 1 };
const char* kind_name(Kind kind) { return kind == Kind::kNaive ? "naive" : "cached"; }

std::shared_ptr<const kvlab::AttentionStack<float>> model() {
  static const auto stack = kvlab::AttentionStack<float>::random(
      kLayers, kvlab::AttentionShape(kNumHeads, kNumKvHeads, kHeadDim), kDModel, kModelSeed);
  return stack;
}

std::unique_ptr<kvlab::Decoder<float>> make_decoder(Kind kind, int capacity) {
  if (kind == Kind::kNaive) return std::make_unique<kvlab::NaiveDecoder<float>>(model());
  return std::make_unique<kvlab::CachedDecoder<float>>(model(), capacity);
}

void use_one_thread() {
#if defined(_OPENMP)
  omp_set_num_threads(1);
#endif
}

// A decoder of `kind` holding `tokens` random tokens, with room for one more. Google Benchmark
// calls a benchmark function once per trial and repetition; filling a decoder to 16383 tokens
// takes seconds, so one decoder per kind is kept between calls (the latest n).
kvlab::Decoder<float>& decoder_holding(Kind kind, int tokens) {
  static std::array<std::unique_ptr<kvlab::Decoder<float>>, 2> held;
  static std::array<int, 2> held_tokens = {-1, -1};
  const auto k = static_cast<std::size_t>(kind);
  if (held_tokens[k] != tokens) {
    held[k].reset();
    held[k] = make_decoder(kind, tokens + 1);
    kvlab::Rng rng(kInputSeed);
    for (int t0 = 0; t0 < tokens; t0 += kPrefillChunk) {
      const int rows = std::min(kPrefillChunk, tokens - t0);
      held[k]->prefill(kvlab::random_matrix<float>(rows, kDModel, rng));  // [rows, d_model]
    }
    held_tokens[k] = tokens;
  }
  return *held[k];
}

void set_counters(benchmark::State& state, const kvlab::CostCounters& c) {
  state.counters["kv_projections"] = static_cast<double>(c.kv_projections);
  state.counters["qk_dots"] = static_cast<double>(c.qk_dots);
  state.counters["macs"] = static_cast<double>(c.macs);
}

// One decode step at context n (the n-th token).
void bm_decode_step(benchmark::State& state, Kind kind) {
  use_one_thread();
  const int n = static_cast<int>(state.range(0));
  kvlab::Decoder<float>& decoder = decoder_holding(kind, n - 1);
  kvlab::Rng rng(kInputSeed + 1);
  const kvlab::RowVector<float> x = kvlab::random_matrix<float>(1, kDModel, rng);  // [d_model]
  for (auto _ : state) {
    const kvlab::RowVector<float> y = decoder.decode(x);  // [d_model]
    benchmark::DoNotOptimize(y.data());
    decoder.rewind(n - 1);
  }
  set_counters(state, decoder.last_step());
}

// A whole generation of n tokens.
void bm_generate(benchmark::State& state, Kind kind) {
  use_one_thread();
  const int n = static_cast<int>(state.range(0));
  const std::unique_ptr<kvlab::Decoder<float>> decoder = make_decoder(kind, n);
  kvlab::Rng rng(kInputSeed + 2);
  // [n, d_model]
  const kvlab::RowMatrix<float> inputs = kvlab::random_matrix<float>(n, kDModel, rng);
  // [1, d_model]
  const kvlab::RowMatrix<float> prompt = inputs.topRows(1);
  for (auto _ : state) {
    decoder->reset();
    kvlab::RowMatrix<float> first = decoder->prefill(prompt);  // [1, d_model]
    benchmark::DoNotOptimize(first.data());
    for (int t = 1; t < n; ++t) {
      const kvlab::RowVector<float> y = decoder->decode(inputs.row(t));  // [d_model]
      benchmark::DoNotOptimize(y.data());
    }
  }
  set_counters(state, decoder->total());  // reset() zeroes them: one generation's work
}

void register_benchmarks() {
  for (Kind kind : {Kind::kNaive, Kind::kCached}) {
    const std::string name = std::string("decode_step/") + kind_name(kind);
    auto* b = benchmark::RegisterBenchmark(name.c_str(), bm_decode_step, kind);
    b->ArgName("n")->UseRealTime()->Unit(benchmark::kMicrosecond);
    for (int n : kStepNs) b->Arg(n);
  }
  for (Kind kind : {Kind::kNaive, Kind::kCached}) {
    const std::string name = std::string("generate/") + kind_name(kind);
    auto* b = benchmark::RegisterBenchmark(name.c_str(), bm_generate, kind);
    b->ArgName("n")->UseRealTime()->Unit(benchmark::kMillisecond);
    for (int n : kGenerateNs) b->Arg(n);
  }
}

// The table: per n, the measured time ratio beside the exact work ratios.
void print_table(const kvlab_bench::MedianReporter& reporter, const char* family,
                 const std::vector<int>& ns, const char* title) {
  using kvlab_bench::MedianReporter;
  bool header = false;
  for (int n : ns) {
    const std::string arg = "/n:" + std::to_string(n);
    const auto* naive = reporter.find(std::string(family) + "/naive" + arg);
    const auto* cached = reporter.find(std::string(family) + "/cached" + arg);
    if (naive == nullptr || cached == nullptr) continue;
    if (!header) {
      std::printf("\n%s\n", title);
      std::printf("%6s | %12s %12s | %10s | %10s %14s | %13s %13s\n", "n", "naive (ms)",
                  "cached (ms)", "time ratio", "MACs ratio", "K/V proj ratio", "naive GMAC/s",
                  "cached GMAC/s");
      header = true;
    }
    const double macs_ratio =
        MedianReporter::counter(*naive, "macs") / MedianReporter::counter(*cached, "macs");
    const double kv_ratio = MedianReporter::counter(*naive, "kv_projections") /
                            MedianReporter::counter(*cached, "kv_projections");
    std::printf("%6d | %12.4f %12.4f | %10.1f | %10.1f %14.1f | %13.1f %13.1f\n", n,
                naive->seconds * 1e3, cached->seconds * 1e3, naive->seconds / cached->seconds,
                macs_ratio, kv_ratio,
                MedianReporter::counter(*naive, "macs") / naive->seconds * 1e-9,
                MedianReporter::counter(*cached, "macs") / cached->seconds * 1e-9);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_benchmarks();
  benchmark::AddCustomContext("kvlab_model",
                              "1 layer, d_model 256, 4 query heads, 4 K/V heads, "
                              "head_dim 64, float");
  benchmark::AddCustomContext("kvlab_threads", "1");

  kvlab_bench::MedianReporter reporter;
  std::fflush(stdout);  // Google Benchmark writes its context to stderr
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  std::printf(
      "\nModel: 1 layer, d_model 256, 4 query heads, 4 K/V heads, head_dim 64, float; "
      "1 thread.\nTimes are medians over the repetitions (real time); ratios of work are "
      "exact (CostCounters).\n");
  print_table(reporter, "decode_step", kStepNs,
              "One decode step at context n (the n-th token), naive / cached:");
  print_table(reporter, "generate", kGenerateNs,
              "Generating n tokens (1 prompt token + n-1 decode steps), naive / cached:");
  std::printf(
      "\nPer step the cache turns n K/V projections per K/V head into 1 (K/V proj ratio "
      "= n); q·k dots stay n per query head for both,\nso the MACs ratio levels off "
      "(attention work remains). The time ratio is the MACs ratio divided by the ratio of "
      "the rates (GMAC/s):\nthe naive decoder's work is large matrix products, the cached "
      "decoder's is matrix-vector products and one pass over the cache.\n");
  return 0;
}
