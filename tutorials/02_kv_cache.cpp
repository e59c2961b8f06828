// Tutorial 02: the KV cache.
//
// What you will learn:
//  1. Why K and V can be kept: a token's key and value depend only on that token's input to the
//     layer and on fixed weights, so once computed they never change. kvlab::CachedDecoder keeps
//     them in a kvlab::ContiguousKVCache and appends one row per K/V head and layer per token.
//  2. Why Q is not kept: a token's query is used once, in its own step; later tokens attend to
//     earlier keys and values, never to earlier queries.
//  3. Prefill and decode: the prompt goes in at once (its queries see a causal mask over the
//     rows just appended), then each decode step feeds one token, whose query sees the whole
//     cache (nothing to mask).
//  4. What the cache saves: K/V projections per step drop from t (naive, tutorial 01) to 1 per
//     K/V head and layer; the q.k dot products stay t per query head.
//  5. What the attention call inside a step computes, written as a loop over the cached rows.
// Each step is checked against the previous method, kvlab::NaiveDecoder on the same model.
//
// Build and run (from the repository root, with `build/` configured by CMake):
//   cmake --build build --target tutorial_02_kv_cache && build/tutorials/02_kv_cache
// Options (the exercises of its page change them): --prompt N tokens prefilled (3), --decode N
// tokens decoded after them (4).
//
// Next: the cost model page of the docs, which sums up what each counter counts; then
// 03_paged_cache.cpp — the same cache in blocks of a shared pool.

#include <kvlab/kvlab.hpp>

#include "support/command_line.hpp"

#include <cstdio>

using kvlab::RowMatrix;

namespace {

// Both decoders compute in double from the same weights and inputs, but add in different orders
// (naive: matrix products over the whole prefix; cached: one key row at a time), so they differ
// by rounding, about 1e-16 relative. 1e-12 relative leaves ample room for that; a real error
// (a stale, missing or misplaced cache row) shows up at 1e-2 or more.
constexpr double kRtol = 1e-12;

// Largest |a - b|; `ok` becomes false if any element is off by more than kRtol * max(1, |b|).
template <typename A, typename B>
double compare(const Eigen::MatrixBase<A>& a, const Eigen::MatrixBase<B>& b, bool& ok) {
  const auto diff = (a - b).cwiseAbs().array();
  ok = ok && (diff <= kRtol * b.cwiseAbs().array().max(1.0)).all();
  return diff.maxCoeff();
}

// Two lines per step: what each decoder did and how far their outputs are apart, then the first
// value of every cached key row of (layer 0, head 0). Checks the counts and that no row
// already in the cache changed (bit for bit, against `keys_before`).
template <typename A, typename B>
bool report(int step, const char* phase, const kvlab::NaiveDecoder<double>& naive,
            const kvlab::CachedDecoder<double>& cached, const Eigen::MatrixBase<A>& y_naive,
            const Eigen::MatrixBase<B>& y_cached, RowMatrix<double>& keys_before) {
  bool ok = true;
  const double diff = compare(y_cached, y_naive, ok);
  const kvlab::CostCounters& n = naive.last_step();
  const kvlab::CostCounters& c = cached.last_step();
  const int t = cached.position();                   // tokens seen
  const auto p = static_cast<int>(y_cached.rows());  // tokens fed in this step
  const int kv_heads = cached.stack().shape().num_kv_heads();
  const int layers = cached.stack().num_layers();
  ok = ok && n.kv_projections == static_cast<unsigned long long>(t * kv_heads * layers) &&
       c.kv_projections == static_cast<unsigned long long>(p * kv_heads * layers);

  const auto keys = cached.cache().keys(/*layer=*/0, /*head=*/0);  // [t, head_dim], in the cache
  const auto old_rows = static_cast<Eigen::Index>(keys_before.rows());
  ok = ok && keys.topRows(old_rows) == keys_before;  // rows kept from earlier steps: unchanged
  keys_before = keys;

  std::printf("%4d  %-7s %5d | %7llu %7llu | %7llu %7llu | %.1e\n", step, phase,
              cached.cache().length(0), static_cast<unsigned long long>(n.kv_projections),
              static_cast<unsigned long long>(c.kv_projections),
              static_cast<unsigned long long>(n.qk_dots),
              static_cast<unsigned long long>(c.qk_dots), diff);
  std::printf("      keys(0, 0)[:, 0]:");
  for (Eigen::Index r = 0; r < keys.rows(); ++r) std::printf(" %+.3f", keys(r, 0));
  std::printf("\n");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  int prompt_len = 3;    // tokens prefilled in one call
  int decode_steps = 4;  // tokens decoded one at a time after them
  kvlab_support::CommandLine command_line{"Tutorial 02: the KV cache"};
  command_line.add_integer("--prompt", prompt_len, "tokens prefilled in one call", 1, 32);
  command_line.add_integer("--decode", decode_steps, "tokens decoded after them", 0, 32);
  if (const auto stop = command_line.parse("02_kv_cache", argc, argv))
    return *stop;
  bool ok = true;

  // [setup]
  // The model of tutorial 01: one layer, 2 query heads sharing 1 K/V head, head_dim 4.
  const kvlab::AttentionShape shape(/*num_heads=*/2, /*num_kv_heads=*/1, /*head_dim=*/4);
  const int d_model = 8;
  const auto stack = kvlab::AttentionStack<double>::random(/*num_layers=*/1, shape, d_model,
                                                           /*seed=*/7);
  const int capacity = prompt_len + decode_steps;  // tokens the cache reserves room for

  kvlab::NaiveDecoder<double> naive(stack);              // keeps its inputs, recomputes K and V
  kvlab::CachedDecoder<double> cached(stack, capacity);  // K and V: [1][1][capacity][4] each
  kvlab::Rng rng(/*seed=*/3);
  const auto tokens =  // [capacity, d_model]
      kvlab::random_matrix<double>(capacity, d_model, rng, -2.0, 2.0);
  // [setup]

  std::printf("Cache: %d layer x %d K/V head x %d tokens x %d values; K and V: %zu bytes\n\n",
              cached.cache().num_layers(), cached.cache().num_kv_heads(), cached.cache().capacity(),
              cached.cache().head_dim(), cached.cache().bytes_reserved());
  std::printf("                      K/V projections      q.k dots\n");
  std::printf("step  phase   cache |   naive  cached |   naive  cached | max |cached - naive|\n");
  RowMatrix<double> keys_before(0, shape.head_dim());  // [rows cached before the step, head_dim]

  // [prefill]
  // Prefill: the whole prompt in one call. The cached decoder projects q, k, v of the prompt's
  // tokens and appends k and v; query i of the prompt sees keys 0..i (a causal mask).
  const RowMatrix<double> prompt = tokens.topRows(prompt_len);  // [prompt_len, d_model]
  const RowMatrix<double> y_naive = naive.prefill(prompt);      // [prompt_len, d_model]
  const RowMatrix<double> y_cached = cached.prefill(prompt);    // [prompt_len, d_model]
  // [prefill]
  ok = report(1, "prefill", naive, cached, y_naive, y_cached, keys_before) && ok;

  // [decode]
  for (int s = 0; s < decode_steps; ++s) {
    const kvlab::RowVector<double> token = tokens.row(prompt_len + s);  // [d_model]
    // Cached: project q, k, v of this token only, append k and v, attend q to the whole cache
    // (it sees every row, so no mask is needed). q is dropped afterwards: no later step uses it.
    const kvlab::RowVector<double> out_cached = cached.decode(token);  // [d_model]
    // Naive: project K and V of all tokens so far again, then attend.
    const kvlab::RowVector<double> out_naive = naive.decode(token);  // [d_model]
    ok = report(2 + s, "decode", naive, cached, out_naive, out_cached, keys_before) && ok;
  }
  // [decode]

  // [equivalent]
  // Inside each step the cached decoder calls kvlab::cpu::decode_attention(shape, q,
  // cache.view(layer)). For one new query that call is equivalent to this loop over the cache:
  // every cached key row of the query head's K/V head, scored, softmaxed, the value rows summed.
  const kvlab::ContiguousKVCache<double>& cache = cached.cache();
  const RowMatrix<double> q = kvlab::random_matrix<double>(1, shape.q_width(), rng);  // [1, 2 * 4]
  const RowMatrix<double> by_kernel = kvlab::cpu::decode_attention(shape, q, cache.view(0));
  RowMatrix<double> by_loop = RowMatrix<double>::Zero(1, shape.q_width());  // [1, 2 * 4]
  const int hd = shape.head_dim();
  for (int h = 0; h < shape.num_heads(); ++h) {
    const auto keys = cache.keys(/*layer=*/0, shape.kv_head_of(h));      // [t, head_dim]
    const auto values = cache.values(/*layer=*/0, shape.kv_head_of(h));  // [t, head_dim]
    Eigen::VectorXd p(keys.rows());  // [t]: scores, then probabilities
    for (Eigen::Index j = 0; j < keys.rows(); ++j)
      p(j) = shape.scale() * q.row(0).segment(h * hd, hd).dot(keys.row(j));
    p = (p.array() - p.maxCoeff()).exp();
    p /= p.sum();
    for (Eigen::Index j = 0; j < keys.rows(); ++j)
      by_loop.row(0).segment(h * hd, hd) += p(j) * values.row(j);
  }
  // [equivalent]
  std::printf("\ndecode_attention over the cache vs the loop over its rows: max |diff| = %.1e\n",
              compare(by_kernel, by_loop, ok));

  // [totals]
  const kvlab::CostCounters& n = naive.total();
  const kvlab::CostCounters& c = cached.total();
  const int t = cached.position();
  const int per_token = shape.num_kv_heads() * stack->num_layers();  // K/V projections per token
  // Naive: 3 in the prefill, then 4 + 5 + 6 + 7 (with the defaults): t(t+1)/2 minus the 1 + 2
  // that the prompt saved by going in at once. Cached: one per token.
  const auto naive_expected = static_cast<unsigned long long>(
      (t * (t + 1) / 2 - prompt_len * (prompt_len - 1) / 2) * per_token);
  const auto cached_expected = static_cast<unsigned long long>(t * per_token);
  ok = ok && n.kv_projections == naive_expected && c.kv_projections == cached_expected;
  std::printf("\nK/V projections in total, %d tokens: naive %llu (= %d", t,
              static_cast<unsigned long long>(n.kv_projections), prompt_len);
  for (int i = prompt_len + 1; i <= t; ++i) std::printf(" + %d", i);
  std::printf("), cached %llu\n", static_cast<unsigned long long>(c.kv_projections));
  std::printf("q.k dots in total: naive %llu, cached %llu (the gap: the prefill's masked scores)\n",
              static_cast<unsigned long long>(n.qk_dots),
              static_cast<unsigned long long>(c.qk_dots));
  // [totals]
  if (ok) {
    std::printf("Rows already cached never changed; outputs agree within %.0e relative.\n", kRtol);
    std::printf("All checks passed.\n");
  } else {
    std::printf("MISMATCH: an output, a count or a cached row differs (see the table).\n");
  }
  return ok ? 0 : 1;
}
