// A ragged batch of sequences in a host block pool, built the way vLLM's paged-attention tests
// build theirs: shared by tests/test_split_k.cpp (CPU) and the CUDA tests. Plain C++: no CUDA.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "kvlab/cache/block_tables.hpp"
#include "kvlab/core/paged_view.hpp"
#include "kvlab/core/random.hpp"
#include "kvlab/core/shape.hpp"

namespace kvlab_test {

/// Sequence lengths as vLLM's test draws them: `count` lengths uniform in [1, max_len], the
/// last one exactly max_len.
inline std::vector<int> vllm_lengths(int count, int max_len, kvlab::Rng& rng) {
  std::vector<int> lengths(static_cast<std::size_t>(count));
  for (int& len : lengths)
    len = 1 + static_cast<int>(rng.next_u64() % static_cast<std::uint64_t>(max_len));
  lengths.back() = max_len;
  return lengths;
}

/// A ragged batch in a float block pool (either layout): every sequence's blocks are taken
/// from a random permutation of the pool, so block tables are non-monotonic; `spare` blocks
/// belong to nobody; every slot no sequence owns (unused blocks, tails of last blocks) holds
/// NaN, so reading one poisons the output. Each stored value is `round(uniform(-1, 1))`:
/// identity for fp32, rounding through fp16/bf16 for the GPU tests, so that a float reference
/// sees exactly the values the GPU stores.
struct RaggedBatch {
  // the pool: [num_blocks, ...] in `layout`
  std::vector<float> k, v;
  kvlab::BlockTables tables{{0, 1}, {0}, {1}, 1, 1};  // replaced in the constructor
  kvlab::PagedKVView<float> view;                     // host pointers into k, v, tables
  std::vector<int> lengths;                           // [batch]

  template <typename Round>
  RaggedBatch(const kvlab::AttentionShape& shape, int block_size, std::vector<int> seq_lengths,
              kvlab::KVLayout layout, kvlab::Rng& rng, Round round, int spare = 3)
      : lengths(std::move(seq_lengths)) {
    int pages = 0;
    for (int len : lengths) pages += (len - 1) / block_size + 1;
    const int num_blocks = pages + spare;
    std::vector<std::int32_t> order(static_cast<std::size_t>(num_blocks));
    std::iota(order.begin(), order.end(), 0);
    for (std::size_t i = order.size() - 1; i > 0; --i)  // Fisher-Yates with kvlab's generator
      std::swap(order[i], order[static_cast<std::size_t>(rng.next_u64() % (i + 1))]);

    const std::size_t pool = static_cast<std::size_t>(num_blocks) *
                             static_cast<std::size_t>(block_size) *
                             static_cast<std::size_t>(shape.kv_width());
    k.assign(pool, std::numeric_limits<float>::quiet_NaN());
    v.assign(pool, std::numeric_limits<float>::quiet_NaN());
    std::vector<std::vector<std::int32_t>> lists;
    std::size_t next = 0;
    for (int len : lengths) {
      const auto count = static_cast<std::size_t>((len - 1) / block_size + 1);
      lists.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(next),
                         order.begin() + static_cast<std::ptrdiff_t>(next + count));
      next += count;
    }
    tables = kvlab::BlockTables::from_lists(lists, lengths, num_blocks, block_size);
    view = tables.view(k.data(), v.data(), shape.num_kv_heads(), shape.head_dim(), layout);
    for (std::size_t s = 0; s < lengths.size(); ++s)
      for (int pos = 0; pos < lengths[s]; ++pos)
        for (int h = 0; h < shape.num_kv_heads(); ++h) {
          const auto at = static_cast<std::size_t>(view.offset(static_cast<int>(s), pos, h));
          for (int c = 0; c < shape.head_dim(); ++c) {
            k[at + static_cast<std::size_t>(c)] = round(static_cast<float>(rng.uniform(-1.0, 1.0)));
            v[at + static_cast<std::size_t>(c)] = round(static_cast<float>(rng.uniform(-1.0, 1.0)));
          }
        }
  }
  RaggedBatch(const RaggedBatch&) = delete;  // `view` points into this object
  RaggedBatch& operator=(const RaggedBatch&) = delete;
};

/// The identity, for fp32 batches.
struct NoRounding {
  float operator()(float x) const { return x; }
};

}  // namespace kvlab_test
