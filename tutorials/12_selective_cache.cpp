// Tutorial 12: selective caching — what each head keeps of the past, head by head.
//
// What you will learn:
//  1. A cache policy can differ from head to head: a policy written as text,
//     "cached,window=6,sinks=2,h2o=3,full_layers=0,full_heads=1.1", keeps every token in layer 0
//     and in K/V head 1 of layer 1, and in every other head only a window of 6 keys, the first 2
//     tokens (attention sinks) and the 3 tokens that received the most attention so far (heavy
//     hitters, H2O). kvlab::make_policy_store makes it a SelectiveStore.
//  2. What each head holds after each decode step, drawn as a row per head: the sinks stay, the
//     window slides, and the heavy hitters are chosen by the attention each row received.
//  3. Its memory: a head holds min(n, S + W − 1 + H) rows, each its key and value row; the store
//     counts exactly those bytes.
//  4. Why a paged cache does not drop single tokens: one block table serves every layer and head
//     of a sequence, and a block goes back only when none of them holds a row of it; a paged
//     pool gives back whole blocks (a window) instead.
//  5. A policy that keeps every token at fp32 in every head computes what the full cache computes.
//  6. Not caching a layer at all (kvlab::PartialCacheDecoder): its K/V must come from its input,
//     which must be kept (576 values a token in SmolLM2, more than its K and V, 2 x 192) or
//     recomputed through every layer below; the counters show each cost.
// It checks itself: it exits non-zero if a head holds other rows than its policy says, the bytes
// differ from the closed form, or the full policy's logits differ from the full cache's.
//
// Build and run (from the repository root, with `build/` configured by CMake):
//   cmake --build build --target tutorial_12_selective_cache
//   build/tutorials/12_selective_cache
// Option (the exercises of its page change it): --policy TEXT, the policy of parts 1 to 3 (the
// one above; any that kvlab::make_policy_store makes a SelectiveStore).
//
// Next: kvlab-eval measures what such policies cost a real model (the docs' page "what a smaller
// cache costs"); kvlab-chat --policy P chats on one.

#include <kvlab/kvlab.hpp>

#include "support/command_line.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    std::printf("  FAILED: %s\n", what);
    ++failures;
  }
}

// The prompt and the tokens decoded after it: fixed ids of the built-in model's vocabulary.
std::vector<int> tokens(int n) {
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back((i * 37 + 11) % 256);
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  std::string text = "cached,window=6,sinks=2,h2o=3,full_layers=0,full_heads=1.1";
  kvlab_support::CommandLine command_line{"Tutorial 12: selective caching"};
  command_line.add_text("--policy", text, "the cache policy of parts 1 to 3, a policy per head");
  if (const auto stop = command_line.parse("12_selective_cache", argc, argv))
    return *stop;
  auto weights = std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin());
  const kvlab::LlamaConfig& config = weights->config;  // 3 layers, 2 K/V heads of 8 values
  const int max_tokens = 64;
  std::shared_ptr<kvlab::KVStore<float>> store;
  try {
    store = kvlab::make_policy_store(kvlab::parse_cache_policy(text), config, max_tokens, 8);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "12_selective_cache: --policy: %s (try --help)\n", e.what());
    return 2;
  }
  const auto* chosen = dynamic_cast<const kvlab::SelectiveStore<float>*>(store.get());
  if (chosen == nullptr) {
    std::fprintf(stderr, "12_selective_cache: --policy: expected a policy that gives heads their "
                 "own rows (a SelectiveStore: heavy hitters, full_layers or full_heads), got '%s', "
                 "of which kvlab::make_policy_store makes a '%s' store (try --help)\n",
                 text.c_str(), store->name());
    return 2;
  }
  const kvlab::SelectiveStore<float>& selective = *chosen;

  std::printf("1. The policy '%s', head by head:\n", text.c_str());
  for (int l = 0; l < config.n_layers; ++l) {
    for (int h = 0; h < config.n_kv_heads; ++h) {
      const kvlab::HeadPolicy& p = selective.policy(l, h);
      std::printf("   layer %d, K/V head %d: %s\n", l, h,
                  p.window == 0 ? "every token"
                                : ("a window of " + std::to_string(p.window) + ", " +
                                   std::to_string(p.sinks) + " sinks, " + std::to_string(p.heavy) +
                                   " heavy hitters")
                                      .c_str());
    }
  }

  std::printf(
      "\n2. What each head holds: a prompt of 8 tokens in one step, then one token a step\n"
      "   ('s' a sink, 'w' in the next token's window, 'h' a heavy hitter, '#' kept by a\n"
      "   head that keeps every token, '.' dropped)\n");
  kvlab::LlamaModel model(weights, store, max_tokens);
  const int seq = store->add_sequence();
  const std::vector<int> ids = tokens(24);
  (void)model.forward_batch(
      {kvlab::SequenceChunk{seq, std::vector<int>(ids.begin(), ids.begin() + 8)}});
  for (int n = 8; n <= 24; ++n) {
    if (n > 8)
      (void)model.forward_batch(
          {kvlab::SequenceChunk{seq, {ids[static_cast<std::size_t>(n - 1)]}}});
    const bool show = n == 8 || n == 12 || n == 24;
    if (show) std::printf("   after %d tokens\n", n);
    std::size_t bytes = 0;  // the closed form: rows held times a row's key and value bytes
    for (int l = 0; l < config.n_layers; ++l) {
      for (int h = 0; h < config.n_kv_heads; ++h) {
        const kvlab::HeadPolicy& p = selective.policy(l, h);
        const std::vector<int> held = selective.held_positions(seq, l, h);
        std::string row;
        for (int pos = 0; pos < n; ++pos) {
          const bool kept = std::binary_search(held.begin(), held.end(), pos);
          // [loops]: why a row is held, from the policy
          const bool sink = p.window > 0 && pos < p.sinks;
          const bool recent = p.window > 0 && pos > n - p.window;
          row += !kept ? '.' : p.window == 0 ? '#' : sink ? 's' : recent ? 'w' : 'h';
          if (p.window > 0 && (sink || recent) && !kept)
            check(false, "a sink or the window dropped");
        }
        if (show)
          std::printf("     layer %d head %d  %-24s %2zu rows\n", l, h, row.c_str(), held.size());
        check(static_cast<long long>(held.size()) == p.rows_held(n),
              "rows held = min(n, S + W - 1 + H)");
        bytes += held.size() * 2 * kvlab::storage_row_bytes<float>(config.head_dim());
      }
    }
    check(store->bytes_used() == bytes, "bytes = rows held x row bytes");
    if (show) {
      std::printf("     %zu bytes held; the full cache %zu\n", store->bytes_used(),
                  static_cast<std::size_t>(n) * store->bytes_per_token());
    }
  }

  std::printf(
      "\n3. The same 24 tokens in a paged pool (kvlab::PagedKVCache, blocks of 4 tokens): one\n"
      "   block table per sequence serves every layer and head (as in vLLM), so a block can go\n"
      "   back to the pool only when no head of any layer holds a row of it\n");
  constexpr int kBlock = 4;
  kvlab::PagedKVCache<float> pool(config.n_layers, config.n_kv_heads, config.head_dim(), kBlock,
                                  /*num_blocks=*/8);
  const int pooled = pool.add_sequence();
  (void)pool.reserve(pooled, 24);  // the slots of the 24 tokens, in every layer
  const auto table = [](const std::vector<std::int32_t>& blocks) {
    std::string entries;  // '-': a block given back
    for (std::int32_t b : blocks)
      entries += b == kvlab::kReleasedBlock ? " -" : " " + std::to_string(b);
    return entries;
  };
  std::printf("   table [%s ]; rows held per block (%d slots each):\n",
              table(pool.blocks(pooled)).c_str(), kBlock);
  const int num_blocks = static_cast<int>(pool.blocks(pooled).size());
  // [layers + 1][24]: whether some head of layer l holds position pos; the last row, any layer
  std::vector<std::vector<bool>> held_by(static_cast<std::size_t>(config.n_layers + 1),
                                         std::vector<bool>(24, false));
  for (int l = 0; l < config.n_layers; ++l) {
    for (int h = 0; h < config.n_kv_heads; ++h) {
      for (int pos : selective.held_positions(seq, l, h)) {
        held_by[static_cast<std::size_t>(l)][static_cast<std::size_t>(pos)] = true;
        held_by.back()[static_cast<std::size_t>(pos)] = true;
      }
    }
  }
  std::vector<int> any_layer;  // [blocks]: rows of each block that some head of some layer holds
  for (int l = 0; l <= config.n_layers; ++l) {
    std::string rows_per_block;
    int blocks_used = 0, rows_held = 0;
    for (int b = 0; b < num_blocks; ++b) {
      int rows = 0;
      for (int pos = b * kBlock; pos < (b + 1) * kBlock; ++pos)
        rows += held_by[static_cast<std::size_t>(l)][static_cast<std::size_t>(pos)] ? 1 : 0;
      rows_per_block += " " + std::to_string(rows);
      blocks_used += rows > 0 ? 1 : 0;
      rows_held += rows;
      if (l == config.n_layers) any_layer.push_back(rows);
    }
    const std::string who = l < config.n_layers ? "layer " + std::to_string(l) : "any layer";
    std::printf("     %-9s [%s ]  %2d rows in %d blocks (%2d slots)\n", who.c_str(),
                rows_per_block.c_str(), rows_held, blocks_used, blocks_used * kBlock);
  }
  const int free_blocks = static_cast<int>(std::count(any_layer.begin(), any_layer.end(), 0));
  std::printf(
      "   %d of %d blocks hold no row of any layer; the pool keeps %d blocks, %zu bytes (the full\n"
      "   cache's), where the selective store holds %zu\n",
      free_blocks, num_blocks, pool.held_blocks(pooled),
      static_cast<std::size_t>(pool.held_blocks(pooled)) * pool.block_bytes(), store->bytes_used());
  check(pool.held_blocks(pooled) * kBlock == 24,
        "the pool keeps every block of the 24 tokens, whatever the heads hold");

  // [window]: what a paged pool gives back instead: whole blocks before the window
  kvlab::PagedKVCache<float> windowed(config.n_layers, config.n_kv_heads, config.head_dim(), kBlock,
                                      /*num_blocks=*/8, kvlab::KVLayout::NHD, /*window=*/6,
                                      /*sinks=*/2);
  const int slid = windowed.add_sequence();
  (void)windowed.reserve(slid, 24);
  const int released = windowed.release_out_of_window(slid);
  std::printf(
      "   Paged systems give back whole blocks instead: a pool with a window of 6 and 2 sinks\n"
      "   (release_out_of_window) after the same 24 tokens: table [%s ], %d blocks back, %d\n"
      "   held; or they preempt a whole sequence when blocks run out (kvlab::Scheduler).\n",
      table(windowed.blocks(slid)).c_str(), released, windowed.held_blocks(slid));
  check(windowed.held_blocks(slid) == 3, "the sinks' block and the window's two are kept");

  std::printf(
      "\n4. Every head whole at fp32 ('cached,window=6,full_layers=0+1+2'): the full cache\n");
  auto whole = kvlab::make_policy_store(
      kvlab::parse_cache_policy("cached,window=6,full_layers=0+1+2"), config, max_tokens, 8);
  kvlab::LlamaModel ours(weights, whole, max_tokens);
  kvlab::LlamaModel full(weights, kvlab::LlamaBackend::Cached, 16, max_tokens);
  const int s = whole->add_sequence();
  const kvlab::RowMatrix<float> a = ours.forward_batch({kvlab::SequenceChunk{s, ids}}, true);
  const kvlab::RowMatrix<float> b = full.forward(ids);
  const double diff = (a - b).cwiseAbs().maxCoeff();
  std::printf("   store '%s', 24 tokens: largest logit difference %.1e (the order of the sums)\n",
              whole->name(), diff);
  check(diff <= 1e-5 * std::max(1.0f, b.cwiseAbs().maxCoeff()),
        "every head whole = the full cache");

  std::printf(
      "\n5. Not caching a layer: two attention layers of SmolLM2-135M's shape (d_model 576,\n"
      "   9 query heads, 3 K/V heads of 64; random weights), one decode step after 255 tokens\n");
  const auto stack =
      kvlab::AttentionStack<float>::random(2, kvlab::AttentionShape(9, 3, 64), 576, 12);
  kvlab::Rng rng(12);
  const kvlab::RowMatrix<float> x = kvlab::random_matrix<float>(256, 576, rng);  // [256, 576]
  kvlab::CachedDecoder<float> both(stack, 256);
  kvlab::PartialCacheDecoder<float> input_kept(stack, 256, {1});  // layer 1 keeps its input
  kvlab::PartialCacheDecoder<float> nothing(stack, 256, {0, 1});  // only the model's input
  std::printf("   %-32s %14s %14s %16s\n", "kept per token", "bytes/token", "K/V projected",
              "multiply-adds");
  const auto row = [&](const char* what, kvlab::Decoder<float>& d, std::size_t bytes) {
    (void)d.prefill(x.topRows(255));
    const kvlab::RowVector<float> y = d.decode(x.row(255));
    std::printf("   %-32s %14zu %14llu %16llu\n", what, bytes,
                static_cast<unsigned long long>(d.last_step().kv_projections),
                static_cast<unsigned long long>(d.last_step().macs));
    return y;
  };
  const kvlab::RowVector<float> y0 =
      row("K and V of both layers", both, both.store().bytes_per_token());
  const kvlab::RowVector<float> y1 =
      row("layer 1: its input, not K/V", input_kept, input_kept.bytes_per_token());
  const kvlab::RowVector<float> y2 =
      row("nothing: layers 0-1 recomputed", nothing, nothing.bytes_per_token());
  std::printf(
      "   Layer 1's input is 576 values a token, its K and V 2 x 192: under grouped-query\n"
      "   attention not caching a layer costs memory as well as 255 x 3 K/V projections a step.\n"
      "   Keeping nothing saves memory, and recomputes every position of every layer below.\n");
  const std::uint64_t t = 255;
  check(input_kept.bytes_per_token() == (2 * 192 + 576) * sizeof(float),
        "a layer's input kept instead of its K/V: 576 + 2 x 192 values a token");
  check(input_kept.last_step().kv_projections == both.last_step().kv_projections + 3 * t,
        "layer 1's K/V projected again for the 255 past tokens");
  check(nothing.last_step().q_projections == both.last_step().q_projections + 9 * t,
        "layer 0's queries computed again for the 255 past tokens");
  const float scale = std::max(1.0f, y0.cwiseAbs().maxCoeff());
  check((y1 - y0).cwiseAbs().maxCoeff() <= 1e-5f * scale &&
            (y2 - y0).cwiseAbs().maxCoeff() <= 1e-5f * scale,
        "the same outputs as the cached decoder (fp32 sums in another order)");

  std::printf(failures == 0 ? "\nAll checks passed.\n" : "\n%d check(s) FAILED.\n", failures);
  return failures == 0 ? 0 : 1;
}
