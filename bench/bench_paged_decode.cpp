// bench_paged_decode: the price of paging for one decode step. The same float rows sit in a
// contiguous cache and in block pools of block size 1, 16 and 32, in both pool layouts, whose
// blocks are in random physical order (a fragmented pool, as a long-running server has); one
// query per step:
//   contiguous  kvlab::cpu::decode_attention        over [num_kv_heads, n, head_dim]
//   NHD/B       kvlab::cpu::paged_decode_attention  over [num_blocks, B, num_kv_heads, head_dim]
//   HND/B       kvlab::cpu::paged_decode_attention  over [num_blocks, num_kv_heads, B, head_dim]
// Shapes: mha (32 heads, 32 K/V heads, head_dim 128: 32 KiB of K+V per token) and gqa (32/8 x
// 128: 8 KiB per token); n = 1024 ... 16384.
//
// Method: per shape, n and thread count, --reps repetitions; in each, every path (in an order
// rotated from one repetition to the next) runs back to back for at least --min-time seconds and
// its mean time per call is kept. Printed: each path's median time, its effective bandwidth
// (CostCounters::kv_bytes_read / time) and that bandwidth's fraction of the read bandwidth
// measured at the start (kvlab_bench::read_bandwidth over --read-mib, default 1 GiB); and
// paged/contiguous, the median over repetitions of the ratio within one repetition (paths timed
// seconds apart, not minutes: memory bandwidth on a virtualised machine drifts). Before timing,
// every paged output is checked against the contiguous one (max row-relative difference <= 1e-5,
// the float tolerance of tests/cpu/test_paged_attention.cpp); a mismatch exits non-zero.
//
// The limit of each path: in the same repetitions, every path's K and V bytes are also read by a
// plain vectorised sum, no attention, in the order its decode step reads them and split between
// the threads as the step splits its work (`read_order`): the contiguous cache one head's rows
// after another, an HND pool one head at a time block by block in block-table order (B rows of a
// head: B * 512 bytes at head_dim 128), an NHD pool block by block with all heads (B * 16 KiB for
// mha). "read" paged / contiguous is what the memory alone costs for reading those pieces in
// random physical order; a paged step cannot be expected to come nearer to the contiguous one
// than that.
//
// Build and run (Release, from the repository root):
//   cmake --build build-bench --target bench_paged_decode
//   build-bench/bench/bench_paged_decode --json bench/results/cpu-paged-decode.json
// --help lists the options.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <kvlab/kvlab.hpp>

#include "read_bandwidth.hpp"
#include "support/cli.hpp"
#include "support/json.hpp"
#include "support/stats.hpp"
#include "timing.hpp"

namespace {

using kvlab_bench::row_relative_difference;
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
constexpr int kBlockSizes[] = {1, 16, 32};
constexpr kvlab::KVLayout kLayouts[] = {kvlab::KVLayout::NHD, kvlab::KVLayout::HND};
constexpr std::uint64_t kSeed = 5;
constexpr double kTolerance = 1e-5;

using Options = kvlab_bench::StepBenchOptions;

// One line of results: a path at one (shape, n, threads).
struct Result {
  std::string shape, path, layout;         // layout "" for contiguous
  int n = 0, threads = 0, block_size = 0;  // block_size 0: contiguous
  double seconds = 0, gbps = 0, fraction = 0, ratio = 1;
  // the same bytes in the same order, summed (`read_order`)
  double read_seconds = 0, read_ratio = 1;
};

// A block pool holding the rows of `cache` through a table of blocks in random physical order.
struct Pool {
  // [num_blocks, block_size, num_kv_heads, head_dim] (NHD) or [num_blocks, num_kv_heads,
  // block_size, head_dim] (HND)
  std::vector<float> k, v;
  kvlab::BlockTables tables{{0, 1}, {0}, {1}, kvlab::BlockSize{1}, kvlab::NumBlocks{1}};
  kvlab::PagedKVView<float> view;

  Pool(const kvlab::ContiguousKVView<float>& cache, int block_size, kvlab::KVLayout layout) {
    const int n = cache.length;
    const int num_blocks = (n - 1) / block_size + 1;
    kvlab::Rng rng(kSeed + static_cast<std::uint64_t>(block_size));
    tables = kvlab::BlockTables::shuffled({n}, block_size, 0, rng);
    const std::size_t size =
        static_cast<std::size_t>(num_blocks) * block_size * cache.num_kv_heads * cache.head_dim;
    k.assign(size, 0.0f);
    v.assign(size, 0.0f);
    view = tables.view(k.data(), v.data(), cache.num_kv_heads, cache.head_dim, layout);
    const auto bytes = static_cast<std::size_t>(cache.head_dim) * sizeof(float);
    for (int pos = 0; pos < n; ++pos)
      for (int h = 0; h < cache.num_kv_heads; ++h) {
        std::memcpy(k.data() + view.offset(0, pos, h), cache.key(h, pos), bytes);
        std::memcpy(v.data() + view.offset(0, pos, h), cache.value(h, pos), bytes);
      }
  }
};

// `count` floats from `data`: a piece of K or V that a decode step reads in one go.
using Piece = std::pair<const float*, std::size_t>;
// [item][piece]: what each work item of a decode step reads, in its order; the items are shared
// out between the threads as the kernels share theirs.
using ReadOrder = std::vector<std::vector<Piece>>;

// The contiguous cache: an item per K/V head, its key rows and then its value rows.
ReadOrder read_order(const kvlab::ContiguousKVView<float>& cache) {
  const auto rows = static_cast<std::size_t>(cache.length) * cache.head_dim;  // floats per head
  ReadOrder order;
  for (int h = 0; h < cache.num_kv_heads; ++h)
    order.push_back({{cache.key(h, 0), rows}, {cache.value(h, 0), rows}});
  return order;
}

// A pool of sequence 0, read as `plan_paged_attention` splits a decode step over `threads`: HND,
// an item per K/V head, its rows of each block in block-table order (keys, then values); NHD, an
// item per partition of the blocks (one on one thread, split-K on more), each block's whole
// token rows in table order (keys, then values).
ReadOrder read_order(const kvlab::PagedKVView<float>& view, int threads) {
  const int blocks = view.num_pages(0), len = view.seq_len(0);
  const auto rows_in = [&](int b) {  // tokens held by the sequence's block b
    return static_cast<std::size_t>(std::min(view.block_size, len - b * view.block_size));
  };
  ReadOrder order;
  const auto add = [&](std::vector<Piece>& item, int b, int head, std::size_t floats) {
    const std::ptrdiff_t at = view.offset(0, b * view.block_size, head);
    item.push_back({view.k + at, floats});
  };
  const auto add_values = [&](std::vector<Piece>& item) {  // the same pieces of V, after K's
    const std::size_t keys = item.size();
    for (std::size_t i = 0; i < keys; ++i)
      item.push_back({view.v + (item[i].first - view.k), item[i].second});
  };
  const auto hd = static_cast<std::size_t>(view.head_dim);
  if (view.layout == kvlab::KVLayout::HND) {
    for (int h = 0; h < view.num_kv_heads; ++h) {
      std::vector<Piece> item;
      for (int b = 0; b < blocks; ++b) add(item, b, h, rows_in(b) * hd);
      add_values(item);
      order.push_back(item);
    }
  } else {
    const int parts = std::min(threads, blocks);
    for (int p = 0; p < parts; ++p) {
      std::vector<Piece> item;
      for (int b = blocks * p / parts; b < blocks * (p + 1) / parts; ++b)
        add(item, b, 0, rows_in(b) * view.num_kv_heads * hd);
      add_values(item);
      order.push_back(item);
    }
  }
  return order;
}

// Sums every piece of `order`, the items shared out between `threads` threads in order (as
// OpenMP's static schedule does), each piece by Eigen's vectorised sum.
float read_in_order(const ReadOrder& order, int threads) {
  const auto items = static_cast<std::ptrdiff_t>(order.size());
  std::vector<float> partial(order.size(), 0.0f);  // [items]
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
  for (std::ptrdiff_t i = 0; i < items; ++i) {
    float sum = 0;
    for (const Piece& piece : order[static_cast<std::size_t>(i)])
      sum += Eigen::Map<const Eigen::ArrayXf>(piece.first, static_cast<Eigen::Index>(piece.second))
                 .sum();
    partial[static_cast<std::size_t>(i)] = sum;
  }
  (void)threads;
  float total = 0;
  for (float p : partial) total += p;
  return total;
}

// Runs every path for one shape and n; appends one Result per path and thread count.
void run_case(const Config& c, int n, const Options& options, const std::vector<double>& read_gbps,
              std::vector<Result>& results) {
  const kvlab::AttentionShape shape(c.num_heads, c.num_kv_heads, c.head_dim);
  kvlab::ContiguousKVCache<float> contiguous(1, c.num_kv_heads, c.head_dim, n);
  kvlab::Rng rng(kSeed);
  for (int t0 = 0; t0 < n; t0 += 512) {
    const int rows = std::min(512, n - t0);
    // [rows, kv_width]
    const kvlab::RowMatrix<float> k = kvlab::random_matrix<float>(rows, shape.kv_width(), rng);
    // [rows, kv_width]
    const kvlab::RowMatrix<float> v = kvlab::random_matrix<float>(rows, shape.kv_width(), rng);
    contiguous.append(0, k, v);
  }
  const kvlab::ContiguousKVView<float> flat = contiguous.view(0);
  std::vector<Pool> pools;
  pools.reserve(std::size(kLayouts) * std::size(kBlockSizes));
  for (kvlab::KVLayout layout : kLayouts)
    for (int b : kBlockSizes) pools.emplace_back(flat, b, layout);
  // [1, heads * head_dim]
  const kvlab::RowMatrix<float> q = kvlab::random_matrix<float>(1, shape.q_width(), rng);
  // [1, heads * head_dim]
  kvlab::RowMatrix<float> out(1, shape.q_width());

  // Checked before timed: every paged output equals the contiguous one.
  kvlab::CostCounters counters;
  const kvlab::RowMatrix<float> want = kvlab::cpu::decode_attention(shape, q, flat, &counters);
  for (const Pool& pool : pools) {
    const double diff =
        row_relative_difference(kvlab::cpu::paged_decode_attention(shape, q, pool.view), want);
    if (!(diff <= kTolerance)) {
      throw std::runtime_error("paged and contiguous outputs differ: " + std::to_string(diff));
    }
  }
  const double gb = static_cast<double>(counters.kv_bytes_read) * 1e-9;

  const std::size_t paths = 1 + pools.size();  // 0: contiguous, then one per block size
  const auto call = [&](std::size_t path) {
    if (path == 0) {
      kvlab::cpu::decode_attention(shape, q, flat, out);
    } else {
      kvlab::cpu::paged_decode_attention(shape, q, pools[path - 1].view, out);
    }
  };
  for (std::size_t ti = 0; ti < options.threads.size(); ++ti) {
    const int threads = options.threads[ti];
    set_threads(threads);
    std::vector<ReadOrder> orders{read_order(flat)};  // [path]
    for (const Pool& pool : pools) orders.push_back(read_order(pool.view, threads));
    volatile float sink = 0;                          // keeps the sums of the reads
    std::vector<std::vector<double>> seconds(paths);  // [path][rep]
    std::vector<std::vector<double>> ratios(paths);   // [path][rep]: paged / contiguous, same rep
    std::vector<std::vector<double>> read_seconds(paths);  // [path][rep]
    std::vector<std::vector<double>> read_ratios(paths);   // [path][rep]
    for (std::size_t p = 0; p < paths; ++p) call(p);       // warm-up
    for (int rep = 0; rep < options.reps; ++rep) {
      std::vector<double> now(paths), read_now(paths);
      for (std::size_t i = 0; i < paths; ++i) {
        const std::size_t p = (i + static_cast<std::size_t>(rep)) % paths;
        now[p] = time_per_call([&] { call(p); }, options.min_time);
        read_now[p] =
            time_per_call([&] { sink = read_in_order(orders[p], threads); }, options.min_time);
      }
      for (std::size_t p = 0; p < paths; ++p) {
        seconds[p].push_back(now[p]);
        ratios[p].push_back(now[p] / now[0]);
        read_seconds[p].push_back(read_now[p]);
        read_ratios[p].push_back(read_now[p] / read_now[0]);
      }
    }
    for (std::size_t p = 0; p < paths; ++p) {
      Result r;
      r.shape = c.name;
      r.n = n;
      r.threads = threads;
      r.block_size = p == 0 ? 0 : pools[p - 1].view.block_size;
      r.layout = p == 0 ? "" : kvlab::to_string(pools[p - 1].view.layout);
      r.path = p == 0 ? "contiguous" : r.layout + "/" + std::to_string(r.block_size);
      r.seconds = median(seconds[p]);
      r.gbps = gb / r.seconds;
      r.fraction = r.gbps / read_gbps[ti];
      r.ratio = median(ratios[p]);
      r.read_seconds = median(read_seconds[p]);
      r.read_ratio = median(read_ratios[p]);
      results.push_back(r);
    }
  }
}

void print_table(const std::vector<Result>& results, const Options& options,
                 const std::vector<double>& read_gbps) {
  std::printf(
      "\nOne decode step, contiguous vs paged (blocks in random physical order). time: median of "
      "%d "
      "repetitions;\nGB/s: K+V bytes read / time; frac: of the read bandwidth; paged columns: "
      "paged / "
      "contiguous time within a repetition, median; HND/16 frac: its fraction of the read "
      "bandwidth.\n",
      options.reps);
  const std::size_t paths = 1 + std::size(kLayouts) * std::size(kBlockSizes);
  std::printf("%-4s %7s %6s | %-22s |", "", "threads", "n", "contiguous: us GB/s frac");
  for (std::size_t j = 1; j < paths; ++j) std::printf(" %7s", results[j].path.c_str());
  std::printf(" | HND/16 frac\n");
  for (std::size_t i = 0; i + paths <= results.size(); i += paths) {
    const Result* r = &results[i];
    std::printf("%-4s %7d %6d | %8.0f %6.2f %5.2f |", r[0].shape.c_str(), r[0].threads, r[0].n,
                r[0].seconds * 1e6, r[0].gbps, r[0].fraction);
    double hnd16 = 0;
    for (std::size_t j = 1; j < paths; ++j) {
      std::printf(" %7.3f", r[j].ratio);
      if (r[j].path == "HND/16") hnd16 = r[j].fraction;
    }
    std::printf(" | %5.2f\n", hnd16);
  }
  std::printf(
      "\nThe same K and V bytes read in the same order by a vectorised sum, no attention "
      "(read_order):\nread us: the contiguous order's median; paged columns: paged / contiguous "
      "read time within a repetition, median.\n");
  std::printf("%-4s %7s %6s | %-8s |", "", "threads", "n", " read us");
  for (std::size_t j = 1; j < paths; ++j) std::printf(" %7s", results[j].path.c_str());
  std::printf("\n");
  for (std::size_t i = 0; i + paths <= results.size(); i += paths) {
    const Result* r = &results[i];
    std::printf("%-4s %7d %6d | %8.0f |", r[0].shape.c_str(), r[0].threads, r[0].n,
                r[0].read_seconds * 1e6);
    for (std::size_t j = 1; j < paths; ++j) std::printf(" %7.3f", r[j].read_ratio);
    std::printf("\n");
  }
  std::printf("\nRead bandwidth (vectorised sum over %d MiB, median of 15):", options.read_mib);
  for (std::size_t t = 0; t < options.threads.size(); ++t)
    std::printf(" %d thread%s %.2f GB/s;", options.threads[t], options.threads[t] == 1 ? "" : "s",
                read_gbps[t]);
  std::printf(
      "\nL3: %zu MiB. K+V of mha is 32 MiB per 1024 tokens, of gqa 8 MiB: caches within about "
      "twice the "
      "L3 are partly re-read from it.\n",
      kvlab_bench::l3_bytes() >> 20);
}

void write_json(const std::string& path, const std::vector<Result>& results, const Options& options,
                const std::vector<double>& read_gbps) {
  kvlab_support::Json json =
      kvlab_bench::step_bench_json_head("bench_paged_decode", options, read_gbps);
  json["results"] = kvlab_support::Json::array();
  for (const Result& r : results) {
    json["results"].push_back({{"shape", r.shape},
                               {"n", r.n},
                               {"threads", r.threads},
                               {"path", r.path},
                               {"layout", r.layout},
                               {"block_size", r.block_size},
                               {"median_us", r.seconds * 1e6},
                               {"GB_per_s", r.gbps},
                               {"fraction_of_read_bandwidth", r.fraction},
                               {"ratio_to_contiguous", r.ratio},
                               {"read_median_us", r.read_seconds * 1e6},
                               {"read_ratio_to_contiguous", r.read_ratio}});
  }
  kvlab_support::write_json_file(path, json);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  return kvlab_bench::step_bench_main<Result>(
      "bench_paged_decode",
      "bench_paged_decode: the price of paging for one decode step: cpu::paged_decode_attention "
      "over block pools (block sizes 1, 16, 32; NHD and HND) against cpu::decode_attention over a "
      "contiguous cache, medians of repetitions, against the read bandwidth.",
      "path", argc, argv, options, kConfigs, run_case, print_table, write_json);
}
