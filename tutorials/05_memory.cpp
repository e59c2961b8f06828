// Tutorial 05: where KV-cache memory goes — contiguous preallocation vs paging.
//
// What you will learn:
//  1. A contiguous cache (one kvlab::ContiguousKVCache per sequence) must reserve room for the
//     most tokens a sequence may ever hold, max_len, when the sequence starts: nobody knows yet
//     how long the answer will be. A sequence that stops at len tokens leaves max_len - len
//     reserved slots that no other sequence can use.
//  2. A paged cache (kvlab::PagedKVCache) takes a block of block_size tokens only when the last
//     one is full, so only the tail of each sequence's last block is unused: at most
//     block_size - 1 tokens per sequence.
//  3. The size calculator (kvlab::bytes_per_token) turns tokens into bytes for a real model, and
//     kvlab/analysis/memory_accounting.hpp counts reserved, used and wasted bytes and how many
//     sequences fit in a memory budget.
// The program checks its formulas against real caches: the bytes a ContiguousKVCache reserves,
// the blocks a PagedKVCache's allocator hands out, and how many sequences a PagedKVCache of the
// budget's size admits.
//
// Build and run (from the repository root, with `build/` configured by CMake):
//   cmake --build build --target tutorial_05_memory && build/tutorials/05_memory
// Options (the exercises of its page change them): --max-len N tokens a contiguous cache
// reserves per sequence (2048), --block-size N tokens per block of the paged cache (16).
//
// Next: 06_generation.cpp — a whole model generating with the three ways of keeping K/V.
// (bench/bench_memory_waste makes this tutorial's comparison on 100,000 requests and block sizes
// 1 to 256; the docs' Benchmarks page links its results.)

#include <kvlab/analysis/memory_accounting.hpp>
#include <kvlab/kvlab.hpp>

#include "support/command_line.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  std::int64_t max_len = 2048;  // what a contiguous cache reserves per sequence
  int block_size = 16;          // tokens per block of the paged cache
  kvlab_support::CommandLine command_line{
      "Tutorial 05: where KV-cache memory goes, contiguous preallocation vs paging"};
  command_line.add_integer("--max-len", max_len, "tokens reserved per sequence", 256, 8192);
  command_line.add_integer("--block-size", block_size, "tokens per block", 1, 256);
  if (const auto stop = command_line.parse("05_memory", argc, argv))
    return *stop;
  bool ok = true;

  // [setup]
  // Llama-2-7B in fp16: 2 · 32 layers · 32 K/V heads · 128 · 2 bytes = 524,288 bytes per token.
  const std::uint64_t per_token =
      kvlab::bytes_per_token(kvlab::llama2_7b_config(), kvlab::KVDtype::fp16);

  // A stream of 200 requests whose final lengths (prompt + output) are log-normal: median 256
  // tokens, ln(length) with standard deviation 1, clamped to [1, max_len]. Box–Muller turns two
  // uniform numbers into one normal one.
  kvlab::Rng rng(/*seed=*/4);
  std::vector<std::int64_t> stream;
  for (int i = 0; i < 200; ++i) {
    const double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    stream.push_back(std::clamp<std::int64_t>(std::llround(256.0 * std::exp(z)), 1, max_len));
  }
  const std::vector<std::int64_t> lengths(stream.begin(), stream.begin() + 8);  // a batch of 8
  // [setup]

  // [per_sequence]
  std::printf("Llama-2-7B, fp16: %s per token; contiguous max_len %lld, paged block_size %d\n\n",
              kvlab::format_bytes(per_token).c_str(), static_cast<long long>(max_len), block_size);
  std::printf("seq  tokens | contiguous: reserved  unused | paged: blocks  reserved  unused\n");
  for (std::size_t s = 0; s < lengths.size(); ++s) {
    const std::int64_t len = lengths[s];
    const std::int64_t blocks = kvlab::blocks_needed(len, block_size);  // ceil(len / 16)
    std::printf("%3zu  %6lld |             %8lld  %6lld |        %6lld  %8lld  %6lld\n", s,
                static_cast<long long>(len), static_cast<long long>(max_len),
                static_cast<long long>(max_len - len), static_cast<long long>(blocks),
                static_cast<long long>(blocks * block_size),
                static_cast<long long>(blocks * block_size - len));
  }
  // [per_sequence]

  // [footprints]
  const kvlab::MemoryFootprint contiguous =
      kvlab::contiguous_footprint(lengths, max_len, per_token);
  const kvlab::MemoryFootprint paged = kvlab::paged_footprint(lengths, block_size, per_token);
  // [footprints]
  std::printf("\nbatch of 8  reserved tokens   reserved       used     wasted    waste\n");
  for (const auto& [name, f] :
       {std::make_pair("contiguous", contiguous), std::make_pair("paged", paged)}) {
    std::printf("%-11s %15llu %10s %10s %10s %7.2f%%\n", name,
                static_cast<unsigned long long>(f.reserved_bytes / per_token),
                kvlab::format_bytes(f.reserved_bytes).c_str(),
                kvlab::format_bytes(f.used_bytes).c_str(),
                kvlab::format_bytes(f.waste_bytes()).c_str(), 100.0 * f.waste_fraction());
  }

  // [check_caches]
  // Real caches, as small as possible (1 layer, 1 K/V head, head_dim 1, float: 8 bytes per
  // token), holding the same 8 sequences. The accounting scales them to Llama-2-7B's bytes.
  std::uint64_t contiguous_reserved = 0;
  for (std::int64_t len : lengths) {
    kvlab::ContiguousKVCache<float> one(1, 1, 1, static_cast<int>(max_len));     // reserves max_len
    const kvlab::RowMatrix<float> rows = kvlab::RowMatrix<float>::Zero(len, 1);  // [len, 1]
    one.append(0, rows, rows);
    contiguous_reserved += one.bytes_reserved();
  }
  ok = ok && contiguous_reserved == kvlab::contiguous_footprint(lengths, max_len, 8).reserved_bytes;

  std::int64_t needed = 0;  // blocks of the 8 sequences: the pool holds exactly them
  for (std::int64_t len : lengths) needed += kvlab::blocks_needed(len, block_size);
  kvlab::PagedKVCache<float> cache(1, 1, 1, block_size, static_cast<int>(needed));
  for (std::int64_t len : lengths) cache.reserve(cache.add_sequence(), static_cast<int>(len));
  const kvlab::MemoryFootprint live = kvlab::paged_cache_footprint(cache, per_token);
  ok = ok && live.reserved_bytes == paged.reserved_bytes && live.used_bytes == paged.used_bytes;
  ok = ok &&
       paged.waste_bytes() < lengths.size() * static_cast<std::uint64_t>(block_size) * per_token;
  // [check_caches]
  std::printf(
      "\nReal caches: 8 ContiguousKVCache of %lld tokens reserve %llu bytes (8 per token);\n"
      "a PagedKVCache holding the same sequences has %d blocks in use.\n",
      static_cast<long long>(max_len), static_cast<unsigned long long>(contiguous_reserved),
      cache.allocator().num_used());

  // [budget]
  // How many requests of the stream fit in 16 GiB of KV cache, taken in arrival order, each at
  // its final length? Contiguous: 16 GiB / (2048 tokens · 512 KiB). Paged: blocks of
  // 16 · 512 KiB, as many requests as their blocks fit.
  const std::uint64_t budget = std::uint64_t{16} << 30;
  const std::uint64_t fit_contiguous = kvlab::max_contiguous_sequences(budget, max_len, per_token);
  const std::size_t fit_paged = kvlab::max_paged_sequences(stream, block_size, per_token, budget);
  // [budget]

  // The same question asked of a real PagedKVCache with the budget's blocks.
  const auto pool = static_cast<int>(kvlab::blocks_in_budget(budget, block_size, per_token));
  kvlab::PagedKVCache<float> full(1, 1, 1, block_size, pool);
  std::size_t admitted = 0;
  try {
    for (std::int64_t len : stream) {
      full.reserve(full.add_sequence(), static_cast<int>(len));
      ++admitted;
    }
  } catch (const kvlab::OutOfBlocks&) {  // the next request does not fit: stop admitting
  }
  ok = ok && admitted == fit_paged && fit_paged < stream.size();

  std::printf("\nIn a budget of %s: contiguous %llu sequences, paged %zu sequences (%.2fx)\n",
              kvlab::format_bytes(budget).c_str(), static_cast<unsigned long long>(fit_contiguous),
              fit_paged, static_cast<double>(fit_paged) / static_cast<double>(fit_contiguous));
  std::printf("A real PagedKVCache of %d blocks admitted %zu before running out of blocks.\n", pool,
              admitted);
  if (ok) {
    std::printf(
        "The formulas match the real caches; paging wasted less than one block per sequence.\n");
    std::printf("All checks passed.\n");
  } else {
    std::printf("MISMATCH: the formulas and the real caches disagree.\n");
  }
  return ok ? 0 : 1;
}
