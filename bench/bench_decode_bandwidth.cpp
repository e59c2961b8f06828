// bench_decode_bandwidth: effective memory bandwidth of one cached decode step,
// kvlab::cpu::decode_attention<float> with one query row over a ContiguousKVCache holding n
// tokens, against the machine's read bandwidth measured in the same run.
//
//  decode_bandwidth/<mha|gqa>/n:N/threads:T
//    mha: 32 query heads, 32 K/V heads, head_dim 128 (32 KiB of K+V per token)
//    gqa: 32 query heads,  8 K/V heads, head_dim 128 ( 8 KiB of K+V per token)
//    n = 1024 ... 16384; T = 1, 2 OpenMP threads (the kernel splits the K/V heads).
//
// Effective bandwidth = CostCounters::kv_bytes_read of one call / time of one call (K and V
// read once per K/V head). Read bandwidth = a vectorised sum (Eigen) over a buffer far larger
// than the caches, split between T threads, median of several runs; it is the ceiling a decode
// step could reach. User counters: GB_per_s; fraction, of the read bandwidth at the same thread
// count; fraction_same_bytes, of a vectorised sum over the step's own K and V run just before
// it (memory bandwidth on a virtualised machine drifts from minute to minute; this ratio does not);
// and kv_MiB. The read bandwidth also goes into the JSON context. A table follows the run. A cache
// no larger than the L3 is partly re-read from it by the repeated calls, so only caches well
// beyond the L3 measure DRAM; the table's regime column says which rows those are on the
// machine at hand (with a 32 MiB L3: GQA n >= 8192, MHA n >= 2048).
//
// Run (Release build, from the repository root):
//   build/bench/bench_decode_bandwidth --benchmark_repetitions=5
//   --benchmark_report_aggregates_only=true --benchmark_min_time=0.2
//   --benchmark_out=bench/results/cpu-decode-bandwidth.json --benchmark_out_format=json
// Own option: --read_mib=M, the size of the read-bandwidth buffer (default 1024 MiB); --help
// lists it.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include <benchmark/benchmark.h>
#include <Eigen/Dense>

#include <kvlab/kvlab.hpp>

#include "median_reporter.hpp"
#include "read_bandwidth.hpp"
#include "support/cli.hpp"

namespace {

using kvlab_bench::l3_bytes;
using kvlab_bench::read_bandwidth;
using kvlab_support::set_threads;

struct Config {
  const char* name;
  int num_heads;
  int num_kv_heads;
  int head_dim;
};
constexpr Config kMha{"mha", 32, 32, 128};
constexpr Config kGqa{"gqa", 32, 8, 128};
const std::vector<int> kNs = {1024, 2048, 4096, 8192, 16384};
#if defined(_OPENMP)
const std::vector<int> kThreads = {1, 2};
#else
const std::vector<int> kThreads = {1};
#endif
constexpr int kMaxThreads = 2;
constexpr std::uint64_t kSeed = 5;
constexpr int kReadRuns = 15;      // runs of the read-bandwidth sum; the median is kept
constexpr int kSameBytesRuns = 5;  // runs of the sum over a benchmark's own K and V

// Read bandwidth in GB/s, by thread count (index = threads); filled before any benchmark runs.
std::array<double, kMaxThreads + 1> g_read_gbps{};

// ---------------------------------------------------------------------------------------------
// The decode step
// ---------------------------------------------------------------------------------------------

kvlab::AttentionShape shape_of(const Config& c) {
  return kvlab::AttentionShape(c.num_heads, c.num_kv_heads, c.head_dim);
}

// A one-layer cache of shape `c` filled with n random tokens. Filling 16384 tokens of MHA
// (512 MiB) takes a while, so the latest one is kept between Google Benchmark's calls.
const kvlab::ContiguousKVCache<float>& cache_holding(const Config& c, int n) {
  static std::unique_ptr<kvlab::ContiguousKVCache<float>> held;
  static std::string held_key;
  const std::string key = std::string(c.name) + "/" + std::to_string(n);
  if (held_key != key) {
    held.reset();
    held = std::make_unique<kvlab::ContiguousKVCache<float>>(1, c.num_kv_heads, c.head_dim, n);
    kvlab::Rng rng(kSeed);
    const int width = c.num_kv_heads * c.head_dim;
    constexpr int kChunk = 512;
    for (int t0 = 0; t0 < n; t0 += kChunk) {
      const int rows = std::min(kChunk, n - t0);
      // [rows, kv_width]
      const kvlab::RowMatrix<float> k = kvlab::random_matrix<float>(rows, width, rng);
      // [rows, kv_width]
      const kvlab::RowMatrix<float> v = kvlab::random_matrix<float>(rows, width, rng);
      held->append(0, k, v);
    }
    held_key = key;
  }
  return *held;
}

void bm_decode_bandwidth(benchmark::State& state, Config c) {
  const int n = static_cast<int>(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  set_threads(threads);
  const kvlab::AttentionShape shape = shape_of(c);
  // [kv_heads, n, head_dim] each
  const kvlab::ContiguousKVView<float> cache = cache_holding(c, n).view(0);
  kvlab::Rng rng(kSeed + 1);
  // [1, heads * head_dim]
  const kvlab::RowMatrix<float> q = kvlab::random_matrix<float>(1, shape.q_width(), rng);
  // [1, heads * head_dim]
  kvlab::RowMatrix<float> out(1, shape.q_width());

  // The same bytes read by a plain vectorised sum, now: memory bandwidth on a virtualised machine
  // drifts by tens of percent from minute to minute, and this ratio does not depend on when it ran.
  const std::size_t per_tensor =
      static_cast<std::size_t>(cache.num_kv_heads) * cache.capacity * cache.head_dim;
  const double same_bytes_gbps =
      read_bandwidth({{cache.k, per_tensor}, {cache.v, per_tensor}}, threads, kSameBytesRuns);

  kvlab::CostCounters one_call;  // also the warm-up
  kvlab::cpu::decode_attention(shape, q, cache, out, &one_call);
  for (auto _ : state) {
    kvlab::cpu::decode_attention(shape, q, cache, out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  const double gb = static_cast<double>(one_call.kv_bytes_read) * 1e-9;
  // Iteration-invariant rates: value * iterations / real time.
  state.counters["GB_per_s"] =
      benchmark::Counter(gb, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["fraction"] =
      benchmark::Counter(gb / g_read_gbps[static_cast<std::size_t>(threads)],
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["fraction_same_bytes"] =
      benchmark::Counter(gb / same_bytes_gbps, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["kv_MiB"] = static_cast<double>(one_call.kv_bytes_read) / (1 << 20);
}

void register_benchmarks() {
  for (const Config& c : {kMha, kGqa}) {
    const std::string name = std::string("decode_bandwidth/") + c.name;
    auto* b = benchmark::RegisterBenchmark(name.c_str(), bm_decode_bandwidth, c);
    b->ArgNames({"n", "threads"})->UseRealTime()->Unit(benchmark::kMicrosecond);
    for (int n : kNs)
      for (int t : kThreads) b->Args({n, t});
  }
}

// Reads the program's own option, --read_mib=M, into `read_mib` and keeps the other arguments
// for Google Benchmark in `rest` (argv[0] first). Returns false when --help was given (and
// printed).
bool parse_options(int argc, char** argv, std::size_t& read_mib, std::vector<std::string>& rest) {
  CLI::App app{
      "bench_decode_bandwidth: the effective bandwidth of cpu::decode_attention (K/V bytes read "
      "per second) against the machine's read bandwidth, timed by Google Benchmark."};
  app.footer(
      "Every other option is Google Benchmark's, written --name=value: --benchmark_filter=REGEX, "
      "--benchmark_repetitions=N, --benchmark_min_time=S, --benchmark_list_tests, "
      "--benchmark_format=json, ...");
  app.allow_extras();
  kvlab_support::add_integer(app, "--read_mib", read_mib,
                             "size of the read-bandwidth buffer in MiB (--read_mib=M)", 1, 1 << 20);
  if (!kvlab_support::parse(app, argc, argv)) return false;
  rest = {argv[0]};
  for (const std::string& arg : app.remaining()) rest.push_back(arg);
  return true;
}

void print_table(const kvlab_bench::MedianReporter& reporter, std::size_t l3) {
  using kvlab_bench::MedianReporter;
  std::printf(
      "\nEffective bandwidth of one decode step (K+V bytes read once per K/V head / "
      "median time). fraction: of the read bandwidth at the same thread\ncount (below); "
      "same bytes: of a vectorised sum over the step's own K and V, run just before it "
      "(median over the repetitions).\n");
  std::printf("%-32s %7s %6s %9s %10s %9s %9s %11s  %s\n", "shape", "threads", "n", "K+V MiB",
              "time (us)", "GB/s", "fraction", "same bytes", "regime");
  for (const Config& c : {kMha, kGqa}) {
    for (int t : kThreads) {
      for (int n : kNs) {
        const std::string key = std::string("decode_bandwidth/") + c.name +
                                "/n:" + std::to_string(n) + "/threads:" + std::to_string(t);
        const auto* m = reporter.find(key);
        if (m == nullptr) continue;
        const double mib = MedianReporter::counter(*m, "kv_MiB");
        const double bytes = mib * (1 << 20);
        const double gbps = bytes * 1e-9 / m->seconds;
        const char* regime = bytes <= static_cast<double>(l3)         ? "fits in L3"
                             : bytes >= 2.0 * static_cast<double>(l3) ? "DRAM"
                                                                      : "partly L3";
        char shape[64];
        std::snprintf(shape, sizeof shape, "%s %d heads / %d K/V x %d", c.name, c.num_heads,
                      c.num_kv_heads, c.head_dim);
        std::printf("%-32s %7d %6d %9.0f %10.1f %9.2f %9.2f %11.2f  %s\n", shape, t, n, mib,
                    m->seconds * 1e6, gbps, gbps / g_read_gbps[static_cast<std::size_t>(t)],
                    MedianReporter::counter(*m, "fraction_same_bytes"), regime);
      }
    }
  }
  std::printf(
      "\nRead bandwidth (vectorised sum over a buffer beyond the caches, median of %d "
      "runs):",
      kReadRuns);
  for (int t : kThreads)
    std::printf(" %d thread%s %.2f GB/s;", t, t == 1 ? "" : "s",
                g_read_gbps[static_cast<std::size_t>(t)]);
  std::printf(
      "\nL3: %zu MiB (regime column: K+V bytes against it). A cache no larger than the L3 "
      "is partly re-read from it\nby the repeated calls; caches of at least twice the L3 "
      "are the clean DRAM regime.\n",
      l3 >> 20);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t read_mib = 1024;
  std::vector<std::string> rest;  // the arguments for Google Benchmark
  const auto parse = [&rest](int c, char** v, std::size_t& mib) {
    return parse_options(c, v, mib, rest);
  };
  if (const auto stop =
          kvlab_support::read_command_line("bench_decode_bandwidth", argc, argv, read_mib, parse))
    return *stop;
  std::vector<char*> bench_argv;  // [rest.size() + 1], null-terminated as a real argv
  for (std::string& arg : rest) bench_argv.push_back(arg.data());
  bench_argv.push_back(nullptr);
  int bench_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&bench_argc, bench_argv.data());
  if (benchmark::ReportUnrecognizedArguments(bench_argc, bench_argv.data())) return 2;

  // The machine's read bandwidth, before any benchmark (the buffer is freed afterwards).
  {
    std::vector<float> buffer((read_mib << 20) / sizeof(float), 1.0f);  // [read_mib MiB / 4]
    for (int t : kThreads) {
      g_read_gbps[static_cast<std::size_t>(t)] =
          read_bandwidth({{buffer.data(), buffer.size()}}, t, kReadRuns);
    }
  }
  const std::size_t l3 = l3_bytes();
  std::printf("Read bandwidth over %zu MiB (vectorised sum, median of %d):", read_mib, kReadRuns);
  for (int t : kThreads) {
    const double gbps = g_read_gbps[static_cast<std::size_t>(t)];
    std::printf(" %d thread%s %.2f GB/s;", t, t == 1 ? "" : "s", gbps);
    benchmark::AddCustomContext("read_bandwidth_GBps_threads_" + std::to_string(t),
                                std::to_string(gbps));
  }
  std::printf("\n");
  benchmark::AddCustomContext("read_bandwidth_buffer_MiB", std::to_string(read_mib));
  benchmark::AddCustomContext("l3_MiB", std::to_string(l3 >> 20));

  register_benchmarks();
  kvlab_bench::MedianReporter reporter;
  std::fflush(stdout);  // Google Benchmark writes its context to stderr
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  print_table(reporter, l3);
  return 0;
}
