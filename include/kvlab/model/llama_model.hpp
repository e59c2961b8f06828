/// \file
/// \brief `LlamaModel`: a Llama-style decoder whose math follows llama2.c's `run.c`.
///
/// The decoder has token embedding, RMSNorm, rotary position embedding, grouped-query attention,
/// SwiGLU MLP, final norm and classifier. It runs on any `KVStore`: naive (recompute the whole
/// prefix every step), cached (a contiguous cache per sequence) or paged (blocks of a shared pool);
/// it works one step at a time over one sequence or a ragged batch of many. Checked in the tests:
/// the three stores give the same greedy tokens for 200+ steps and the same logits within a stated
/// tolerance, on a random model and on stories260K.bin, with exact cost counts; a batch gives each
/// sequence what it gets alone.
///
/// \par Measured
/// `bench/results/README.md`, "bench_generate: a whole model, three backends" (tokens per second
/// of each store, the weights streamed against the read bandwidth, where a step's time goes,
/// the prefill against Eigen's GEMM and its buffers reused from layer to layer: "the prefill's
/// fresh pages") and "bench_generate on the real model".
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvlab/cache/contiguous_kv_cache.hpp"
#include "kvlab/cache/paged_kv_cache.hpp"
#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/cpu/layer_ops.hpp"
#include "kvlab/matrix.hpp"
#include "kvlab/model/attention_step.hpp"
#include "kvlab/model/cache_policy.hpp"
#include "kvlab/model/llama_backend.hpp"
#include "kvlab/model/llama_config.hpp"
#include "kvlab/model/llama_counters.hpp"
#include "kvlab/model/llama_weights.hpp"
#include "kvlab/model/phase_times.hpp"
#include "kvlab/model/rope.hpp"
#include "kvlab/store/kv_store.hpp"

namespace kvlab {

/// The new tokens of one sequence in a batched step: a prompt, a chunk of one, or one decoded
/// token.
struct SequenceChunk {
  int seq = -1;             ///< the sequence (an id of the model's store)
  std::vector<int> tokens;  ///< its new token ids, in order, at least one
};

/// A Llama-style decoder on `LlamaWeights`, over a `KVStore` that keeps what it needs of past
/// tokens.
///
/// The forward pass of one token, in run.c's order (a step runs many at once):
///  1. x = the token's row of the embedding table;
///  2. per layer: xb = RMSNorm(x); then `attention_step`: q, k, v = xb Wqᵀ, xb Wkᵀ, xb Wvᵀ, RoPE
///     rotates q and k by the token's position, k and v join the past (the store), attention of
///     q over the past, x += attention · Woᵀ; then xb = RMSNorm(x); x += (SiLU(xb W1ᵀ) ⊙
///     (xb W3ᵀ)) W2ᵀ;
///  3. logits = RMSNorm(x) · classifierᵀ.
///
/// The stores differ only in how step 2 reaches the keys and values of past tokens (see
/// `LlamaBackend`): **naive** keeps the inputs and runs every token of a sequence through every
/// layer again (Θ(t) K/V projections per step, Θ(n²) over n tokens); **cached** and **paged**
/// keep K and V and compute the new tokens only (Θ(1) projections per decode step). All compute
/// the same function; they differ by rounding (sums in different orders), so greedy decoding
/// gives the same tokens unless two logits are within rounding of each other.
///
/// Two ways to use it:
///  - **one sequence** (the model owns its store): `prefill` a prompt, then `decode` one token
///    at a time; `reset` starts over;
///  - **many sequences in one step** (a store the caller shares, e.g. a `PagedStore` of one
///    pool): `forward_batch(batch)` takes a `SequenceChunk` per sequence — a prompt chunk or one
///    decode token each — sends all their rows through each weight matrix in one product (the
///    weights are read once per step for the whole batch) and runs each layer's attention as
///    one call over the ragged batch. Sequences are added and freed between steps through
///    `store()`.
/// Each step records its work in `last_step()` and adds it to `total()`. The weights are shared
/// (`shared_ptr<const>`), so many models can run the same weights.
class LlamaModel {
 public:
  /// A model of one sequence, with a store of its own for `backend`.
  /// \param weights     the weights (checked against their config)
  /// \param backend     how attention reaches past tokens
  /// \param block_size  tokens per block of the paged backend (unused by the others), >= 1
  /// \param max_tokens  the longest sequence; 0 means `config.seq_len`, the model's own limit
  /// \param kv_dtype    how the cached and paged backends store K and V (`KVDtype`)
  /// \param window      a sliding window: each query attends to its last `window` keys (0:
  ///                    all; `make_llama_store`)
  /// \throws InvalidArgument if `weights` is null or malformed, `block_size < 1`, `max_tokens`
  ///         is not in [0, seq_len], or `make_llama_store` refuses `kv_dtype` or `window`.
  LlamaModel(std::shared_ptr<const LlamaWeights> weights, LlamaBackend backend, int block_size = 16,
             int max_tokens = 0, KVDtype kv_dtype = KVDtype::fp32, int window = 0)
      : weights_(checked(std::move(weights))),
        max_tokens_(checked_max_tokens(weights_->config, block_size, max_tokens)),
        shape_(weights_->config.n_heads, weights_->config.n_kv_heads, weights_->config.head_dim()),
        rope_(weights_->config.head_dim(), max_tokens_, weights_->config.rope_theta),
        store_(make_llama_store(backend, weights_->config, max_tokens_, block_size, 1, kv_dtype,
                                window)),
        seq_(store_->add_sequence()),
        backend_(backend),
        block_size_(block_size) {}

  /// A model of one sequence, with a store of its own that keeps `policy`
  /// (`make_policy_store`: a windowed ring takes prompt chunks of up to W tokens, as the
  /// backend constructor's; a policy per head is a `SelectiveStore`).
  /// \param weights     the weights (checked against their config)
  /// \param policy      what the store keeps, and how (`CachePolicy`, `parse_cache_policy`)
  /// \param max_tokens  the longest sequence; 0 means `config.seq_len`, the model's own limit
  /// \throws InvalidArgument if `weights` is null or malformed, `max_tokens` is not in
  ///         [0, seq_len], or `make_policy_store` refuses the policy for this model.
  LlamaModel(std::shared_ptr<const LlamaWeights> weights, const CachePolicy& policy,
             int max_tokens = 0)
      : weights_(checked(std::move(weights))),
        max_tokens_(checked_max_tokens(weights_->config, policy.block_size, max_tokens)),
        shape_(weights_->config.n_heads, weights_->config.n_kv_heads, weights_->config.head_dim()),
        rope_(weights_->config.head_dim(), max_tokens_, weights_->config.rope_theta),
        store_(make_policy_store(policy, weights_->config, max_tokens_,
                                 std::max(1, std::min(policy.window, max_tokens_)), 1)),
        seq_(store_->add_sequence()),
        backend_(llama_backend_of(*store_)),
        block_size_(policy.block_size) {}

  /// A model over `store`, which may hold many sequences (and be shared): run them with
  /// `forward_batch(batch)`, add and free them through `store()`. This model owns no sequence of
  /// its own, so `prefill`, `decode`, `forward(tokens)`, `position`, `tokens` and `reset` refuse.
  /// \param weights     the weights (checked against their config)
  /// \param store       the store, shared (its layers, K/V heads and head_dim the model's); its
  ///                    type gives `backend()` (`llama_backend_of`)
  /// \param max_tokens  the longest sequence (the RoPE table); 0 means `config.seq_len`
  /// \throws InvalidArgument if `weights` or `store` is null, the store is not a
  ///         `RecomputeStore`, `ContiguousStore`, `PagedStore` or `SelectiveStore`, the store's
  ///         layers, K/V heads
  ///         or head_dim differ from the model's, or `max_tokens` is not in [0, seq_len].
  LlamaModel(std::shared_ptr<const LlamaWeights> weights, std::shared_ptr<KVStore<float>> store,
             int max_tokens = 0)
      : weights_(checked(std::move(weights))),
        max_tokens_(checked_max_tokens(weights_->config, 1, max_tokens)),
        shape_(weights_->config.n_heads, weights_->config.n_kv_heads, weights_->config.head_dim()),
        rope_(weights_->config.head_dim(), max_tokens_, weights_->config.rope_theta),
        store_(checked(std::move(store), weights_->config)),
        backend_(llama_backend_of(*store_)) {
    if (const PagedKVCacheBase* pool = store_->paged_pool()) block_size_ = pool->block_size();
  }

  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;
  /// Frees the model's own sequence (if it has one).
  ~LlamaModel() {
    if (seq_ >= 0 && store_->contains(seq_)) store_->free_sequence(seq_);
  }

  /// The model's shape.
  const LlamaConfig& config() const { return weights_->config; }
  /// The weights.
  const LlamaWeights& weights() const { return *weights_; }
  /// The backend, i.e. which kind of store the model runs on.
  LlamaBackend backend() const { return backend_; }
  /// Tokens per block of a paged store (for the other stores: the block size given, unused).
  int block_size() const { return block_size_; }
  /// The longest sequence this model runs.
  int max_tokens() const { return max_tokens_; }
  /// The head layout of every layer's attention.
  const AttentionShape& shape() const { return shape_; }
  /// The store (read-only): its sequences, their lengths, its bytes.
  const KVStore<float>& store() const { return *store_; }
  /// The store, to add, fork, truncate and free sequences between steps.
  KVStore<float>& store() { return *store_; }
  /// The model's own sequence in `store()`, or -1 for a model built over a store.
  int sequence() const { return seq_; }
  /// The work of the last step.
  const LlamaCounters& last_step() const { return last_step_; }
  /// The work of every step since construction or `reset`.
  const LlamaCounters& total() const { return total_; }

  /// From now on, times each step's phases and adds them to `phase_times()` (`on`), or stops
  /// (the default: a step then reads no clock). A timed step reads a steady clock about twenty
  /// times per layer; `bench_generate` prints the split.
  void time_phases(bool on) { time_phases_ = on; }
  /// The seconds of each phase of the steps timed since the model was made or `reset`
  /// (`time_phases`); all 0 when none was.
  const PhaseTimes& phase_times() const { return phase_times_; }

  /// One step over a ragged batch: sequence `batch[i].seq` of the store takes `batch[i].tokens`
  /// as its next tokens. Returns the logits after each sequence's last new token, [batch,
  /// vocab_size] (row i for batch[i]), or with `every_token` after every new token,
  /// [total new tokens, vocab_size], sequence after sequence. Each sequence gets what it would
  /// get alone, up to rounding (its rows share matrix products with the others').
  /// \throws InvalidArgument for an empty batch, a sequence that is not live or appears twice,
  ///         an empty chunk or a token id outside [0, vocab_size); CapacityError if a sequence
  ///         would exceed `max_tokens()` (or a contiguous store's capacity); OutOfBlocks if a
  ///         paged store lacks the blocks. Nothing changes in any of these cases.
  RowMatrix<float> forward_batch(const std::vector<SequenceChunk>& batch,
                                 bool every_token = false) {
    return step(batch, every_token, "kvlab::LlamaModel::forward_batch", false);
  }

  /// Number of tokens of the model's own sequence (the position of the next one).
  /// \throws InvalidArgument for a model built over a store (it has no sequence of its own).
  int position() const {
    return static_cast<int>(own_tokens("kvlab::LlamaModel::position").size());
  }
  /// The tokens of the model's own sequence, [position()].
  /// \throws InvalidArgument for a model built over a store.
  const std::vector<int>& tokens() const { return own_tokens("kvlab::LlamaModel::tokens"); }

  /// Feeds `tokens` to the model's own sequence at positions [position(), position() + p) and
  /// returns the logits after each, [p, vocab_size]: row i is the distribution of the token that
  /// follows tokens[i].
  /// One step, or, when the store limits a step (`KVStore::max_step_tokens`: a sliding
  /// window's ring), as many steps of at most that many tokens as it takes.
  /// \throws InvalidArgument if `tokens` is empty or holds an id outside [0, vocab_size), or
  ///         for a model built over a store; CapacityError if the sequence would exceed
  ///         `max_tokens()`. Either way nothing changes.
  RowMatrix<float> forward(const std::vector<int>& tokens) {
    return own_steps("kvlab::LlamaModel::forward", tokens, true);
  }

  /// Feeds a prompt (or any run of tokens) at once — in chunks when the store limits a step, as
  /// `forward` does — and returns the logits after its last token, [vocab_size]: the
  /// distribution of the first generated token. The classifier runs on the last position only.
  /// \throws as `forward(tokens)`.
  RowVector<float> prefill(const std::vector<int>& tokens) {
    return own_steps("kvlab::LlamaModel::prefill", tokens, false).row(0);
  }

  /// Feeds one token and returns the logits after it, [vocab_size].
  /// \throws InvalidArgument if `token` is outside [0, vocab_size), or for a model built over a
  ///         store; CapacityError if no position is left (`position() == max_tokens()`).
  ///         Either way nothing changes.
  RowVector<float> decode(int token) {
    constexpr const char* kWhere = "kvlab::LlamaModel::decode";
    SequenceChunk chunk = own_chunk(kWhere, {token});
    if (token < 0 || token >= config().vocab_size) {
      detail::fail(kWhere, "token", "an id in [0, " + std::to_string(config().vocab_size) + ")",
                   token);
    }
    if (position() >= max_tokens_) {
      detail::fail<CapacityError>(
          kWhere, "position()",
          "below max_tokens (" + std::to_string(max_tokens_) + "): a position for the token",
          position());
    }
    return step({std::move(chunk)}, false, kWhere, true).row(0);
  }

  /// Forgets every token of the model's own sequence and zeroes the counters (a contiguous
  /// cache's memory stays reserved).
  /// \throws InvalidArgument for a model built over a store.
  void reset() {
    own_tokens("kvlab::LlamaModel::reset");
    store_->truncate(seq_, 0);
    tokens_.clear();
    last_step_ = LlamaCounters{};
    total_ = LlamaCounters{};
    phase_times_ = PhaseTimes{};
  }

  /// The contiguous cache of the model's own sequence, or null (another store, a cache that
  /// stores its rows in another type than float, or no sequence of its own).
  const ContiguousKVCache<float>* contiguous_cache() const {
    const auto* store = dynamic_cast<const ContiguousStore<float>*>(store_.get());
    return store != nullptr && seq_ >= 0 ? &store->cache(seq_) : nullptr;
  }
  /// The block pool of a paged store (its bookkeeping: blocks, tables, bytes per token), or
  /// null for the other stores.
  const PagedKVCacheBase* paged_cache() const { return store_->paged_pool(); }

 private:
  static std::shared_ptr<const LlamaWeights> checked(std::shared_ptr<const LlamaWeights> weights) {
    if (!weights) detail::fail("kvlab::LlamaModel", "weights", "non-null weights", "nullptr");
    weights->check("kvlab::LlamaModel");
    return weights;
  }
  static std::shared_ptr<KVStore<float>> checked(std::shared_ptr<KVStore<float>> store,
                                                 const LlamaConfig& c) {
    constexpr const char* kWhere = "kvlab::LlamaModel";
    if (!store) detail::fail(kWhere, "store", "a non-null store", "nullptr");
    detail::require_equal(kWhere, "store->num_layers()", store->num_layers(), c.n_layers,
                          "n_layers");
    detail::require_equal(kWhere, "store->num_kv_heads()", store->num_kv_heads(), c.n_kv_heads,
                          "n_kv_heads");
    detail::require_equal(kWhere, "store->head_dim()", store->head_dim(), c.head_dim(),
                          "dim / n_heads");
    return store;
  }
  // The sequence limit (max_tokens, 0 meaning seq_len), checked with block_size before anything
  // is allocated.
  static int checked_max_tokens(const LlamaConfig& c, int block_size, int max_tokens) {
    constexpr const char* kWhere = "kvlab::LlamaModel";
    detail::require_at_least(kWhere, "block_size", block_size, 1);
    if (max_tokens < 0 || max_tokens > c.seq_len) {
      detail::fail(kWhere, "max_tokens", "in [0, seq_len (" + std::to_string(c.seq_len) + ")]",
                   max_tokens);
    }
    return max_tokens == 0 ? c.seq_len : max_tokens;
  }

  // The own sequence's tokens; a truncate through store() shortens them here too.
  const std::vector<int>& own_tokens(const char* where) const {
    if (seq_ < 0) {
      detail::fail(where, "model",
                   "a model of one sequence (built with a LlamaBackend or a CachePolicy)",
                   "a model built over a store: use forward_batch(batch)");
    }
    const auto length = static_cast<std::size_t>(store_->length(seq_));
    if (tokens_.size() > length) tokens_.resize(length);
    return tokens_;
  }
  SequenceChunk own_chunk(const char* where, const std::vector<int>& tokens) const {
    own_tokens(where);
    return SequenceChunk{seq_, tokens};
  }

  // Feeds `tokens` to the model's own sequence in steps of at most the store's
  // max_step_tokens() (one step unless a windowed ring limits it), all of them checked first,
  // and returns the logits of every token or of the last.
  RowMatrix<float> own_steps(const char* where, const std::vector<int>& tokens, bool every_token) {
    const std::vector<SequenceChunk> all{own_chunk(where, tokens)};
    const auto limit = static_cast<std::size_t>(store_->max_step_tokens());
    if (tokens.size() <= limit) return step(all, every_token, where, true);
    check_batch(all, where, true);  // the whole run, before any step
    RowMatrix<float> logits;        // [tokens or 1, vocab_size]
    for (std::size_t begin = 0; begin < tokens.size(); begin += limit) {
      const std::size_t end = std::min(tokens.size(), begin + limit);
      const RowMatrix<float> part = step(
          {own_chunk(where, std::vector<int>(tokens.begin() + static_cast<std::ptrdiff_t>(begin),
                                             tokens.begin() + static_cast<std::ptrdiff_t>(end)))},
          every_token, where, true);
      if (!every_token) {
        logits = part;
      } else {
        logits.conservativeResize(static_cast<Eigen::Index>(end), part.cols());
        logits.bottomRows(part.rows()) = part;
      }
    }
    return logits;
  }

  // Checks `batch` (naming arguments as `where` was called: "tokens" for the model's own
  // sequence, "batch[i].tokens" otherwise): ids, live distinct sequences, room in max_tokens.
  // Returns the new tokens' CSR row pointers, [batch + 1].
  std::vector<std::int32_t> check_batch(const std::vector<SequenceChunk>& batch, const char* where,
                                        bool own) const {
    const LlamaConfig& c = config();
    detail::require_at_least(where, "batch.size()", batch.size(), std::size_t{1});
    std::vector<std::int32_t> new_indptr{0};  // [batch + 1]
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const std::string name =
          own ? std::string("tokens") : "batch[" + std::to_string(i) + "].tokens";
      const std::vector<int>& tokens = batch[i].tokens;
      detail::require_at_least(where, name + ".size()", tokens.size(), std::size_t{1});
      for (std::size_t j = 0; j < tokens.size(); ++j) {
        if (tokens[j] < 0 || tokens[j] >= c.vocab_size) {
          detail::fail(where, name + "[" + std::to_string(j) + "]",
                       "an id in [0, " + std::to_string(c.vocab_size) + ")", tokens[j]);
        }
      }
      if (!store_->contains(batch[i].seq)) {
        detail::fail(where, "batch[" + std::to_string(i) + "].seq", "a live sequence of the store",
                     batch[i].seq);
      }
      const int length = store_->length(batch[i].seq);
      if (length > max_tokens_ || tokens.size() > static_cast<std::size_t>(max_tokens_ - length)) {
        detail::fail<CapacityError>(where, name + ".size()",
                                    "at most " + std::to_string(max_tokens_ - length) +
                                        " (max_tokens " + std::to_string(max_tokens_) +
                                        ", position " + std::to_string(length) + ")",
                                    tokens.size());
      }
      new_indptr.push_back(new_indptr.back() + static_cast<std::int32_t>(tokens.size()));
    }
    return new_indptr;
  }

  // Checks `batch` (`check_batch`), runs one step, and returns the logits of each sequence's
  // last new token, or of every new token.
  RowMatrix<float> step(const std::vector<SequenceChunk>& batch, bool every_token,
                        const char* where, bool own) {
    const LlamaConfig& c = config();
    const auto start = std::chrono::steady_clock::now();
    PhaseTimes* times = time_phases_ ? &phase_times_ : nullptr;  // where the phases go, if timed
    using detail::timed;
    const std::vector<std::int32_t> new_indptr = check_batch(batch, where, own);  // [batch + 1]
    std::vector<int> seqs;                                                        // [batch]
    for (const SequenceChunk& chunk : batch) seqs.push_back(chunk.seq);
    // 1. The new tokens' rows of the embedding table, sequence after sequence.
    RowMatrix<float> embedded(new_indptr.back(), c.dim);  // [new tokens, dim]
    for (std::size_t i = 0, row = 0; i < batch.size(); ++i)
      for (int id : batch[i].tokens)
        embedded.row(static_cast<Eigen::Index>(row++)) = weights_->token_embedding.row(id);

    LlamaCounters counters;
    RowMatrix<float> x;  // [step rows, dim]: the residual stream of every row the step computes
    // aborted unless committed
    OpenStep<float> open_step(*store_, seqs, new_indptr, embedded, x, where);
    // 2. The layers.
    // Buffers reused from layer to layer: allocated afresh for each layer, a prefill's buffers
    // are new pages each time, which the system must zero.
    StepScratch<float> scratch;
    MlpScratch mlp_scratch;
    RowMatrix<float> xb, out;  // [step rows, dim], [rows that carry on, dim]
    for (int l = 0; l < c.n_layers; ++l) {
      const LlamaLayerWeights& w = weights_->layers[static_cast<std::size_t>(l)];
      const bool top = l + 1 == c.n_layers;
      // attention's RMSNorm
      timed(times, &PhaseTimes::norms, [&] { cpu::rmsnorm(x, w.rms_att, xb, c.norm_eps); });
      attention_step(shape_, AttentionWeights<float>{w.wq, w.wk, w.wv, w.wo}, &rope_, *store_, l,
                     top, xb, out, scratch, counters.attention, times);
      add_residual(open_step.batch(), x, out);
      mlp(w, x, mlp_scratch, counters, times);  // x += MLP(x)
    }
    // 3. Final RMSNorm and classifier, on the rows whose logits are wanted: x now holds the
    // new tokens, sequence after sequence.
    RowMatrix<float> last;  // [rows wanted, dim]
    if (every_token) {
      last = std::move(x);
    } else {
      last.resize(static_cast<Eigen::Index>(batch.size()), c.dim);
      for (std::size_t i = 0; i < batch.size(); ++i)
        last.row(static_cast<Eigen::Index>(i)) = x.row(new_indptr[i + 1] - 1);
    }
    RowMatrix<float> normed, logits;  // [rows wanted, dim], [rows wanted, vocab_size]
    timed(times, &PhaseTimes::norms,
          [&] { cpu::rmsnorm(last, weights_->rms_final, normed, c.norm_eps); });
    timed(times, &PhaseTimes::classifier,
          [&] { cpu::linear(normed, weights_->classifier(), logits); });
    counters.classifier_macs += static_cast<std::uint64_t>(last.rows()) *
                                static_cast<std::uint64_t>(c.dim) *
                                static_cast<std::uint64_t>(c.vocab_size);

    // 4. The step kept: the store's (a failure anywhere above aborted it), then the model's own.
    std::size_t own_tokens = tokens_.size();
    for (const SequenceChunk& chunk : batch)
      if (chunk.seq == seq_) own_tokens += chunk.tokens.size();
    tokens_.reserve(own_tokens);  // so that nothing below can fail
    open_step.commit();
    for (const SequenceChunk& chunk : batch)
      if (chunk.seq == seq_)
        tokens_.insert(tokens_.end(), chunk.tokens.begin(), chunk.tokens.end());
    last_step_ = counters;
    total_ += counters;
    if (times != nullptr)
      times->total +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return logits;
  }

  // The MLP block's buffers, kept from layer to layer of a step.
  struct MlpScratch {
    RowMatrix<float> xb;   // [rows, dim]: RMSNorm(x)
    RowMatrix<float> hb;   // [rows, hidden_dim]: the gate, then SiLU(gate) ⊙ up
    RowMatrix<float> hb2;  // [rows, hidden_dim]: up
    RowMatrix<float> out;  // [rows, dim]: down
  };

  // x += W2 (SiLU(W1 RMSNorm(x)) ⊙ W3 RMSNorm(x)): the MLP block and its residual.
  // `times`: where not null, receives the seconds of the norm and the products.
  void mlp(const LlamaLayerWeights& w, RowMatrix<float>& x, MlpScratch& scratch, LlamaCounters& c,
           PhaseTimes* times) const {
    using detail::timed;
    RowMatrix<float>& xb = scratch.xb;
    RowMatrix<float>& hb = scratch.hb;
    RowMatrix<float>& hb2 = scratch.hb2;
    RowMatrix<float>& out = scratch.out;
    // ffn RMSNorm
    timed(times, &PhaseTimes::norms, [&] { cpu::rmsnorm(x, w.rms_ffn, xb, config().norm_eps); });
    // gate: xb W1^T, up: xb W3^T
    timed(times, &PhaseTimes::matmuls, [&] { cpu::linear(xb, {{w.w1, hb}, {w.w3, hb2}}); });
    // SiLU(gate) * up
    hb.array() = hb.array() * (1.0f + (-hb.array()).exp()).inverse() * hb2.array();
    timed(times, &PhaseTimes::matmuls, [&] { cpu::linear(hb, w.w2, out); });  // down: W2
    x += out;                                                                 // residual
    c.mlp_macs += 3 * static_cast<std::uint64_t>(x.rows()) *
                  static_cast<std::uint64_t>(config().dim) *
                  static_cast<std::uint64_t>(config().hidden_dim);
  }

  std::shared_ptr<const LlamaWeights> weights_;
  int max_tokens_;
  AttentionShape shape_;
  RotaryEmbedding rope_;                   // [max_tokens] positions
  std::shared_ptr<KVStore<float>> store_;  // what the model keeps of past tokens
  int seq_ = -1;                           // the model's own sequence in store_, or -1
  LlamaBackend backend_;                   // the kind of store_
  int block_size_ = 16;                    // tokens per block of a paged store_
  mutable std::vector<int> tokens_;        // [position]: the own sequence's (trimmed lazily)
  LlamaCounters last_step_;
  LlamaCounters total_;
  bool time_phases_ = false;  // whether steps time their phases (`time_phases`)
  PhaseTimes phase_times_;    // the phases' seconds so far
};

}  // namespace kvlab
