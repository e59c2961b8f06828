// Tutorial 09: a sliding window.
//
// What you will learn:
//  1. The band: with a window of W keys, the token at position i attends to positions
//     i − W < j <= i — the W keys ending with its own (transformers, vLLM, llama.cpp; FlashInfer
//     calls it window_left = W − 1). Older keys are never read again.
//  2. So a cache need keep only the last rows: a ring of slots, row pos in slot pos % capacity.
//     A decode step needs W slots; a step of C tokens needs W − 1 + C, or its own writes would
//     overwrite keys its first query still reads.
//  3. A paged cache gives back the blocks wholly before the window; the block table keeps their
//     entries (positions keep their pages) but they point to nothing.
//  4. Attention over the ring and over the paged blocks is the reference attention with the band.
//  5. Attention sinks (StreamingLLM): a window that also keeps the sequence's first S tokens. The
//     ring keeps them in its first S slots and wraps the rest; the pool keeps their blocks; the
//     kernels attend the sinks as a second range of keys and merge the two.
// It checks itself: it exits non-zero if an output differs from the reference's band.
//
// Build and run (from the repository root, with `build/` configured by CMake):
//   cmake --build build --target tutorial_09_sliding_window
//   build/tutorials/09_sliding_window
// Options (the exercises of its page change them): --window W keys (4), --sinks S first tokens
// kept besides in Part 5 (2).
//
// Next: kvlab-generate --window W runs a model with a window (the cached backend's ring, the paged
// backend's blocks); bench_window measures the memory and the step time over a long generation.

#include <kvlab/kvlab.hpp>

#include "support/command_line.hpp"

#include <cstdint>
#include <cstdio>
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

// Part 1: which keys each query sees.
void part1_band(int window) {
  std::printf("1. The band, W = %d: row i is the query at position i, column j the key at j\n",
              window);
  std::printf("      j: 0 1 2 3 4 5 6 7 8 9\n");
  for (int i = 0; i < 10; ++i) {
    std::printf("   i = %d ", i);
    for (int j = 0; j < 10; ++j) {
      // [loops]: the band, as cpu::reference_attention applies it
      const bool seen = j <= i && j > i - window;
      std::printf(" %c", seen ? 'x' : '.');
    }
    std::printf("   (keys %d..%d)\n", kvlab::first_visible_key(i, window), i);
  }
  std::printf(
      "   W keys, the query's own included (the Mistral paper's text counts W before it: "
      "W + 1)\n\n");
}

// Part 2: a ring of W - 1 + C slots.
void part2_ring(int window) {
  const int chunk = 3, capacity = window - 1 + chunk;  // steps of up to 3 tokens
  std::printf("2. A contiguous cache with a window of %d: a ring of %d slots (W - 1 + C, C = %d)\n",
              window, capacity, chunk);
  kvlab::ContiguousKVCache<float> ring(1, 1, 2, capacity, window);  // one head of 2 values
  std::vector<int> holds(static_cast<std::size_t>(capacity), -1);   // [slot]: its position
  for (int pos = 0; pos < 11; ++pos) {
    // K = V = [pos, pos]: the row says which token it is
    const kvlab::RowMatrix<float> kv =
        kvlab::RowMatrix<float>::Constant(1, 2, static_cast<float>(pos));
    ring.append(0, kv, kv);
    holds[static_cast<std::size_t>(pos % capacity)] = pos;
    std::string slots;
    for (int s = 0; s < capacity; ++s) {
      const float stored = ring.view(0).key(0, 0)[s * 2];  // slot s, first value
      slots += " " + (holds[static_cast<std::size_t>(s)] < 0
                          ? std::string(" .")
                          : (stored < 10 ? " " : "") + std::to_string(static_cast<int>(stored)));
    }
    std::printf("   after token %2d: slots [%s ]  (the next query reads keys %d..%d)\n", pos,
                slots.c_str(), kvlab::first_visible_key(pos + 1, window), pos + 1);
  }
  try {
    const kvlab::RowMatrix<float> four = kvlab::RowMatrix<float>::Zero(chunk + 1, 2);
    ring.append(0, four, four);
    check(false, "a chunk of 4 into a ring for chunks of 3 is refused");
  } catch (const kvlab::CapacityError& e) {
    std::printf("   a step of %d tokens: %s\n\n", chunk + 1, e.what());
  }
}

// Part 3: a paged pool gives back the blocks before the window.
void part3_paged(int window) {
  std::printf(
      "3. A paged pool with a window of %d, blocks of 2 tokens: the table after each token\n",
      window);
  kvlab::PagedKVCache<float> pool(1, 1, 2, /*block_size=*/2, /*num_blocks=*/8, kvlab::KVLayout::NHD,
                                  window);
  const int seq = pool.add_sequence();
  for (int pos = 0; pos < 10; ++pos) {
    const kvlab::RowMatrix<float> kv =
        kvlab::RowMatrix<float>::Constant(1, 2, static_cast<float>(pos));
    pool.append(seq, kv, kv);
    // after the step (its query has attended): what the next token's window leaves behind
    const int released = pool.release_out_of_window(seq);
    std::string table;
    for (std::int32_t b : pool.blocks(seq))
      table += b == kvlab::kReleasedBlock ? " -" : " " + std::to_string(b);
    std::printf("   after token %d: table [%s ]  held %d, free %d%s\n", pos, table.c_str(),
                pool.held_blocks(seq), pool.allocator().num_free(),
                released > 0 ? "  <- a block went back" : "");
    check(pool.held_blocks(seq) <= (window - 1 + 1 + 1) / 2 + 1,
          "held <= ceil((W - 1 + 1) / 2) + 1");
  }
  std::printf(
      "   ('-': a block back in the pool; positions keep their pages, which point nowhere)\n\n");
}

// One decode step over 40 tokens of random K/V through a ring of S + W slots and a paged pool
// (blocks of 4) with a window of W and S sinks, each against the reference's band and sinks.
struct KernelCheck {
  double ring_error, pool_error;  // largest differences from the reference
  int ring_slots, blocks_held, blocks_in_table;
};
KernelCheck kernels_against_reference(int window, int sinks, std::uint64_t seed) {
  const kvlab::AttentionShape shape(4, 2, 8);
  kvlab::Rng rng(seed);
  const kvlab::RowMatrix<float> k =
      kvlab::random_matrix<float>(40, shape.kv_width(), rng);  // [40, 16]
  const kvlab::RowMatrix<float> v =
      kvlab::random_matrix<float>(40, shape.kv_width(), rng);  // [40, 16]
  const kvlab::RowMatrix<float> q =
      kvlab::random_matrix<float>(1, shape.q_width(), rng);  // [1, 32]
  const kvlab::RowMatrix<float> want =
      kvlab::cpu::reference_attention(shape, q, k, v, 39, window, sinks);
  // S + W slots: enough for decode
  kvlab::ContiguousKVCache<float> ring(1, 2, 8, sinks + window, window, sinks);
  kvlab::PagedKVCache<float> pool(1, 2, 8, 4, 16, kvlab::KVLayout::NHD, window, sinks);
  const int seq = pool.add_sequence();
  for (int pos = 0; pos < 40; ++pos) {
    // the blocks that token pos (the next query) no longer sees go back before it is added —
    // a store does this at the end of each step, once the step's own queries have attended
    pool.release_out_of_window(seq);
    ring.append(0, k.row(pos), v.row(pos));
    pool.append(seq, k.row(pos), v.row(pos));
  }
  const kvlab::BlockTables tables = pool.tables({seq});
  const kvlab::RowMatrix<float> from_ring = kvlab::cpu::decode_attention(shape, q, ring.view(0));
  const kvlab::RowMatrix<float> from_pool =
      kvlab::cpu::paged_decode_attention(shape, q, pool.view(0, tables));
  return KernelCheck{(from_ring - want).cwiseAbs().maxCoeff(),
                     (from_pool - want).cwiseAbs().maxCoeff(), ring.capacity(),
                     pool.held_blocks(seq), static_cast<int>(pool.blocks(seq).size())};
}

// Part 4: the kernels compute the band.
void part4_attention(int window) {
  std::printf(
      "4. One decode step over 40 tokens, W = %d: the ring and the paged pool against the "
      "reference's band\n",
      window);
  const KernelCheck c = kernels_against_reference(window, 0, 2);
  std::printf("   ring (%d slots): largest difference %.2e;  paged (%d of %d blocks held): %.2e\n",
              c.ring_slots, c.ring_error, c.blocks_held, c.blocks_in_table, c.pool_error);
  check(c.ring_error <= 1e-5 && c.pool_error <= 1e-5, "the kernels compute the band");
}

// Part 5: a window with sinks.
void part5_sinks(int window, int sinks) {
  std::printf("5. A window of %d with %d sinks: the band, and the first %d keys besides\n", window,
              sinks, sinks);
  std::printf("      j: 0 1 2 3 4 5 6 7 8 9\n");
  for (int i = 0; i < 10; ++i) {
    std::printf("   i = %d ", i);
    for (int j = 0; j < 10; ++j) {
      const bool band = j <= i && j > i - window;
      const bool sink = j < sinks && j <= i && !band;  // a sink the band has left
      std::printf(" %c", band ? 'x' : sink ? 's' : '.');
    }
    std::printf("   (%d keys)\n", static_cast<int>(kvlab::visible_keys(i, 1, window, sinks)));
  }
  // The ring: S slots for the sinks, then W - 1 + C for the band and a step of C = 1.
  const int capacity = sinks + window;
  kvlab::ContiguousKVCache<float> ring(1, 1, 2, capacity, window, sinks);
  for (int pos = 0; pos < 11; ++pos) {
    const kvlab::RowMatrix<float> kv =
        kvlab::RowMatrix<float>::Constant(1, 2, static_cast<float>(pos));
    ring.append(0, kv, kv);
  }
  std::string slots;
  for (int s = 0; s < capacity; ++s)
    slots += " " + std::to_string(static_cast<int>(ring.view(0).key(0, 0)[s * 2]));
  std::printf(
      "   a ring of %d slots after token 10: [%s ]  (the %d sinks stay in slots 0-%d; "
      "the band wraps in the other %d)\n",
      capacity, slots.c_str(), sinks, sinks - 1, capacity - sinks);
  // The pool: the sinks' block is never given back.
  kvlab::PagedKVCache<float> pool(1, 1, 2, /*block_size=*/2, /*num_blocks=*/8, kvlab::KVLayout::NHD,
                                  window, sinks);
  const int seq = pool.add_sequence();
  for (int pos = 0; pos < 10; ++pos) {
    const kvlab::RowMatrix<float> kv =
        kvlab::RowMatrix<float>::Constant(1, 2, static_cast<float>(pos));
    pool.append(seq, kv, kv);
    pool.release_out_of_window(seq);
  }
  std::string table;
  for (std::int32_t b : pool.blocks(seq))
    table += b == kvlab::kReleasedBlock ? " -" : " " + std::to_string(b);
  std::printf(
      "   a paged pool, blocks of 2, after token 9: table [%s ]  held %d (the sinks' block "
      "and the window's)\n",
      table.c_str(), pool.held_blocks(seq));
  check(pool.blocks(seq).front() != kvlab::kReleasedBlock, "the sinks' block is kept");
  // The kernels: one decode step over 40 tokens against the reference with sinks.
  const KernelCheck c = kernels_against_reference(window, sinks, 5);
  std::printf(
      "   one decode step over 40 tokens: ring %.2e, paged %.2e from the reference with "
      "sinks\n",
      c.ring_error, c.pool_error);
  check(c.ring_error <= 1e-5 && c.pool_error <= 1e-5, "the kernels compute the band and the sinks");
}

}  // namespace

int main(int argc, char** argv) {
  int window = 4;  // keys each query sees, its own included
  int sinks = 2;   // first tokens kept besides, in Part 5
  kvlab_support::CommandLine command_line{"Tutorial 09: a sliding window"};
  command_line.add_integer("--window", window, "keys each query sees, its own included", 2, 8);
  command_line.add_integer("--sinks", sinks, "first tokens kept besides, in Part 5", 1, 4);
  if (const auto stop = command_line.parse("09_sliding_window", argc, argv))
    return *stop;
  if (sinks >= window) {  // a window's sinks are some of its first keys, not all of them
    std::fprintf(stderr, "09_sliding_window: --sinks: expected below the window (%d), got %d "
                 "(try --help)\n", window, sinks);
    return 2;
  }
  part1_band(window);
  part2_ring(window);
  part3_paged(window);
  part4_attention(window);
  std::printf("\n");
  part5_sinks(window, sinks);
  if (failures != 0) {
    std::printf("\n%d checks FAILED\n", failures);
    return 1;
  }
  std::printf(
      "\nThe ring and the paged pool give the reference attention's band, with sinks too.\n");
  return 0;
}
