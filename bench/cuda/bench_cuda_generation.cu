// bench_cuda_generation: the naive-vs-cached gap on the GPU. For n = 256 ... 4096 generated
// tokens, runs kvlab::cuda::NaiveDecoder (no cache: K/V of the whole prefix re-projected and the
// score matrix materialised at every step), kvlab::cuda::CachedDecoder (contiguous KV cache) and
// kvlab::cuda::PagedDecoder (paged KV cache, blocks of 16) on the same random model and inputs —
// one prompt token through prefill, then n - 1 decode steps — and prints, per n, the exact K/V
// projections and q·k dot products of each (CostCounters) and the median wall time of the whole
// generation. Every step goes through the `Decoder` interface: the token is copied to the GPU and
// the output back, as a sampler on the host would need, for all three decoders alike.
// The last step's outputs of the three are compared (|a - b| <= 1e-4 + 1e-4 |b|).
//
// Model: 1 layer, d_model 256, 4 query heads, 4 K/V heads,
// head_dim 64, float (--layers for more).
//
// Run (a GPU machine; see bench/cuda/README.md):
//   build/bench/cuda/bench_cuda_generation [--max-n N] [--layers L] [--reps R] [--json FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <kvlab/model/attention_layer.hpp>
#include <kvlab/model/cuda_decoders.cuh>
#include <kvlab/model/decoder.hpp>

#include "gpu_bench.cuh"
#include "support/json.hpp"
#include "support/stats.hpp"

namespace {

namespace kc = kvlab::cuda;
using kvlab::RowMatrix;
using kvlab_support::median;

struct Options {
  int max_n = 4096, layers = 1, reps = 3;
  std::string json;
};

bool parse(int argc, char** argv, Options& o) {
  using namespace kvlab_support;
  CLI::App app{
      "bench_cuda_generation: the naive-vs-cached gap on the GPU: naive, cached and paged "
      "decoders generating n tokens, their exact counts and median times."};
  add_integer(app, "--max-n", o.max_n, "largest n; n runs over 256, 512, ... up to it", 2, 1 << 16);
  add_integer(app, "--layers", o.layers, "attention layers in the model", 1, 64);
  add_integer(app, "--reps", o.reps, "runs per decoder and n; the median is printed", 1, 1000);
  add_file(app, "--json", o.json, "also write the results as JSON");
  return kvlab_support::parse(app, argc, argv);
}

// One generation of n tokens: reset, the first token through prefill, n - 1 decode steps.
// Returns the wall time in ms and leaves the last output in `last`.
double generate(kvlab::Decoder<float>& decoder, const RowMatrix<float>& tokens, int n,
                RowMatrix<float>& last) {
  const auto start = std::chrono::steady_clock::now();
  decoder.reset();
  last = decoder.prefill(tokens.topRows(1));
  for (int t = 1; t < n; ++t) last = decoder.decode(tokens.row(t));
  const auto stop = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(stop - start).count();
}

double max_relative_gap(const RowMatrix<float>& a, const RowMatrix<float>& b) {
  double worst = 0;
  for (Eigen::Index i = 0; i < b.size(); ++i)
    worst = std::max(worst, std::abs(double(a.data()[i]) - double(b.data()[i])) /
                                (1e-4 + 1e-4 * std::abs(double(b.data()[i]))));
  return worst;  // <= 1: within tolerance
}

int run(const Options& o) {
  const kvlab::AttentionShape shape(4, 4, 64);
  const int d_model = 256;
  const auto stack = kvlab::AttentionStack<float>::random(o.layers, shape, d_model, /*seed=*/11);
  kvlab::Rng rng(12);
  const RowMatrix<float> tokens = kvlab::random_matrix<float>(o.max_n, d_model, rng);
  std::printf(
      "GPU: %s; model: %d layer(s), d_model %d, %d heads / %d K/V heads, head_dim %d, fp32\n\n",
      kvlab_bench::device_name().c_str(), o.layers, d_model, shape.num_heads(),
      shape.num_kv_heads(), shape.head_dim());
  std::printf("%6s | %12s %12s | %12s %12s | %10s %10s %10s | %7s\n", "n", "naive K/V",
              "cached K/V", "naive dots", "cached dots", "naive ms", "cached ms", "paged ms",
              "ratio");
  kvlab_support::Json json = {{"program", "bench_cuda_generation"},
                              {"gpu", kvlab_bench::device_name()},
                              {"layers", o.layers},
                              {"d_model", 256},
                              {"heads", 4},
                              {"kv_heads", 4},
                              {"head_dim", 64},
                              {"reps", o.reps},
                              {"results", kvlab_support::Json::array()}};
  int failures = 0;
  for (int n = 256; n <= o.max_n; n *= 2) {
    kc::NaiveDecoder<float> naive(stack);
    kc::CachedDecoder<float> cached(stack, n);
    kc::PagedDecoder<float> paged(stack, /*block_size=*/16, /*num_blocks=*/(n + 15) / 16);
    std::vector<double> t_naive, t_cached, t_paged;
    RowMatrix<float> y_naive, y_cached, y_paged;
    for (int r = 0; r < o.reps + 1; ++r) {  // the first run warms up and is not counted
      const double a = generate(naive, tokens, n, y_naive);
      const double b = generate(cached, tokens, n, y_cached);
      const double c = generate(paged, tokens, n, y_paged);
      if (r > 0) t_naive.push_back(a), t_cached.push_back(b), t_paged.push_back(c);
    }
    const double gap =
        std::max(max_relative_gap(y_naive, y_cached), max_relative_gap(y_paged, y_cached));
    if (gap > 1) ++failures;
    const kvlab::CostCounters& cn = naive.total();
    const kvlab::CostCounters& cc = cached.total();
    std::printf("%6d | %12llu %12llu | %12llu %12llu | %10.1f %10.1f %10.1f | %6.1fx%s\n", n,
                static_cast<unsigned long long>(cn.kv_projections),
                static_cast<unsigned long long>(cc.kv_projections),
                static_cast<unsigned long long>(cn.qk_dots),
                static_cast<unsigned long long>(cc.qk_dots), median(t_naive), median(t_cached),
                median(t_paged), median(t_naive) / median(t_cached), gap > 1 ? "  MISMATCH" : "");
    std::fflush(stdout);
    json["results"].push_back({{"n", n},
                               {"naive_kv_projections", cn.kv_projections},
                               {"cached_kv_projections", cc.kv_projections},
                               {"naive_qk_dots", cn.qk_dots},
                               {"cached_qk_dots", cc.qk_dots},
                               {"naive_ms", median(t_naive)},
                               {"cached_ms", median(t_cached)},
                               {"paged_ms", median(t_paged)}});
  }
  if (!o.json.empty()) kvlab_support::write_json_file(o.json, json);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return kvlab_bench::gpu_main<Options>("bench_cuda_generation", argc, argv, parse, run);
}
