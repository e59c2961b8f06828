// Tutorial 06: generation end to end.
//
// What you will learn:
//  1. A whole Llama-style decoder, kvlab::LlamaModel, as llama2.c's run.c computes it: token
//     embedding; per layer RMSNorm, q/k/v, RoPE, attention, output projection, RMSNorm, SwiGLU
//     MLP; final norm; classifier. Its attention backend is chosen per model: naive (recompute
//     the prefix every step), cached (a contiguous KV cache) or paged (a KV cache in blocks).
//  2. Prefill, then decode: the prompt goes in at once, then each step feeds the token just
//     drawn and reads the logits of the next.
//  3. The three backends compute the same function: the same greedy tokens, logits equal to
//     rounding. What differs is the work (K/V projections: Θ(n²) naive, Θ(n) cached) and so the
//     time, shown on a real model, SmolLM2-135M-Instruct (tutorial 10's), when it is there: the
//     three continue a sentence with the same words.
// It runs the built-in model (random weights, no file needed) and checks itself: it exits
// non-zero if a backend picks another token, logits differ beyond rounding or a count is off.
//
// Build and run (from the repository root, with `build/` configured by CMake):
//   cmake --build build --target tutorial_06_generation
//   build/tutorials/06_generation [MODEL.gguf]
// Without an argument it reads $KVLAB_REAL_MODEL, else where scripts/get-model.sh puts
// SmolLM2-135M-Instruct; without the file it runs the built-in model only. Options (the
// exercises of its page change them): --steps N greedy tokens of the built-in model (40);
// --real-steps N of the real model (20); --no-real-model.
//
// Next: tutorial 07 serves many requests at once (continuous batching). kvlab-generate
// (apps/kvlab_generate.cpp) runs real checkpoints with a tokenizer, and
// bench_generate measures tokens/s of the three backends.

#include <kvlab/kvlab.hpp>
#include <kvlab/model/bpe_tokenizer.hpp>

#include "support/builtin_model.hpp"
#include "support/command_line.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>
#if defined(_OPENMP)
#include <omp.h>
#endif

namespace {

using kvlab::LlamaBackend;

// Logits of two backends differ by rounding only (sums in other orders): about 1e-7 relative
// here. 3e-5 relative to max(1, |largest logit|) is the bound of tests/model/test_llama_model.cpp.
constexpr double kRtol = 3e-5;

double rel_diff(const kvlab::RowVector<float>& a, const kvlab::RowVector<float>& b) {
  return (a - b).cwiseAbs().maxCoeff() / std::max(1.0f, b.cwiseAbs().maxCoeff());
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_file;  // the real model's GGUF file, if given
  int steps = 40;          // greedy tokens of the built-in model
  int real_steps = 20;     // greedy tokens of the real model
  bool no_real_model = false;
  kvlab_support::CommandLine command_line{"Tutorial 06: generation end to end"};
  command_line.add_text("model", model_file,
                        "the real model's GGUF file (default: $KVLAB_REAL_MODEL, see the source)");
  command_line.add_integer("--steps", steps, "greedy tokens of the built-in model", 1, 500);
  command_line.add_integer("--real-steps", real_steps, "greedy tokens of the real model", 1, 200);
  command_line.add_flag("--no-real-model", no_real_model, "run the built-in model only");
  if (const auto stop = command_line.parse("06_generation", argc, argv))
    return *stop;
#if defined(_OPENMP)
  omp_set_num_threads(1);  // one thread: the times below compare the backends, not the cores
#endif
  bool ok = true;

  // [model]
  // The built-in model: dim 48, 3 layers, 6 query heads over 2 K/V heads, vocab 256, random
  // weights from a fixed seed. Weights are shared; each LlamaModel holds one sequence.
  const auto weights = std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin());
  kvlab::LlamaModel naive(weights, LlamaBackend::Naive);     // keeps token ids, recomputes all
  kvlab::LlamaModel cached(weights, LlamaBackend::Cached);   // K/V of 512 positions reserved
  kvlab::LlamaModel paged(weights, LlamaBackend::Paged, 4);  // K/V in blocks of 4 tokens
  // [model]
  std::printf("Built-in model: %s\n\n", kvlab::to_string(weights->config).c_str());

  // [lockstep]
  // Prefill the prompt (BOS first, as llama2.c does), then decode greedily, the three in step.
  const std::vector<int> prompt{kvlab::Tokenizer::kBos, 17, 42, 99};
  kvlab::RowVector<float> l_naive = naive.prefill(prompt);  // [vocab]: logits after the prompt
  kvlab::RowVector<float> l_cached = cached.prefill(prompt);
  kvlab::RowVector<float> l_paged = paged.prefill(prompt);
  double worst = 0;
  std::printf("greedy tokens (cached):");
  for (int s = 0; s < steps; ++s) {
    const int token = kvlab::sample_argmax(l_cached.data(), static_cast<int>(l_cached.size()));
    ok = ok && kvlab::sample_argmax(l_naive.data(), static_cast<int>(l_naive.size())) == token &&
         kvlab::sample_argmax(l_paged.data(), static_cast<int>(l_paged.size())) == token;
    worst = std::max({worst, rel_diff(l_naive, l_cached), rel_diff(l_paged, l_cached)});
    std::printf(" %d", token);
    if (s + 1 == steps) break;
    l_naive = naive.decode(token);  // feed the token just drawn, read the next logits
    l_cached = cached.decode(token);
    l_paged = paged.decode(token);
  }
  // [lockstep]
  ok = ok && worst <= kRtol;
  std::printf(
      "\nsame tokens from naive, cached and paged: %s; max logit difference %.1e (bound %.0e)\n\n",
      ok ? "yes" : "NO", worst, kRtol);

  // [counts]
  // n tokens fed (P = 4 in the prefill, then one per step); per layer and K/V head the naive
  // backend projects P, then t at step t: n(n+1)/2 - P(P-1)/2. The cached and paged ones: n.
  const unsigned long long n = static_cast<unsigned long long>(cached.position()),
                           p = prompt.size();
  // 3 x 2
  const unsigned long long per_token = 1ULL * weights->config.n_layers * weights->config.n_kv_heads;
  ok = ok &&
       naive.total().attention.kv_projections == per_token * (n * (n + 1) / 2 - p * (p - 1) / 2) &&
       cached.total().attention.kv_projections == per_token * n && paged.total() == cached.total();
  // [counts]
  std::printf("%-7s %16s %14s %16s\n", "backend", "K/V projections", "q.k dots", "multiply-adds");
  for (const kvlab::LlamaModel* m : {&naive, &cached, &paged}) {
    const kvlab::LlamaCounters& c = m->total();
    std::printf("%-7s %16llu %14llu %16.4g\n", kvlab::to_string(m->backend()),
                static_cast<unsigned long long>(c.attention.kv_projections),
                static_cast<unsigned long long>(c.attention.qk_dots),
                static_cast<double>(c.macs()));
  }
  std::printf("(%llu tokens fed: naive %llu = 6 x (n(n+1)/2 - P(P-1)/2), cached %llu = 6 x n)\n\n",
              n, static_cast<unsigned long long>(naive.total().attention.kv_projections),
              static_cast<unsigned long long>(cached.total().attention.kv_projections));

  // [real]
  // A real model: the three backends continue a sentence greedily, timed, and the tokenizer
  // stored in the same file turns the ids back into text.
  const std::string path = kvlab_support::real_model_path(model_file);
  if (no_real_model) {
    std::printf("The real model: not run (--no-real-model).\n");
  } else if (!std::ifstream(path)) {
    std::printf("The real model: not run, %s is not there (scripts/get-model.sh fetches it).\n",
                path.c_str());
  } else {
    const kvlab::GgufFile file(path);
    const auto real = std::make_shared<const kvlab::LlamaWeights>(kvlab::load_gguf_weights(file));
    const kvlab::BpeTokenizer tok = kvlab::BpeTokenizer::from_gguf(file);
    const std::string text = "The three best things about a rainy day are";
    const std::vector<int> prompt_ids = tok.encode_text(text, /*parse_special=*/false);
    std::printf("The real model, %s:\n  %s\n", path.substr(path.find_last_of('/') + 1).c_str(),
                kvlab::to_string(real->config).c_str());
    std::vector<int> reference;
    for (LlamaBackend backend : {LlamaBackend::Naive, LlamaBackend::Cached, LlamaBackend::Paged}) {
      kvlab::LlamaModel model(real, backend, 16, 256);  // blocks of 16; at most 256 tokens
      kvlab::Sampler greedy(real->config.vocab_size, /*temperature=*/0.0f, /*top_p=*/1.0f,
                            /*seed=*/0);
      const kvlab::Generation g = kvlab::generate(model, greedy, prompt_ids, real_steps);
      if (reference.empty()) reference = g.tokens;
      ok = ok && g.tokens == reference;
      // the counts of the built-in model's part, with P = the prompt's tokens and 90 per token
      const unsigned long long fed = prompt_ids.size() + g.tokens.size() - 1,
                               pp = prompt_ids.size(),
                               per = 1ULL * real->config.n_layers * real->config.n_kv_heads;
      ok = ok &&
           model.total().attention.kv_projections ==
               (backend == LlamaBackend::Naive ? per * (fed * (fed + 1) / 2 - pp * (pp - 1) / 2)
                                               : per * fed);
      const double seconds = g.prefill_seconds + g.decode_seconds;
      std::printf("  %-6s %d + %zu tokens, %7llu K/V projections, %8.1f ms (%.0f tok/s)%s\n",
                  kvlab::to_string(backend), g.prompt_tokens, g.tokens.size(),
                  static_cast<unsigned long long>(model.total().attention.kv_projections),
                  seconds * 1e3, static_cast<double>(g.tokens.size()) / seconds,
                  g.tokens == reference ? "" : "  DIFFERENT TOKENS");
    }
    std::printf("  the text: \"%s%s\"\n", text.c_str(), tok.decode(reference).c_str());
    std::printf("  (the times vary from run to run; the counts and the words do not)\n");
  }
  // [real]

  std::printf("\n%s\n", ok ? "All checks passed."
                           : "MISMATCH: a token, a logit or a count differs (see above).");
  return ok ? 0 : 1;
}
