// kvlab-eval: what a smaller KV cache costs a real model. It reads a fixed text, feeds it to the
// model teacher-forced (every token of the text, not the model's own), once through the full
// fp32 contiguous cache — the reference — and once through each cache policy given
// (`kvlab::CachePolicy`: lower precisions for K and V, a sliding window with attention sinks
// and heavy hitters, heads or layers kept whole, the paged store), in lockstep,
// and at every position compares the policy's next-token distribution with the reference's:
// KL divergence (mean, 99th percentile, largest), top-1 agreement, the text's perplexity under
// both, and the KV bytes the policy's store holds (its own counters: what it has reserved —
// whole blocks of the paged store, every slot of a ring — and what of it tokens fill), overall
// and per span of positions. A pass-key probe (a number stated early in a long prompt, asked for at
// its end) shows what each policy forgets. Selective caching (--selective K): a calibration on
// another text ranks the heads by the attention they put outside a window and sinks; the top K
// keep every token, the others the window.
//
//   scripts/get-model.sh                        # once: SmolLM2-135M-Instruct (about 98 MB)
//   build/apps/kvlab-eval                       # the default policies on the default text
//   build/apps/kvlab-eval --policy cached,kv=int4 --policy paged,window=512 --json eval.json
//   build/apps/kvlab-eval --tokens 1024 --context 512 --passkey 1024
//   build/apps/kvlab-eval --selective 9,18,45 --calibrate cached,window=256,sinks=4
// --help lists the options.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <kvlab/kvlab.hpp>
#include <kvlab/model/bpe_tokenizer.hpp>
#include <kvlab/model/cache_policy.hpp>

#include "support/builtin_model.hpp"
#include "support/cli.hpp"
#include "support/json.hpp"
#include "support/policy_option.hpp"

namespace {

using kvlab_support::Json;
using kvlab_support::UsageError;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string model = kvlab_support::default_chat_model();
  // Texts every Debian system has (the base-files package): the GNU GPL, versions 3 and 2.
  std::vector<std::string> texts = {"/usr/share/common-licenses/GPL-3",
                                    "/usr/share/common-licenses/GPL-2"};
  int tokens = 8192;
  int context = 4096;
  int step = 64;
  int bucket = 256;
  std::vector<std::string> policies = {"cached", "cached,kv=int8", "cached,kv=int4",
                                       "cached,window=1024"};
  std::vector<int> passkey;  // prompt lengths of the probe; none: no probe
  // Selective caching: the top K heads of a calibration kept in full, the rest as `calibrate`.
  std::vector<int> selective;  // the Ks; none: no calibration
  std::string calibrate = "cached,window=256,sinks=4";
  std::vector<std::string> calibration_texts = {"/usr/share/common-licenses/GFDL-1.3"};
  int calibration_tokens = 2048;
  std::string calibration;      // a ranking file to read instead of calibrating
  std::string calibration_out;  // where to write the ranking
  int threads = 1;
  std::string json;
  bool quiet = false;
};

bool parse_options(int argc, char** argv, Options& o) {
  using namespace kvlab_support;
  CLI::App app{
      "kvlab-eval: what a cache policy costs a GGUF model (SmolLM2-135M-Instruct by default). "
      "The text is fed teacher-forced, in windows of --context tokens, through the full fp32 "
      "contiguous cache and through each --policy; at every position the policy's next-token "
      "distribution is compared with the full cache's (KL divergence, top-1 agreement, "
      "perplexity) and the policy's KV bytes are read from its store."};
  app.footer(std::string("A policy is ") + policy_syntax() + ".");
  add_file(app, "--model", o.model,
           "the GGUF file (default: where scripts/get-model.sh puts SmolLM2-135M-Instruct)")
      ->capture_default_str();
  app.add_option("--text", o.texts,
                 "text files, read in order and joined by a blank line (default: the GNU GPL "
                 "versions 3 and 2 from /usr/share/common-licenses)")
      ->type_name("FILE ...")
      ->capture_default_str();
  add_integer(app, "--tokens", o.tokens,
              "tokens of the text to evaluate (the text must have that many)", 2, 1 << 24);
  add_integer(app, "--context", o.context,
              "tokens per window: the cache starts empty at each window's first token", 2, 1 << 20);
  add_integer(app, "--step", o.step,
              "tokens per step (a prefill chunk); the reference and every policy take the same "
              "steps; a windowed contiguous ring holds W - 1 + step slots (1: exactly W)",
              1, 1 << 20);
  add_integer(app, "--bucket", o.bucket, "positions per span in the per-position figures", 1,
              1 << 20);
  add_policies(app, "--policy", o.policies, "a cache policy to evaluate (repeat for several)");
  add_integer_list(app, "--passkey", o.passkey,
                   "prompt lengths of the pass-key probe, in tokens (e.g. 1024,2048,4096; none: "
                   "no probe)",
                   64, 1 << 20);
  add_integer_list(app, "--selective", o.selective,
                   "selective caching: for each K, a policy that keeps the K heads of the "
                   "calibration that put the most attention outside --calibrate's window and "
                   "sinks in full, and the others as --calibrate (e.g. 9,18,45)",
                   1, 1 << 20);
  add_policy(app, "--calibrate", o.calibrate,
             "the window and sinks that the calibration measures against and the other heads "
             "keep (a cache policy with a window)")
      ->capture_default_str();
  app.add_option("--calibration-text", o.calibration_texts,
                 "text files for the calibration, joined by a blank line (default: the GNU FDL "
                 "1.3 from /usr/share/common-licenses, not the evaluated text)")
      ->type_name("FILE ...")
      ->capture_default_str();
  add_integer(app, "--calibration-tokens", o.calibration_tokens,
              "tokens of the calibration text, fed in one window", 2, 1 << 20);
  add_file(app, "--calibration", o.calibration,
           "read the heads' ranking from this file (written by --calibration-out for the same "
           "model) instead of calibrating");
  app.add_option("--calibration-out", o.calibration_out, "write the heads' ranking to this file")
      ->type_name("FILE");
  add_integer(app, "--threads", o.threads, "OpenMP threads", 1, 1024);
  app.add_option("--json", o.json, "write every figure to this JSON file")->type_name("FILE");
  app.add_flag("--quiet", o.quiet, "no progress on standard error");
  if (!kvlab_support::parse(app, argc, argv)) return false;
  const kvlab::CachePolicy calibrate = kvlab::parse_cache_policy(o.calibrate);  // checked
  if (calibrate.window == 0 || calibrate.backend != kvlab::LlamaBackend::Cached ||
      calibrate.heavy != 0 || !calibrate.full_heads.empty()) {
    throw UsageError(
        "--calibrate: expected a contiguous policy with a window, no h2o and no "
        "full_heads, got '" +
        o.calibrate + "'");
  }
  return true;
}

// The files `paths`, read in order and joined by a blank line.
// \throws UsageError naming `option` when one cannot be read.
std::string read_texts(const std::vector<std::string>& paths, const char* option) {
  std::string text;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    std::ifstream file(paths[i], std::ios::binary);
    if (!file) {
      throw UsageError(std::string(option) + ": expected a readable file, got '" + paths[i] + "'");
    }
    std::ostringstream content;
    content << file.rdbuf();
    text += (i > 0 ? "\n\n" : "") + content.str();
  }
  return text;
}

// log softmax of `logits`, in double: [vocab]
std::vector<double> log_softmax(const Eigen::Ref<const kvlab::RowVector<float>>& logits) {
  const double m = static_cast<double>(logits.maxCoeff());
  double sum = 0;
  for (Eigen::Index i = 0; i < logits.size(); ++i) sum += std::exp(logits[i] - m);
  const double lse = m + std::log(sum);
  std::vector<double> out(static_cast<std::size_t>(logits.size()));
  for (Eigen::Index i = 0; i < logits.size(); ++i)
    out[static_cast<std::size_t>(i)] = logits[i] - lse;
  return out;
}

// Index of the largest logit (the first of equals): the greedy token.
int argmax(const Eigen::Ref<const kvlab::RowVector<float>>& logits) {
  Eigen::Index best = 0;
  logits.maxCoeff(&best);
  return static_cast<int>(best);
}

// The figures of one span of positions (within the windows), all windows together.
struct Span {
  double kl = 0;                // sum of KL
  long long positions = 0;      // positions counted
  long long top1 = 0;           // positions whose greedy token matches the reference's
  double nll = 0, ref_nll = 0;  // sums of -log p(next token) under the policy, the reference
  long long targets = 0;        // positions with a next token in their window
  std::size_t bytes_max = 0;    // the most KV bytes the store held (reserved) at these positions
};

// One policy under evaluation: its store and model, and what it measured.
struct Evaluated {
  kvlab::CachePolicy policy;
  std::shared_ptr<kvlab::KVStore<float>> store;
  std::unique_ptr<kvlab::LlamaModel> model;
  int seq = -1;
  std::vector<float> kls;  // [positions]: KL at every position, all windows
  Span all;
  std::vector<Span> spans;                                // [context / bucket]
  std::size_t bytes_at_context = 0, used_at_context = 0;  // held and filled, at a window's end
  double seconds = 0;
};

// One model per policy over its own store, sequence `seq`, each window starting empty.
void start_window(Evaluated& e) {
  if (e.seq >= 0) e.store->free_sequence(e.seq);
  e.seq = e.store->add_sequence();
}

// Logits of every token of `tokens`, [tokens, vocab], fed to sequence `seq` of `model` in one
// step, or in as many as the store's step limit takes (a ring cut to the sequence's length).
kvlab::RowMatrix<float> feed(kvlab::LlamaModel& model, int seq, const std::vector<int>& tokens) {
  const auto limit = static_cast<std::size_t>(model.store().max_step_tokens());
  if (tokens.size() <= limit) return model.forward_batch({kvlab::SequenceChunk{seq, tokens}}, true);
  kvlab::RowMatrix<float> logits(static_cast<Eigen::Index>(tokens.size()),
                                 model.config().vocab_size);
  for (std::size_t at = 0; at < tokens.size(); at += limit) {
    const std::size_t n = std::min(limit, tokens.size() - at);
    const auto from = tokens.begin() + static_cast<std::ptrdiff_t>(at);
    logits.middleRows(static_cast<Eigen::Index>(at), static_cast<Eigen::Index>(n)) =
        model.forward_batch(
            {kvlab::SequenceChunk{seq,
                                  std::vector<int>(from, from + static_cast<std::ptrdiff_t>(n))}},
            true);
  }
  return logits;
}

// `feed` to `e`'s sequence, timed.
kvlab::RowMatrix<float> feed(Evaluated& e, const std::vector<int>& tokens) {
  const auto start = Clock::now();
  kvlab::RowMatrix<float> logits = feed(*e.model, e.seq, tokens);
  e.seconds += std::chrono::duration<double>(Clock::now() - start).count();
  return logits;
}

// The 99th percentile of `values` (nearest rank), not empty.
double percentile99(std::vector<float> values) {
  const std::size_t rank = static_cast<std::size_t>(std::ceil(0.99 * values.size())) - 1;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(rank),
                   values.end());
  return values[rank];
}

Json span_json(const Span& s) {
  Json j;
  j["kl_mean"] = s.positions > 0 ? s.kl / static_cast<double>(s.positions) : 0.0;
  j["top1"] =
      s.positions > 0 ? static_cast<double>(s.top1) / static_cast<double>(s.positions) : 0.0;
  j["perplexity"] = s.targets > 0 ? std::exp(s.nll / static_cast<double>(s.targets)) : 0.0;
  j["reference_perplexity"] =
      s.targets > 0 ? std::exp(s.ref_nll / static_cast<double>(s.targets)) : 0.0;
  j["positions"] = s.positions;
  return j;
}

// The pass-key probe's prompt of about `length` tokens: an instruction, the key stated early,
// filler, the question; and the key's own tokens as the answer continues it.
struct PasskeyPrompt {
  std::string key;          // five digits
  std::vector<int> prompt;  // ends with "The pass key is"
  std::vector<int> answer;  // " " + key, as the tokenizer writes it after the prompt
  int key_position = 0;     // the token where the key is stated
};

PasskeyPrompt passkey_prompt(const kvlab::TextTokenizer& tok, int length, int trial) {
  PasskeyPrompt p;
  // A key that differs from length to length, from a fixed seed.
  std::uint64_t x = 0x9E3779B97F4A7C15ULL * static_cast<std::uint64_t>(length * 31 + trial + 1);
  x ^= x >> 29;
  p.key = std::to_string(10000 + x % 90000);
  const std::string intro =
      "There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. I "
      "will quiz you about the pass key.\n";
  const std::string filler =
      "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
      "again.\n";
  const std::string stated =
      "The pass key is " + p.key + ". Remember it. " + p.key + " is the pass key.\n";
  const std::string question = "What is the pass key? The pass key is";
  const auto count = [&](const std::string& s) {
    return static_cast<int>(tok.encode_text(s, false).size());
  };
  std::string text = intro + filler;
  p.key_position = count(text);
  text += stated;
  const int fixed = count(text) + count(question);
  const int fill = std::max(0, (length - fixed) / std::max(1, count(filler)));
  for (int i = 0; i < fill; ++i) text += filler;
  text += question;
  p.prompt = tok.encode_text(text, false);
  const std::vector<int> with = tok.encode_text(text + " " + p.key, false);
  p.answer.assign(with.begin() + static_cast<std::ptrdiff_t>(p.prompt.size()), with.end());
  return p;
}

// The model's shape as the calibration file records it.
Json config_json(const kvlab::LlamaConfig& config) {
  return {{"n_layers", config.n_layers},
          {"n_kv_heads", config.n_kv_heads},
          {"head_dim", config.head_dim()},
          {"vocab_size", config.vocab_size}};
}

// The heads' ranking: every (layer, K/V head) with the attention its queries put outside
// --calibrate's window and sinks on the calibration text, the most first — read from
// --calibration, or measured with every head kept in full at fp32 (a `SelectiveStore` that
// measures, `SelectiveStore::measure_outside`).
Json rank_heads(const Options& o, const std::shared_ptr<const kvlab::LlamaWeights>& weights,
                const kvlab::BpeTokenizer& tokenizer, int step) {
  const kvlab::LlamaConfig& config = weights->config;
  const kvlab::CachePolicy base = kvlab::parse_cache_policy(o.calibrate);
  if (!o.calibration.empty()) {
    std::ifstream file(o.calibration);
    Json ranking;
    try {
      ranking = Json::parse(file);
    } catch (const std::exception&) {
      throw UsageError("--calibration: expected a JSON file written by --calibration-out, got '" +
                       o.calibration + "'");
    }
    if (!ranking.contains("model_config") || ranking["model_config"] != config_json(config)) {
      throw UsageError("--calibration: expected a ranking for this model (" +
                       config_json(config).dump() + "), got one for " +
                       (ranking.contains("model_config") ? ranking["model_config"].dump()
                                                         : std::string("no model")) +
                       " in '" + o.calibration + "'");
    }
    if (ranking["window"] != base.window || ranking["sinks"] != base.sinks) {
      throw UsageError("--calibration: expected a ranking against --calibrate's window " +
                       std::to_string(base.window) + " and sinks " + std::to_string(base.sinks) +
                       ", got window " + ranking["window"].dump() + " and sinks " +
                       ranking["sinks"].dump() + " in '" + o.calibration + "'");
    }
    return ranking;
  }
  std::vector<int> ids =
      tokenizer.encode_text(read_texts(o.calibration_texts, "--calibration-text"), false);
  if (static_cast<int>(ids.size()) < o.calibration_tokens) {
    throw UsageError("--calibration-tokens: expected at most the calibration text's " +
                     std::to_string(ids.size()) + " tokens, got " +
                     std::to_string(o.calibration_tokens));
  }
  ids.resize(static_cast<std::size_t>(o.calibration_tokens));
  const int heads = config.n_layers * config.n_kv_heads;
  auto store = std::make_shared<kvlab::SelectiveStore<float>>(
      config.n_layers, config.n_kv_heads, config.head_dim(),
      std::vector<kvlab::HeadPolicy>(static_cast<std::size_t>(heads)));
  store->measure_outside(base.window, base.sinks);
  kvlab::LlamaModel model(weights, store, o.calibration_tokens);
  const int seq = store->add_sequence();
  const auto start = Clock::now();
  for (int at = 0; at < o.calibration_tokens; at += step) {
    const int n = std::min(step, o.calibration_tokens - at);
    (void)model.forward_batch(
        {kvlab::SequenceChunk{seq, std::vector<int>(ids.begin() + at, ids.begin() + at + n)}});
    if (!o.quiet) {
      std::fprintf(stderr, "\r  calibration: %d/%d tokens, %.0f s", at + n, o.calibration_tokens,
                   std::chrono::duration<double>(Clock::now() - start).count());
      std::fflush(stderr);
    }
  }
  if (!o.quiet) std::fprintf(stderr, "\n");
  const std::vector<double> outside = store->attention_outside();
  std::vector<int> order(static_cast<std::size_t>(heads));
  for (int i = 0; i < heads; ++i) order[static_cast<std::size_t>(i)] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return outside[static_cast<std::size_t>(a)] > outside[static_cast<std::size_t>(b)];
  });
  Json ranking;
  ranking["model"] = o.model.substr(o.model.find_last_of('/') + 1);
  ranking["model_config"] = config_json(config);
  ranking["text"] = o.calibration_texts;
  ranking["tokens"] = o.calibration_tokens;
  ranking["window"] = base.window;
  ranking["sinks"] = base.sinks;
  ranking["heads"] = Json::array();
  for (int i : order) {
    ranking["heads"].push_back({{"layer", i / config.n_kv_heads},
                                {"kv_head", i % config.n_kv_heads},
                                {"outside", outside[static_cast<std::size_t>(i)]}});
  }
  return ranking;
}

// A policy's name for the table: its heads kept in full counted, not listed, when many.
std::string table_name(const kvlab::CachePolicy& policy) {
  if (policy.full_heads.size() <= 3) return policy.name();
  kvlab::CachePolicy shown = policy;
  shown.full_heads.clear();
  return shown.name() + ",full_heads=" + std::to_string(policy.full_heads.size()) + " heads";
}

int run(const Options& o) {
  kvlab_support::set_threads(kvlab_support::usable_threads("kvlab-eval", {o.threads}).front());
  if (!kvlab_support::can_write("kvlab-eval", "--json", o.json)) return 2;
  const kvlab::GgufFile file(o.model);
  auto weights = std::make_shared<const kvlab::LlamaWeights>(kvlab::load_gguf_weights(file));
  const kvlab::BpeTokenizer tokenizer = kvlab::BpeTokenizer::from_gguf(file);
  const kvlab::LlamaConfig& config = weights->config;
  if (o.context > config.seq_len) {
    throw UsageError("--context: expected at most the model's " + std::to_string(config.seq_len) +
                     " tokens, got " + std::to_string(o.context));
  }
  for (int length : o.passkey) {
    if (length > config.seq_len) {
      throw UsageError("--passkey: expected lengths of at most the model's " +
                       std::to_string(config.seq_len) + " tokens, got " + std::to_string(length));
    }
  }
  std::vector<int> ids = tokenizer.encode_text(read_texts(o.texts, "--text"), false);
  const int text_tokens = static_cast<int>(ids.size());
  if (o.tokens > text_tokens) {
    throw UsageError("--tokens: expected at most the text's " + std::to_string(text_tokens) +
                     " tokens, got " + std::to_string(o.tokens));
  }
  ids.resize(static_cast<std::size_t>(o.tokens));
  const int context = std::min(o.context, o.tokens);
  const int windows = (o.tokens + context - 1) / context;
  const int step = std::min(o.step, context);
  const int buckets = (context + o.bucket - 1) / o.bucket;

  // The policies: those given, then the selective ones from the heads' ranking.
  std::vector<kvlab::CachePolicy> chosen;
  for (const std::string& spec : o.policies) chosen.push_back(kvlab::parse_cache_policy(spec));
  Json ranking;
  if (!o.selective.empty() || !o.calibration_out.empty()) {
    const int heads = config.n_layers * config.n_kv_heads;
    for (int k : o.selective) {
      if (k > heads) {
        throw UsageError("--selective: expected at most the model's " + std::to_string(heads) +
                         " heads, got " + std::to_string(k));
      }
    }
    ranking = rank_heads(o, weights, tokenizer, step);
    if (!o.calibration_out.empty()) kvlab_support::write_json_file(o.calibration_out, ranking);
    for (int k : o.selective) {
      kvlab::CachePolicy p = kvlab::parse_cache_policy(o.calibrate);
      for (int i = 0; i < k; ++i) {
        const Json& h = ranking["heads"][static_cast<std::size_t>(i)];
        p.full_heads.emplace_back(h["layer"].get<int>(), h["kv_head"].get<int>());
      }
      std::sort(p.full_heads.begin(), p.full_heads.end());
      chosen.push_back(p);
    }
  }
  // A budget that covers a whole window keeps every token: it would measure nothing.
  for (const kvlab::CachePolicy& p : chosen) {
    const long long budget = 1LL * p.sinks + p.window + p.heavy;
    if (p.window > 0 && budget >= context) {
      throw UsageError("--policy '" + p.name() + "': expected sinks + window + h2o (" +
                       std::to_string(budget) + ") below --context (" + std::to_string(context) +
                       "): such a budget keeps every token of a window");
    }
  }

  // The reference, then every policy: a model each, over a store of its own.
  std::vector<Evaluated> evals(chosen.size() + 1);
  for (std::size_t i = 0; i < evals.size(); ++i) {
    Evaluated& e = evals[i];
    e.policy = i == 0 ? kvlab::CachePolicy{} : chosen[i - 1];
    e.store = kvlab::make_policy_store(e.policy, config, context, step);
    e.model = std::make_unique<kvlab::LlamaModel>(weights, e.store, context);
    e.spans.resize(static_cast<std::size_t>(buckets));
  }
  if (!o.quiet) {
    std::fprintf(stderr,
                 "kvlab-eval: %s (%s)\n  %d tokens of %d in %d window(s) of %d, steps of %d; %zu "
                 "policies against the full fp32 cache\n",
                 o.model.c_str(), kvlab::to_string(config).c_str(), o.tokens, text_tokens, windows,
                 context, step, chosen.size());
  }

  const auto start = Clock::now();
  for (int w = 0; w < windows; ++w) {
    const int begin = w * context, length = std::min(context, o.tokens - begin);
    for (Evaluated& e : evals) start_window(e);
    for (int at = 0; at < length; at += step) {
      const int n = std::min(step, length - at);
      const std::vector<int> chunk(ids.begin() + begin + at, ids.begin() + begin + at + n);
      const kvlab::RowMatrix<float> ref_logits = feed(evals[0], chunk);  // [n, vocab]
      std::vector<std::vector<double>> ref_logp, ref_p;                  // [n][vocab]
      std::vector<int> ref_top;                                          // [n]
      for (int r = 0; r < n; ++r) {
        ref_logp.push_back(log_softmax(ref_logits.row(r)));
        ref_p.push_back(ref_logp.back());
        for (double& x : ref_p.back()) x = std::exp(x);
        ref_top.push_back(argmax(ref_logits.row(r)));
      }
      for (std::size_t i = 0; i < evals.size(); ++i) {
        Evaluated& e = evals[i];
        const kvlab::RowMatrix<float> logits = i == 0 ? ref_logits : feed(e, chunk);
        const std::size_t bytes = e.store->bytes_reserved();  // held: reserved, whole blocks
        for (int r = 0; r < n; ++r) {
          const int pos = at + r;  // within the window
          const std::vector<double> logp = log_softmax(logits.row(r));
          const std::vector<double>& ref = ref_logp[static_cast<std::size_t>(r)];
          const std::vector<double>& p = ref_p[static_cast<std::size_t>(r)];
          double kl = 0;  // KL(reference || policy)
          for (std::size_t v = 0; v < logp.size(); ++v) kl += p[v] * (ref[v] - logp[v]);
          kl = std::max(kl, 0.0);  // rounding can take a zero a hair below
          Span& s = e.spans[static_cast<std::size_t>(pos / o.bucket)];
          for (Span* span : {&s, &e.all}) {
            span->kl += kl;
            span->positions += 1;
            span->top1 += argmax(logits.row(r)) == ref_top[static_cast<std::size_t>(r)] ? 1 : 0;
            if (pos + 1 < length) {
              const auto next =
                  static_cast<std::size_t>(ids[static_cast<std::size_t>(begin + pos + 1)]);
              span->nll -= logp[next];
              span->ref_nll -= ref[next];
              span->targets += 1;
            }
            span->bytes_max = std::max(span->bytes_max, bytes);
          }
          e.kls.push_back(static_cast<float>(kl));
        }
        if (length == context && at + n == length) {
          e.bytes_at_context = bytes;
          e.used_at_context = e.store->bytes_used();
        }
      }
      if (!o.quiet) {
        std::fprintf(stderr, "\r  window %d/%d: %d/%d tokens, %.0f s", w + 1, windows, at + n,
                     length, std::chrono::duration<double>(Clock::now() - start).count());
        std::fflush(stderr);
      }
    }
  }
  if (!o.quiet) std::fprintf(stderr, "\n");

  // The pass-key probe: each policy's greedy answer and the probability of the key's tokens.
  Json passkey = Json::array();
  for (int length : o.passkey) {
    const PasskeyPrompt p = passkey_prompt(tokenizer, length, 0);
    Json probe;
    probe["length"] = static_cast<int>(p.prompt.size());
    probe["key"] = p.key;
    probe["key_position"] = p.key_position;
    probe["results"] = Json::array();
    for (const Evaluated& base : evals) {
      const int max_tokens = static_cast<int>(p.prompt.size() + p.answer.size()) + 2;
      // Two sequences: the greedy answer, and a fork that is fed the key.
      auto store = kvlab::make_policy_store(base.policy, config, max_tokens, step, 2);
      kvlab::LlamaModel model(weights, store, max_tokens);
      const int seq = store->add_sequence();
      // The prompt, in steps; its last logits give the answer's first token.
      kvlab::RowMatrix<float> last;  // [1, vocab]
      for (std::size_t at = 0; at < p.prompt.size(); at += static_cast<std::size_t>(step)) {
        const std::size_t n = std::min(p.prompt.size() - at, static_cast<std::size_t>(step));
        const auto from = p.prompt.begin() + static_cast<std::ptrdiff_t>(at);
        const kvlab::RowMatrix<float> logits =  // [n, vocab]
            feed(model, seq, std::vector<int>(from, from + static_cast<std::ptrdiff_t>(n)));
        last = logits.bottomRows(1);
      }
      const int forced = store->fork(seq);  // the same prompt, to be continued by the key
      // Teacher-forced: the log-probability of the key's tokens after the prompt.
      std::vector<double> logp = log_softmax(last.row(0));
      double key_logp = logp[static_cast<std::size_t>(p.answer[0])];
      for (std::size_t i = 1; i < p.answer.size(); ++i) {
        const kvlab::RowMatrix<float> logits =
            model.forward_batch({kvlab::SequenceChunk{forced, {p.answer[i - 1]}}});
        key_logp += log_softmax(logits.row(0))[static_cast<std::size_t>(p.answer[i])];
      }
      // Greedy: the answer the policy gives, from the prompt alone.
      std::vector<int> answer{argmax(last.row(0))};
      for (std::size_t i = 1; i < p.answer.size() + 2; ++i) {
        const kvlab::RowMatrix<float> logits =
            model.forward_batch({kvlab::SequenceChunk{seq, {answer.back()}}});
        answer.push_back(argmax(logits.row(0)));
      }
      const std::string said = tokenizer.decode(answer);
      Json r;
      r["policy"] = &base == &evals[0] ? "reference" : base.policy.name();
      r["answer"] = said;
      r["recalled"] = said.compare(0, p.key.size() + 1, " " + p.key) == 0;
      r["key_logprob"] = key_logp;
      probe["results"].push_back(r);
      if (!o.quiet) {
        std::string shown;  // the answer on one line
        for (char c : said) shown += c == '\n' ? std::string("\\n") : std::string(1, c);
        std::fprintf(stderr, "  pass key at %d tokens, %s: '%s' (key %s, log p %.2f)\n",
                     static_cast<int>(p.prompt.size()), r["policy"].get<std::string>().c_str(),
                     shown.c_str(), p.key.c_str(), key_logp);
      }
    }
    passkey.push_back(probe);
  }

  // The table, and the JSON.
  std::printf("%-34s %12s %10s %10s %8s %10s %14s\n", "policy", "KL mean", "KL p99", "KL max",
              "top-1", "ppl", "KV bytes/tok");
  Json policies = Json::array();
  for (std::size_t i = 0; i < evals.size(); ++i) {
    const Evaluated& e = evals[i];
    const double kl_mean = e.all.kl / static_cast<double>(e.all.positions);
    const double p99 = percentile99(e.kls);
    const double kl_max = *std::max_element(e.kls.begin(), e.kls.end());
    const double top1 = static_cast<double>(e.all.top1) / static_cast<double>(e.all.positions);
    const double ppl = std::exp(e.all.nll / static_cast<double>(e.all.targets));
    const double per_token =
        e.bytes_at_context > 0 ? static_cast<double>(e.bytes_at_context) / context : 0.0;
    const std::string name = i == 0 ? "reference (" + e.policy.name() + ")" : table_name(e.policy);
    std::printf("%-34s %12.3e %10.3e %10.3e %8.4f %10.4f %14.1f\n", name.c_str(), kl_mean, p99,
                kl_max, top1, ppl, per_token);
    if (i == 0) continue;
    Json j;
    j["policy"] = e.policy.name();
    j["store"] = e.store->name();
    j["storage"] = e.store->storage_name();
    j["window"] = e.policy.window;
    j["key_storage"] = kvlab::dtype_name(e.policy.key_dtype);
    j["value_storage"] = kvlab::dtype_name(e.policy.value_dtype);
    j["sinks"] = e.policy.sinks;
    j["h2o"] = e.policy.heavy;
    j["full_layers"] = e.policy.full_layers;
    j["full_heads"] = Json::array();
    for (const auto& h : e.policy.full_heads) j["full_heads"].push_back({h.first, h.second});
    j["block_size"] = e.policy.backend == kvlab::LlamaBackend::Paged ? e.policy.block_size : 0;
    j["kv_bytes_per_token_stored"] = e.store->bytes_per_token();
    j["kl_mean"] = kl_mean;
    j["kl_p99"] = p99;
    j["kl_max"] = kl_max;
    j["top1"] = top1;
    j["perplexity"] = ppl;
    j["kv_bytes_at_context"] = e.bytes_at_context;
    j["kv_bytes_used_at_context"] = e.used_at_context;
    j["kv_bytes_per_token_at_context"] = per_token;
    j["seconds"] = e.seconds;
    j["per_position"] = Json::array();
    for (int b = 0; b < buckets; ++b) {
      const Span& s = e.spans[static_cast<std::size_t>(b)];
      Json span = span_json(s);
      span["begin"] = b * o.bucket;
      span["end"] = std::min(context, (b + 1) * o.bucket);
      span["kv_bytes_max"] = s.bytes_max;
      j["per_position"].push_back(span);
    }
    policies.push_back(j);
  }
  if (!o.json.empty()) {
    Json root;
    root["program"] = "kvlab-eval";
    root["model"] = o.model.substr(o.model.find_last_of('/') + 1);  // the file's name
    root["model_shape"] = kvlab::to_string(config);
    root["model_config"] = config_json(config);
    root["text"] = {{"files", o.texts},
                    {"text_tokens", text_tokens},
                    {"tokens", o.tokens},
                    {"context", context},
                    {"windows", windows}};
    root["step"] = step;
    root["bucket"] = o.bucket;
    root["threads"] = o.threads;
    root["reference"] = {
        {"policy", evals[0].policy.name()},
        {"perplexity", std::exp(evals[0].all.ref_nll / static_cast<double>(evals[0].all.targets))},
        {"kv_bytes_at_context", evals[0].bytes_at_context},
        {"seconds", evals[0].seconds}};
    root["policies"] = policies;
    root["passkey"] = passkey;
    if (!ranking.is_null()) root["calibration"] = ranking;
    kvlab_support::write_json_file(o.json, root);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (const auto stop =
          kvlab_support::read_command_line("kvlab-eval", argc, argv, options, parse_options))
    return *stop;
  try {
    return run(options);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "kvlab-eval: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvlab-eval: %s\n", e.what());
    return 1;
  }
}
