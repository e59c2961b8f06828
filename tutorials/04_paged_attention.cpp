// Tutorial 04: paged attention — attending through the block tables.
//
// What you will learn:
//  1. The block tables of a batch in the CSR form that paged kernels read (FlashInfer's, and
//     vLLM's in spirit): indptr, indices, last_page_len; and how a kernel finds a key from them.
//  2. What kvlab::cpu::paged_decode_attention computes, written as a loop over the block table
//     (the "this call is equivalent to" of the call), for a ragged batch: three sequences of
//     different lengths, one new query each, in one call.
//  3. kvlab::cpu::paged_prefill_attention: several new queries per sequence (a prompt chunk),
//     each seeing its sequence up to itself, and sequences that bring none.
// Every output is checked against the previous method: kvlab::cpu::reference_attention on the
// sequence's rows held contiguously.
//
// Build and run (from the repository root, with `build/` configured by CMake):
//   cmake --build build --target tutorial_04_paged_attention && build/tutorials/04_paged_attention
// Option (the exercises of its page change it): --block-size N tokens per block (4).
//
// Next: 05_memory.cpp — what paging saves.

#include <kvlab/kvlab.hpp>

#include "support/command_line.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

using kvlab::RowMatrix;

namespace {

// Float paths that add the same terms in other orders agree to rounding, ~1e-7 here; reading a
// wrong row changes an output by 1e-2 or more.
constexpr float kTolerance = 1e-5f;

std::string list(const std::vector<std::int32_t>& array) {
  std::string out;
  for (std::int32_t x : array) out += (out.empty() ? "" : " ") + std::to_string(x);
  return out;
}

float max_diff(const RowMatrix<float>& a, const RowMatrix<float>& b) {
  return (a - b).cwiseAbs().maxCoeff();
}

}  // namespace

int main(int argc, char** argv) {
  int block_size = 4;  // tokens per block
  kvlab_support::CommandLine command_line{"Tutorial 04: paged attention, through the block tables"};
  command_line.add_integer("--block-size", block_size, "tokens per block", 1, 16);
  if (const auto stop = command_line.parse("04_paged_attention", argc, argv))
    return *stop;

  // [batch]
  // 4 query heads over 2 K/V heads of 4 values; one layer; a pool of blocks of 4 tokens, 8 of
  // them (as many as the sequences need, at least).
  const kvlab::AttentionShape shape(/*num_heads=*/4, /*num_kv_heads=*/2, /*head_dim=*/4);
  const std::vector<int> lengths{5, 2, 9};
  int num_blocks = 0;
  for (int len : lengths) num_blocks += (len + block_size - 1) / block_size;
  kvlab::PagedKVCache<float> cache(/*num_layers=*/1, 2, 4, block_size, std::max(num_blocks, 8));
  kvlab::Rng rng(/*seed=*/4);
  std::vector<RowMatrix<float>> keys, values;  // [sequence][length, 2 * 4]: the same rows
  for (int len : lengths) {
    keys.push_back(kvlab::random_matrix<float>(len, shape.kv_width(), rng));
    values.push_back(kvlab::random_matrix<float>(len, shape.kv_width(), rng));
    cache.add_sequence();
  }
  // The sequences grow in turns, as in a server: their blocks interleave in the pool.
  for (int pos = 0; pos < 9; ++pos)
    for (int s = 0; s < 3; ++s)
      if (pos < lengths[static_cast<std::size_t>(s)])
        cache.append(s, keys[static_cast<std::size_t>(s)].row(pos),
                     values[static_cast<std::size_t>(s)].row(pos));
  const kvlab::BlockTables tables = cache.tables({0, 1, 2});               // the batch [0, 1, 2]
  const kvlab::PagedKVView<float> view = cache.view(/*layer=*/0, tables);  // what a kernel reads
  // [batch]
  std::printf("== three sequences of 5, 2 and 9 tokens in one pool; their block tables (CSR)\n");
  std::printf("  indptr        [%s]   sequence s owns indices[indptr[s] .. indptr[s+1])\n",
              list(tables.indptr()).c_str());
  std::printf("  indices       [%s]   physical blocks, logical order\n",
              list(tables.indices()).c_str());
  std::printf("  last_page_len [%s]   tokens in each sequence's last block\n",
              list(tables.last_page_len()).c_str());

  // [translate]
  std::printf("  seq pos head -> block slot | offset in the pool\n");
  const int probes[][3] = {{0, 4, 1}, {1, 1, 0}, {2, 8, 1}};  // (sequence, position, K/V head)
  for (const auto& p : probes) {
    const std::int32_t block = view.block_of(p[0], p[1]);  // indices[indptr[s] + pos / 4]
    // NHD: ((block * block_size + pos % block_size) * num_kv_heads + head) * head_dim
    const std::ptrdiff_t offset = view.offset(p[0], p[1], p[2]);
    std::printf("  %3d %3d %4d -> %5d %4d | %6td\n", p[0], p[1], p[2], block, p[1] % block_size,
                offset);
  }
  // [translate]

  // [decode]
  // One new query per sequence: each is its sequence's last token and sees all of it.
  const RowMatrix<float> q = kvlab::random_matrix<float>(3, shape.q_width(), rng);    // [3, 16]
  const RowMatrix<float> paged = kvlab::cpu::paged_decode_attention(shape, q, view);  // [3, 16]
  // [decode]

  // [equivalent]
  // What that call computes, as a loop: for sequence s and query head h, the keys and values of
  // K/V head h / group, read through the block table, one position at a time.
  RowMatrix<float> loop = RowMatrix<float>::Zero(3, shape.q_width());  // [3, 16]
  const int hd = shape.head_dim();
  for (int s = 0; s < view.batch; ++s)
    for (int h = 0; h < shape.num_heads(); ++h) {
      const int hk = shape.kv_head_of(h);
      std::vector<double> p(static_cast<std::size_t>(view.seq_len(s)));  // [length]
      double max = -INFINITY, sum = 0;
      for (int pos = 0; pos < view.seq_len(s); ++pos) {  // scores: q . key, scaled
        const float* key = view.key(s, pos, hk);         // the table says where the row is
        double dot = 0;
        for (int c = 0; c < hd; ++c) dot += double(q(s, h * hd + c)) * key[c];
        p[static_cast<std::size_t>(pos)] = shape.scale() * dot;
        max = std::max(max, p[static_cast<std::size_t>(pos)]);
      }
      for (double& x : p) sum += (x = std::exp(x - max));  // softmax
      for (int pos = 0; pos < view.seq_len(s); ++pos)      // the weighted values
        for (int c = 0; c < hd; ++c)
          loop(s, h * hd + c) += static_cast<float>(p[static_cast<std::size_t>(pos)] / sum *
                                                    view.value(s, pos, hk)[c]);
    }
  // [equivalent]
  float worst = max_diff(paged, loop);
  std::printf("\n== paged_decode_attention, one query per sequence\n");
  std::printf("  max |paged_decode_attention - the loop through the table| = %.1e\n",
              static_cast<double>(worst));
  float vs_reference = 0;
  for (int s = 0; s < 3; ++s) {
    const auto i = static_cast<std::size_t>(s);
    vs_reference =
        std::max(vs_reference, max_diff(paged.row(s), kvlab::cpu::reference_attention(
                                                          shape, q.row(s), keys[i], values[i])));
  }
  std::printf(
      "  max |paged_decode_attention - reference_attention, rows held contiguously| = %.1e\n",
      static_cast<double>(vs_reference));
  worst = std::max(worst, vs_reference);

  // [prefill]
  // A prompt chunk per sequence: the last 3 tokens of sequence 0, none of sequence 1, the last
  // 4 of sequence 2. Query row i of a sequence with q_len queries is its token at position
  // length - q_len + i, and sees the sequence up to itself: causal within the chunk.
  const std::vector<std::int32_t> qo_indptr{0, 3, 3, 7};  // [batch + 1]: queries per sequence
  const RowMatrix<float> chunk = kvlab::random_matrix<float>(7, shape.q_width(), rng);  // [7, 16]
  const RowMatrix<float> prefill =
      kvlab::cpu::paged_prefill_attention(shape, chunk, qo_indptr, view);  // [7, 16]
  // [prefill]
  float prefill_worst = 0;
  for (int s : {0, 2}) {
    const auto i = static_cast<std::size_t>(s);
    const int n = qo_indptr[i + 1] - qo_indptr[i];
    const RowMatrix<float> want = kvlab::cpu::reference_attention(
        shape, chunk.middleRows(qo_indptr[i], n), keys[i], values[i], lengths[i] - n);
    prefill_worst = std::max(prefill_worst, max_diff(prefill.middleRows(qo_indptr[i], n), want));
  }
  std::printf("\n== paged_prefill_attention, queries per sequence 3, 0, 4 (qo_indptr [%s])\n",
              list(qo_indptr).c_str());
  std::printf("  max |paged_prefill_attention - reference_attention| = %.1e\n",
              static_cast<double>(prefill_worst));
  worst = std::max(worst, prefill_worst);

  const bool ok = worst <= kTolerance;
  std::printf("%s (tolerance %.0e)\n", ok ? "\nAll checks passed." : "\nMISMATCH",
              static_cast<double>(kTolerance));
  return ok ? 0 : 1;
}
