// A long random sequence of paged-cache operations (add, append, fork, truncate, free), checked
// after every operation against a model of each sequence's tokens. Run short by
// tests/cache/test_paged_kv_cache.cpp (which also writes and reads tokens with these helpers), long
// by kvlab_stress.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "kvlab/cache/paged_kv_cache.hpp"
#include "kvlab/core/random.hpp"
#include "stress_support.hpp"

namespace kvlab_stress {

/// The key stored for token value `x` in head `h`, element `c`: distinct per head and element,
/// so a row written to or read from the wrong place shows (x < 1e6, head_dim <= 10).
inline double key_of(double x, int h, int c) { return x + 1e7 * h + 1e6 * c; }

/// Appends `values.size()` tokens to `seq`; token i gets key `key_of(values[i], h, c)` and the
/// negated value in head h, element c, of every layer.
inline void append_tokens(kvlab::PagedKVCache<double>& cache, int seq,
                          const std::vector<double>& values) {
  const std::vector<std::int64_t> slots = cache.reserve(seq, static_cast<int>(values.size()));
  const int width = cache.num_kv_heads() * cache.head_dim();
  // [n, num_kv_heads * head_dim]
  kvlab::RowMatrix<double> k(static_cast<Eigen::Index>(values.size()), width);
  for (std::size_t i = 0; i < values.size(); ++i)
    for (int h = 0; h < cache.num_kv_heads(); ++h)
      for (int c = 0; c < cache.head_dim(); ++c)
        k(static_cast<Eigen::Index>(i), h * cache.head_dim() + c) = key_of(values[i], h, c);
  const kvlab::RowMatrix<double> v = -k;
  for (int l = 0; l < cache.num_layers(); ++l) cache.write(l, slots, k, v);
}

/// Every token of `seq`, read back through the block tables (key of head 0, element 0, layer
/// `layer`).
/// \throws Failure if another head, element or the value of a token disagrees with that key.
inline std::vector<double> read_tokens(const kvlab::PagedKVCache<double>& cache, int seq,
                                       int layer = 0) {
  const kvlab::BlockTables tables = cache.tables({seq});
  const kvlab::PagedKVView<double> view = cache.view(layer, tables);
  std::vector<double> out;  // [length]
  for (int pos = 0; pos < view.seq_len(0); ++pos) {
    const double key = view.key(0, pos, 0)[0];
    for (int h = 0; h < view.num_kv_heads; ++h)
      for (int c = 0; c < view.head_dim; ++c)
        if (view.key(0, pos, h)[c] != key_of(key, h, c) ||
            view.value(0, pos, h)[c] != -key_of(key, h, c))
          throw Failure("sequence " + std::to_string(seq) + ", position " + std::to_string(pos) +
                        ": heads, elements or value disagree with its key");
    out.push_back(key);
  }
  return out;
}

/// What a paged-cache run did.
struct PagedCacheRun {
  long operations = 0;
  long out_of_blocks = 0;     ///< appends refused for want of blocks (nothing changed)
  long forks = 0;             ///< sequences forked (blocks shared, copied on a later write)
  long truncations = 0;       ///< sequences cut back to a random shorter length
  long contents_checked = 0;  ///< sequences read back whole and compared with the model
};

/// `operations` random operations on a one-layer cache of 2 K/V heads of 1 element, in blocks of
/// `block_size` tokens, in `layout`: add a sequence, append 1..5 tokens, fork, truncate to a
/// random shorter length, free. After every operation: each sequence's length and block count
/// (ceil(length / block_size)) match the model, reference counts equal the tables that hold
/// each block, a block is in use exactly when some table holds it, free + used = total, and a
/// refused append changes nothing; every 97 operations every sequence reads back exactly its
/// own tokens.
inline PagedCacheRun paged_cache(long operations, std::uint64_t seed, kvlab::KVLayout layout,
                                 int block_size) {
  const int num_blocks = block_size >= 16 ? 24 : 64;  // small enough to run dry now and then
  kvlab::PagedKVCache<double> cache(1, 2, 1, block_size, num_blocks, layout);
  kvlab::Rng rng(seed);
  std::map<int, std::vector<double>> model;  // sequence id -> its tokens' keys
  std::vector<int> holders(static_cast<std::size_t>(num_blocks));  // [num_blocks]
  double next_value = 1;
  PagedCacheRun run;
  for (long op = 0; op < operations; ++op) {
    const double u = rng.uniform();
    auto pick = [&] {
      auto it = model.begin();
      std::advance(it, static_cast<long>(rng.next_u64() % model.size()));
      return it->first;
    };
    // Adds and forks (16 %) are outnumbered by frees (20 % + whenever 40 sequences are live),
    // so the population stays small and the pool runs dry now and then.
    if (model.empty() || (u < 0.10 && model.size() < 40)) {
      model[cache.add_sequence()] = {};
    } else if (u < 0.70 && model.size() < 40) {
      const int seq = pick();
      const int n = 1 + static_cast<int>(rng.next_u64() % 5);
      std::vector<double> values;  // [n]
      for (int i = 0; i < n; ++i) values.push_back(next_value++);
      const std::vector<std::int32_t> blocks_before = cache.blocks(seq);
      const int free_before = cache.allocator().num_free();
      try {
        append_tokens(cache, seq, values);
        model[seq].insert(model[seq].end(), values.begin(), values.end());
      } catch (const kvlab::OutOfBlocks&) {
        ++run.out_of_blocks;
        check(cache.blocks(seq) == blocks_before && cache.allocator().num_free() == free_before, op,
              "a refused append changed the sequence's blocks or the free count");
      }
    } else if (u < 0.76 && model.size() < 40) {
      const int seq = pick();
      model[cache.fork(seq)] = model[seq];
      ++run.forks;
    } else if (u < 0.80) {  // truncate to a random shorter length (a rewind)
      const int seq = pick();
      const int length = static_cast<int>(rng.next_u64() % (model[seq].size() + 1));
      cache.truncate(seq, length);
      model[seq].resize(static_cast<std::size_t>(length));
      ++run.truncations;
    } else {
      const int seq = pick();
      cache.free_sequence(seq);
      model.erase(seq);
    }
    // Invariants: reference counts equal the number of tables holding each block; a block is
    // in use exactly when some table holds it (no leak, no double free); each table has
    // ceil(length / block_size) blocks; free + used = total.
    std::fill(holders.begin(), holders.end(), 0);
    for (const auto& entry : model) {
      const std::vector<std::int32_t>& blocks = cache.blocks(entry.first);
      const auto length = static_cast<int>(entry.second.size());
      if (cache.length(entry.first) != length ||
          static_cast<int>(blocks.size()) != (length + block_size - 1) / block_size)
        check(false, op,
              "sequence " + std::to_string(entry.first) + " has length " +
                  std::to_string(cache.length(entry.first)) + " and " +
                  std::to_string(blocks.size()) + " blocks, the model " + std::to_string(length) +
                  " tokens");
      for (std::int32_t b : blocks) ++holders[static_cast<std::size_t>(b)];
    }
    int used = 0;
    for (std::int32_t b = 0; b < num_blocks; ++b) {
      const int expected = holders[static_cast<std::size_t>(b)];
      if (cache.allocator().ref_count(b) != expected)
        check(false, op,
              "block " + std::to_string(b) + " has reference count " +
                  std::to_string(cache.allocator().ref_count(b)) + ", held by " +
                  std::to_string(expected) + " tables");
      used += expected > 0;
    }
    check(cache.allocator().num_used() == used, op, "blocks in use differ from the blocks held");
    check(cache.allocator().num_free() + used == num_blocks, op, "free + used != total");
    check(cache.sequences().size() == model.size(), op, "live sequences differ from the model");
    // Contents, every 97 operations: every sequence reads back exactly its own tokens.
    if (op % 97 == 0) {
      for (const auto& entry : model) {
        if (entry.second.empty()) continue;
        check(read_tokens(cache, entry.first) == entry.second, op,
              "sequence " + std::to_string(entry.first) + " does not read back its own tokens");
        ++run.contents_checked;
      }
    }
    ++run.operations;
  }
  return run;
}

}  // namespace kvlab_stress
