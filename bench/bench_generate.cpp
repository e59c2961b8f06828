// bench_generate: tokens per second of greedy generation with each attention backend of
// kvlab::LlamaModel — naive (recompute the prefix every step), cached (contiguous KV cache) and
// paged (KV cache in blocks) — on stories260K.bin (when present) and on a model of the
// stories15M shape (dim 288, 6 layers, 6 heads, vocab 32000) with random weights, on 1 and 2
// threads; with --model, on a llama2.c checkpoint or a GGUF file too (SmolLM2-135M-Instruct, its
// weights dequantized to fp32: the real model's figures, bench/results/cpu-real-model.txt).
//
// Method: per model and thread count, --reps repetitions; in each, the three backends (in an
// order rotated from one repetition to the next) each generate --steps greedy tokens from BOS
// (a prefill of 1 token, then steps - 1 decode steps), timed as prefill + decode. Printed: each
// backend's median tokens/s and ms per token; naive/cached, the median over repetitions of the
// time ratio within one repetition, beside the ratio of their multiply-adds (exact, from
// kvlab::LlamaCounters: the op-count ratio); and for the cached backend the bytes one decode
// step streams (every weight once: LlamaConfig::decode_weight_bytes, plus the K/V it reads) per
// second, as a fraction of two read bandwidths measured in the same run
// (kvlab_bench::read_bandwidth): a vectorised sum over the model's own weight arrays (the limit
// for streaming exactly those bytes, from wherever they sit in the cache hierarchy) and over a
// --read-mib buffer (main memory). Before timing counts, every backend's tokens are checked
// against the cached backend's (greedy, so they must be identical); a mismatch exits non-zero.
//
// Prefill (--prefill P, default 512; 0 skips it; with the stories15M shape and --model): the cached
// backend's prefill of a P-token prompt (one `LlamaModel::prefill` call, or with
// --prefill-chunk C one call per C tokens, as a server's chunked prefill), median of --reps, as
// multiply-adds per second (exact, kvlab::LlamaCounters), against Eigen's matrix product (GEMM)
// timed in the same run on the same products at P rows — each layer's seven weight matrices —
// the throughput the prefill would have if it were nothing but those products.
//
// Where the time goes: after the timed repetitions, one more cached generation and one more
// prefill run with their phases timed (kvlab::LlamaModel::time_phases: the layers' products, the
// classifier, attention, RoPE, the norms, the rest; and the sampling, kvlab::Generation); printed
// per token (decode) or per call (prefill), with the layers' products inside the prefill as GMAC/s
// against the GEMM above. Kept out of the timed runs, whose clocks they would read ~20 times a
// layer.
//
// KV cache (with --model): bytes per token of each KV dtype (kvlab::stored_bytes_per_token) and
// at the model's whole context; peak RSS of the process (getrusage) at the end.
//
// Build and run (Release, from the repository root):
//   cmake --build build-bench --target bench_generate
//   build-bench/bench/bench_generate --json bench/results/cpu-generate.json
//   build-bench/bench/bench_generate --models none --model "$(scripts/get-model.sh)"
//       --backends cached,paged --json bench/results/cpu-real-model.json   (one line)
// --help lists the options.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <sys/resource.h>

#include <kvlab/kvlab.hpp>

#include "read_bandwidth.hpp"
#include "support/builtin_model.hpp"
#include "support/cli.hpp"
#include "support/json.hpp"
#include "support/stats.hpp"

namespace {

using kvlab::LlamaBackend;
using kvlab_support::median;
using kvlab_support::UsageError;

struct Options {
  int steps = 256;
  int reps = 5;
  std::vector<int> threads = {1, 2};
  std::vector<std::string> models = {"stories260K", "stories15M-shape"};
  std::string models_dir;  // empty: kvlab_support::models_dir's default
  std::string model_file;  // an extra checkpoint (e.g. a real stories15M.bin) or GGUF file
  std::vector<std::string> backends = {"naive", "cached", "paged"};
  int block_size = 16;
  int read_mib = 1024;
  int prefill = 512;      // prompt tokens of the prefill measurement; 0: none
  int prefill_chunk = 0;  // tokens per prefill step; 0: the whole prompt in one step
  std::string json;
};

struct Model {
  std::string name, source;
  std::shared_ptr<const kvlab::LlamaWeights> weights;
};

// One line of results: a backend on one model at one thread count.
struct Result {
  std::string model, backend;                // backend: its name as printed ("paged/16")
  LlamaBackend kind = LlamaBackend::Cached;  // the backend itself
  int threads = 0, steps = 0, block_size = 0;
  double tokens_per_second = 0;  // median over repetitions: steps / (prefill + decode time)
  double ms_per_token = 0;
  double ratio_to_cached = 1;  // median over repetitions of time / cached time
  kvlab::LlamaCounters work;   // of one generation
  // Cached only: decode bandwidth.
  double step_bytes = 0, gbps = 0, weights_read_gbps = 0, dram_read_gbps = 0;
  // Cached only: one more generation with its phases timed (LlamaModel::time_phases), and the
  // time of its samples.
  kvlab::PhaseTimes phases;
  double sampling_seconds = 0;
};

// The prefill of a P-token prompt at one thread count, against Eigen's GEMM.
struct PrefillResult {
  std::string model;
  int threads = 0, tokens = 0;
  double seconds = 0;            // median over repetitions of one prefill call
  std::uint64_t macs = 0;        // of one prefill (kvlab::LlamaCounters::macs)
  double gemm_gmacs = 0;         // Eigen's GEMM on the layers' products at `tokens` rows, GMAC/s
  std::uint64_t layer_macs = 0;  // of those products (what the GEMM pass computes)
  kvlab::PhaseTimes phases;      // of one more prefill, its phases timed
  double gmacs() const { return static_cast<double>(macs) / seconds * 1e-9; }
  // The layers' products inside the timed prefill, GMAC/s.
  double layer_gmacs() const { return static_cast<double>(layer_macs) / phases.matmuls * 1e-9; }
};

// The weight arrays a decode step reads (for the read-bandwidth reference): every matrix and
// norm, and the classifier (the embedding table when shared).
std::vector<std::pair<const float*, std::size_t>> weight_arrays(const kvlab::LlamaWeights& w) {
  std::vector<std::pair<const float*, std::size_t>> parts;
  const auto add = [&](const auto& m) {
    parts.emplace_back(m.data(), static_cast<std::size_t>(m.size()));
  };
  for (const kvlab::LlamaLayerWeights& l : w.layers) {
    add(l.rms_att);
    add(l.wq);
    add(l.wk);
    add(l.wv);
    add(l.wo);
    add(l.rms_ffn);
    add(l.w1);
    add(l.w2);
    add(l.w3);
  }
  add(w.rms_final);
  add(w.classifier());
  return parts;
}

// Runs every backend on `model` at `threads` threads; appends one Result per backend.
void run_model(const Model& model, int threads, const Options& o, double dram_gbps,
               std::vector<Result>& results) {
  kvlab_support::set_threads(threads);
  const kvlab::LlamaConfig& c = model.weights->config;
  const int steps = std::min(o.steps, c.seq_len);
  // The backends of --backends, cached (the reference of the ratios and the tokens) first.
  std::vector<LlamaBackend> backends = {LlamaBackend::Cached};
  for (const std::string& name : o.backends) {
    const LlamaBackend b = kvlab::parse_llama_backend(name);
    if (std::find(backends.begin(), backends.end(), b) == backends.end()) backends.push_back(b);
  }
  std::vector<std::unique_ptr<kvlab::LlamaModel>> models;
  for (LlamaBackend b : backends)
    models.push_back(std::make_unique<kvlab::LlamaModel>(model.weights, b, o.block_size));
  const std::size_t reference = 0;  // cached

  std::vector<std::vector<double>> seconds(backends.size()), decode_seconds(backends.size()),
      ratios(backends.size());
  std::vector<std::vector<int>> tokens(backends.size());
  int decode_steps = 0;
  for (int rep = 0; rep < o.reps; ++rep) {
    std::vector<double> now(backends.size());
    for (std::size_t i = 0; i < backends.size(); ++i) {
      const std::size_t b = (i + static_cast<std::size_t>(rep)) % backends.size();
      std::fprintf(stderr, "bench_generate: %s, %d thread%s, rep %d, %s ...\n", model.name.c_str(),
                   threads, threads == 1 ? "" : "s", rep + 1, kvlab::to_string(backends[b]));
      kvlab::LlamaModel& m = *models[b];
      m.reset();
      kvlab::Sampler greedy(c.vocab_size, 0.0f, 1.0f, 0);
      const kvlab::Generation g = kvlab::generate(m, greedy, {kvlab::Tokenizer::kBos}, steps);
      now[b] = g.prefill_seconds + g.decode_seconds;
      decode_seconds[b].push_back(g.decode_seconds);
      decode_steps = g.decode_steps;
      if (rep == 0) tokens[b] = g.tokens;
    }
    for (std::size_t b = 0; b < backends.size(); ++b) {
      seconds[b].push_back(now[b]);
      ratios[b].push_back(now[b] / now[reference]);
    }
  }
  for (std::size_t b = 0; b < backends.size(); ++b) {
    if (tokens[b] != tokens[reference]) {
      throw std::runtime_error(model.name + ": the " + kvlab::to_string(backends[b]) +
                               " backend generated other tokens than the cached one");
    }
  }

  // Bytes of one cached decode step: the weights, once, and the K/V rows it attends to.
  // One more cached generation, its phases timed (not one of the timed repetitions: reading the
  // clock costs a little).
  kvlab::LlamaModel& cached = *models[reference];
  cached.reset();
  cached.time_phases(true);
  kvlab::Sampler greedy(c.vocab_size, 0.0f, 1.0f, 0);
  const double sampling_seconds =
      kvlab::generate(cached, greedy, {kvlab::Tokenizer::kBos}, steps).sampling_seconds;
  const kvlab::PhaseTimes phases = cached.phase_times();
  cached.time_phases(false);

  kvlab::LlamaModel probe(model.weights, LlamaBackend::Cached);
  probe.prefill({kvlab::Tokenizer::kBos});
  const double kv_decode_bytes = static_cast<double>(
      models[reference]->total().attention.kv_bytes_read - probe.total().attention.kv_bytes_read);
  const double step_bytes =
      static_cast<double>(c.decode_weight_bytes()) + kv_decode_bytes / decode_steps;
  const double weights_gbps =
      kvlab_bench::read_bandwidth(weight_arrays(*model.weights), threads, 15);

  for (std::size_t b = 0; b < backends.size(); ++b) {
    Result r;
    r.model = model.name;
    r.kind = backends[b];
    r.backend = backends[b] == LlamaBackend::Paged ? "paged/" + std::to_string(o.block_size)
                                                   : kvlab::to_string(backends[b]);
    r.threads = threads;
    r.steps = steps;
    r.block_size = backends[b] == LlamaBackend::Paged ? o.block_size : 0;
    r.tokens_per_second = steps / median(seconds[b]);
    r.ms_per_token = 1e3 / r.tokens_per_second;
    r.ratio_to_cached = median(ratios[b]);
    r.work = models[b]->total();
    if (b == reference) {
      r.step_bytes = step_bytes;
      r.gbps = step_bytes * decode_steps / median(decode_seconds[b]) * 1e-9;
      r.weights_read_gbps = weights_gbps;
      r.dram_read_gbps = dram_gbps;
      r.phases = phases;
      r.sampling_seconds = sampling_seconds;
    }
    results.push_back(r);
  }
}

// Times the cached prefill of a `tokens`-token prompt on `weights` (whose seq_len allows it) at
// `threads` threads, and Eigen's GEMM on the same layers' products, in turn, `reps` times each.
PrefillResult run_prefill(const std::string& name,
                          const std::shared_ptr<const kvlab::LlamaWeights>& weights, int tokens,
                          int chunk, int threads, int reps) {
  using Clock = std::chrono::steady_clock;
  kvlab_support::set_threads(threads);
  const kvlab::LlamaConfig& c = weights->config;
  kvlab::Rng rng(7);
  std::vector<int> prompt(static_cast<std::size_t>(tokens));  // [tokens]: ids in [2, vocab)
  for (int& id : prompt) id = 2 + static_cast<int>(rng.next_u64() % (c.vocab_size - 2));
  kvlab::LlamaModel model(weights, LlamaBackend::Cached, 16, tokens);
  // The products a prefill runs through Eigen at `tokens` rows (the classifier, on the last
  // row only, is left out of both sides' comparison: it is in `macs` but is one row).
  const kvlab::RowMatrix<float> x = kvlab::random_matrix<float>(tokens, c.dim, rng);  // [P, dim]
  const kvlab::RowMatrix<float> h =
      kvlab::random_matrix<float>(tokens, c.hidden_dim, rng);  // [P, hidden]
  kvlab::RowMatrix<float> out;                                 // [P, out]
  std::uint64_t gemm_macs = 0;
  const auto gemm_pass = [&] {
    for (const kvlab::LlamaLayerWeights& l : weights->layers) {
      for (const kvlab::RowMatrix<float>* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w1, &l.w3}) {
        out.noalias() = x * w->transpose();
        gemm_macs += static_cast<std::uint64_t>(tokens) * static_cast<std::uint64_t>(w->size());
      }
      out.noalias() = h * l.w2.transpose();
      gemm_macs += static_cast<std::uint64_t>(tokens) * static_cast<std::uint64_t>(l.w2.size());
    }
  };
  // The prompt in one step, or in steps of `chunk` tokens.
  const auto prefill = [&] {
    const std::size_t step = chunk > 0 ? static_cast<std::size_t>(chunk) : prompt.size();
    for (std::size_t at = 0; at < prompt.size(); at += step) {
      const auto from = prompt.begin() + static_cast<std::ptrdiff_t>(at);
      model.prefill(std::vector<int>(
          from, from + static_cast<std::ptrdiff_t>(std::min(step, prompt.size() - at))));
    }
  };
  std::vector<double> prefill_seconds, gemm_seconds;
  PrefillResult r;
  for (int rep = 0; rep < reps; ++rep) {
    std::fprintf(stderr, "bench_generate: prefill of %d tokens, %s, %d thread%s, rep %d ...\n",
                 tokens, name.c_str(), threads, threads == 1 ? "" : "s", rep + 1);
    model.reset();
    auto start = Clock::now();
    prefill();
    prefill_seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    r.macs = model.total().macs();
    gemm_macs = 0;
    start = Clock::now();
    gemm_pass();
    gemm_seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  r.layer_macs = gemm_macs;
  model.reset();
  model.time_phases(true);
  prefill();
  r.phases = model.phase_times();
  r.model = name;
  r.threads = threads;
  r.tokens = tokens;
  r.seconds = median(prefill_seconds);
  r.gemm_gmacs = static_cast<double>(gemm_macs) / median(gemm_seconds) * 1e-9;
  return r;
}

// The head of a table of phases (`print_phases`).
void print_phase_head() {
  std::printf("%-18s %3s | %9s | %15s %15s %15s %15s %15s %15s %15s\n", "model", "thr", "ms",
              "layer products", "classifier", "attention", "RoPE", "norms", "sampling", "other");
}

// One row of phases: `phases` and `sampling` seconds (sampling outside the model's steps) over
// `per` units (tokens, or 1 for one call), in ms per unit and as shares of their sum.
void print_phases(const std::string& model, int threads, const kvlab::PhaseTimes& phases,
                  double sampling, int per) {
  const double all = phases.total + sampling;
  const auto cell = [&](double seconds) {
    std::printf(" %8.3f (%4.1f%%)", seconds * 1e3 / per, 100 * seconds / all);
  };
  std::printf("%-18s %3d | %9.3f |", model.c_str(), threads, all * 1e3 / per);
  for (double x : {phases.matmuls, phases.classifier, phases.attention, phases.rope, phases.norms,
                   sampling, phases.other()})
    cell(x);
  std::printf("\n");
}

// The phases as a JSON object (seconds).
kvlab_support::Json phases_json(const kvlab::PhaseTimes& p, double sampling) {
  return {{"layer_products", p.matmuls},
          {"classifier", p.classifier},
          {"attention", p.attention},
          {"rope", p.rope},
          {"norms", p.norms},
          {"sampling", sampling},
          {"other", p.other()},
          {"model_steps", p.total}};
}

void print_prefill(const std::vector<PrefillResult>& prefills, const Options& o) {
  if (prefills.empty()) return;
  std::printf(
      "\nPrefill of a %d-token prompt (cached backend, %s), median of %d repetitions: "
      "multiply-adds per second\n(all of the steps', exact) against Eigen's GEMM on the layers' "
      "weight products at %d rows, timed in turn in the same run.\n",
      o.prefill,
      o.prefill_chunk > 0 ? ("steps of " + std::to_string(o.prefill_chunk) + " tokens").c_str()
                          : "one step",
      o.reps, o.prefill);
  std::printf("%-18s %3s | %10s %10s %11s | %11s %6s\n", "model", "thr", "ms", "tok/s", "GMAC/s",
              "GEMM GMAC/s", "frac");
  for (const PrefillResult& r : prefills) {
    std::printf("%-18s %3d | %10.2f %10.1f %11.2f | %11.2f %6.2f\n", r.model.c_str(), r.threads,
                r.seconds * 1e3, r.tokens / r.seconds, r.gmacs(), r.gemm_gmacs,
                r.gmacs() / r.gemm_gmacs);
  }
  std::printf(
      "\nWhere the prefill's time goes: one more prefill with its phases timed "
      "(LlamaModel::time_phases), ms and share of\nits time; the layers' products as GMAC/s "
      "(their multiply-adds / their time) and as a fraction of the GEMM above.\n");
  print_phase_head();
  for (const PrefillResult& r : prefills) {
    print_phases(r.model, r.threads, r.phases, 0, 1);
    std::printf("  layers' products %.2f GMAC/s, %.2f of the GEMM\n", r.layer_gmacs(),
                r.layer_gmacs() / r.gemm_gmacs);
  }
}

void print_table(const std::vector<Result>& results, const Options& o) {
  std::printf(
      "\nGreedy generation from BOS: %d tokens per run (prefill 1, then decode), median of %d "
      "repetitions, "
      "backends timed in turn within each.\n",
      o.steps, o.reps);
  std::printf(
      "time/cached: median over repetitions of the time ratio; ops/cached: ratio of multiply-adds "
      "(exact, "
      "attention + MLP + classifier).\n\n");
  std::printf("%-18s %3s %-9s | %10s %9s | %11s %10s | %12s %14s\n", "model", "thr", "backend",
              "tok/s", "ms/token", "time/cached", "ops/cached", "K/V proj", "multiply-adds");
  for (const Result& r : results) {
    // The cached row of the same (model, threads): the reference of the ratios.
    const Result* ref = nullptr;
    for (const Result& x : results)
      if (x.model == r.model && x.threads == r.threads && x.kind == LlamaBackend::Cached) ref = &x;
    const double ops =
        ref ? static_cast<double>(r.work.macs()) / static_cast<double>(ref->work.macs()) : 0.0;
    std::printf("%-18s %3d %-9s | %10.1f %9.3f | %11.2f %10.2f | %12llu %14.4g\n", r.model.c_str(),
                r.threads, r.backend.c_str(), r.tokens_per_second, r.ms_per_token,
                r.ratio_to_cached, ops,
                static_cast<unsigned long long>(r.work.attention.kv_projections),
                static_cast<double>(r.work.macs()));
  }
  std::printf(
      "\nCached decode against the memory: bytes streamed per decode step (every weight once + the "
      "K/V read), "
      "per second, and that as a fraction of\nthe read bandwidth over the model's own weight "
      "arrays (same run, "
      "same threads) and over %d MiB (main memory).\n",
      o.read_mib);
  std::printf("%-18s %3s | %12s %9s | %13s %6s | %13s %6s\n", "model", "thr", "bytes/step", "GB/s",
              "weights GB/s", "frac", "memory GB/s", "frac");
  for (const Result& r : results) {
    if (r.kind != LlamaBackend::Cached) continue;
    std::printf("%-18s %3d | %12.0f %9.2f | %13.2f %6.2f | %13.2f %6.2f\n", r.model.c_str(),
                r.threads, r.step_bytes, r.gbps, r.weights_read_gbps, r.gbps / r.weights_read_gbps,
                r.dram_read_gbps, r.gbps / r.dram_read_gbps);
  }
  std::printf("L3: %zu MiB.\n", kvlab_bench::l3_bytes() >> 20);
  std::printf(
      "\nWhere a cached generation's time goes: one more generation with its phases timed "
      "(LlamaModel::time_phases),\nms per generated token and share of the time (sampling: "
      "drawing each token from its logits).\n");
  print_phase_head();
  for (const Result& r : results)
    if (r.kind == LlamaBackend::Cached)
      print_phases(r.model, r.threads, r.phases, r.sampling_seconds, r.steps);
}

// The KV cache of `model` per KV dtype: bytes per token, and at the model's whole context.
void print_kv_sizes(const Model& model) {
  const kvlab::LlamaConfig& c = model.weights->config;
  const kvlab::ModelConfig sizes = kvlab::to_model_config(c, model.name);
  std::printf(
      "\nKV cache of %s (%d layers, %d K/V heads of %d values; kvlab::stored_bytes_per_token):\n",
      model.name.c_str(), sizes.num_layers, sizes.num_kv_heads, sizes.head_dim);
  std::printf("%-5s | %15s | %22s\n", "dtype", "bytes per token", "at the context");
  for (kvlab::KVDtype d : {kvlab::KVDtype::fp32, kvlab::KVDtype::fp16, kvlab::KVDtype::bf16,
                           kvlab::KVDtype::int8, kvlab::KVDtype::int4}) {
    const std::uint64_t per_token = kvlab::stored_bytes_per_token(sizes, d);
    std::printf("%-5s | %15llu | %9s (%d tokens)\n", kvlab::dtype_name(d).c_str(),
                static_cast<unsigned long long>(per_token),
                kvlab::format_bytes(per_token * static_cast<std::uint64_t>(c.seq_len)).c_str(),
                c.seq_len);
  }
  std::printf(
      "Weights read per decode step (fp32, every matrix once; LlamaConfig::decode_weight_bytes): "
      "%llu bytes.\n",
      static_cast<unsigned long long>(c.decode_weight_bytes()));
}

void write_json(const std::string& path, const std::vector<Result>& results,
                const std::vector<PrefillResult>& prefills, const Options& o,
                const std::vector<Model>& models) {
  using kvlab_support::Json;
  Json json = {{"program", "bench_generate"},
               {"steps", o.steps},
               {"reps", o.reps},
               {"read_bandwidth_buffer_MiB", o.read_mib},
               {"l3_MiB", kvlab_bench::l3_bytes() >> 20},
               {"models", Json::array()},
               {"results", Json::array()},
               {"prefill", Json::array()}};
  for (const Model& m : models) {
    json["models"].push_back(
        {{"name", m.name}, {"source", m.source}, {"config", kvlab::to_string(m.weights->config)}});
  }
  for (const Result& r : results) {
    Json row = {{"model", r.model},
                {"threads", r.threads},
                {"backend", r.backend},
                {"tokens_per_second", r.tokens_per_second},
                {"ms_per_token", r.ms_per_token},
                {"time_ratio_to_cached", r.ratio_to_cached},
                {"kv_projections", r.work.attention.kv_projections},
                {"macs", r.work.macs()}};
    if (r.kind == LlamaBackend::Cached) {
      row["decode_step_bytes"] = r.step_bytes;
      row["decode_GB_per_s"] = r.gbps;
      row["weights_read_GB_per_s"] = r.weights_read_gbps;
      row["memory_read_GB_per_s"] = r.dram_read_gbps;
      row["phase_seconds"] = phases_json(r.phases, r.sampling_seconds);
    }
    json["results"].push_back(row);
  }
  for (const PrefillResult& r : prefills) {
    json["prefill"].push_back({{"model", r.model},
                               {"threads", r.threads},
                               {"tokens", r.tokens},
                               {"chunk", o.prefill_chunk},
                               {"seconds", r.seconds},
                               {"macs", r.macs},
                               {"GMAC_per_s", r.gmacs()},
                               {"gemm_GMAC_per_s", r.gemm_gmacs},
                               {"layer_products_GMAC_per_s", r.layer_gmacs()},
                               {"phase_seconds", phases_json(r.phases, 0)}});
  }
  kvlab_support::write_json_file(path, json);
}

bool parse_options(int argc, char** argv, Options& o) {
  using namespace kvlab_support;
  CLI::App app{
      "bench_generate: tokens per second of the naive, cached and paged backends (greedy "
      "generation from BOS), against the read bandwidth of the weights; the prefill against "
      "Eigen's GEMM (medians of repetitions)."};
  add_integer(app, "--steps", o.steps, "greedy tokens per run", 2, 1 << 20);
  add_integer(app, "--reps", o.reps, "repetitions; medians are printed", 1, 1000);
  add_integer_list(app, "--threads", o.threads, "OpenMP thread counts", 1, 256);
  add_choice_list(app, "--models", o.models,
                  "stories260K (from --models-dir; skipped if absent), stories15M-shape (random "
                  "weights), tiny (the built-in model), or none (only --model)",
                  {"stories260K", "stories15M-shape", "tiny", "none"});
  add_file(app, "--models-dir", o.models_dir, kvlab_support::kModelsDirHelp)->type_name("DIR");
  add_file(app, "--model", o.model_file,
           "also run this llama2.c checkpoint (e.g. stories15M.bin) or GGUF file (.gguf: "
           "SmolLM2-135M-Instruct, dequantized to fp32), and time its prefill too");
  add_choice_list(app, "--backends", o.backends,
                  "the backends timed (cached always runs: it is the reference)",
                  {"naive", "cached", "paged"});
  add_integer(app, "--block-size", o.block_size, "block size of the paged backend", 1, 1 << 20);
  add_integer(app, "--read-mib", o.read_mib, "size of the main-memory read-bandwidth buffer in MiB",
              1, 1 << 16);
  add_integer(app, "--prefill", o.prefill,
              "also time the prefill of a P-token prompt on the stories15M shape and --model "
              "against Eigen's GEMM (0: skip)",
              0, 1 << 16);
  add_integer(app, "--prefill-chunk", o.prefill_chunk,
              "feed that prompt in steps of C tokens (0: in one step)", 0, 1 << 16);
  add_file(app, "--json", o.json, "also write the results as JSON");
  if (!kvlab_support::parse(app, argc, argv)) return false;
  if (o.models.size() > 1 && std::find(o.models.begin(), o.models.end(), "none") != o.models.end())
    throw UsageError("--models: expected none alone, got '" + CLI::detail::join(o.models, ",") +
                     "'");
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const auto stop =
          kvlab_support::read_command_line("bench_generate", argc, argv, o, parse_options))
    return *stop;
  if (!kvlab_support::can_write("bench_generate", "--json", o.json)) return 2;
  o.threads = kvlab_support::usable_threads("bench_generate", o.threads);
  try {
    std::vector<Model> models;
    const std::string dir = kvlab_support::models_dir(o.models_dir);
    for (const std::string& name : o.models) {
      if (name == "stories260K") {
        const std::string path = dir + "/stories260K.bin";
        if (!std::ifstream(path)) {
          std::printf("stories260K: %s not found, skipped (set --models-dir or KVLAB_MODELS_DIR)\n",
                      path.c_str());
          continue;
        }
        models.push_back(
            {name, path,
             std::make_shared<const kvlab::LlamaWeights>(kvlab::load_llama_checkpoint(path))});
      } else if (name == "stories15M-shape") {
        // A separate classifier: random weights with a shared one make every token predict itself
        // (LlamaConfig::tiny); a decode step reads the same bytes either way.
        kvlab::LlamaConfig shape = kvlab::LlamaConfig::stories15m();
        shape.shared_classifier = false;
        models.push_back(
            {name, "random weights, seed " + std::to_string(kvlab::LlamaWeights::kBuiltinSeed),
             std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin(shape))});
      } else if (name == "tiny") {
        models.push_back(
            {name, "random weights, seed " + std::to_string(kvlab::LlamaWeights::kBuiltinSeed),
             std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin())});
      }
    }
    if (!o.model_file.empty()) {
      // Named by the file's name without its folder (the figures do not carry a machine's paths).
      const std::string base = o.model_file.substr(o.model_file.find_last_of('/') + 1);
      models.push_back({base, base, kvlab_support::choose_model(o.model_file, "tiny").weights});
    }
    if (models.empty()) throw std::runtime_error("no model to run");
    for (const Model& m : models)
      std::printf("%s: %s (%s)\n", m.name.c_str(), kvlab::to_string(m.weights->config).c_str(),
                  m.source.c_str());

    std::vector<double> dram_gbps;  // [threads]
    {
      std::vector<float> buffer((static_cast<std::size_t>(o.read_mib) << 20) / sizeof(float), 1.0f);
      for (int t : o.threads)
        dram_gbps.push_back(kvlab_bench::read_bandwidth({{buffer.data(), buffer.size()}}, t, 15));
    }
    std::vector<Result> results;
    for (const Model& m : models)
      for (std::size_t t = 0; t < o.threads.size(); ++t)
        run_model(m, o.threads[t], o, dram_gbps[t], results);
    // The prefill: the stories15M shape with a seq_len that holds the prompt.
    std::vector<PrefillResult> prefills;
    if (o.prefill > 0 &&
        std::find(o.models.begin(), o.models.end(), "stories15M-shape") != o.models.end()) {
      kvlab::LlamaConfig shape = kvlab::LlamaConfig::stories15m();
      shape.shared_classifier = false;
      shape.seq_len = std::max(shape.seq_len, o.prefill);
      const auto weights =
          std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin(shape));
      for (int t : o.threads)
        prefills.push_back(
            run_prefill("stories15M-shape", weights, o.prefill, o.prefill_chunk, t, o.reps));
    }
    if (o.prefill > 0 && !o.model_file.empty()) {
      const Model& m = models.back();
      if (m.weights->config.seq_len < o.prefill) {
        std::printf("%s: its context (%d) is shorter than --prefill %d: prefill not timed\n",
                    m.name.c_str(), m.weights->config.seq_len, o.prefill);
      } else {
        for (int t : o.threads)
          prefills.push_back(run_prefill(m.name, m.weights, o.prefill, o.prefill_chunk, t, o.reps));
      }
    }
    print_table(results, o);
    print_prefill(prefills, o);
    if (!o.model_file.empty()) print_kv_sizes(models.back());
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    std::printf(
        "\nPeak resident memory of this process: %.1f MiB (getrusage ru_maxrss; the read-bandwidth "
        "buffer of %d MiB included).\n",
        static_cast<double>(usage.ru_maxrss) / 1024.0, o.read_mib);
    if (!o.json.empty()) write_json(o.json, results, prefills, o, models);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_generate: %s\n", e.what());
    return 1;
  }
  return 0;
}
