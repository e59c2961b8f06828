/// \file
/// \brief `PagedKVView`: the documented layout of a paged KV cache — a block pool addressed
/// through per-sequence block tables in CSR form — as plain pointers and sizes that host and
/// device code read the same way. The addressing is checked in the tests.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvlab/config.hpp"

namespace kvlab {

/// Read-only view of one layer of a paged KV cache and the block tables of a batch.
///
/// Pool layout ("NHD"): `k` and `v` each point to `[num_blocks, block_size, num_kv_heads,
/// head_dim]` values. A block holds `block_size` consecutive tokens of one sequence, each token
/// with all its K/V heads.
///
/// Block tables, in the CSR form FlashInfer uses: sequence `s` of the batch owns the logical
/// blocks `indices[indptr[s]] … indices[indptr[s + 1] - 1]` (physical block ids, in any order),
/// all full but the last, which holds `last_page_len[s]` tokens (1 <= last_page_len <=
/// block_size). Token `pos` of sequence `s` is slot `pos % block_size` of physical block
/// `indices[indptr[s] + pos / block_size]` — the same translation a page table does for a
/// virtual address. Slots past a sequence's end hold nothing meaningful and are never read.
template <typename T>
struct PagedKVView {
  const T* k = nullptr;                        ///< keys:   [num_blocks, block_size, num_kv_heads, head_dim]
  const T* v = nullptr;                        ///< values: [num_blocks, block_size, num_kv_heads, head_dim]
  int num_blocks = 0;                          ///< blocks in the pool
  int block_size = 0;                          ///< tokens per block, >= 1
  int num_kv_heads = 0;                        ///< K/V heads
  int head_dim = 0;                            ///< values per head
  int batch = 0;                               ///< sequences in the batch
  const std::int32_t* indptr = nullptr;        ///< [batch + 1]: CSR row pointers into indices
  const std::int32_t* indices = nullptr;       ///< [indptr[batch]]: physical block ids
  const std::int32_t* last_page_len = nullptr; ///< [batch]: tokens in each last block, 1..block_size

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
  /// Offset, in elements, of head `head` of token `pos` of sequence `seq` from `k` (or `v`).
  KVLAB_HOST_DEVICE std::ptrdiff_t offset(int seq, int pos, int head) const {
    const std::ptrdiff_t slot =
        static_cast<std::ptrdiff_t>(block_of(seq, pos)) * block_size + pos % block_size;
    return (slot * num_kv_heads + head) * head_dim;
  }
  /// Key of head `head` of token `pos` of sequence `seq`: `head_dim` values.
  KVLAB_HOST_DEVICE const T* key(int seq, int pos, int head) const { return k + offset(seq, pos, head); }
  /// Value of head `head` of token `pos` of sequence `seq`: `head_dim` values.
  KVLAB_HOST_DEVICE const T* value(int seq, int pos, int head) const { return v + offset(seq, pos, head); }
};

}  // namespace kvlab
