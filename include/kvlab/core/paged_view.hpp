/// \file
/// \brief `PagedKVView`: the documented layout of a paged KV cache, for host and device code.
///
/// The cache is a block pool addressed through per-sequence block tables in CSR form, given as
/// plain pointers and sizes that host and device code read the same way. The addressing is checked
/// in the tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/core/quant_blocks.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/core/views.hpp"

namespace kvlab {

/// The entry of a block table whose block went back to the pool because it fell wholly out of
/// a sliding window (`PagedKVView::window`): it points to nothing that can be read.
constexpr std::int32_t kReleasedBlock = -1;

/// How a block pool orders the values of one block: the two layouts that vLLM and FlashInfer
/// offer (FlashInfer's `kv_layout`). Both hold `block_size` tokens of one sequence per block.
enum class KVLayout : int {
  /// `[num_blocks, block_size, num_kv_heads, head_dim]`: token-major; one token's K/V heads are
  /// adjacent, so writing a token is one contiguous copy.
  NHD = 0,
  /// `[num_blocks, num_kv_heads, block_size, head_dim]`: head-major within each block; one
  /// head's rows of a block are adjacent, so attention reads each head as the contiguous cache
  /// does (`[num_kv_heads, capacity, head_dim]`), block by block.
  HND = 1,
};

/// Name of a layout: "NHD" or "HND".
inline const char* to_string(KVLayout layout) { return layout == KVLayout::HND ? "HND" : "NHD"; }

/// Read-only view of one layer of a paged KV cache and the block tables of a batch.
///
/// Pool layout (`layout`): `k` and `v` each point to `num_blocks` blocks of `block_size *
/// num_kv_heads * head_dim` values, ordered `[block_size, num_kv_heads, head_dim]` in each
/// block (NHD, the default) or `[num_kv_heads, block_size, head_dim]` (HND). A block holds
/// `block_size` consecutive tokens of one sequence, each token with all its K/V heads. `T` is the
/// stored element (a number, or a quantized block of 32 values: `StorageUnit`), so a head's row
/// is `row_units()` elements and every offset below counts elements.
///
/// Block tables, in the CSR form FlashInfer uses: sequence `s` of the batch owns the logical
/// blocks `indices[indptr[s]] … indices[indptr[s + 1] - 1]` (physical block ids, in any order),
/// all full but the last, which holds `last_page_len[s]` tokens (1 <= last_page_len <=
/// block_size). Token `pos` of sequence `s` is slot `pos % block_size` of physical block
/// `indices[indptr[s] + pos / block_size]` — the same translation a page table does for a
/// virtual address. Slots past a sequence's end hold nothing meaningful and are never read.
///
/// With a sliding window (`window` = W >= 1; see `cpu::reference_attention`) the query at
/// position p reads only keys (p − W, p]: the blocks wholly before the first query's window may
/// have gone back to the pool, and their entries in `indices` are `kReleasedBlock` (−1) —
/// nothing that can be read (the kernels check that no query's window reaches one). With
/// attention sinks (`sinks` = S >= 1, a window only) a query also sees the sequence's first S
/// keys (`sink_keys`), so the blocks that hold them stay.
template <typename T>
struct PagedKVView {
  /// keys:   [num_blocks, block_size, num_kv_heads, head_dim] (NHD)
  const T* k = nullptr;
  const T* v = nullptr;                   ///< values: the same layout as `k`
  int num_blocks = 0;                     ///< blocks in the pool
  int block_size = 0;                     ///< tokens per block, >= 1
  int num_kv_heads = 0;                   ///< K/V heads
  int head_dim = 0;                       ///< values per head
  int batch = 0;                          ///< sequences in the batch
  const std::int32_t* indptr = nullptr;   ///< [batch + 1]: CSR row pointers into indices
  const std::int32_t* indices = nullptr;  ///< [indptr[batch]]: physical block ids
  /// [batch]: tokens in each last block, 1..block_size
  const std::int32_t* last_page_len = nullptr;
  KVLayout layout = KVLayout::NHD;  ///< order of the values within a block
  int window = 0;  ///< W >= 1: a query sees its last W keys; 0: every key up to itself
  int sinks = 0;   ///< S >= 1 (a window only): a query also sees keys [0, S)

  /// Blocks held by sequence `seq`.
  KVLAB_HOST_DEVICE int num_pages(int seq) const { return indptr[seq + 1] - indptr[seq]; }
  /// Tokens in sequence `seq`: `(num_pages - 1) * block_size + last_page_len`.
  KVLAB_HOST_DEVICE int seq_len(int seq) const {
    return (num_pages(seq) - 1) * block_size + last_page_len[seq];
  }
  /// Physical block holding token `pos` of sequence `seq`.
  KVLAB_HOST_DEVICE std::int32_t block_of(int seq, int pos) const {
    return indices[indptr[seq] + pos / block_size];
  }
  /// Stored elements of one head's row: `head_dim / StorageUnit<T>::kValues`.
  KVLAB_HOST_DEVICE int row_units() const { return head_dim / StorageUnit<T>::kValues; }
  /// Offset, in elements, of head `head` of the token in physical slot `slot` (`block *
  /// block_size + slot in block`, as `PagedKVCache::append` returns) from `k` (or `v`).
  KVLAB_HOST_DEVICE std::ptrdiff_t slot_offset(std::int64_t slot, int head) const {
    const std::ptrdiff_t block = static_cast<std::ptrdiff_t>(slot / block_size);
    const std::ptrdiff_t in_block = static_cast<std::ptrdiff_t>(slot % block_size);
    return layout == KVLayout::HND
               ? ((block * num_kv_heads + head) * block_size + in_block) * row_units()
               : ((block * block_size + in_block) * num_kv_heads + head) * row_units();
  }
  /// Offset, in elements, of head `head` of token `pos` of sequence `seq` from `k` (or `v`).
  KVLAB_HOST_DEVICE std::ptrdiff_t offset(int seq, int pos, int head) const {
    return slot_offset(
        static_cast<std::int64_t>(block_of(seq, pos)) * block_size + pos % block_size, head);
  }
  /// Elements from a token's row of one head to the next token's row of the same head in the
  /// same block: `num_kv_heads * row_units()` (NHD) or `row_units()` (HND).
  KVLAB_HOST_DEVICE std::ptrdiff_t token_stride() const {
    return layout == KVLayout::HND ? row_units()
                                   : static_cast<std::ptrdiff_t>(num_kv_heads) * row_units();
  }
  /// Elements from a token's row of head h to the same token's row of head h + 1: `row_units()`
  /// (NHD) or `block_size * row_units()` (HND).
  KVLAB_HOST_DEVICE std::ptrdiff_t head_stride() const {
    return layout == KVLayout::HND ? static_cast<std::ptrdiff_t>(block_size) * row_units()
                                   : row_units();
  }
  /// Key of head `head` of token `pos` of sequence `seq`: `row_units()` elements.
  KVLAB_HOST_DEVICE const T* key(int seq, int pos, int head) const {
    return k + offset(seq, pos, head);
  }
  /// Value of head `head` of token `pos` of sequence `seq`: `row_units()` elements.
  KVLAB_HOST_DEVICE const T* value(int seq, int pos, int head) const {
    return v + offset(seq, pos, head);
  }
};

namespace detail {

/// Checks a paged view against `shape` and every invariant of its block tables (a raw view may
/// come from anywhere): non-null arrays, `indptr` increasing from 0, every index a block of the
/// pool (or, with a window, `kReleasedBlock`: `check_window_pages` says whether a query reaches
/// it), `1 <= last_page_len <= block_size`, a window >= 0, sinks >= 0 and only with a window.
/// O(number of pages).
/// (Host only.)
template <typename T>
void check_paged_view(const char* where, const AttentionShape& shape, const PagedKVView<T>& cache) {
  require_equal(where, "cache.num_kv_heads", cache.num_kv_heads, shape.num_kv_heads(),
                "shape.num_kv_heads()");
  require_equal(where, "cache.head_dim", cache.head_dim, shape.head_dim(), "shape.head_dim()");
  require_at_least(where, "cache.batch", cache.batch, 1);
  require_at_least(where, "cache.block_size", cache.block_size, 1);
  require_at_least(where, "cache.num_blocks", cache.num_blocks, 1);
  require_at_least(where, "cache.window", cache.window, 0);
  require_at_least(where, "cache.sinks", cache.sinks, 0);
  if (cache.sinks > 0 && cache.window == 0) {
    fail(where, "cache.sinks", "0 without a window (every key is seen)", cache.sinks);
  }
  if (cache.k == nullptr || cache.v == nullptr || cache.indptr == nullptr ||
      cache.indices == nullptr || cache.last_page_len == nullptr) {
    fail(where, "cache.k / v / indptr / indices / last_page_len", "non-null pointers",
         "a null pointer");
  }
  require_equal(where, "cache.indptr[0]", cache.indptr[0], 0);
  for (int s = 0; s < cache.batch; ++s) {
    const std::string seq = "[" + std::to_string(s) + "]";
    if (cache.indptr[s + 1] <= cache.indptr[s]) {
      fail(where, "cache.indptr[" + std::to_string(s + 1) + "]",
           "> cache.indptr" + seq + " (" + std::to_string(cache.indptr[s]) + ")",
           cache.indptr[s + 1]);
    }
    if (static_cast<std::int64_t>(cache.indptr[s + 1] - cache.indptr[s]) * cache.block_size >
        INT32_MAX) {
      fail(where, "cache.indptr[" + std::to_string(s + 1) + "]",
           "a sequence of at most " + std::to_string(INT32_MAX) + " tokens",
           std::to_string(cache.indptr[s + 1] - cache.indptr[s]) + " blocks");
    }
    if (cache.last_page_len[s] < 1 || cache.last_page_len[s] > cache.block_size) {
      fail(where, "cache.last_page_len" + seq,
           "in [1, block_size (" + std::to_string(cache.block_size) + ")]", cache.last_page_len[s]);
    }
  }
  for (std::int32_t i = 0; i < cache.indptr[cache.batch]; ++i) {
    const bool released = cache.window > 0 && cache.indices[i] == kReleasedBlock;
    if (!released && (cache.indices[i] < 0 || cache.indices[i] >= cache.num_blocks)) {
      fail(where, "cache.indices[" + std::to_string(i) + "]",
           "in [0, " + std::to_string(cache.num_blocks) + ")" +
               (cache.window > 0 ? " or kReleasedBlock (-1)" : ""),
           cache.indices[i]);
    }
  }
}

/// Checks that no query reaches a released block: for each sequence s with q queries
/// (`qo_indptr`, [batch + 1], checked), every page from the one holding its first query's first
/// visible key on, and every page holding a sink its last query sees, is a block of the pool.
/// (Host only.)
template <typename T>
void check_window_pages(const char* where, const std::int32_t* qo_indptr,
                        const PagedKVView<T>& cache) {
  for (int s = 0; s < cache.batch; ++s) {
    const int q_len = qo_indptr[s + 1] - qo_indptr[s];
    if (q_len == 0) continue;
    const int first_page =
        kvlab::first_visible_key(cache.seq_len(s) - q_len, cache.window) / cache.block_size;
    // pages [0, sink_pages) hold the sinks that the last query sees (the most of any)
    const int sink_pages =
        (kvlab::sink_keys(cache.seq_len(s) - 1, cache.window, cache.sinks) + cache.block_size - 1) /
        cache.block_size;
    for (std::int32_t i = cache.indptr[s]; i < cache.indptr[s + 1]; ++i) {
      const std::int32_t page = i - cache.indptr[s];
      if (cache.indices[i] == kReleasedBlock && (page >= first_page || page < sink_pages)) {
        fail(where, "cache.indices[" + std::to_string(i) + "]",
             "a block of the pool (page " + std::to_string(page) + " of sequence " +
                 std::to_string(s) +
                 (page >= first_page ? " is within its queries' window)" : " holds sinks)"),
             "kReleasedBlock (-1)");
      }
    }
  }
}

/// Checks the query rows of a ragged batch against its view (a raw array may come from
/// anywhere): `qo_indptr` is [batch + 1], starts at 0, and sequence s brings between 0 and its
/// length queries. (Host only.)
template <typename T>
void check_qo_indptr(const char* where, const std::vector<std::int32_t>& qo_indptr,
                     const PagedKVView<T>& cache) {
  require_equal(where, "qo_indptr.size()", qo_indptr.size(),
                static_cast<std::size_t>(cache.batch) + 1, "cache.batch + 1");
  require_equal(where, "qo_indptr[0]", qo_indptr[0], 0);
  for (int s = 0; s < cache.batch; ++s) {
    const auto i = static_cast<std::size_t>(s);
    const std::int64_t q_len = static_cast<std::int64_t>(qo_indptr[i + 1]) - qo_indptr[i];
    if (q_len < 0 || q_len > cache.seq_len(s)) {
      fail(where, "qo_indptr[" + std::to_string(s + 1) + "]",
           "in [qo_indptr[" + std::to_string(s) + "] (" + std::to_string(qo_indptr[i]) +
               "), that + the sequence's length (" + std::to_string(cache.seq_len(s)) + ")]",
           qo_indptr[i + 1]);
    }
  }
}

}  // namespace detail
}  // namespace kvlab
