// Tutorial 03: the paged KV cache.
//
// What you will learn:
//  1. How a paged cache finds a token: the sequence's block table maps logical block
//     pos / block_size to a physical block of one shared pool, and pos % block_size is the slot
//     in it, as a page table maps a virtual address to a physical page and an offset.
//  2. That a block is allocated only when the sequence's last block is full.
//  3. That kvlab::PagedKVCache::fork shares blocks (reference count 2, nothing copied), and that
//     appending into a shared, partly filled block copies it first (copy on write).
//  4. That a failed append changes nothing, and that ending a sequence frees the blocks no one
//     else holds.
// After every step, every key and value read through kvlab::PagedKVView is compared with a
// kvlab::ContiguousKVCache (tutorial 02) fed the same rows.
//
// Build and run (from the repository root, with `build/` configured by CMake):
//   cmake --build build --target tutorial_03_paged_cache && build/tutorials/03_paged_cache
// With --dot FILE it also writes the pool after the fork and the copy on write as a Graphviz
// graph (kvlab::pool_dot; `dot -Tsvg FILE -o pool.svg` draws it, as the docs do). With --ask N,
// B asks for N more tokens instead of 20 (the exercises of its page change it).
//
// Next: 04_paged_attention.cpp — attention through the block tables.

#include <kvlab/report/pool_dot.hpp>
#include <kvlab/kvlab.hpp>

#include "support/command_line.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

using kvlab::RowMatrix;

namespace {

// [pool]
// One layer, 2 K/V heads of 2 values (a token: 4 floats of K, 4 of V), 8 blocks of 4 tokens.
// K and V are each [num_blocks = 8, block_size = 4, num_kv_heads = 2, head_dim = 2].
constexpr int kKVHeads = 2, kHeadDim = 2, kBlockSize = 4, kNumBlocks = 8;
using Cache = kvlab::PagedKVCache<float>;
// [pool]

// Sequence id (0, 1 in the cache; printed A, B) -> a contiguous cache (tutorial 02) holding the
// same rows: the reference that every read through the paged cache is checked against.
using References = std::map<int, kvlab::ContiguousKVCache<float>>;

// Readable rows: token pos of sequence A has key[h][d] = 100 + pos + 0.1 h + 0.01 d (B: 200 +
// ...) and value = -key, so the pool can be printed as the names of the tokens it holds.
RowMatrix<float> token_rows(int seq, int first_pos, int n, float sign) {  // [n, 2 * 2]
  RowMatrix<float> rows(n, kKVHeads * kHeadDim);
  for (int i = 0; i < n; ++i)
    // column c: head c / head_dim, value c % head_dim
    for (int c = 0; c < kKVHeads * kHeadDim; ++c)
      rows(i, c) = sign * static_cast<float>(100 * (seq + 1) + first_pos + i +
                                             0.1 * (c / kHeadDim) + 0.01 * (c % kHeadDim));
  return rows;
}

// "0 2 3": the elements of a block table or CSR array.
std::string list(const std::vector<std::int32_t>& array) {
  std::string out;
  for (std::int32_t x : array) out += (out.empty() ? "" : " ") + std::to_string(x);
  return out;
}

// [append]
// A decoder step for `seq`: append the K and V of n tokens. The cache makes room (a new block
// only when the last one is full) and stores them in one call; it returns their slots,
// block * block_size + offset. (A cache of several layers makes room once, `reserve`, and then
// stores each layer's rows in those slots, `write`.) The contiguous reference gets the same.
void append(Cache& cache, References& refs, int seq, int n) {
  int pos = cache.length(seq);
  std::vector<std::int32_t> table = cache.blocks(seq);              // the block table, copied
  const RowMatrix<float> k = token_rows(seq, pos, n, +1);           // [n, 4]
  const RowMatrix<float> v = token_rows(seq, pos, n, -1);           // [n, 4]
  const std::vector<std::int64_t> slots = cache.append(seq, k, v);  // [n]
  refs.at(seq).append(/*layer=*/0, k, v);
  for (std::int64_t slot : slots) {
    const auto block = static_cast<std::int32_t>(slot / kBlockSize);
    const auto logical = static_cast<std::size_t>(pos / kBlockSize);  // index in the block table
    std::printf("  %c%d -> slot %2lld = block %d, offset %d", 'A' + seq, pos++,
                static_cast<long long>(slot), block, static_cast<int>(slot % kBlockSize));
    if (logical == table.size()) {  // past the end of the table: the last block was full
      std::printf("  (a new block)");
      table.push_back(block);
    } else if (table[logical] != block) {  // the table points elsewhere now: copy on write
      std::printf("  (a copy of block %d)", table[logical]);
      table[logical] = block;
    }
    std::printf("\n");
  }
}
// [append]

// Prints each block table (logical block j -> physical block), then the pool: each block in use,
// its reference count and the tokens it holds (read from its keys; ".." = not filled), and the
// free blocks. True if free + used = total, the reference counts add up to the entries of all
// tables, and every key and value read through the view equals the reference's, bit for bit.
bool show(const Cache& cache, const References& refs) {
  const std::vector<int> ids = cache.sequences();
  const kvlab::BlockTables tables = cache.tables(ids);
  const kvlab::PagedKVView<float> view = cache.view(/*layer=*/0, tables);
  std::vector<int> filled(kNumBlocks, 0);  // [num_blocks]: slots in use
  float max_diff = 0;
  for (int s = 0; s < view.batch; ++s) {
    const int seq = ids[static_cast<std::size_t>(s)];
    std::printf("  %c: %d tokens, table [%s], last block %d/%d\n", 'A' + seq, view.seq_len(s),
                list(cache.blocks(seq)).c_str(), view.last_page_len[s], kBlockSize);
    for (int j = 0; j < view.num_pages(s); ++j)  // logical block j: full, but the last one
      filled[static_cast<std::size_t>(view.indices[view.indptr[s] + j])] =
          j + 1 < view.num_pages(s) ? kBlockSize : view.last_page_len[s];
    const kvlab::ContiguousKVView<float> ref = refs.at(seq).view(/*layer=*/0);
    if (ref.length != view.seq_len(s)) return false;
    for (int pos = 0; pos < ref.length; ++pos)
      for (int h = 0; h < kKVHeads; ++h)
        for (int d = 0; d < kHeadDim; ++d)
          max_diff = std::max({max_diff, std::abs(view.key(s, pos, h)[d] - ref.key(h, pos)[d]),
                               std::abs(view.value(s, pos, h)[d] - ref.value(h, pos)[d])});
  }
  const kvlab::BlockAllocator& pool = cache.allocator();
  std::string free_blocks;
  int holders = 0;
  for (std::int32_t block = 0; block < kNumBlocks; ++block) {
    holders += pool.ref_count(block);
    if (pool.ref_count(block) == 0) {
      free_blocks += " " + std::to_string(block);
      continue;
    }
    std::printf("  block %d, ref %d:", block, pool.ref_count(block));
    for (int slot = 0; slot < kBlockSize; ++slot) {
      // [block][slot][head 0]
      const float* key = view.k + (block * kBlockSize + slot) * kKVHeads * kHeadDim;
      const int token = static_cast<int>(key[0]);  // head 0: 100 (A) or 200 (B) + position
      if (slot >= filled[static_cast<std::size_t>(block)])
        std::printf(" ..");
      else
        std::printf(" %c%d", 'A' + token / 100 - 1, token % 100);
    }
    std::printf("\n");
  }
  std::printf("  free:%s  (%d free + %d used = %d blocks)\n", free_blocks.c_str(), pool.num_free(),
              pool.num_used(), pool.num_blocks());
  std::printf("  every key and value, paged vs contiguous: max |diff| = %.1e\n",
              static_cast<double>(max_diff));
  return pool.num_free() + pool.num_used() == kNumBlocks && holders == tables.indptr().back() &&
         max_diff == 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dot_file;  // where the pool's graph goes ("": nowhere)
  int ask = 20;          // the tokens B asks for at the end
  kvlab_support::CommandLine command_line{"Tutorial 03: the paged KV cache"};
  command_line.add_text("--dot", dot_file,
                        "write the pool after the copy on write as a Graphviz graph");
  command_line.add_integer("--ask", ask, "tokens B asks for at the end", 1, 64);
  if (const auto stop = command_line.parse("03_paged_cache", argc, argv))
    return *stop;
  bool ok = true;
  // [grow]
  Cache cache(/*num_layers=*/1, kKVHeads, kHeadDim, kBlockSize, kNumBlocks);
  References refs;
  const int a = cache.add_sequence();  // sequence A: an empty table, no block yet
  refs.emplace(a, kvlab::ContiguousKVCache<float>(1, kKVHeads, kHeadDim, /*capacity=*/80));
  std::printf("== A: a prompt of 3 tokens, then 3 decode steps of 1 token\n");
  append(cache, refs, a, 3);                                       // takes block 0
  for (int step = 0; step < 3; ++step) append(cache, refs, a, 1);  // A3 fills it; A4 takes block 1
  // [grow]
  ok = show(cache, refs) && cache.blocks(a) == std::vector<std::int32_t>{0, 1} && ok;

  // [fork]
  const int b = cache.fork(a);  // sequence B: a copy of A's table; the blocks gain a holder
  refs.emplace(b, refs.at(a));  // the contiguous reference copies A's rows
  // [fork]
  std::printf("\n== fork: B = A, sharing A's blocks\n");
  ok = show(cache, refs) && cache.allocator().ref_count(0) == 2 &&
       cache.allocator().ref_count(1) == 2 && ok;

  // [cow]
  std::printf("\n== B appends into shared block 1 (2/4 full): copy on write\n");
  append(cache, refs, b, 1);  // B gets a private copy of block 1 (A4 A5), then B6 goes in it
  std::printf("== A appends: block 1 is A's alone now, no copy\n");
  append(cache, refs, a, 1);
  std::printf("== B appends 2 tokens: B7 fills its block, B8 takes a new one\n");
  append(cache, refs, b, 2);
  // [cow]
  ok = show(cache, refs) && cache.blocks(b) == std::vector<std::int32_t>{0, 2, 3} && ok;
  if (!dot_file.empty()) {  // the pool as a graph: tables, blocks, holders (kvlab::pool_dot)
    kvlab::PoolDotOptions dot;
    dot.title = "tutorial 03's pool after the fork and the copy on write (03_paged_cache --dot)";
    dot.sequence_names = {{a, "A"}, {b, "B"}};
    dot.block_notes[cache.blocks(b)[1]] = "B's copy of block 1";
    std::ofstream out(dot_file);
    if (!(out << kvlab::pool_dot(cache, dot))) {
      std::fprintf(stderr, "--dot: expected a file it can write, got %s\n", dot_file.c_str());
      return 2;
    }
  }

  // [out_of_blocks]
  // 20 more tokens for B: 3 fit in its last block, the other 17 need 5 new blocks, but 4 are free.
  const int held = static_cast<int>(cache.blocks(b).size());                   // 3 blocks
  const int fits_in_last = held * kBlockSize - cache.length(b);                // free slots: 3
  const int new_blocks = (std::max(ask - fits_in_last, 0) + kBlockSize - 1) / kBlockSize;
  const bool enough = new_blocks <= cache.allocator().num_free();             // 20: 5 > 4
  std::printf("\n== B asks for %d more tokens\n", ask);
  try {
    cache.append(b, token_rows(b, 9, ask, +1), token_rows(b, 9, ask, -1));
    refs.at(b).append(0, token_rows(b, 9, ask, +1), token_rows(b, 9, ask, -1));
    std::printf("  appended: ");
    ok = ok && enough;
  } catch (const kvlab::OutOfBlocks& e) {
    std::printf("  OutOfBlocks: %s\n  nothing changed: ", e.what());
    ok = ok && !enough;
  }
  const int expect_length = enough ? 9 + ask : 9;
  ok = ok && cache.length(b) == expect_length &&
       cache.blocks(b).size() == static_cast<std::size_t>(held + (enough ? new_blocks : 0)) &&
       cache.allocator().num_free() == 4 - (enough ? new_blocks : 0);
  // [out_of_blocks]
  std::printf("B has %d tokens in %zu blocks, %d blocks are free\n", cache.length(b),
              cache.blocks(b).size(), cache.allocator().num_free());

  // [free]
  std::printf("\n== A ends: block 1 (A's alone) returns to the pool, block 0 keeps B\n");
  cache.free_sequence(a);
  refs.erase(a);
  ok = show(cache, refs) && cache.allocator().ref_count(0) == 1 && ok;
  cache.free_sequence(b);
  // [free]
  std::printf("== B ends: %d of %d blocks free\n", cache.allocator().num_free(), kNumBlocks);
  ok = ok && cache.allocator().num_free() == kNumBlocks;

  std::printf(ok ? "\nAll checks passed.\n"
                 : "\nMISMATCH: a row, a count or a table differs (see above).\n");
  return ok ? 0 : 1;
}
