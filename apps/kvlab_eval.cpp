// kvlab-eval: what a smaller KV cache costs a real model. It reads a fixed text, feeds it to the
// model teacher-forced (every token of the text, not the model's own), once through the full
// fp32 contiguous cache — the reference — and once through each cache policy given
// (`kvlab::CachePolicy`: a lower precision, a sliding window, the paged store), in lockstep,
// and at every position compares the policy's next-token distribution with the reference's:
// KL divergence (mean, 99th percentile, largest), top-1 agreement, the text's perplexity under
// both, and the KV bytes the policy's store holds (its own counters: what it has reserved —
// whole blocks of the paged store, every slot of a ring — and what of it tokens fill), overall
// and per span of positions. A pass-key probe (a number stated early in a long prompt, asked for at
// its end) shows what each policy forgets.
//
//   scripts/get-model.sh                        # once: SmolLM2-135M-Instruct (about 98 MB)
//   build/apps/kvlab-eval                       # the default policies on the default text
//   build/apps/kvlab-eval --policy cached,kv=int4 --policy paged,window=512 --json eval.json
//   build/apps/kvlab-eval --tokens 1024 --context 512 --passkey 1024
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
  app.footer(
      "A policy is a store name and key=value items (kvlab::CachePolicy): cached or paged; "
      "kv=fp32|fp16|bf16|int8|int4; window=W (each query sees its last W keys); block=N (paged). "
      "Examples: cached,kv=int8  paged,window=512  cached,kv=int4,window=1024.");
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
  app.add_option("--policy", o.policies, "a cache policy to evaluate (repeat for several)")
      ->type_name("POLICY")
      ->capture_default_str();
  add_integer_list(app, "--passkey", o.passkey,
                   "prompt lengths of the pass-key probe, in tokens (e.g. 1024,2048,4096; none: "
                   "no probe)",
                   64, 1 << 20);
  add_integer(app, "--threads", o.threads, "OpenMP threads", 1, 1024);
  app.add_option("--json", o.json, "write every figure to this JSON file")->type_name("FILE");
  app.add_flag("--quiet", o.quiet, "no progress on standard error");
  if (!kvlab_support::parse(app, argc, argv)) return false;
  for (const std::string& spec : o.policies) {
    try {
      (void)kvlab::parse_cache_policy(spec);
    } catch (const kvlab::InvalidArgument& e) {
      throw UsageError(std::string("--policy: ") + e.what());
    }
  }
  return true;
}

// The whole of file `path`.
// \throws UsageError naming --text when it cannot be read.
std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw UsageError("--text: expected a readable file, got '" + path + "'");
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
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
  std::string text;
  for (std::size_t i = 0; i < o.texts.size(); ++i)
    text += (i > 0 ? "\n\n" : "") + read_file(o.texts[i]);
  std::vector<int> ids = tokenizer.encode_text(text, false);
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

  // The reference, then every policy: a model each, over a store of its own.
  std::vector<Evaluated> evals(o.policies.size() + 1);
  for (std::size_t i = 0; i < evals.size(); ++i) {
    Evaluated& e = evals[i];
    e.policy = i == 0 ? kvlab::CachePolicy{} : kvlab::parse_cache_policy(o.policies[i - 1]);
    e.store = kvlab::make_policy_store(e.policy, config, context, step);
    e.model = std::make_unique<kvlab::LlamaModel>(weights, e.store, context);
    e.spans.resize(static_cast<std::size_t>(buckets));
  }
  if (!o.quiet) {
    std::fprintf(stderr,
                 "kvlab-eval: %s (%s)\n  %d tokens of %d in %d window(s) of %d, steps of %d; %zu "
                 "policies against the full fp32 cache\n",
                 o.model.c_str(), kvlab::to_string(config).c_str(), o.tokens, text_tokens, windows,
                 context, step, o.policies.size());
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
    const std::string name = i == 0 ? "reference (" + e.policy.name() + ")" : e.policy.name();
    std::printf("%-34s %12.3e %10.3e %10.3e %8.4f %10.4f %14.1f\n", name.c_str(), kl_mean, p99,
                kl_max, top1, ppl, per_token);
    if (i == 0) continue;
    Json j;
    j["policy"] = e.policy.name();
    j["store"] = e.store->name();
    j["storage"] = e.store->storage_name();
    j["window"] = e.policy.window;
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
    root["model_config"] = {{"n_layers", config.n_layers},
                            {"n_kv_heads", config.n_kv_heads},
                            {"head_dim", config.head_dim()},
                            {"vocab_size", config.vocab_size}};
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
