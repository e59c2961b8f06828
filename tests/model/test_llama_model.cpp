// LlamaModel: the naive, cached and paged backends generate the same greedy tokens for 200+
// steps, with logits within a stated tolerance at every step — on the built-in random model
// (separate and shared classifier) and on stories260K.bin (naive: the first 128 steps) — over
// paged block sizes 1, 7 and 16; the cost counters equal their closed forms for the whole
// model; RoPE has its defining properties; prefill equals token-by-token decode; errors leave
// the model unchanged; generate() is run.c's loop.
//
// Tolerance (kLogitRtol): the backends compute the same float sums in different orders (GEMMs
// over the whole prefix, streamed vs materialised scores, different row counts per matrix
// product), so logits differ by rounding only. Compared per step as
// max_i |a_i - b_i| <= kLogitRtol * max(1, max_i |b_i|). Measured (g++ 12 Release, default
// x86-64 target, 1 thread), against the cached backend: paged below 2e-6 everywhere; naive at
// most 3.8e-7 on the built-in model over 220 steps and 7.0e-6 on stories260K over 256 steps (5
// layers; the error grows with the prefix that naive re-projects). The bound 3e-5 leaves a
// margin of 4x for other compilers and vector widths, and is far below what a real error gives:
// keys rotated one position too far in the cached backend gave 7e-2 (built-in) and 1.4
// (stories260K) within 30 steps. Greedy tokens are compared for equality, and at every step
// the winning logit must lead the runner-up by more than 2 * kLogitRtol (relative), so that no
// backend within the tolerance could have picked another token: the agreement is not luck at a
// near-tie (smallest lead measured: 3.0e-4 built-in, 8.7e-5 stories260K).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kvlab/kvlab.hpp"
#include "model_files.hpp"
#include "test_support.hpp"

using kvlab::CapacityError;
using kvlab::InvalidArgument;
using kvlab::LlamaBackend;
using kvlab::LlamaConfig;
using kvlab::LlamaModel;
using kvlab::LlamaWeights;
using kvlab::RowMatrix;
using kvlab::RowVector;
using kvlab_test::names;

namespace {

constexpr double kLogitRtol = 3e-5;

using Weights = std::shared_ptr<const LlamaWeights>;

Weights shared(LlamaWeights w) { return std::make_shared<const LlamaWeights>(std::move(w)); }

// max_i |a_i - b_i| / max(1, max_i |b_i|)
double logit_error(const RowVector<float>& a, const RowVector<float>& b) {
  const double scale = std::max(1.0, static_cast<double>(b.cwiseAbs().maxCoeff()));
  return static_cast<double>((a - b).cwiseAbs().maxCoeff()) / scale;
}

// Top logit minus the runner-up, relative to max(1, max |logit|).
double top2_gap(const RowVector<float>& logits) {
  std::vector<float> v(logits.data(), logits.data() + logits.size());
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
  const double scale = std::max(1.0, static_cast<double>(logits.cwiseAbs().maxCoeff()));
  return (static_cast<double>(v[0]) - v[1]) / scale;
}

struct LockstepResult {
  std::vector<int> tokens;  // the reference model's greedy tokens after the prompt
  double worst_error = 0;   // max over steps and models of logit_error against the reference
  double min_gap = 1e30;    // min over steps of top2_gap of the reference
};

// Runs `models` in lockstep: prefill `prompt`, then greedy decode until `steps` tokens were
// generated. models[0] is the reference; every other model must pick the same token at every
// step, with logits within kLogitRtol. `compare_until[i]`: model i takes part in the first
// that many generated tokens only (the naive backend is quadratic).
LockstepResult run_lockstep(std::vector<LlamaModel*> models, const std::vector<int>& prompt,
                            int steps, std::vector<int> compare_until = {}) {
  compare_until.resize(models.size(), steps);
  LockstepResult r;
  std::vector<RowVector<float>> logits(models.size());
  for (std::size_t m = 0; m < models.size(); ++m) logits[m] = models[m]->prefill(prompt);
  for (int s = 0; s < steps; ++s) {
    CAPTURE(s);
    const int token = kvlab::sample_argmax(logits[0].data(), static_cast<int>(logits[0].size()));
    r.min_gap = std::min(r.min_gap, top2_gap(logits[0]));
    // no near-tie: every backend within tolerance picks this token
    REQUIRE(top2_gap(logits[0]) > 2 * kLogitRtol);
    for (std::size_t m = 1; m < models.size(); ++m) {
      if (s >= compare_until[m]) continue;
      CAPTURE(m, kvlab::to_string(models[m]->backend()), models[m]->block_size());
      const double error = logit_error(logits[m], logits[0]);
      r.worst_error = std::max(r.worst_error, error);
      REQUIRE(error <= kLogitRtol);
      REQUIRE(kvlab::sample_argmax(logits[m].data(), static_cast<int>(logits[m].size())) == token);
    }
    r.tokens.push_back(token);
    if (s + 1 == steps) break;
    for (std::size_t m = 0; m < models.size(); ++m) {
      if (m == 0 || s + 1 < compare_until[m]) logits[m] = models[m]->decode(token);
    }
  }
  return r;
}

// A prompt of `n` ids from a fixed seed, BOS first (as llama2.c's encode puts it).
std::vector<int> random_prompt(int n, int vocab_size, std::uint64_t seed) {
  kvlab::Rng rng(seed);
  std::vector<int> prompt{kvlab::Tokenizer::kBos};
  while (static_cast<int>(prompt.size()) < n)
    prompt.push_back(static_cast<int>(rng.next_u64() % vocab_size));
  return prompt;
}

// Every backend on `weights`: cached (the reference), naive, paged with block sizes 1, 7, 16.
void check_backends_agree(const Weights& weights, int prompt_len, int steps, int naive_steps) {
  LlamaModel cached(weights, LlamaBackend::Cached);
  LlamaModel naive(weights, LlamaBackend::Naive);
  LlamaModel paged1(weights, LlamaBackend::Paged, 1);
  LlamaModel paged7(weights, LlamaBackend::Paged, 7);
  LlamaModel paged16(weights, LlamaBackend::Paged, 16);
  const std::vector<int> prompt = random_prompt(prompt_len, weights->config.vocab_size, 99);
  const LockstepResult r = run_lockstep({&cached, &naive, &paged1, &paged7, &paged16}, prompt,
                                        steps, {steps, naive_steps, steps, steps, steps});
  INFO("worst logit error " << r.worst_error << ", smallest top-2 gap " << r.min_gap);
  CHECK(static_cast<int>(r.tokens.size()) == steps);
  CHECK(r.worst_error <= kLogitRtol);
  // The same work in the cached and paged backends, counter by counter.
  CHECK(paged1.total() == cached.total());
  CHECK(paged16.total() == cached.total());
  // Blocks taken as the sequence grew: exactly enough for its tokens.
  const int length = prompt_len + steps - 1;
  CHECK(paged7.paged_cache()->blocks(paged7.sequence()).size() ==
        static_cast<std::size_t>((length + 6) / 7));
  CHECK(paged7.paged_cache()->length(paged7.sequence()) == length);
  CHECK(cached.contiguous_cache()->length(0) == length);
}

}  // namespace

TEST_CASE(
    "built-in model: naive, cached and paged (blocks 1, 7, 16) agree token for token for 220 "
    "steps") {
  // 5 prompt tokens, then 220 greedy tokens: 224 positions. Naive: about 2 G multiply-adds.
  check_backends_agree(shared(LlamaWeights::builtin()), 5, 220, 220);
}

TEST_CASE("built-in shape with a shared classifier: the three backends agree for 200 steps") {
  LlamaConfig config = LlamaConfig::tiny();
  // random weights: greedy repeats one token, but every step still attends to all
  config.shared_classifier = true;
  check_backends_agree(shared(LlamaWeights::random(config, 7)), 3, 200, 200);
}

TEST_CASE(
    "a batch of sequences gives each the logits and greedy tokens it gets alone: every backend, "
    "blocks 1, 7, 16") {
  // Four sequences in one model over one store: prompts of 1, 9, 17 and 30 tokens (the longest
  // prefilled in chunks of 13 and 17 over two steps, while the others decode), sequence 3
  // joining at step 3, then greedy decoding of all of them together. Each sequence's logits
  // must equal, within kLogitRtol, those of a model running that sequence alone, and its greedy
  // tokens must be the same. Measured (g++ 12 Release, 1 thread): at most 3.3e-7 — the matrix
  // products of more rows round differently; far inside the bound.
  const Weights weights = shared(LlamaWeights::builtin());
  struct Case {
    LlamaBackend backend;
    int block_size;
  };
  const Case c = GENERATE(Case{LlamaBackend::Naive, 16}, Case{LlamaBackend::Cached, 16},
                          Case{LlamaBackend::Paged, 1}, Case{LlamaBackend::Paged, 7},
                          Case{LlamaBackend::Paged, 16});
  CAPTURE(kvlab::to_string(c.backend), c.block_size);
  constexpr int kMax = 64;
  LlamaModel batched(
      weights, kvlab::make_llama_store(c.backend, weights->config, kMax, c.block_size, 4), kMax);
  const std::vector<int> lengths{1, 9, 17, 30};
  std::vector<std::vector<int>> prompts;
  std::vector<std::unique_ptr<LlamaModel>> alone;
  std::vector<int> seqs(4, -1), fed(4, 0);  // fed: prompt tokens given so far
  std::vector<RowVector<float>> last_batched(4), last_alone(4);
  for (int s = 0; s < 4; ++s) {
    prompts.push_back(random_prompt(lengths[static_cast<std::size_t>(s)], 256,
                                    40 + static_cast<std::uint64_t>(s)));
    alone.push_back(std::make_unique<LlamaModel>(weights, c.backend, c.block_size, kMax));
  }
  double worst = 0;
  for (int step = 0; step < 14; ++step) {
    CAPTURE(step);
    std::vector<kvlab::SequenceChunk> batch;
    for (int s = 0; s < 4; ++s) {
      const auto i = static_cast<std::size_t>(s);
      if (s == 3 && step < 3) continue;  // joins later
      if (seqs[i] < 0) seqs[i] = batched.store().add_sequence();
      std::vector<int> chunk;
      if (fed[i] < lengths[i]) {  // still in its prompt: the rest, or a chunk of 13
        const int n = std::min(lengths[i] - fed[i], s == 3 && fed[i] == 0 ? 13 : lengths[i]);
        chunk.assign(prompts[i].begin() + fed[i], prompts[i].begin() + fed[i] + n);
        fed[i] += n;
      } else {  // decoding: the greedy token after its last logits
        chunk.push_back(
            kvlab::sample_argmax(last_batched[i].data(), static_cast<int>(last_batched[i].size())));
      }
      batch.push_back({seqs[i], chunk});
    }
    const RowMatrix<float> logits = batched.forward_batch(batch);
    REQUIRE(logits.rows() == static_cast<Eigen::Index>(batch.size()));
    for (std::size_t b = 0; b < batch.size(); ++b) {
      const int s = batch[b].seq == seqs[0]   ? 0
                    : batch[b].seq == seqs[1] ? 1
                    : batch[b].seq == seqs[2] ? 2
                                              : 3;
      const auto i = static_cast<std::size_t>(s);
      last_batched[i] = logits.row(static_cast<Eigen::Index>(b));
      last_alone[i] = alone[i]->forward(batch[b].tokens).bottomRows(1);
      const double error = logit_error(last_batched[i], last_alone[i]);
      worst = std::max(worst, error);
      CHECK(error <= kLogitRtol);
      CHECK(kvlab::sample_argmax(last_batched[i].data(), 256) ==
            kvlab::sample_argmax(last_alone[i].data(), 256));
      CHECK(batched.store().length(batch[b].seq) == alone[i]->position());
    }
  }
  // Two models over one store with different limits: the one with the shorter limit refuses a
  // sequence that the other grew past it, with the capacity error, before anything is reserved.
  const auto shared_store =
      kvlab::make_llama_store(c.backend, weights->config, kMax, c.block_size, 1);
  LlamaModel long_limit(weights, shared_store, kMax);
  LlamaModel short_limit(weights, shared_store, 8);
  const int grown = shared_store->add_sequence();
  long_limit.forward_batch({{grown, std::vector<int>(10, 3)}});
  CHECK_THROWS_AS(short_limit.forward_batch({{grown, {1}}}), kvlab::CapacityError);
  CHECK(shared_store->length(grown) == 10);
  INFO("largest logit difference batched vs alone: " << worst);
  CHECK(worst <= kLogitRtol);
  // The step's work is that of the sequences alone, in one step.
  kvlab::LlamaCounters sum;
  for (const auto& m : alone) sum += m->total();
  CHECK(batched.total().attention == sum.attention);
  CHECK(batched.total().mlp_macs == sum.mlp_macs);
}

namespace {
// A ContiguousStore that calls itself "paged": the backend must come from its type.
class MisnamedStore : public kvlab::ContiguousStore<float, kvlab::BlockQ8_0> {
 public:
  using ContiguousStore::ContiguousStore;
  const char* name() const override { return "paged"; }
};
}  // namespace

TEST_CASE("a model over a store: its backend is told by the store's type, for every storage") {
  // heads of 32 values, so that int8 and int4 blocks fit
  const Weights weights =
      shared(LlamaWeights::random(LlamaConfig::tiny().with_dim(64).with_heads(2, 1), 3));
  const LlamaConfig& c = weights->config;
  for (LlamaBackend backend : {LlamaBackend::Naive, LlamaBackend::Cached, LlamaBackend::Paged}) {
    for (kvlab::KVDtype dtype : {kvlab::KVDtype::fp32, kvlab::KVDtype::fp16, kvlab::KVDtype::bf16,
                                 kvlab::KVDtype::int8, kvlab::KVDtype::int4}) {
      if (backend == LlamaBackend::Naive && dtype != kvlab::KVDtype::fp32) continue;
      CAPTURE(kvlab::to_string(backend), kvlab::dtype_name(dtype));
      const auto store = kvlab::make_llama_store(backend, c, 32, 8, 2, dtype);
      CHECK(kvlab::llama_backend_of(*store) == backend);
      CHECK(LlamaModel(weights, store, 32).backend() == backend);
    }
  }
  const auto misnamed = std::make_shared<MisnamedStore>(c.n_layers, c.n_kv_heads, c.head_dim(), 32);
  REQUIRE(std::string(misnamed->name()) == "paged");
  CHECK(kvlab::llama_backend_of(*misnamed) == LlamaBackend::Cached);
  CHECK(LlamaModel(weights, misnamed, 32).backend() == LlamaBackend::Cached);
}

TEST_CASE(
    "stories260K.bin: cached and paged agree for 256 greedy steps, naive for the first 200 (100 "
    "under AddressSanitizer)") {
  // Naive stops at 200 tokens: its cost grows as n^2 (projections) and n^3 (attention in the
  // lower layers); 256 naive steps take 26 s under the sanitizers, where it stops at 100.
  const Weights weights =
      shared(kvlab::load_llama_checkpoint(kvlab_test::model_file_or_skip("stories260K.bin")));
  check_backends_agree(weights, 1, 256, kvlab_test::kSanitized ? 100 : 200);
}

TEST_CASE("stories260K.bin: greedy tokens from BOS equal those of llama2.c's forward pass") {
  const Weights weights =
      shared(kvlab::load_llama_checkpoint(kvlab_test::model_file_or_skip("stories260K.bin")));
  // Golden ids: greedy (argmax) generation from BOS with a line-by-line C transcription of
  // transformer() in llama2.c's run.c (commit bd18228), run on this stories260K.bin (sha256
  // 9414d5a2...); its logits agreed with kvlab's within 8.4e-6 relative over 200 steps. A
  // separate NumPy forward in float64, rotating with the file's own freq_cis tables, gives the
  // same first 40 ids. The ids are tok512 ids (stories260K's own 512-piece tokenizer, not
  // tokenizer.bin). Open question: llama2.c's doc/stories260K.md shows coherent greedy text for
  // its stories260K.bin, and these repeating ids do not look like it; without tok512.bin they
  // cannot be decoded here, so whether this file is that checkpoint is not settled.
  const std::vector<int> golden{461, 461, 401, 401, 401, 461, 378, 455, 473, 456, 435,
                                299, 362, 409, 283, 264, 283, 452, 288, 13,  431, 431,
                                431, 431, 431, 431, 431, 431, 431, 431, 431, 431};
  LlamaModel model(weights, LlamaBackend::Cached);
  kvlab::Sampler greedy(weights->config.vocab_size, 0.0f, 1.0f, 0);
  const kvlab::Generation g =
      kvlab::generate(model, greedy, {kvlab::Tokenizer::kBos}, static_cast<int>(golden.size()));
  CHECK(g.tokens == golden);
}

TEST_CASE("K/V projections: naive Θ(n²), cached and paged Θ(n), exactly, for the whole model") {
  // Prompt of P tokens, then decode steps up to n tokens. Per layer and K/V head the naive
  // backend projects P in the prefill and t at step t (t tokens so far); the cached one 1 per
  // token. Query heads: naive recomputes all t positions below the top layer, the new ones at
  // the top; cached the new ones only. q·k dots per query head: naive materialises the full
  // [rows, t] score matrix (masked entries too), cached computes the visible ones only.
  const Weights weights = shared(LlamaWeights::builtin());
  const LlamaConfig& c = weights->config;
  const std::uint64_t L = c.n_layers, H = c.n_heads, KV = c.n_kv_heads;
  const int P = 6, n = 48;
  LlamaModel naive(weights, LlamaBackend::Naive);
  LlamaModel cached(weights, LlamaBackend::Cached);
  LlamaModel paged(weights, LlamaBackend::Paged, 5);
  const std::vector<int> prompt = random_prompt(P, c.vocab_size, 3);
  naive.prefill(prompt);
  cached.prefill(prompt);
  paged.prefill(prompt);
  const std::uint64_t p = P;
  CHECK(naive.last_step().attention.kv_projections == L * KV * p);
  CHECK(cached.last_step().attention.kv_projections == L * KV * p);
  kvlab::Rng rng(4);
  for (int t = P + 1; t <= n; ++t) {
    CAPTURE(t);
    const int token = static_cast<int>(rng.next_u64() % static_cast<std::uint64_t>(c.vocab_size));
    naive.decode(token);
    cached.decode(token);
    paged.decode(token);
    const std::uint64_t tt = static_cast<std::uint64_t>(t);
    REQUIRE(naive.last_step().attention.kv_projections == L * KV * tt);  // Θ(t) per step
    REQUIRE(cached.last_step().attention.kv_projections == L * KV);      // Θ(1) per step
    REQUIRE(paged.last_step() == cached.last_step());
  }
  const std::uint64_t nn = n;
  const std::uint64_t sum_t = nn * (nn + 1) / 2 - p * (p + 1) / 2;  // t = P+1 .. n
  const std::uint64_t sum_t2 = nn * (nn + 1) * (2 * nn + 1) / 6 - p * (p + 1) * (2 * p + 1) / 6;
  const kvlab::LlamaCounters& N = naive.total();
  const kvlab::LlamaCounters& C = cached.total();
  CHECK(N.attention.kv_projections == L * KV * (p + sum_t));  // = L·KV·(n(n+1)/2 - P(P-1)/2)
  CHECK(N.attention.kv_projections == L * KV * (nn * (nn + 1) / 2 - p * (p - 1) / 2));
  CHECK(C.attention.kv_projections == L * KV * nn);
  CHECK(N.attention.q_projections == H * ((L - 1) * (p + sum_t) + nn));
  CHECK(C.attention.q_projections == H * L * nn);
  CHECK(N.attention.qk_dots == H * ((L - 1) * (p * p + sum_t2) + (p * p + sum_t)));
  CHECK(C.attention.qk_dots == H * L * (nn * (nn + 1) / 2));
  // MLP: 3·dim·hidden per computed position — naive: t positions per lower layer, the new ones at
  // the top.
  const std::uint64_t mlp = 3ULL * c.dim * c.hidden_dim;
  CHECK(N.mlp_macs == mlp * ((L - 1) * (p + sum_t) + nn));
  CHECK(C.mlp_macs == mlp * L * nn);
  // Classifier: one row per prefill (its last token) and per decode step.
  const std::uint64_t rows = 1 + (nn - p);
  CHECK(N.classifier_macs == rows * c.dim * c.vocab_size);
  CHECK(C.classifier_macs == rows * c.dim * c.vocab_size);
  CHECK(paged.total() == cached.total());
}

TEST_CASE(
    "prefill of a prompt equals feeding it token by token, and forward() returns every position") {
  const Weights weights = shared(LlamaWeights::builtin());
  const std::vector<int> prompt = random_prompt(9, weights->config.vocab_size, 11);
  for (LlamaBackend backend : {LlamaBackend::Naive, LlamaBackend::Cached, LlamaBackend::Paged}) {
    CAPTURE(kvlab::to_string(backend));
    LlamaModel at_once(weights, backend, 4);
    LlamaModel one_by_one(weights, backend, 4);
    LlamaModel all_rows(weights, backend, 4);
    const RowVector<float> last = at_once.prefill(prompt);
    const RowMatrix<float> rows = all_rows.forward(prompt);  // [9, vocab]
    REQUIRE(rows.rows() == 9);
    for (std::size_t i = 0; i < prompt.size(); ++i) {
      const RowVector<float> step = one_by_one.decode(prompt[i]);
      CHECK(logit_error(rows.row(static_cast<Eigen::Index>(i)), step) <= kLogitRtol);
    }
    CHECK(logit_error(last, rows.row(8)) <= kLogitRtol);
    CHECK(at_once.position() == 9);
    CHECK(at_once.tokens() == prompt);
    // Both go on identically.
    CHECK(logit_error(at_once.decode(5), one_by_one.decode(5)) <= kLogitRtol);
  }
}

TEST_CASE("reset starts over: the same tokens give bit-identical logits") {
  const Weights weights = shared(LlamaWeights::builtin());
  for (LlamaBackend backend : {LlamaBackend::Naive, LlamaBackend::Cached, LlamaBackend::Paged}) {
    CAPTURE(kvlab::to_string(backend));
    LlamaModel model(weights, backend, 3);
    const RowVector<float> a0 = model.prefill({1, 20, 30});
    const RowVector<float> a1 = model.decode(40);
    model.reset();
    CHECK(model.position() == 0);
    CHECK(model.total() == kvlab::LlamaCounters{});
    CHECK(model.prefill({1, 20, 30}) == a0);
    CHECK(model.decode(40) == a1);
  }
}

TEST_CASE("timed phases: off by default, every phase measured when on, logits unchanged") {
  const Weights weights = shared(LlamaWeights::builtin());
  for (LlamaBackend backend : {LlamaBackend::Naive, LlamaBackend::Cached, LlamaBackend::Paged}) {
    CAPTURE(kvlab::to_string(backend));
    LlamaModel plain(weights, backend, 3), timed(weights, backend, 3);
    timed.time_phases(true);
    CHECK(plain.prefill({1, 20, 30}) == timed.prefill({1, 20, 30}));
    CHECK(plain.decode(40) == timed.decode(40));
    // Untimed, a model reads no clock: all zero.
    const kvlab::PhaseTimes& none = plain.phase_times();
    CHECK(none.total == 0);
    CHECK(none.matmuls + none.classifier + none.attention + none.rope + none.norms == 0);
    // Timed, every phase of the built-in model (it has RoPE) took some time, and the phases,
    // measured inside the steps, add up to no more than the steps (up to rounding).
    const kvlab::PhaseTimes t = timed.phase_times();
    for (double phase : {t.matmuls, t.classifier, t.attention, t.rope, t.norms}) CHECK(phase > 0);
    CHECK(t.other() >= -1e-9 * t.total);
    // Stopped, the next step adds nothing; reset zeroes them.
    timed.time_phases(false);
    timed.decode(41);
    CHECK(timed.phase_times().total == t.total);
    timed.reset();
    CHECK(timed.phase_times().total == 0);
  }
  // generate() times its samples apart from the steps.
  LlamaModel model(weights, LlamaBackend::Cached);
  kvlab::Sampler greedy(256, 0.0f, 1.0f, 0);
  const kvlab::Generation g = kvlab::generate(model, greedy, {1, 40}, 5);
  CHECK(g.sampling_seconds > 0);
  CHECK(g.sampling_seconds <= g.prefill_seconds + g.decode_seconds);
}

TEST_CASE("errors name the argument and leave the model unchanged") {
  const Weights weights = shared(LlamaWeights::builtin());
  for (LlamaBackend backend : {LlamaBackend::Naive, LlamaBackend::Cached, LlamaBackend::Paged}) {
    CAPTURE(kvlab::to_string(backend));
    LlamaModel model(weights, backend, 4, /*max_tokens=*/8);
    LlamaModel twin(weights, backend, 4, 8);
    model.prefill({1, 2, 3});
    twin.prefill({1, 2, 3});
    CHECK_THROWS_MATCHES(model.decode(256), InvalidArgument,
                         names("token", "an id in [0, 256)", "256"));
    // The message names the public function called, not an internal one.
    CHECK_THROWS_WITH(model.decode(256), Catch::StartsWith("kvlab::LlamaModel::decode: "));
    CHECK_THROWS_WITH(model.prefill({-1}), Catch::StartsWith("kvlab::LlamaModel::prefill: "));
    CHECK_THROWS_MATCHES(model.decode(-1), InvalidArgument,
                         names("token", "an id in [0, 256)", "-1"));
    CHECK_THROWS_MATCHES(model.forward({}), InvalidArgument, names("tokens.size()", ">= 1", "0"));
    CHECK_THROWS_MATCHES(model.forward({4, 5, 6, 7, 8, 9}), CapacityError,
                         names("tokens.size()", "at most 5 (max_tokens 8, position 3)", "6"));
    CHECK(model.position() == 3);
    CHECK(model.last_step() == twin.last_step());
    CHECK(model.decode(7) == twin.decode(7));  // the failed calls left no trace
    model.forward({1, 1, 1, 1});
    CHECK(model.position() == 8);
    CHECK_THROWS_AS(model.decode(1), CapacityError);
  }
  CHECK_THROWS_MATCHES(LlamaModel(nullptr, LlamaBackend::Cached), InvalidArgument,
                       names("weights", "non-null weights", "nullptr"));
  CHECK_THROWS_MATCHES(LlamaModel(weights, LlamaBackend::Cached, 16, 513), InvalidArgument,
                       names("max_tokens", "in [0, seq_len (512)]", "513"));
  CHECK_THROWS_MATCHES(LlamaModel(weights, LlamaBackend::Paged, 0), InvalidArgument,
                       names("block_size", ">= 1", "0"));
  LlamaWeights broken = LlamaWeights::builtin();
  broken.layers[2].wk.resize(48, 48);
  CHECK_THROWS_MATCHES(LlamaModel(shared(broken), LlamaBackend::Naive), InvalidArgument,
                       names("layers[2].wk shape", "[16, 48]", "[48, 48]"));
  CHECK(kvlab::parse_llama_backend("paged") == LlamaBackend::Paged);
  CHECK_THROWS_MATCHES(kvlab::parse_llama_backend("fast"), InvalidArgument,
                       names("name", "naive, cached or paged", "'fast'"));
}

TEST_CASE(
    "RoPE: identity at position 0, rotations keep lengths, scores depend on relative position "
    "only") {
  const int head_dim = 8, heads = 3;
  const kvlab::RotaryEmbedding rope(head_dim, 64);
  kvlab::Rng rng(5);
  // [1, heads * head_dim]
  const RowMatrix<float> q0 = kvlab::random_matrix<float>(1, heads * head_dim, rng);
  const RowMatrix<float> k0 = kvlab::random_matrix<float>(1, heads * head_dim, rng);
  RowMatrix<float> q = q0;
  rope.apply(q, 0);
  CHECK(q == q0);
  // Pair (2j, 2j+1) of every head turns by pos / 10000^(2j / head_dim).
  rope.apply(q, 3);
  for (int h = 0; h < heads; ++h) {
    for (int j = 0; j < head_dim / 2; ++j) {
      const int i = h * head_dim + 2 * j;
      const double angle = 3.0 / std::pow(10000.0, 2.0 * j / head_dim);
      CHECK(q(0, i) ==
            Approx(q0(0, i) * std::cos(angle) - q0(0, i + 1) * std::sin(angle)).margin(1e-6));
      CHECK(q(0, i + 1) ==
            Approx(q0(0, i) * std::sin(angle) + q0(0, i + 1) * std::cos(angle)).margin(1e-6));
      CHECK(std::hypot(q(0, i), q(0, i + 1)) ==
            Approx(std::hypot(q0(0, i), q0(0, i + 1))).epsilon(1e-6));
    }
  }
  // q at m, k at n: the per-head dot product is the same for (m, n) and (m + s, n + s).
  const auto dot_at = [&](int m, int n, int h) {
    RowMatrix<float> a = q0, b = k0;
    rope.apply(a, m);
    rope.apply(b, n);
    return static_cast<double>(
        a.row(0).segment(h * head_dim, head_dim).dot(b.row(0).segment(h * head_dim, head_dim)));
  };
  for (int h = 0; h < heads; ++h) {
    CHECK(dot_at(10, 4, h) == Approx(dot_at(40, 34, h)).margin(1e-5));
    CHECK(dot_at(2, 9, h) == Approx(dot_at(50, 57, h)).margin(1e-5));
  }
  RowMatrix<float> wide = kvlab::random_matrix<float>(2, 12, rng);
  CHECK_THROWS_MATCHES(rope.apply(wide, 0), InvalidArgument,
                       names("x.cols()", "a multiple of head_dim (8)", "12"));
  RowMatrix<float> two = kvlab::random_matrix<float>(2, 8, rng);
  CHECK_THROWS_MATCHES(rope.apply(two, 63), InvalidArgument,
                       names("first_position", "positions within [0, 64)", "63 + 2 rows"));
  CHECK_THROWS_MATCHES(kvlab::RotaryEmbedding(7, 4), InvalidArgument,
                       names("head_dim", "an even number", "7"));
}

TEST_CASE("generate: run.c's loop — prefill, then decode the last token, a stop token, limits") {
  const Weights weights = shared(LlamaWeights::builtin());
  const std::vector<int> prompt{1, 40, 41};
  LlamaModel model(weights, LlamaBackend::Paged, 4);
  kvlab::Sampler greedy(256, 0.0f, 1.0f, 0);
  std::vector<int> seen;
  const kvlab::Generation g =
      kvlab::generate(model, greedy, prompt, 30, [&](int t) { seen.push_back(t); });
  CHECK(g.tokens.size() == 30);
  CHECK(seen == g.tokens);
  CHECK(g.prompt_tokens == 3);
  CHECK(g.decode_steps == 29);
  CHECK(model.position() == 3 + 29);  // the last token drawn is not fed
  // The same by hand.
  LlamaModel manual(weights, LlamaBackend::Naive);
  RowVector<float> logits = manual.prefill(prompt);
  for (int s = 0; s < 30; ++s) {
    const int t = kvlab::sample_argmax(logits.data(), 256);
    REQUIRE(t == g.tokens[static_cast<std::size_t>(s)]);
    if (s + 1 < 30) logits = manual.decode(t);
  }
  // Stopping at a token: generation ends before its first occurrence.
  std::size_t first = 1;  // the first token that did not occur before it
  while (first < g.tokens.size() &&
         std::count(g.tokens.begin(), g.tokens.begin() + first, g.tokens[first]) > 0)
    ++first;
  REQUIRE(first < g.tokens.size());
  LlamaModel again(weights, LlamaBackend::Cached);
  const kvlab::Generation stopped =
      kvlab::generate(again, greedy, prompt, 30, nullptr, g.tokens[first]);
  CHECK(stopped.stopped);
  CHECK(stopped.tokens ==
        std::vector<int>(g.tokens.begin(), g.tokens.begin() + static_cast<std::ptrdiff_t>(first)));
  // More steps than the model holds.
  LlamaModel small(weights, LlamaBackend::Cached, 16, 10);
  CHECK_THROWS_MATCHES(
      kvlab::generate(small, greedy, prompt, 9), InvalidArgument,
      names("steps", "at most 8 (max_tokens 10 - position 0 - prompt 3 + 1)", "9"));
  CHECK(small.position() == 0);
  CHECK(kvlab::generate(small, greedy, prompt, 8).tokens.size() == 8);
}

TEST_CASE(
    "two threads split the matrix products and the attention heads: same logits as one thread") {
#if defined(_OPENMP)
  // Large enough that the matrix products (classifier: 2048 x 64 per row; the others in the
  // 1030-token prefill) and the attention (1030 tokens x 4 K/V heads x 16 values >=
  // cpu::kDecodeParallelMinElements) take their parallel paths.
  const LlamaConfig config = LlamaConfig()
                                 .with_dim(64)
                                 .with_hidden_dim(128)
                                 .with_layers(1)
                                 .with_heads(4, 4)
                                 .with_vocab_size(2048)
                                 .with_seq_len(2048)
                                 .with_shared_classifier(false);
  const Weights weights = shared(LlamaWeights::random(config, 17));
  const std::vector<int> prompt = random_prompt(1030, config.vocab_size, 8);
  REQUIRE(1030LL * 4 * 16 >= kvlab::cpu::kDecodeParallelMinElements);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  LlamaModel one(weights, LlamaBackend::Cached);
  const RowVector<float> a0 = one.prefill(prompt), a1 = one.decode(7);
  omp_set_num_threads(2);
  LlamaModel two(weights, LlamaBackend::Paged, 16);
  const RowVector<float> b0 = two.prefill(prompt), b1 = two.decode(7);
  omp_set_num_threads(saved);
  CHECK(logit_error(b0, a0) <= kLogitRtol);
  CHECK(logit_error(b1, a1) <= kLogitRtol);
#else
  WARN("built without OpenMP: nothing to compare");
#endif
}

TEST_CASE(
    "every storage precision: cached and paged agree, and the distance from fp32 follows the "
    "bits kept") {
  // Heads of 32 values (int8 and int4 blocks fit), 3 layers, random weights. Every model is fed
  // the same tokens (fp32's greedy choices), so their logits stay comparable step by step.
  const Weights weights =
      shared(LlamaWeights::random(LlamaConfig::tiny().with_dim(64).with_heads(2, 1), 3));
  const std::vector<int> prompt = random_prompt(12, weights->config.vocab_size, 4);
  constexpr int kSteps = 60;
  LlamaModel reference(weights, LlamaBackend::Cached);
  std::vector<int> fed = prompt;
  std::vector<RowVector<float>> want{reference.prefill(prompt)};
  for (int s = 0; s < kSteps; ++s) {
    const RowVector<float>& l = want.back();
    Eigen::Index best;
    l.maxCoeff(&best);
    fed.push_back(static_cast<int>(best));
    want.push_back(reference.decode(fed.back()));
  }
  std::map<kvlab::KVDtype, double> distance;  // largest logit error from fp32, per storage
  for (kvlab::KVDtype dtype :
       {kvlab::KVDtype::fp16, kvlab::KVDtype::bf16, kvlab::KVDtype::int8, kvlab::KVDtype::int4}) {
    CAPTURE(kvlab::dtype_name(dtype));
    LlamaModel cached(weights, LlamaBackend::Cached, 16, 0, dtype);
    LlamaModel paged(weights, LlamaBackend::Paged, 7, 0, dtype);
    CHECK(std::string(cached.store().storage_name()) == kvlab::dtype_name(dtype));
    double worst = 0, same = 0;
    for (int s = 0; s <= kSteps; ++s) {
      const RowVector<float> a =
          s == 0 ? cached.prefill(prompt) : cached.decode(fed[prompt.size() + s - 1]);
      const RowVector<float> b =
          s == 0 ? paged.prefill(prompt) : paged.decode(fed[prompt.size() + s - 1]);
      same = std::max(same, logit_error(b, a));  // one storage, two layouts: rounding only
      worst = std::max(worst, logit_error(a, want[static_cast<std::size_t>(s)]));
    }
    CHECK(same <= kLogitRtol);
    CHECK(paged.total() == cached.total());  // the same work, counted in the stored bytes
    distance[dtype] = worst;
    INFO("largest logit error vs fp32: " << worst);
    CHECK(worst > 0);  // the storage is lossy, and this path stored through it
  }
  // fp16 keeps 11 significant bits, bf16 8, int8 about 8 over each block's range, int4 about 4.
  CHECK(distance[kvlab::KVDtype::fp16] < distance[kvlab::KVDtype::bf16]);
  CHECK(distance[kvlab::KVDtype::fp16] < distance[kvlab::KVDtype::int8]);
  CHECK(distance[kvlab::KVDtype::int8] < distance[kvlab::KVDtype::int4]);
  CHECK(distance[kvlab::KVDtype::bf16] < distance[kvlab::KVDtype::int4]);
}

TEST_CASE(
    "a sliding window: the cached backend's ring, the paged pool and the naive backend agree token "
    "for token") {
  // The built-in model, windows of 1, 8 and 24 keys, a 20-token prompt (longer than 8: the
  // cached backend's ring of 2W - 1 slots takes it in chunks of W), 120 greedy steps; the paged
  // backend (blocks of 7) gives back the blocks wholly before the window after every step.
  const Weights weights = shared(LlamaWeights::builtin());
  const std::vector<int> prompt = random_prompt(20, weights->config.vocab_size, 5);
  for (int window : {1, 8, 24}) {
    CAPTURE(window);
    LlamaModel cached(weights, LlamaBackend::Cached, 16, 0, kvlab::KVDtype::fp32, window);
    LlamaModel paged(weights, LlamaBackend::Paged, 7, 0, kvlab::KVDtype::fp32, window);
    LlamaModel naive(weights, LlamaBackend::Naive, 16, 0, kvlab::KVDtype::fp32, window);
    LlamaModel full(weights, LlamaBackend::Cached);
    CHECK(cached.store().window() == window);
    CHECK(paged.store().window() == window);
    CHECK(cached.store().max_step_tokens() == window);
    // the ring, however long the sequence: 2W - 1 slots of K and V per layer
    CHECK(cached.store().bytes_reserved() ==
          static_cast<std::size_t>(2 * window - 1) * cached.store().bytes_per_token());
    const LockstepResult r = run_lockstep({&cached, &paged, &naive}, prompt, 120, {120, 120, 120});
    INFO("worst logit error " << r.worst_error << ", smallest top-2 gap " << r.min_gap);
    CHECK(r.worst_error <= kLogitRtol);
    CHECK(cached.position() == 20 + 119);
    // the paged sequence holds the blocks of its window only: ceil((W - 1 + 1) / 7) + 1 at most
    CHECK(paged.paged_cache()->held_blocks(paged.sequence()) <= (window - 1 + 1 + 6) / 7 + 1);
    // the window changes what the model computes: the last logits differ from full attention's
    std::vector<int> history = prompt;
    history.insert(history.end(), r.tokens.begin(), r.tokens.end());
    const kvlab::RowVector<float> with_all = full.prefill(history);
    CHECK(logit_error(cached.decode(r.tokens.back()), with_all) > 0);
  }
}
