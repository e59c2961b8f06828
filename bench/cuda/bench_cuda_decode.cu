// bench_cuda_decode: decode attention on the GPU over contexts 1k ... 128k and batches 1 ... 64,
// against the memory-bandwidth limit: time, achieved bandwidth (K/V bytes read ÷ time) and its
// fraction of the GPU's peak (H100 SXM 3.35 TB/s, H200 4.8 TB/s), single pass vs split-K.
//
//  - paged: kvlab::cuda::paged_decode_attention, a batch of B sequences in one launch, a pool of
//    16-token blocks in random physical order (NHD by default); lengths all equal to the context
//    ("uniform") or drawn as vLLM's test draws them, uniform in [1, context] with the last at
//    the context ("ragged").
//  - contiguous: kvlab::cuda::decode_attention on one sequence (batch 1).
// Each case is validated before it is timed: split-K against the single pass, every element
// (fp16 tolerances: rtol 1e-2, atol 1e-4), and for small cases (at most 32768 tokens) both
// against cpu::paged_decode_attention / cpu::decode_attention on the same values.
// fp16 storage, GQA 32 query heads over 8 K/V heads, head_dim 128 (Llama-3-8B's attention).
// Times: median of --reps runs, each after an L2 flush (cuda events). The JSON lists every
// case with its sequence lengths, so that bench/cuda/torch_sdpa.py can run the same shapes
// through PyTorch in the same run.
//
// Run (a GPU machine; see bench/cuda/README.md):
//   build/bench/cuda/bench_cuda_decode [--contexts 1024,4096,...] [--batches 1,4,16,64]
//       [--max-tokens N] [--layout NHD|HND] [--reps R] [--peak-tbps X] [--json FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include <kvlab/cache/block_tables.hpp>
#include <kvlab/cpu/decode_attention.hpp>
#include <kvlab/cpu/paged_attention.hpp>
#include <kvlab/cuda/contiguous_kv_cache.cuh>
#include <kvlab/cuda/decode_attention.cuh>
#include <kvlab/cuda/paged_kv_cache.cuh>

#include "gpu_bench.cuh"
#include "support/json.hpp"

namespace {

namespace kc = kvlab::cuda;
using kvlab::RowMatrix;

struct Options {
  std::vector<int> contexts{1024, 4096, 16384, 32768, 65536, 131072};
  std::vector<int> batches{1, 4, 16, 64};
  // B * context at most: 4M tokens = 16 GiB of fp16 K/V at the default shape
  long max_tokens = 1L << 22;
  int heads = 32, kv_heads = 8, head_dim = 128, block_size = 16, reps = 20;
  kvlab::KVLayout layout = kvlab::KVLayout::NHD;
  double peak_tbps = 0;
  std::string json;
};

bool parse(int argc, char** argv, Options& o) {
  using namespace kvlab_support;
  CLI::App app{
      "bench_cuda_decode: decode attention on the GPU over contexts and batches (paged, uniform "
      "and ragged; contiguous): time, bandwidth and its fraction of the GPU's peak, single pass "
      "vs split-K."};
  std::string layout = "NHD";
  add_integer_list(app, "--contexts", o.contexts, "tokens per sequence", 1, 1 << 24);
  add_integer_list(app, "--batches", o.batches, "sequences per launch", 1, 4096);
  add_integer(app, "--max-tokens", o.max_tokens, "batch x context at most (larger cases skipped)",
              1, 1L << 30);
  add_integer(app, "--heads", o.heads, "query heads", 1, 1024);
  add_integer(app, "--kv-heads", o.kv_heads, "K/V heads (a divisor of --heads)", 1, 1024);
  add_integer(app, "--head-dim", o.head_dim, "values per head (a multiple of 8)", 8,
              kc::kMaxHeadDim);
  add_integer(app, "--block-size", o.block_size, "tokens per block of the pool", 1, 4096);
  add_choice(app, "--layout", layout, "the pool's layout", {"NHD", "HND"});
  add_integer(app, "--reps", o.reps, "timed runs, each after an L2 flush; the median is printed", 1,
              10000);
  add_number(app, "--peak-tbps", o.peak_tbps,
             "the GPU's peak bandwidth in TB/s (0: from its name, H100 and H200 known)", 0.0,
             100.0);
  add_file(app, "--json", o.json, "also write the results as JSON");
  if (!kvlab_support::parse(app, argc, argv)) return false;
  o.layout = layout == "HND" ? kvlab::KVLayout::HND : kvlab::KVLayout::NHD;
  kvlab_bench::check_head_options(o.heads, o.kv_heads, o.head_dim);
  return true;
}

// Elements of `got` outside atol + rtol |want| (fp16: 1e-4, 1e-2).
long mismatches(const RowMatrix<float>& got, const RowMatrix<float>& want) {
  long bad = 0;
  for (Eigen::Index i = 0; i < want.size(); ++i)
    if (!(std::abs(double(got.data()[i]) - double(want.data()[i])) <=
          1e-4 + 1e-2 * std::abs(double(want.data()[i]))))
      ++bad;
  return bad;
}

RowMatrix<float> to_float(const std::vector<__half>& host, int rows, int cols) {
  RowMatrix<float> m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i)
    m.data()[i] = __half2float(host[static_cast<std::size_t>(i)]);
  return m;
}

struct Result {
  std::string kind;  // "paged" or "contiguous"
  int batch, context;
  bool ragged;
  std::vector<int> lengths;
  double kv_bytes, single_us, split_us;
  int partitions;
};

int run(const Options& o) {
  const kvlab::AttentionShape shape(o.heads, o.kv_heads, o.head_dim);
  const std::string gpu = kvlab_bench::device_name();
  const double peak = o.peak_tbps > 0 ? o.peak_tbps : kvlab_bench::peak_tbps_for(gpu);
  const double copy = kvlab_bench::copy_tbps();
  int sm_count = 0;
  KVLAB_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  std::printf("GPU: %s, %d SMs; peak %.2f TB/s%s; device-to-device copy %.2f TB/s (read + write)\n",
              gpu.c_str(), sm_count, peak, peak > 0 ? "" : " (unknown: pass --peak-tbps)", copy);
  std::printf("%d query heads / %d K/V heads, head_dim %d, fp16, blocks of %d (%s)\n\n", o.heads,
              o.kv_heads, o.head_dim, o.block_size, kvlab::to_string(o.layout));
  std::printf("%-10s %6s %7s %-7s | %12s %8s | %12s %8s %6s | %8s\n", "kind", "batch", "context",
              "lengths", "single (us)", "TB/s", "split-K (us)", "TB/s", "parts", "of peak");

  kvlab::Rng rng(7);
  kvlab_bench::GpuTimer timer;
  std::vector<Result> results;
  int failures = 0;
  const auto report = [&](const Result& r) {
    const double single_tbps = r.kv_bytes / (r.single_us * 1e-6) / 1e12;
    const double split_tbps = r.kv_bytes / (r.split_us * 1e-6) / 1e12;
    std::printf("%-10s %6d %7d %-7s | %12.1f %8.2f | %12.1f %8.2f %6d | %7.1f%%\n", r.kind.c_str(),
                r.batch, r.context, r.ragged ? "ragged" : "uniform", r.single_us, single_tbps,
                r.split_us, split_tbps, r.partitions, peak > 0 ? 100 * split_tbps / peak : 0.0);
    std::fflush(stdout);
    results.push_back(r);
  };
  kc::Workspace workspace;
  kc::LaunchOptions single, split;
  single.partitions = 1;
  single.workspace = split.workspace = &workspace;
  const int q_width = shape.q_width();

  for (int context : o.contexts)
    for (int batch : o.batches) {
      if (static_cast<long>(batch) * context > o.max_tokens) continue;
      for (bool ragged : {false, true}) {
        if (ragged && batch == 1) continue;  // one sequence is never ragged
        Result r{"paged", batch, context, ragged, {}, 0, 0, 0, 0};
        r.lengths = ragged ? std::vector<int>(static_cast<std::size_t>(batch))
                           : std::vector<int>(batch, context);
        if (ragged) {
          for (int& len : r.lengths)
            len = 1 + static_cast<int>(rng.next_u64() % static_cast<std::uint64_t>(context));
          r.lengths.back() = context;
        }
        // The pool: every sequence's blocks in a random permutation of the pool.
        const kvlab::BlockTables host_tables =
            kvlab::BlockTables::shuffled(r.lengths, o.block_size, 0, rng);
        const int blocks = host_tables.num_blocks();
        const kc::DeviceBlockTables tables(host_tables);
        const std::size_t pool = static_cast<std::size_t>(blocks) * o.block_size * shape.kv_width();
        kc::DeviceBuffer<__half> k(pool), v(pool), q(static_cast<std::size_t>(batch) * q_width);
        kc::DeviceBuffer<__half> out_single(q.size()), out_split(q.size());
        kvlab_bench::random_fill(k, 1 + rng.next_u64());
        kvlab_bench::random_fill(v, 1 + rng.next_u64());
        kvlab_bench::random_fill(q, 1 + rng.next_u64());
        const kvlab::PagedKVView<__half> view =
            tables.view<__half>(k.data(), v.data(), o.kv_heads, o.head_dim, o.layout);
        long tokens = 0;
        for (int len : r.lengths) tokens += len;
        r.kv_bytes = 2.0 * sizeof(__half) * static_cast<double>(tokens) * shape.kv_width();
        r.partitions = kc::plan_attention(shape, batch, o.block_size, sm_count, 0).partitions;
        const auto run_single = [&] {
          kc::paged_decode_attention(shape, q.matrix(batch, q_width), view,
                                     out_single.matrix(batch, q_width), nullptr, single);
        };
        const auto run_split = [&] {
          kc::paged_decode_attention(shape, q.matrix(batch, q_width), view,
                                     out_split.matrix(batch, q_width), nullptr, split);
        };
        // Validate, then time.
        run_single();
        run_split();
        const RowMatrix<float> one = to_float(out_single.to_host(), batch, q_width);
        const RowMatrix<float> many = to_float(out_split.to_host(), batch, q_width);
        long bad = mismatches(many, one);
        if (tokens <= 32768) {  // small enough for the CPU reference
          const auto hk = k.to_host(), hv = v.to_host(), hq = q.to_host();
          std::vector<float> fk(pool), fv(pool);
          for (std::size_t i = 0; i < pool; ++i)
            fk[i] = __half2float(hk[i]), fv[i] = __half2float(hv[i]);
          const RowMatrix<float> want = kvlab::cpu::paged_decode_attention(
              shape, to_float(hq, batch, q_width),
              host_tables.view(fk.data(), fv.data(), o.kv_heads, o.head_dim, o.layout));
          bad += mismatches(one, want) + mismatches(many, want);
        }
        if (bad > 0) {
          std::printf("paged batch %d context %d %s: MISMATCH (%ld elements); not timed\n", batch,
                      context, ragged ? "ragged" : "uniform", bad);
          ++failures;
          continue;
        }
        r.single_us = timer.median_us(run_single, o.reps);
        r.split_us = timer.median_us(run_split, o.reps);
        report(r);
      }
    }

  // Contiguous cache, batch 1: decode_attention, single pass vs split-K.
  for (int context : o.contexts) {
    if (context > o.max_tokens) continue;
    Result r{"contiguous", 1, context, false, {context}, 0, 0, 0, 0};
    const std::size_t size = static_cast<std::size_t>(o.kv_heads) * context * o.head_dim;
    kc::DeviceBuffer<__half> k(size), v(size), q(static_cast<std::size_t>(q_width)),
        out_single(q.size()), out_split(q.size());
    kvlab_bench::random_fill(k, 1 + rng.next_u64());
    kvlab_bench::random_fill(v, 1 + rng.next_u64());
    kvlab_bench::random_fill(q, 1 + rng.next_u64());
    const kvlab::ContiguousKVView<__half> cache{k.data(),   v.data(), o.kv_heads,
                                                o.head_dim, context,  context};
    r.kv_bytes = 2.0 * sizeof(__half) * static_cast<double>(size);
    r.partitions = kc::plan_attention(shape, 1, 1, sm_count, 0).partitions;
    const auto run_single = [&] {
      kc::decode_attention(shape, q.matrix(1, q_width), cache, out_single.matrix(1, q_width),
                           nullptr, single);
    };
    const auto run_split = [&] {
      kc::decode_attention(shape, q.matrix(1, q_width), cache, out_split.matrix(1, q_width),
                           nullptr, split);
    };
    run_single();
    run_split();
    const RowMatrix<float> one = to_float(out_single.to_host(), 1, q_width);
    long bad = mismatches(to_float(out_split.to_host(), 1, q_width), one);
    if (context <= 32768) {
      const auto hk = k.to_host(), hv = v.to_host();
      std::vector<float> fk(size), fv(size);
      for (std::size_t i = 0; i < size; ++i)
        fk[i] = __half2float(hk[i]), fv[i] = __half2float(hv[i]);
      const kvlab::ContiguousKVView<float> host{fk.data(),  fv.data(), o.kv_heads,
                                                o.head_dim, context,   context};
      bad += mismatches(
          one, kvlab::cpu::decode_attention(shape, to_float(q.to_host(), 1, q_width), host));
    }
    if (bad > 0) {
      std::printf("contiguous context %d: MISMATCH (%ld elements); not timed\n", context, bad);
      ++failures;
      continue;
    }
    r.single_us = timer.median_us(run_single, o.reps);
    r.split_us = timer.median_us(run_split, o.reps);
    report(r);
  }

  if (!o.json.empty()) {
    using kvlab_support::Json;
    Json json = {{"program", "bench_cuda_decode"},
                 {"gpu", gpu},
                 {"sm_count", sm_count},
                 {"peak_tbps", peak},
                 {"copy_tbps", copy},
                 {"heads", o.heads},
                 {"kv_heads", o.kv_heads},
                 {"head_dim", o.head_dim},
                 {"dtype", "fp16"},
                 {"block_size", o.block_size},
                 {"layout", kvlab::to_string(o.layout)},
                 {"reps", o.reps},
                 {"cases", Json::array()}};
    for (const Result& r : results) {
      const double split_tbps = r.kv_bytes / (r.split_us * 1e-6) / 1e12;
      json["cases"].push_back({{"kind", r.kind},
                               {"batch", r.batch},
                               {"context", r.context},
                               {"ragged", r.ragged},
                               {"lengths", r.lengths},
                               {"kv_bytes", r.kv_bytes},
                               {"single_pass_us", r.single_us},
                               {"split_k_us", r.split_us},
                               {"split_k_partitions", r.partitions},
                               {"single_pass_tbps", r.kv_bytes / (r.single_us * 1e-6) / 1e12},
                               {"split_k_tbps", split_tbps},
                               {"split_k_fraction_of_peak", peak > 0 ? split_tbps / peak : 0.0}});
    }
    kvlab_support::write_json_file(o.json, json);
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return kvlab_bench::gpu_main<Options>("bench_cuda_decode", argc, argv, parse, run);
}
