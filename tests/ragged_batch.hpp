// A ragged batch of sequences in a host block pool, built the way vLLM's paged-attention tests
// build theirs: the one helper of the CPU tests (test_paged_attention, test_attention_plan), the
// CUDA tests and the paged benchmarks. Host code only (Eigen for the per-sequence matrices).
#pragma once

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "kvlab/cache/block_tables.hpp"
#include "kvlab/core/paged_view.hpp"
#include "kvlab/core/random.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/matrix.hpp"

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

/// The identity: values stored as drawn.
struct NoRounding {
  template <typename T>
  T operator()(T x) const {
    return x;
  }
};

/// A ragged batch in a block pool of `T` (either layout): every sequence's blocks are taken from
/// a random permutation of the pool (`BlockTables::shuffled`), so block tables are non-monotonic;
/// `spare` blocks belong to nobody; every slot no sequence owns (unused blocks, tails of last
/// blocks) holds NaN, so reading one poisons the output. Each stored value is
/// `round(uniform(-1, 1))`: `NoRounding` keeps it, the GPU tests round it through fp16/bf16 so
/// that a float reference sees exactly the values the GPU stores.
template <typename T = float>
struct RaggedBatch {
  std::vector<T> k, v;  // the pool: [num_blocks, ...] in `layout`
  kvlab::BlockTables tables{
      {0, 1}, {0}, {1}, kvlab::BlockSize{1}, kvlab::NumBlocks{1}};  // replaced in the constructor
  kvlab::PagedKVView<T> view;  // host pointers into k, v, tables
  std::vector<int> lengths;    // [batch]

  template <typename Round = NoRounding>
  RaggedBatch(const kvlab::AttentionShape& shape, int block_size, std::vector<int> seq_lengths,
              kvlab::KVLayout layout, kvlab::Rng& rng, Round round = Round{}, int spare = 3)
      : lengths(std::move(seq_lengths)) {
    tables = kvlab::BlockTables::shuffled(lengths, block_size, spare, rng);
    const std::size_t pool = static_cast<std::size_t>(tables.num_blocks()) *
                             static_cast<std::size_t>(block_size) *
                             static_cast<std::size_t>(shape.kv_width());
    k.assign(pool, std::numeric_limits<T>::quiet_NaN());
    v.assign(pool, std::numeric_limits<T>::quiet_NaN());
    view = tables.view(k.data(), v.data(), shape.num_kv_heads(), shape.head_dim(), layout);
    for (std::size_t s = 0; s < lengths.size(); ++s)
      for (int pos = 0; pos < lengths[s]; ++pos)
        for (int h = 0; h < shape.num_kv_heads(); ++h) {
          const auto at = static_cast<std::size_t>(view.offset(static_cast<int>(s), pos, h));
          for (int c = 0; c < shape.head_dim(); ++c) {
            k[at + static_cast<std::size_t>(c)] = round(static_cast<T>(rng.uniform(-1.0, 1.0)));
            v[at + static_cast<std::size_t>(c)] = round(static_cast<T>(rng.uniform(-1.0, 1.0)));
          }
        }
  }
  RaggedBatch(const RaggedBatch&) = delete;  // `view` points into this object
  RaggedBatch& operator=(const RaggedBatch&) = delete;

  /// The keys of sequence `s` as a contiguous matrix, [lengths[s], num_kv_heads * head_dim]:
  /// the values stored in the pool, gathered through the block table.
  kvlab::RowMatrix<T> keys(int s) const { return gather(view.k, s); }
  /// The values of sequence `s`, [lengths[s], num_kv_heads * head_dim].
  kvlab::RowMatrix<T> values(int s) const { return gather(view.v, s); }

 private:
  kvlab::RowMatrix<T> gather(const T* pool, int s) const {
    const int d = view.head_dim;
    kvlab::RowMatrix<T> out(view.seq_len(s), view.num_kv_heads * d);
    for (int pos = 0; pos < view.seq_len(s); ++pos)
      for (int h = 0; h < view.num_kv_heads; ++h)
        for (int c = 0; c < d; ++c) out(pos, h * d + c) = pool[view.offset(s, pos, h) + c];
    return out;
  }
};

}  // namespace kvlab_test
