/// \file
/// \brief How split-K ("flash-decoding") cuts a sequence's keys into partitions of whole units.
///
/// The units are the blocks of a paged cache, so a partition never splits a block. Shared by host
/// and device code. The partial results of the partitions merge by `merge_softmax_states`
/// (`core/softmax_state.hpp`). Checked in the tests for every length, part count and unit.
#pragma once

#include "kvlab/config.hpp"

namespace kvlab {

/// How split-K cuts `length` keys into at most `parts` partitions of whole `align`-key units
/// (the block size of a paged cache, so a partition never splits a block; 1 for a contiguous
/// cache): every partition but the last has `partition_size(length, parts, align)` keys.
/// \return keys per partition: ceil(ceil(length / align) / parts) · align, 0 if length is 0
KVLAB_HOST_DEVICE inline int partition_size(int length, int parts, int align) {
  if (length <= 0) return 0;
  const int units = (length + align - 1) / align;
  return (units + parts - 1) / parts * align;
}

/// Number of non-empty partitions that `partition_size` gives: ceil(length / size), <= parts.
KVLAB_HOST_DEVICE inline int partition_count(int length, int parts, int align) {
  const int size = partition_size(length, parts, align);
  return size == 0 ? 0 : (length + size - 1) / size;
}

}  // namespace kvlab
