// What the CPU kernels ran between two points of a test, from their execution counters
// (cpu/parallel.hpp's `parallel_counts`, cpu/paged_attention.hpp's `paged_split_counts`), so that
// a test of a divided path asserts that the path ran, not that a plan chose it.
#pragma once

#include <cstdint>

#include "kvlab/cpu/paged_attention.hpp"
#include "kvlab/cpu/parallel.hpp"

namespace kvlab_test {

// The counters' values when it was made; each member function gives the increase since.
class RanSince {
 public:
  RanSince()
      : threaded_(parallel().threaded.load()),
        split_k_(paged().split_k.load()),
        partitions_(paged().partitions.load()),
        merges_(paged().merges.load()),
        by_heads_(paged().by_heads.load()),
        head_items_(paged().head_items.load()) {}

  // loops of parallel_for whose items ran on several threads
  std::uint64_t threaded_loops() const { return parallel().threaded.load() - threaded_; }
  // paged calls that ran split-K, the partitions they attended and merged
  std::uint64_t split_k_calls() const { return paged().split_k.load() - split_k_; }
  std::uint64_t partitions() const { return paged().partitions.load() - partitions_; }
  std::uint64_t merges() const { return paged().merges.load() - merges_; }
  // paged calls that ran (sequence, head range) items, and those items
  std::uint64_t by_heads_calls() const { return paged().by_heads.load() - by_heads_; }
  std::uint64_t head_items() const { return paged().head_items.load() - head_items_; }

 private:
  static kvlab::cpu::detail::ParallelCounts& parallel() {
    return kvlab::cpu::detail::parallel_counts();
  }
  static kvlab::cpu::detail::PagedSplitCounts& paged() {
    return kvlab::cpu::detail::paged_split_counts();
  }
  std::uint64_t threaded_, split_k_, partitions_, merges_, by_heads_, head_items_;
};

}  // namespace kvlab_test
