// attention_lab: decode attention on the GPU, kernel by kernel — each version validated against
// kvlab's tuned CPU decode (kvlab::cpu::decode_attention, every element; its own tests check it
// against the plain-loop oracle, cpu::reference_attention) before it is timed. After
// llm.c's dev/cuda/attention_forward.cu.
//
// The problem: one new query per sequence attends to its cached keys and values; B sequences
// of L tokens; fp16 storage, fp32 arithmetic; by default Llama-style GQA (32 query heads over 8
// K/V heads, head_dim 128), B = 1, L = 32768. The versions:
//  1. one thread per (sequence, query head): walks every key alone with an online softmax — the
//     formula transcribed; no sharing, and every thread reads whole rows on its own.
//  2. one warp per (sequence, query head): the 32 lanes share each K/V row (coalesced reads),
//     one key after the other; K/V are still read once per query head.
//  3. kvlab::cuda::naive_attention: the score matrix materialised in memory (three launches:
//     Q Kᵀ, softmax, P V), on token-major K/V; one call per sequence.
//  4. kvlab::cuda::decode_attention, single pass: one block per (sequence, K/V head) serves the
//     whole GQA group (K/V read once per K/V head), 8 values per thread loaded 16 bytes at a
//     time, tiles of 256 keys in shared memory; one call per sequence.
//  5. version 4 with split-K (partitions chosen automatically): the context cut into partitions
//     run in parallel and merged by the log-sum-exp rule.
//  6. kvlab::cuda::paged_decode_attention, NHD pool of 16-token blocks in random physical order,
//     the whole batch in one launch, split-K.
//  7. version 6 with an HND pool.
// Bandwidth: the K/V bytes a decode step must read (B · L · num_kv_heads · head_dim · 2 tensors
// · 2 bytes) divided by the time, against the GPU's peak (H100 SXM 3.35 TB/s, H200 4.8 TB/s).
// Versions 1-3 read K/V more than once; the figure is still "useful bytes per second".
//
// Run (a GPU machine; see bench/cuda/README.md):
//   build/bench/cuda/attention_lab [--batch B] [--context L] [--heads H] [--kv-heads HKV]
//       [--head-dim D] [--version V] [--reps R] [--peak-tbps X] [--json FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include <kvlab/cache/block_tables.hpp>
#include <kvlab/cpu/decode_attention.hpp>
#include <kvlab/cuda/contiguous_kv_cache.cuh>
#include <kvlab/cuda/host_api.cuh>
#include <kvlab/cuda/paged_kv_cache.cuh>

#include "gpu_bench.cuh"
#include "support/json.hpp"

namespace {

namespace kc = kvlab::cuda;
using kvlab::RowMatrix;

// --- versions 1 and 2: written here, to show what the library kernel improves on -------------

// Version 1. One thread per (sequence s, query head h): for every key, the score, the online
// softmax update (rescale the running sum and output when the max grows), the weighted value.
// q, out: [batch, heads * d]; k, v: [batch, kv_heads, L, d] (contiguous caches, stacked).
__global__ void v1_thread_per_head(const __half* q, const __half* k, const __half* v, __half* out,
                                   int batch, int heads, int kv_heads, int d, int length,
                                   float scale) {
  const int idx = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);  // s * heads + h
  if (idx >= batch * heads) return;
  const int s = idx / heads, h = idx % heads, hk = h / (heads / kv_heads);
  const __half* qh = q + static_cast<std::size_t>(idx) * d;  // [d]
  // [L, d]
  const __half* kh = k + (static_cast<std::size_t>(s) * kv_heads + hk) * length * d;
  // [L, d]
  const __half* vh = v + (static_cast<std::size_t>(s) * kv_heads + hk) * length * d;
  float acc[kc::kMaxHeadDim];  // the running output (local memory)
  for (int c = 0; c < d; ++c) acc[c] = 0.f;
  float max = -INFINITY, sum = 0.f;
  for (int j = 0; j < length; ++j) {
    float dot = 0.f;
    for (int c = 0; c < d; ++c)
      dot += __half2float(qh[c]) * __half2float(kh[static_cast<std::size_t>(j) * d + c]);
    const float score = scale * dot;
    const float new_max = fmaxf(max, score);
    const float rescale = expf(max - new_max);  // 0 at the first key (max = -inf)
    const float weight = expf(score - new_max);
    sum = sum * rescale + weight;
    for (int c = 0; c < d; ++c)
      acc[c] = acc[c] * rescale + weight * __half2float(vh[static_cast<std::size_t>(j) * d + c]);
    max = new_max;
  }
  for (int c = 0; c < d; ++c)
    out[static_cast<std::size_t>(idx) * d + c] = __float2half(acc[c] / sum);
}

// Version 2. One warp per (sequence, query head); lane i holds values i, i + 32, ... of the
// query and of the output, so each K/V row is read by 32 consecutive lanes (coalesced). The
// keys are still walked one after the other, and each query head reads its rows itself.
__global__ void v2_warp_per_head(const __half* q, const __half* k, const __half* v, __half* out,
                                 int batch, int heads, int kv_heads, int d, int length,
                                 float scale) {
  constexpr int kPerLane = kc::kMaxHeadDim / 32;
  const int warp = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / 32);  // s * heads + h
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (warp >= batch * heads) return;  // the whole warp
  const int s = warp / heads, h = warp % heads, hk = h / (heads / kv_heads);
  const __half* kh = k + (static_cast<std::size_t>(s) * kv_heads + hk) * length * d;
  const __half* vh = v + (static_cast<std::size_t>(s) * kv_heads + hk) * length * d;
  float qv[kPerLane], acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + 32 * i;
    qv[i] = c < d ? __half2float(q[static_cast<std::size_t>(warp) * d + c]) : 0.f;
    acc[i] = 0.f;
  }
  float max = -INFINITY, sum = 0.f;
  for (int j = 0; j < length; ++j) {
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane + 32 * i;
      if (c < d) dot += qv[i] * __half2float(kh[static_cast<std::size_t>(j) * d + c]);
    }
    for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    const float score = scale * dot;
    const float new_max = fmaxf(max, score);
    const float rescale = expf(max - new_max);
    const float weight = expf(score - new_max);
    sum = sum * rescale + weight;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane + 32 * i;
      if (c < d)
        acc[i] = acc[i] * rescale + weight * __half2float(vh[static_cast<std::size_t>(j) * d + c]);
    }
    max = new_max;
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + 32 * i;
    if (c < d) out[static_cast<std::size_t>(warp) * d + c] = __float2half(acc[i] / sum);
  }
}

// --- the lab -----------------------------------------------------------------------------------

struct Options {
  int batch = 1, context = 32768, heads = 32, kv_heads = 8, head_dim = 128, version = 0, reps = 20;
  double peak_tbps = 0;
  std::string json;
};

bool parse(int argc, char** argv, Options& o) {
  using namespace kvlab_support;
  CLI::App app{
      "attention_lab: decode attention on the GPU, kernel by kernel: each version validated "
      "against kvlab's tuned CPU decode, then timed against the GPU's peak bandwidth."};
  add_integer(app, "--batch", o.batch, "sequences in the batch", 1, 4096);
  add_integer(app, "--context", o.context, "tokens of each sequence", 1, 1 << 24);
  add_integer(app, "--heads", o.heads, "query heads", 1, 1024);
  add_integer(app, "--kv-heads", o.kv_heads, "K/V heads (a divisor of --heads)", 1, 1024);
  add_integer(app, "--head-dim", o.head_dim, "values per head (a multiple of 8)", 8,
              kc::kMaxHeadDim);
  add_integer(app, "--version", o.version, "the kernel version to run (0: all)", 0, 7);
  add_integer(app, "--reps", o.reps, "timed runs; the median is printed", 1, 10000);
  add_number(app, "--peak-tbps", o.peak_tbps,
             "the GPU's peak bandwidth in TB/s (0: from its name, H100 and H200 known)", 0.0,
             100.0);
  add_file(app, "--json", o.json, "also write the results as JSON");
  if (!kvlab_support::parse(app, argc, argv)) return false;
  kvlab_bench::check_head_options(o.heads, o.kv_heads, o.head_dim);
  return true;
}

float to_half_float(float x) { return __half2float(__float2half(x)); }

int run(const Options& o) {
  const kvlab::AttentionShape shape(o.heads, o.kv_heads, o.head_dim);
  const int B = o.batch, L = o.context, d = o.head_dim;
  const std::string gpu = kvlab_bench::device_name();
  const double peak = o.peak_tbps > 0 ? o.peak_tbps : kvlab_bench::peak_tbps_for(gpu);
  std::printf("GPU: %s (peak %.2f TB/s%s)\n", gpu.c_str(), peak,
              peak > 0 ? "" : ": unknown, pass --peak-tbps");
  std::printf("batch %d x context %d, %d query heads / %d K/V heads, head_dim %d, fp16 storage\n\n",
              B, L, o.heads, o.kv_heads, d);

  // Host data, rounded to fp16 so that the float reference sees what the GPU stores.
  kvlab::Rng rng(2024);
  const std::size_t per_seq = static_cast<std::size_t>(o.kv_heads) * L * d;  // [kv_heads, L, d]
  std::vector<float> k(per_seq * B), v(per_seq * B);
  for (float& x : k) x = to_half_float(static_cast<float>(rng.uniform(-1, 1)));
  for (float& x : v) x = to_half_float(static_cast<float>(rng.uniform(-1, 1)));
  RowMatrix<float> q(B, shape.q_width());
  for (Eigen::Index i = 0; i < q.size(); ++i)
    q.data()[i] = to_half_float(static_cast<float>(rng.uniform(-1, 1)));

  // What every version must equal: cpu::decode_attention on each sequence's contiguous cache.
  RowMatrix<float> want(B, shape.q_width());
  for (int s = 0; s < B; ++s) {
    const kvlab::ContiguousKVView<float> cache{
        k.data() + s * per_seq, v.data() + s * per_seq, o.kv_heads, d, L, L};
    want.row(s) = kvlab::cpu::decode_attention(shape, RowMatrix<float>(q.row(s)), cache).row(0);
  }

  // Device data: stacked contiguous caches (versions 1, 2, 4, 5), token-major rows (3), pools (6,
  // 7).
  const kc::DeviceBuffer<__half> d_k = kc::detail::upload_as<__half>(k.data(), k.size());
  const kc::DeviceBuffer<__half> d_v = kc::detail::upload_as<__half>(v.data(), v.size());
  const kc::DeviceBuffer<__half> d_q = kc::to_device<__half>(q);
  kc::DeviceBuffer<__half> d_out(static_cast<std::size_t>(B) * shape.q_width());
  const auto token_major = [&](const std::vector<float>& x) {  // [B][L, kv_heads * d]
    std::vector<float> t(x.size());
    for (int s = 0; s < B; ++s)
      for (int h = 0; h < o.kv_heads; ++h)
        for (int pos = 0; pos < L; ++pos)
          std::memcpy(&t[s * per_seq + (static_cast<std::size_t>(pos) * o.kv_heads + h) * d],
                      &x[s * per_seq + (static_cast<std::size_t>(h) * L + pos) * d],
                      sizeof(float) * d);
    return kc::detail::upload_as<__half>(t.data(), t.size());
  };
  const kc::DeviceBuffer<__half> d_kt = token_major(k), d_vt = token_major(v);
  const int block_size = 16, pages = (L + block_size - 1) / block_size;
  struct Pool {
    kc::DeviceBuffer<__half> k, v;
    std::unique_ptr<kc::DeviceBlockTables> tables;
    kvlab::PagedKVView<__half> view;
  };
  // the same rows in blocks of a shuffled pool
  const auto make_pool = [&](kvlab::KVLayout layout) {
    const kvlab::BlockTables tables =
        kvlab::BlockTables::shuffled(std::vector<int>(B, L), block_size, 0, rng);
    const std::size_t size = static_cast<std::size_t>(B) * pages * block_size * o.kv_heads * d;
    std::vector<float> pk(size, NAN), pv(size, NAN);
    const kvlab::PagedKVView<float> host = tables.view(pk.data(), pv.data(), o.kv_heads, d, layout);
    for (int s = 0; s < B; ++s)
      for (int pos = 0; pos < L; ++pos)
        for (int h = 0; h < o.kv_heads; ++h) {
          std::memcpy(&pk[host.offset(s, pos, h)],
                      &k[s * per_seq + (static_cast<std::size_t>(h) * L + pos) * d],
                      sizeof(float) * d);
          std::memcpy(&pv[host.offset(s, pos, h)],
                      &v[s * per_seq + (static_cast<std::size_t>(h) * L + pos) * d],
                      sizeof(float) * d);
        }
    auto pool = std::make_unique<Pool>();
    pool->k = kc::detail::upload_as<__half>(pk.data(), size);
    pool->v = kc::detail::upload_as<__half>(pv.data(), size);
    pool->tables = std::make_unique<kc::DeviceBlockTables>(tables);
    pool->view = pool->tables->view<__half>(pool->k.data(), pool->v.data(), o.kv_heads, d, layout);
    return pool;
  };
  const auto nhd = make_pool(kvlab::KVLayout::NHD), hnd = make_pool(kvlab::KVLayout::HND);

  const auto scale = static_cast<float>(shape.scale());
  const auto q_row = [&](int s) {
    return kc::DeviceMatrix<const __half>(d_q.data() + s * shape.q_width(), 1, shape.q_width());
  };
  const auto out_row = [&](int s) {
    return kc::DeviceMatrix<__half>(d_out.data() + s * shape.q_width(), 1, shape.q_width());
  };
  const auto cache_of = [&](int s) {
    return kvlab::ContiguousKVView<__half>{
        d_k.data() + s * per_seq, d_v.data() + s * per_seq, o.kv_heads, d, L, L};
  };
  kc::Workspace workspace;
  kc::LaunchOptions single, split;
  single.partitions = 1;
  single.workspace = split.workspace = &workspace;
  struct Version {
    int id;
    const char* what;
    std::function<void()> run;
  };
  const std::vector<Version> versions = {
      {1, "thread per (sequence, head), online softmax",
       [&] {
         v1_thread_per_head<<<(B * o.heads + 63) / 64, 64>>>(
             d_q.data(), d_k.data(), d_v.data(), d_out.data(), B, o.heads, o.kv_heads, d, L, scale);
         KVLAB_CUDA_CHECK_LAUNCH("v1_thread_per_head");
       }},
      {2, "warp per (sequence, head), coalesced rows",
       [&] {
         v2_warp_per_head<<<(B * o.heads * 32 + 127) / 128, 128>>>(
             d_q.data(), d_k.data(), d_v.data(), d_out.data(), B, o.heads, o.kv_heads, d, L, scale);
         KVLAB_CUDA_CHECK_LAUNCH("v2_warp_per_head");
       }},
      {3, "naive_attention: scores materialised",
       [&] {
         kc::LaunchOptions options;
         options.workspace = &workspace;
         for (int s = 0; s < B; ++s)
           kc::naive_attention<__half>(
               shape, q_row(s),
               kc::DeviceMatrix<const __half>(d_kt.data() + s * per_seq, L, shape.kv_width()),
               kc::DeviceMatrix<const __half>(d_vt.data() + s * per_seq, L, shape.kv_width()),
               out_row(s), nullptr, /*window=*/0, options);
       }},
      {4, "decode_attention, single pass",
       [&] {
         for (int s = 0; s < B; ++s)
           kc::decode_attention(shape, q_row(s), cache_of(s), out_row(s), nullptr, single);
       }},
      {5, "decode_attention, split-K",
       [&] {
         for (int s = 0; s < B; ++s)
           kc::decode_attention(shape, q_row(s), cache_of(s), out_row(s), nullptr, split);
       }},
      {6, "paged_decode_attention, NHD, split-K",
       [&] {
         kc::paged_decode_attention(shape, d_q.matrix(B, shape.q_width()), nhd->view,
                                    d_out.matrix(B, shape.q_width()), nullptr, split);
       }},
      {7, "paged_decode_attention, HND, split-K",
       [&] {
         kc::paged_decode_attention(shape, d_q.matrix(B, shape.q_width()), hnd->view,
                                    d_out.matrix(B, shape.q_width()), nullptr, split);
       }},
  };

  const double bytes = 2.0 * 2.0 * B * static_cast<double>(L) * o.kv_heads * d;  // K and V, fp16
  kvlab_bench::GpuTimer timer;
  kvlab_support::Json json = {
      {"gpu", gpu},    {"peak_tbps", peak}, {"batch", B},
      {"context", L},  {"heads", o.heads},  {"kv_heads", o.kv_heads},
      {"head_dim", d}, {"dtype", "fp16"},   {"versions", kvlab_support::Json::array()}};
  int failures = 0;
  std::printf("%-3s %-44s %12s %10s %8s %10s\n", "v", "kernel", "time (us)", "GB/s", "of peak",
              "max err");
  for (const Version& version : versions) {
    if (o.version != 0 && version.id != o.version) continue;
    // Validate first: every element against cpu::decode_attention (fp16: rtol 1e-2, atol 1e-4).
    d_out.fill_bytes(0xFF);  // NaN: an element the version does not write fails
    version.run();
    const RowMatrix<float> got = kc::to_host(d_out, B, shape.q_width());
    long bad = 0;
    double max_err = 0;
    for (Eigen::Index i = 0; i < got.size(); ++i) {
      const double err = std::abs(double(got.data()[i]) - double(want.data()[i]));
      if (!(err <= 1e-4 + 1e-2 * std::abs(double(want.data()[i])))) ++bad;
      max_err = std::max(max_err, std::isnan(err) ? INFINITY : err);
    }
    if (bad > 0) {
      std::printf("%-3d %-44s MISMATCH: %ld of %ld elements outside tolerance; not timed\n",
                  version.id, version.what, bad, static_cast<long>(got.size()));
      ++failures;
      continue;
    }
    // Slow versions get fewer repetitions.
    const double first = timer.median_us(version.run, 1);
    const double us = timer.median_us(version.run, first > 50000 ? std::min(o.reps, 3) : o.reps);
    const double tbps = bytes / (us * 1e-6) / 1e12;
    std::printf("%-3d %-44s %12.1f %10.1f %7.1f%% %10.1e\n", version.id, version.what, us,
                tbps * 1000, peak > 0 ? 100 * tbps / peak : 0.0, max_err);
    json["versions"].push_back({{"version", version.id},
                                {"kernel", version.what},
                                {"time_us", us},
                                {"tbps", tbps},
                                {"fraction_of_peak", peak > 0 ? tbps / peak : 0.0},
                                {"max_abs_error", max_err}});  // infinite (a NaN): null
  }
  if (!o.json.empty()) kvlab_support::write_json_file(o.json, json);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return kvlab_bench::gpu_main<Options>("attention_lab", argc, argv, parse, run);
}
