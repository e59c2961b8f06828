// bench_kv_accuracy: what storing K and V in less precision costs in accuracy (no timing).
//
// 1. Attention outputs. A GQA layer (32 query heads, 8 K/V heads, head_dim 128) holds n = 4096
// (--n)
//    tokens of uniform random K in [-2, 2) and V in [-1, 1); 16 queries attend as decode steps
//    (kvlab::cpu::decode_attention) over a cache of each precision. Printed: the largest and the
//    mean |error| of the outputs against the exact attention over the values appended (double,
//    kvlab::cpu::reference_attention), and the largest error as a fraction of the bound derived
//    in tests/test_kv_storage.cpp (max_j εv + (e^{2δ} − 1) · max_j |v|, per output value).
// 2. Whole models, greedy, 256 steps from a fixed prompt: stories260K.bin (when --model-dir holds
//    it; heads of 8 values) and random-weight models of the stories15M shape (heads of 48 values)
//    and of that shape with 9 heads of 32 (dim 288), each on the cached backend with K/V stored
//    in each precision. Printed: the step at which the greedy tokens first differ from fp32's
//    ("agree": all 256 when they never do), and, with every model fed fp32's tokens (teacher
//    forcing, so that the logits stay comparable), the mean and the largest |logit − fp32 logit|
//    per step, averaged over the vocabulary. int8 and int4 need heads of a multiple of 32 values
//    (a q8_0 / q4_0 block holds 32 values of one head): the others print "refused".
//
// Build and run (Release, from the repository root):
//   cmake --build build-bench --target bench_kv_accuracy
//   build-bench/bench/bench_kv_accuracy --model-dir "$KVLAB_MODELS_DIR"
// --help lists the options.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <kvlab/kvlab.hpp>

#include "support/cli.hpp"

namespace {

using kvlab::KVDtype;
using kvlab::RowMatrix;

constexpr KVDtype kDtypes[] = {KVDtype::fp32, KVDtype::fp16, KVDtype::bf16, KVDtype::int8,
                               KVDtype::int4};

struct Options {
  std::string model_dir;  // empty: no checkpoint
  int steps = 256;
  int n = 4096;  // tokens of the attention part
};

// Part 1: one storage's attention error on random rows.
void attention_errors(int n) {
  const kvlab::AttentionShape shape(32, 8, 128);
  const int queries = 16, hd = shape.head_dim();
  kvlab::Rng rng(7);
  const RowMatrix<float> k = kvlab::random_matrix<float>(n, shape.kv_width(), rng, -2, 2);
  const RowMatrix<float> v = kvlab::random_matrix<float>(n, shape.kv_width(), rng, -1, 1);
  const RowMatrix<float> q = kvlab::random_matrix<float>(queries, shape.q_width(), rng);
  // The query at row i attends as the decode step of token n - queries + i.
  const RowMatrix<double> exact = kvlab::cpu::reference_attention(
      shape, RowMatrix<double>(q.cast<double>()), RowMatrix<double>(k.cast<double>()),
      RowMatrix<double>(v.cast<double>()), n - queries);
  std::printf(
      "1. Attention outputs: %d heads / %d K/V x %d, n = %d, %d decode queries; error "
      "against the exact attention (double) over the values appended\n",
      shape.num_heads(), shape.num_kv_heads(), hd, n, queries);
  std::printf("%-5s %12s %12s %16s\n", "kv", "max |err|", "mean |err|", "max err / bound");
  for (KVDtype d : kDtypes) {
    kvlab::visit_kv_dtype(d, [&](auto tag) {
      using S = typename decltype(tag)::type;
      kvlab::ContiguousKVCache<float, S> cache(1, shape.num_kv_heads(), hd, n);
      cache.append(0, k, v);
      const auto view = cache.view(0);
      // per-value bounds of what was stored: [n, kv_width]
      RowMatrix<double> ek(n, shape.kv_width()), ev(n, shape.kv_width());
      for (int t = 0; t < n; ++t)
        for (int h = 0; h < shape.num_kv_heads(); ++h) {
          kvlab::KVStorage<S>::error_bounds(view.key(h, t), hd, &ek(t, h * hd));
          kvlab::KVStorage<S>::error_bounds(view.value(h, t), hd, &ev(t, h * hd));
        }
      double max_err = 0, sum_err = 0, worst_ratio = 0;
      long count = 0;
      for (int i = 0; i < queries; ++i) {
        const int len = n - queries + i + 1;
        kvlab::ContiguousKVView<S> upto = view;
        upto.length = len;
        const RowMatrix<float> got = kvlab::cpu::decode_attention(shape, q.row(i), upto);
        for (int h = 0; h < shape.num_heads(); ++h) {
          const int hk = h / shape.group_size();
          double delta = 0;  // max over keys of scale · Σ_c |q_c| εk
          for (int j = 0; j < len; ++j) {
            double dj = 0;
            for (int c = 0; c < hd; ++c)
              dj += std::fabs(double(q(i, h * hd + c))) * ek(j, hk * hd + c);
            delta = std::max(delta, shape.scale() * dj);
          }
          for (int c = 0; c < hd; ++c) {
            double ev_max = 0, vmax = 0;
            for (int j = 0; j < len; ++j) {
              ev_max = std::max(ev_max, ev(j, hk * hd + c));
              vmax = std::max(vmax, std::fabs(double(v(j, hk * hd + c))));
            }
            const double err = std::fabs(double(got(0, h * hd + c)) - exact(i, h * hd + c));
            const double bound = ev_max + std::expm1(2 * delta) * vmax;
            max_err = std::max(max_err, err);
            sum_err += err;
            ++count;
            if (bound > 0) worst_ratio = std::max(worst_ratio, err / bound);
          }
        }
      }
      if (d == KVDtype::fp32) {
        std::printf("%-5s %12.2e %12.2e %16s\n", "fp32", max_err, sum_err / count,
                    "(float rounding)");
      } else {
        std::printf("%-5s %12.2e %12.2e %16.4f\n", kvlab::KVStorage<S>::name(), max_err,
                    sum_err / count, worst_ratio);
      }
      return 0;
    });
  }
}

// Part 2: one model, every storage.
void model_agreement(const std::string& name, const std::shared_ptr<const kvlab::LlamaWeights>& w,
                     int steps) {
  const kvlab::LlamaConfig& c = w->config;
  std::printf("\n%s (dim %d, %d layers, %d heads / %d K/V of %d values, vocab %d)\n", name.c_str(),
              c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim(), c.vocab_size);
  std::printf("%-5s %9s %14s %14s %16s\n", "kv", "agree", "bytes/token", "mean |dlogit|",
              "max step |dlogit|");
  std::vector<int> prompt{1};  // BOS, then a few fixed ids
  for (int id : {345, 29, 17, 400}) prompt.push_back(id % c.vocab_size);
  const int room = std::min(steps, c.seq_len - static_cast<int>(prompt.size()));
  // fp32's greedy run: its tokens and logits
  kvlab::LlamaModel reference(w, kvlab::LlamaBackend::Cached);
  std::vector<int> tokens;                      // [room]
  std::vector<kvlab::RowVector<float>> logits;  // [room]
  kvlab::RowVector<float> l = reference.prefill(prompt);
  for (int s = 0; s < room; ++s) {
    logits.push_back(l);
    Eigen::Index best;
    l.maxCoeff(&best);
    tokens.push_back(static_cast<int>(best));
    if (s + 1 < room) l = reference.decode(tokens.back());
  }
  for (KVDtype d : kDtypes) {
    const std::string dname = kvlab::dtype_name(d);
    std::unique_ptr<kvlab::LlamaModel> free_run, forced;
    try {
      free_run = std::make_unique<kvlab::LlamaModel>(w, kvlab::LlamaBackend::Cached, 16, 0, d);
      forced = std::make_unique<kvlab::LlamaModel>(w, kvlab::LlamaBackend::Cached, 16, 0, d);
    } catch (const kvlab::InvalidArgument&) {
      std::printf("%-5s %9s  (refused: heads of %d values, not whole blocks of 32)\n",
                  dname.c_str(), "-", c.head_dim());
      continue;
    }
    // free-running greedy: the first step whose token differs
    int agree = room;
    kvlab::RowVector<float> f = free_run->prefill(prompt);
    for (int s = 0; s < room; ++s) {
      Eigen::Index best;
      f.maxCoeff(&best);
      if (static_cast<int>(best) != tokens[static_cast<std::size_t>(s)]) {
        agree = s;
        break;
      }
      if (s + 1 < room) f = free_run->decode(static_cast<int>(best));
    }
    // teacher-forced: fp32's tokens in, logits compared step by step
    double sum = 0, worst = 0;
    kvlab::RowVector<float> g = forced->prefill(prompt);
    for (int s = 0; s < room; ++s) {
      const double mean_abs =
          static_cast<double>((g - logits[static_cast<std::size_t>(s)]).cwiseAbs().mean());
      sum += mean_abs;
      worst = std::max(worst, mean_abs);
      if (s + 1 < room) g = forced->decode(tokens[static_cast<std::size_t>(s)]);
    }
    std::printf("%-5s %5d/%-3d %14zu %14.3e %16.3e\n", dname.c_str(), agree, room,
                forced->store().bytes_per_token(), sum / room, worst);
  }
}

bool parse_options(int argc, char** argv, Options& options) {
  using namespace kvlab_support;
  CLI::App app{
      "bench_kv_accuracy: what storing K and V in less precision costs in accuracy: attention "
      "outputs against the exact attention, and whole models' greedy agreement with fp32 (no "
      "timing)."};
  add_file(app, "--model-dir", options.model_dir,
           "a folder holding stories260K.bin (without it, the random-weight models only)")
      ->type_name("DIR");
  add_integer(app, "--steps", options.steps, "greedy steps per model", 1, 1 << 20);
  add_integer(app, "--n", options.n, "tokens in the cache of the attention part", 16, 1 << 20);
  return kvlab_support::parse(app, argc, argv);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (const auto stop =
          kvlab_support::read_command_line("bench_kv_accuracy", argc, argv, options, parse_options))
    return *stop;
  try {
    attention_errors(options.n);
    std::printf(
        "\n2. Whole models, greedy from a fixed 5-token prompt: the step at which the "
        "tokens first differ from fp32's, and the logits' distance with fp32's tokens "
        "fed (mean over the vocabulary, per step)\n");
    if (!options.model_dir.empty()) {
      const std::string path = options.model_dir + "/stories260K.bin";
      model_agreement(
          "stories260K.bin",
          std::make_shared<const kvlab::LlamaWeights>(kvlab::load_llama_checkpoint(path)),
          options.steps);
    }
    kvlab::LlamaConfig shape15m = kvlab::LlamaConfig::stories15m().with_shared_classifier(false);
    model_agreement(
        "stories15M shape, random weights",
        std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::random(shape15m, 1)),
        options.steps);
    model_agreement("stories15M shape with 9 heads of 32, random weights",
                    std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::random(
                        kvlab::LlamaConfig(shape15m).with_heads(9, 9), 1)),
                    options.steps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_kv_accuracy: %s\n", e.what());
    return 1;
  }
  return 0;
}
