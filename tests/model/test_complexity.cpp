// The cost of decoding, from exact counters (never from clocks): totals equal their closed
// forms, and the log-log slopes over n = 64 … 2048 are 2 (naive) and 1 (cached) for K/V
// projections.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kvlab/kvlab.hpp"
#include "support/stats.hpp"

using kvlab::AttentionShape;
using kvlab::AttentionStack;
using kvlab::CachedDecoder;
using kvlab::CostCounters;
using kvlab::NaiveDecoder;
using kvlab::RowMatrix;
using kvlab::RowVector;

namespace {

using u64 = std::uint64_t;

// Feeds a `prompt`-token prompt then decodes up to n tokens; returns the totals after each
// of the n positions (index t - 1 holds the totals once t tokens have been consumed, for
// t >= prompt).
template <typename Decoder>
std::vector<CostCounters> run(Decoder& decoder, const RowMatrix<float>& inputs, int prompt) {
  std::vector<CostCounters> totals(static_cast<std::size_t>(inputs.rows()));
  (void)decoder.prefill(inputs.topRows(prompt));
  totals[static_cast<std::size_t>(prompt - 1)] = decoder.total();
  for (int t = prompt; t < inputs.rows(); ++t) {
    (void)decoder.decode(inputs.row(t));
    totals[static_cast<std::size_t>(t)] = decoder.total();
  }
  return totals;
}

using kvlab_support::log_log_slope;  // the least-squares slope of log y against log x

}  // namespace

TEST_CASE("per-step and total counts equal their closed forms") {
  const int heads = 4, kv_heads = 2, head_dim = 8, d_model = 16, n = 40;
  kvlab::Rng rng(1);
  const RowMatrix<float> inputs = kvlab::random_matrix<float>(n, d_model, rng);
  for (int layers : {1, 2, 3}) {
    for (int prompt : {1, 7}) {
      INFO("layers " << layers << ", prompt " << prompt);
      const auto stack = AttentionStack<float>::random(
          layers, AttentionShape(heads, kv_heads, head_dim), d_model, 2);
      NaiveDecoder<float> naive(stack);
      CachedDecoder<float> cached(stack, n);
      const std::vector<CostCounters> nt = run(naive, inputs, prompt);
      const std::vector<CostCounters> ct = run(cached, inputs, prompt);
      const u64 L = static_cast<u64>(layers), H = heads, Hkv = kv_heads,
                P = static_cast<u64>(prompt);

      // The last step (t = n tokens): naive re-projects all n, cached only the new one.
      CHECK(naive.last_step().kv_projections == L * Hkv * n);
      CHECK(cached.last_step().kv_projections == L * Hkv);
      // Scores in the last step: cached t per head per layer; naive t per head at the top
      // layer plus t² per head in each lower layer (all positions recomputed).
      CHECK(cached.last_step().qk_dots == L * H * n);
      CHECK(naive.last_step().qk_dots == H * n + (L - 1) * H * n * n);

      for (u64 t = P; t <= static_cast<u64>(n); ++t) {
        const CostCounters& a = nt[t - 1];
        const CostCounters& b = ct[t - 1];
        // K/V projections: naive P + (P+1) + … + t; cached t.
        const u64 naive_kv = t * (t + 1) / 2 - P * (P - 1) / 2;
        REQUIRE(a.kv_projections == L * Hkv * naive_kv);
        REQUIRE(b.kv_projections == L * Hkv * t);
        // Query projections: cached one per token; naive t per lower layer, new tokens at the top.
        const u64 recomputed = naive_kv;  // positions run through each lower layer
        REQUIRE(b.q_projections == L * H * t);
        REQUIRE(a.q_projections == H * t + (L - 1) * H * recomputed);
        // Scores, cached: the prompt's causal triangle P(P+1)/2, then t' per decode step.
        REQUIRE(b.qk_dots == L * H * (t * (t + 1) / 2));
        // Scores, naive: every step materialises [rows, t'] per head: the top layer's new rows
        // (P rows in the prefill, 1 after) and all t' rows in each lower layer.
        u64 naive_dots = P * P, lower_dots = 0;
        for (u64 s = P + 1; s <= t; ++s) naive_dots += s;
        for (u64 s = P; s <= t; ++s) lower_dots += s * s;
        REQUIRE(a.qk_dots == H * naive_dots + (L - 1) * H * lower_dots);
        // Bytes of K/V read: cached, each of the t' rows once per K/V head per step (one query
        // tile: P <= 16); naive, each row once per query head per layer per step.
        REQUIRE(b.kv_bytes_read == L * Hkv * 2 * head_dim * sizeof(float) * naive_kv);
        REQUIRE(a.kv_bytes_read == L * H * 2 * head_dim * sizeof(float) * naive_kv);
        // Multiply-adds: d_model * head_dim per query (projection in, projection out), 2 *
        // d_model * head_dim per K/V projection, 2 * head_dim per score (q.k and p.v).
        for (const CostCounters* c : {&a, &b}) {
          REQUIRE(c->macs ==
                  2 * static_cast<u64>(head_dim) *
                      (static_cast<u64>(d_model) * (c->q_projections + c->kv_projections) +
                       c->qk_dots));
        }
      }
    }
  }
}

TEST_CASE(
    "K/V projections: Θ(n²) without a cache, Θ(n) with one, by log-log slope over n = 64 … 2048") {
  // The smallest model: what is counted does not depend on the widths.
  const int n = 2048;
  const auto stack = AttentionStack<float>::random(1, AttentionShape(1, 1, 1), 1, 3);
  kvlab::Rng rng(3);
  const RowMatrix<float> inputs = kvlab::random_matrix<float>(n, 1, rng);
  NaiveDecoder<float> naive(stack);
  CachedDecoder<float> cached(stack, n);
  const std::vector<CostCounters> nt = run(naive, inputs, 1);
  const std::vector<CostCounters> ct = run(cached, inputs, 1);

  std::vector<double> ns, naive_kv, cached_kv, naive_dots, cached_dots;
  for (int m = 64; m <= n; m *= 2) {
    const auto i = static_cast<std::size_t>(m - 1);
    const u64 um = static_cast<u64>(m);
    REQUIRE(nt[i].kv_projections == um * (um + 1) / 2);  // 1 + 2 + … + m
    REQUIRE(ct[i].kv_projections == um);
    ns.push_back(m);
    naive_kv.push_back(static_cast<double>(nt[i].kv_projections));
    cached_kv.push_back(static_cast<double>(ct[i].kv_projections));
    naive_dots.push_back(static_cast<double>(nt[i].qk_dots));
    cached_dots.push_back(static_cast<double>(ct[i].qk_dots));
  }
  CHECK(log_log_slope(ns, naive_kv) == Approx(2.0).margin(0.05));
  CHECK(log_log_slope(ns, cached_kv) == Approx(1.0).margin(0.05));
  // With one layer the scores are Θ(n²) either way: the cache saves projections, not scores.
  CHECK(log_log_slope(ns, naive_dots) == Approx(2.0).margin(0.05));
  CHECK(log_log_slope(ns, cached_dots) == Approx(2.0).margin(0.05));
  CHECK(nt.back().qk_dots == ct.back().qk_dots);
}
