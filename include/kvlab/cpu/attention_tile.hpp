/// \file
/// \brief The inner loop shared by `cpu::decode_attention` (contiguous cache) and
/// `cpu::paged_decode_attention` / `cpu::paged_prefill_attention` (paged cache): a tile of
/// queries of one GQA group attends to the key and value rows of one K/V head, wherever those
/// rows are stored. Internal; tested through the public kernels.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kvlab/core/counters.hpp"
#include "kvlab/core/paged_view.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/core/views.hpp"
#include "kvlab/cpu/softmax.hpp"
#include "kvlab/cpu/types.hpp"

namespace kvlab {
namespace cpu {

/// Query rows processed together by the decode kernels (a decode step has one per sequence).
constexpr int kDecodeQueryTile = 16;

}  // namespace cpu

namespace detail {

/// The rows of K/V head `head` in a contiguous cache: row `pos` at `base + pos * head_dim`.
template <typename T>
struct ContiguousRows {
  const ContiguousKVView<T>& cache;
  int head;

  /// Calls `f(pos, row)` for the key rows `pos` in [0, end), in order.
  template <typename F>
  void keys(int end, F&& f) const { walk(cache.key(head, 0), end, f); }
  /// Calls `f(pos, row)` for the value rows `pos` in [0, end), in order.
  template <typename F>
  void values(int end, F&& f) const { walk(cache.value(head, 0), end, f); }

 private:
  template <typename F>
  void walk(const T* base, int end, F& f) const {
    for (int pos = 0; pos < end; ++pos) f(pos, base + static_cast<std::ptrdiff_t>(pos) * cache.head_dim);
  }
};

/// The rows of K/V head `head` of sequence `seq` in a paged cache, block by block: the block
/// table is read once per block, not once per row.
template <typename T>
struct PagedRows {
  const PagedKVView<T>& cache;
  int seq;
  int head;

  /// Calls `f(pos, row)` for the key rows `pos` in [0, end), in order.
  template <typename F>
  void keys(int end, F&& f) const { walk(cache.k, end, f); }
  /// Calls `f(pos, row)` for the value rows `pos` in [0, end), in order.
  template <typename F>
  void values(int end, F&& f) const { walk(cache.v, end, f); }

 private:
  template <typename F>
  void walk(const T* pool, int end, F& f) const {
    const std::ptrdiff_t stride = static_cast<std::ptrdiff_t>(cache.num_kv_heads) * cache.head_dim;  // token to token
    for (int pos = 0; pos < end;) {
      const T* row = pool + cache.offset(seq, pos, head);  // slot 0 of this block (pos % block_size == 0)
      const int last = std::min(end, pos + cache.block_size);
      for (; pos < last; ++pos, row += stride) f(pos, row);
    }
  }
};

/// Scratch buffers of one worker, reused from tile to tile.
template <typename T>
struct TileScratch {
  RowMatrix<T> queries;  ///< [rows * group, head_dim]: query (row i, head hk*group + j) at i*group + j
  RowMatrix<T> probs;    ///< [rows * group, span]: scores, then probabilities
  RowMatrix<T> acc;      ///< [rows * group, head_dim]: outputs
};

/// Attention of the query rows [row0, row0 + rows) of `q` — consecutive tokens of one sequence,
/// row `row0` at position `first_position` — for the query heads of K/V head `hk`, over the
/// key/value rows of `source` (`ContiguousRows` or `PagedRows`). Writes the same rows of `out`.
///
/// The queries of the group and of the tile's rows are gathered; then
///  1. the key rows are streamed once, and each one is scored against every query that sees it;
///  2. each query's visible scores are softmaxed;
///  3. the value rows are streamed once, and each one is added to every query's output with
///     its probability as weight.
template <typename T, typename Source>
void attend_tile(const AttentionShape& shape, const RowMatrix<T>& q, int row0, int rows,
                 int first_position, int hk, const Source& source, TileScratch<T>& scratch,
                 RowMatrix<T>& out) {
  const int group = shape.group_size();
  const int hd = shape.head_dim();
  const T scale = static_cast<T>(shape.scale());
  const int m = rows * group;
  const int span = first_position + rows;  // keys seen by the tile's last row
  RowMatrix<T>& queries = scratch.queries;  // [m, head_dim]
  RowMatrix<T>& probs = scratch.probs;      // [m, span]
  RowMatrix<T>& acc = scratch.acc;          // [m, head_dim]
  queries.resize(m, hd);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < group; ++j)
      queries.row(i * group + j) = q.block(row0 + i, (hk * group + j) * hd, 1, hd);
  // Query qi of the tile sees keys [0, shared + qi / group]: all of them see [0, shared), and
  // the tile's later rows see up to `rows - 1` more (the causal corner).
  const int shared = first_position + 1;
  const auto visible = [&](int qi) { return shared + qi / group; };
  // The first query of the tile that sees key `pos` (0 outside the corner).
  const auto first_seeing = [&](int pos) { return pos < shared ? 0 : (pos - shared + 1) * group; };

  // 1. Scores: each key row is read once and met by every query of the tile that sees it.
  probs.resize(m, span);
  source.keys(span, [&](int pos, const T* row) {
    const Eigen::Map<const RowVector<T>> key(row, hd);  // [head_dim]
    for (int qi = first_seeing(pos); qi < m; ++qi) probs(qi, pos) = scale * queries.row(qi).dot(key);
  });
  // 2. Softmax of each query's visible scores.
  for (int qi = 0; qi < m; ++qi) cpu::softmax_inplace(&probs(qi, 0), visible(qi));
  // 3. Values: each value row is read once and added to every query's sum.
  acc.setZero(m, hd);
  source.values(span, [&](int pos, const T* row) {
    const Eigen::Map<const RowVector<T>> value(row, hd);  // [head_dim]
    for (int qi = first_seeing(pos); qi < m; ++qi) acc.row(qi) += probs(qi, pos) * value;
  });
  for (int qi = 0; qi < m; ++qi)
    out.block(row0 + qi / group, (hk * group + qi % group) * hd, 1, hd) = acc.row(qi);
}

/// Adds the work of `q_len` query rows of one sequence, the first at position
/// `first_position`, processed in tiles of `cpu::kDecodeQueryTile` rows, to `counters`:
/// row i sees first_position + i + 1 keys, and each tile streams the rows its last row sees.
inline void count_attention(const AttentionShape& shape, std::size_t element_bytes, int q_len,
                            int first_position, CostCounters& counters) {
  const auto n = static_cast<std::uint64_t>(q_len);
  const std::uint64_t dots = static_cast<std::uint64_t>(shape.num_heads()) *
                             (n * static_cast<std::uint64_t>(first_position) + n * (n + 1) / 2);
  std::uint64_t rows_streamed = 0;
  for (int r0 = 0; r0 < q_len; r0 += cpu::kDecodeQueryTile)
    rows_streamed += static_cast<std::uint64_t>(first_position + r0 + std::min(cpu::kDecodeQueryTile, q_len - r0));
  counters.qk_dots += dots;
  counters.macs += 2 * dots * static_cast<std::uint64_t>(shape.head_dim());
  counters.kv_bytes_read += 2 * element_bytes * rows_streamed *
                            static_cast<std::uint64_t>(shape.num_kv_heads()) *
                            static_cast<std::uint64_t>(shape.head_dim());
}

}  // namespace detail
}  // namespace kvlab
