// Tutorial 01: naive attention, and decoding without a cache.
//
// What you will learn:
//  1. What causal attention computes, written as the loops the formula describes
//     (kvlab::cpu::reference_attention, the library's oracle), and that
//     kvlab::cpu::naive_attention computes the same with matrix products.
//  2. How a decoder without a cache produces a sequence one token per step: kvlab::NaiveDecoder
//     keeps only its inputs, so step t projects K and V again for all t tokens so far. Over n
//     steps that is 1 + 2 + ... + n = n(n+1)/2 K/V projections per layer and K/V head: Θ(n²).
//
// Build and run (from the repository root, with `build/` configured by CMake):
//   cmake --build build --target tutorial_01_naive_attention && build/tutorials/01_naive_attention
// Options (the exercises of its page change them): --steps N tokens decoded in Part 2 (6),
// --kv-heads 1 or 2 (1: both query heads share one K/V head; 2: one each, MHA).
//
// Next: 02_kv_cache.cpp — K and V of past tokens never change, so keep them.

#include <kvlab/kvlab.hpp>

#include "support/command_line.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

using kvlab::RowMatrix;

namespace {

// Everything here is double and of order 1. The loops and the library add the same terms in
// different orders, so they differ by rounding only, a few units of 1e-16. 1e-12 leaves ample
// room for that; a real error (a wrong mask, head or scale) shows up at 1e-2 or more.
constexpr double kTolerance = 1e-12;

// [scores]
// The scores that a step computes for its newest query, query head `head`: the keys of every
// token seen so far are projected again (a decoder without a cache has no other way to get
// them) and each is dotted with the newest query.
std::vector<double> newest_query_scores(const kvlab::AttentionLayer<double>& layer,
                                        const RowMatrix<double>& inputs,  // [t, d_model]
                                        int head) {
  const kvlab::AttentionShape& shape = layer.shape();
  const int hd = shape.head_dim();
  RowMatrix<double> k, v;  // [t, num_kv_heads * head_dim]: all t rows, again
  layer.project_kv(inputs, k, v);
  const RowMatrix<double> q = layer.project_q(inputs.bottomRows(1));  // [1, num_heads * head_dim]
  const auto q_h = q.row(0).segment(head * hd, hd);                   // [head_dim]
  const int hk = shape.kv_head_of(head);
  std::vector<double> scores;  // [t]
  for (Eigen::Index j = 0; j < k.rows(); ++j)
    scores.push_back(shape.scale() * q_h.dot(k.row(j).segment(hk * hd, hd)));
  return scores;
}
// [scores]

}  // namespace

int main(int argc, char** argv) {
  int steps = 6;     // tokens decoded in Part 2
  int kv_heads = 1;  // K/V heads of the layer (its 2 query heads share them)
  kvlab_support::CommandLine command_line{
      "Tutorial 01: naive attention, and decoding without a cache"};
  command_line.add_integer("--steps", steps, "tokens decoded in Part 2", 1, 64);
  command_line.add_integer("--kv-heads", kv_heads, "K/V heads (1: shared, 2: MHA)", 1, 2);
  if (const auto stop = command_line.parse("01_naive_attention", argc, argv))
    return *stop;
  bool ok = true;

  // [naive_attention]
  // One layer's head layout: 2 query heads over kv_heads K/V heads, 4 values per head.
  const kvlab::AttentionShape shape(/*num_heads=*/2, kv_heads, /*head_dim=*/4);
  kvlab::Rng rng(/*seed=*/1);
  const int n = 5;                                                        // tokens
  const auto q = kvlab::random_matrix<double>(n, shape.q_width(), rng);   // [5, 2 * 4]
  const auto k = kvlab::random_matrix<double>(n, shape.kv_width(), rng);  // [5, kv_heads * 4]
  const auto v = kvlab::random_matrix<double>(n, shape.kv_width(), rng);  // [5, kv_heads * 4]
  kvlab::CostCounters work;
  const RowMatrix<double> out = kvlab::cpu::naive_attention(shape, q, k, v, &work);  // [5, 2 * 4]
  const RowMatrix<double> ref = kvlab::cpu::reference_attention(shape, q, k, v);     // [5, 2 * 4]
  // [naive_attention]
  const double diff = (out - ref).cwiseAbs().maxCoeff();
  const int heads = shape.num_heads();
  std::printf("Part 1: causal attention, %d tokens, %d query heads over %d K/V head%s, head_dim %d\n",
              n, heads, kv_heads, kv_heads == 1 ? "" : "s", shape.head_dim());
  std::printf("  last token, head 0, loops:           ");
  for (int d = 0; d < shape.head_dim(); ++d) std::printf(" %+.6f", ref(n - 1, d));
  std::printf("\n  last token, head 0, naive_attention: ");
  for (int d = 0; d < shape.head_dim(); ++d) std::printf(" %+.6f", out(n - 1, d));
  std::printf("\n  q.k dots computed: %llu = %d heads x %d x %d (masked ones too; %d visible)\n",
              static_cast<unsigned long long>(work.qk_dots), heads, n, n, heads * n * (n + 1) / 2);
  std::printf("  max |naive_attention - loops| = %.1e (tolerance %.0e)\n\n", diff, kTolerance);
  ok = ok && diff <= kTolerance;

  // [decode]
  // A one-layer model on the same head layout, with random weights fixed by the seed.
  const int d_model = 8;
  const auto stack = kvlab::AttentionStack<double>::random(/*num_layers=*/1, shape, d_model,
                                                           /*seed=*/7);
  kvlab::NaiveDecoder<double> decoder(stack);  // keeps its inputs, recomputes from them
  // The tokens' embeddings, in [-2, 2), given in advance (which token comes next does not
  // change the cost).
  const auto x = kvlab::random_matrix<double>(steps, d_model, rng, -2.0, 2.0);  // [steps, d_model]
  RowMatrix<double> y(steps, d_model);  // [steps, d_model]: the output at each step

  std::printf("Part 2: decoding %d tokens with NaiveDecoder (no cache), %d K/V head%s\n", steps,
              kv_heads, kv_heads == 1 ? "" : "s");
  std::printf("  (K/V proj.: K/V rows projected in step t, all t of them; total: since step 1)\n");
  std::printf(
      "  t | K/V proj. | total | t(t+1)/2 x kv_heads |"
      " scores of the newest query, head 0\n");
  for (int t = 1; t <= steps; ++t) {
    y.row(t - 1) = decoder.decode(x.row(t - 1));  // step t feeds token t-1; t tokens seen now
    const kvlab::CostCounters& step = decoder.last_step();
    const kvlab::CostCounters& total = decoder.total();
    const auto expected_total = static_cast<unsigned long long>(t * (t + 1) / 2 * kv_heads);
    std::printf("  %d | %9llu | %5llu | %19llu |", t,
                static_cast<unsigned long long>(step.kv_projections),
                static_cast<unsigned long long>(total.kv_projections), expected_total);
    for (double s : newest_query_scores(stack->layer(0), x.topRows(t), /*head=*/0))
      std::printf(" %+.3f", s);
    std::printf("\n");
    ok = ok && total.kv_projections == expected_total;
  }
  // [decode]

  // [check]
  // The previous method: one causal pass over all tokens at once, with the loops of Part 1.
  // Decoding token by token must give the same output at every position.
  const kvlab::AttentionLayer<double>& layer = stack->layer(0);
  RowMatrix<double> k_all, v_all;  // [steps, num_kv_heads * head_dim]
  layer.project_kv(x, k_all, v_all);
  const RowMatrix<double> q_all = layer.project_q(x);  // [steps, num_heads * head_dim]
  const RowMatrix<double> y_ref =                      // [steps, d_model]: input + attention output
      x + layer.project_out(kvlab::cpu::reference_attention(shape, q_all, k_all, v_all));
  const double decode_diff = (y - y_ref).cwiseAbs().maxCoeff();
  // [check]
  std::printf("\n  max |NaiveDecoder - one causal pass with the loops| = %.1e (tolerance %.0e)\n",
              decode_diff, kTolerance);
  ok = ok && decode_diff <= kTolerance;

  std::printf("%s\n", ok ? "All checks passed." : "MISMATCH");
  return ok ? 0 : 1;
}
