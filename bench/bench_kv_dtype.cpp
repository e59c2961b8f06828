// bench_kv_dtype: what storing K and V in less precision buys one decode step. The same float
// rows sit in five contiguous caches — fp32, fp16, bf16, int8 (q8_0: 8.5 bits per value with
// its scales) and int4 (q4_0: 4.5 bits) — and one query attends to each with
// kvlab::cpu::decode_attention, which decodes each row as it reads it.
// Shapes: mha (32 heads, 32 K/V heads, head_dim 128) and gqa (32/8 x 128); n = 1024 ... 32768.
//
// Method (as bench_paged_decode): per shape, n and thread count, --reps repetitions; in each,
// every storage (in an order rotated from one repetition to the next) runs back to back for at
// least --min-time seconds and its mean time per call is kept. Printed per storage: the median
// time; the bytes it reads as stored (CostCounters::kv_bytes_read) and their fraction of the
// fp32 step's; its effective bandwidth on those bytes and that bandwidth's fraction of the read
// bandwidth measured at the start (kvlab_bench::read_bandwidth over --read-mib, default 1 GiB);
// time / fp32 time, the median over repetitions of the ratio within one repetition (the paths
// timed seconds apart: memory bandwidth on a virtualised machine drifts); and the largest
// row-relative difference of its output from the fp32 step's (the storage's error on this
// data: uniform random rows in [-1, 1)). The regime column compares each storage's own K+V bytes
// with the L3: a cache that fits is partly re-read from it by the repeated calls.
//
// Build and run (Release, from the repository root):
//   cmake --build build-bench --target bench_kv_dtype
//   build-bench/bench/bench_kv_dtype --json bench/results/cpu-kv-dtype.json
// --help lists the options.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <kvlab/kvlab.hpp>

#include "read_bandwidth.hpp"
#include "support/cli.hpp"
#include "support/json.hpp"
#include "support/stats.hpp"
#include "timing.hpp"

namespace {

using kvlab::KVDtype;
using kvlab_support::median;
using kvlab_support::set_threads;
using kvlab_support::time_per_call;

struct Config {
  const char* name;
  int num_heads;
  int num_kv_heads;
  int head_dim;
};
constexpr Config kConfigs[] = {{"mha", 32, 32, 128}, {"gqa", 32, 8, 128}};
constexpr KVDtype kDtypes[] = {KVDtype::fp32, KVDtype::fp16, KVDtype::bf16, KVDtype::int8,
                               KVDtype::int4};
constexpr std::uint64_t kSeed = 5;

using Options = kvlab_bench::StepBenchOptions;

// One line of results: a storage at one (shape, n, threads).
struct Result {
  std::string shape, dtype;
  int n = 0, threads = 0;
  double seconds = 0, mib = 0, bytes_ratio = 1, gbps = 0, fraction = 0, ratio = 1, error = 0;
};

// A one-layer contiguous cache of any storage, behind one interface for the timing loop.
struct AnyCache {
  virtual ~AnyCache() = default;
  virtual void append(const kvlab::RowMatrix<float>& k, const kvlab::RowMatrix<float>& v) = 0;
  virtual void attend(const kvlab::AttentionShape& shape, const kvlab::RowMatrix<float>& q,
                      kvlab::RowMatrix<float>& out, kvlab::CostCounters* counters) const = 0;
};
template <typename S>
struct Cache : AnyCache {
  kvlab::ContiguousKVCache<float, S> cache;
  Cache(const Config& c, int n) : cache(1, c.num_kv_heads, c.head_dim, n) {}
  void append(const kvlab::RowMatrix<float>& k, const kvlab::RowMatrix<float>& v) override {
    cache.append(0, k, v);
  }
  void attend(const kvlab::AttentionShape& shape, const kvlab::RowMatrix<float>& q,
              kvlab::RowMatrix<float>& out, kvlab::CostCounters* counters) const override {
    kvlab::cpu::decode_attention(shape, q, cache.view(0), out, counters);
  }
};

// Runs every storage for one shape and n; appends one Result per storage and thread count.
void run_case(const Config& c, int n, const Options& options, const std::vector<double>& read_gbps,
              std::vector<Result>& results) {
  const kvlab::AttentionShape shape(c.num_heads, c.num_kv_heads, c.head_dim);
  std::vector<std::unique_ptr<AnyCache>> caches;  // [dtype], kDtypes' order
  for (KVDtype d : kDtypes) {
    caches.push_back(kvlab::visit_kv_dtype(d, [&](auto tag) -> std::unique_ptr<AnyCache> {
      return std::make_unique<Cache<typename decltype(tag)::type>>(c, n);
    }));
  }
  kvlab::Rng rng(kSeed);
  for (int t0 = 0; t0 < n; t0 += 512) {
    const int rows = std::min(512, n - t0);
    // [rows, kv_width]
    const kvlab::RowMatrix<float> k = kvlab::random_matrix<float>(rows, shape.kv_width(), rng);
    // [rows, kv_width]
    const kvlab::RowMatrix<float> v = kvlab::random_matrix<float>(rows, shape.kv_width(), rng);
    for (auto& cache : caches) cache->append(k, v);
  }
  // [1, heads * head_dim]
  const kvlab::RowMatrix<float> q = kvlab::random_matrix<float>(1, shape.q_width(), rng);
  // [1, heads * head_dim]
  kvlab::RowMatrix<float> out(1, shape.q_width());

  const std::size_t paths = caches.size();
  std::vector<kvlab::CostCounters> counters(paths);
  std::vector<double> error(paths);
  kvlab::RowMatrix<float> fp32_out;
  caches[0]->attend(shape, q, fp32_out, &counters[0]);
  for (std::size_t p = 0; p < paths; ++p) {
    kvlab::RowMatrix<float> o;
    if (p > 0) caches[p]->attend(shape, q, o, &counters[p]);
    error[p] = p == 0 ? 0.0 : kvlab_bench::row_relative_difference(o, fp32_out);
  }
  for (std::size_t ti = 0; ti < options.threads.size(); ++ti) {
    const int threads = options.threads[ti];
    set_threads(threads);
    std::vector<std::vector<double>> seconds(paths);  // [path][rep]
    std::vector<std::vector<double>> ratios(paths);   // [path][rep]: / fp32, same rep
    for (std::size_t p = 0; p < paths; ++p) caches[p]->attend(shape, q, out, nullptr);  // warm-up
    for (int rep = 0; rep < options.reps; ++rep) {
      std::vector<double> now(paths);
      for (std::size_t i = 0; i < paths; ++i) {
        const std::size_t p = (i + static_cast<std::size_t>(rep)) % paths;
        now[p] =
            time_per_call([&] { caches[p]->attend(shape, q, out, nullptr); }, options.min_time);
      }
      for (std::size_t p = 0; p < paths; ++p) {
        seconds[p].push_back(now[p]);
        ratios[p].push_back(now[p] / now[0]);
      }
    }
    for (std::size_t p = 0; p < paths; ++p) {
      Result r;
      r.shape = c.name;
      r.dtype = kvlab::dtype_name(kDtypes[p]);
      r.n = n;
      r.threads = threads;
      r.seconds = median(seconds[p]);
      const double bytes = static_cast<double>(counters[p].kv_bytes_read);
      r.mib = bytes / (1 << 20);
      r.bytes_ratio = bytes / static_cast<double>(counters[0].kv_bytes_read);
      r.gbps = bytes * 1e-9 / r.seconds;
      r.fraction = r.gbps / read_gbps[ti];
      r.ratio = median(ratios[p]);
      r.error = error[p];
      results.push_back(r);
    }
  }
}

void print_table(const std::vector<Result>& results, const Options& options,
                 const std::vector<double>& read_gbps) {
  const double l3 = static_cast<double>(kvlab_bench::l3_bytes());
  std::printf(
      "\nOne decode step over K/V stored in each precision (median of %d repetitions; time / "
      "fp32: median of the ratios within a repetition)\n",
      options.reps);
  std::printf("%-5s %7s %6s %-5s %9s %8s %10s %8s %9s %11s %12s  %s\n", "shape", "threads", "n",
              "kv", "K+V MiB", "bytes/", "time (us)", "GB/s", "fraction", "time/fp32",
              "error vs fp32", "regime");
  std::printf("%-5s %7s %6s %-5s %9s %8s %10s %8s %9s %11s %12s\n", "", "", "", "", "", "fp32", "",
              "", "of read", "", "");
  for (const Result& r : results) {
    const double bytes = r.mib * (1 << 20);
    const char* regime = bytes <= l3 ? "fits in L3" : bytes >= 2 * l3 ? "DRAM" : "partly L3";
    std::printf("%-5s %7d %6d %-5s %9.1f %8.3f %10.1f %8.2f %9.2f %11.3f %12.2e  %s\n",
                r.shape.c_str(), r.threads, r.n, r.dtype.c_str(), r.mib, r.bytes_ratio,
                r.seconds * 1e6, r.gbps, r.fraction, r.ratio, r.error, regime);
  }
  std::printf("\nRead bandwidth (vectorised sum over %d MiB, median of 15 runs):",
              options.read_mib);
  for (std::size_t t = 0; t < options.threads.size(); ++t)
    std::printf(" %d thread%s %.2f GB/s;", options.threads[t], options.threads[t] == 1 ? "" : "s",
                read_gbps[t]);
  std::printf(
      "\nL3: %zu MiB. Bytes as stored: fp16/bf16 0.5, int8 34/128 = 0.266, int4 18/128 = "
      "0.141 of fp32's.\n",
      kvlab_bench::l3_bytes() >> 20);
}

void write_json(const std::string& path, const std::vector<Result>& results, const Options& options,
                const std::vector<double>& read_gbps) {
  kvlab_support::Json json =
      kvlab_bench::step_bench_json_head("bench_kv_dtype", options, read_gbps);
  json["results"] = kvlab_support::Json::array();
  for (const Result& r : results) {
    json["results"].push_back({{"shape", r.shape},
                               {"n", r.n},
                               {"threads", r.threads},
                               {"kv_dtype", r.dtype},
                               {"kv_MiB", r.mib},
                               {"bytes_ratio_to_fp32", r.bytes_ratio},
                               {"median_us", r.seconds * 1e6},
                               {"GB_per_s", r.gbps},
                               {"fraction_of_read_bandwidth", r.fraction},
                               {"time_ratio_to_fp32", r.ratio},
                               {"error_vs_fp32", r.error}});
  }
  kvlab_support::write_json_file(path, json);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  options.max_n = 32768;
  options.reps = 5;
  return kvlab_bench::step_bench_main<Result>(
      "bench_kv_dtype",
      "bench_kv_dtype: one decode step over K/V stored as fp32, fp16, bf16, int8 and int4 "
      "(cpu::decode_attention), medians of repetitions, against the read bandwidth.",
      "storage", argc, argv, options, kConfigs, run_case, print_table, write_json);
}
