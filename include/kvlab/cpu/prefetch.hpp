/// \file
/// \brief When and how far ahead the CPU attention kernels ask for K/V rows before reading them.
///
/// A decode step reads each head's K/V rows once, in order. The memory's own prefetcher follows
/// such a stream only where it lies in order in memory and stops at each 4 KiB page; in a block
/// pool the next rows lie in another block, wherever the block table puts it, which no hardware
/// prefetcher can guess. So the kernels ask for rows ahead themselves (`attend_partial`, through
/// `ask_rows_ahead`): at each row they read, the same head's row `kPrefetchAhead` bytes on into the
/// L1 cache, and where rows are read one by one over a long range, the row `kPrefetchFar` bytes on
/// into the L2. Short ranges (under `kPrefetchMinBytes` per head) sit in the caches after the
/// first step and ask for nothing. An ask is a hint: it reads nothing, cannot fault, and changes no
/// result. Both distances can be set before kvlab is included (`KVLAB_PREFETCH_AHEAD`,
/// `KVLAB_PREFETCH_FAR`). Internal (`cpu::detail`); tested in `tests/cpu/test_row_runs.cpp`.
///
/// \par Measured
/// `bench/results/README.md`, "the K/V rows asked for ahead of their reading" and "a second ask, a
/// page ahead, into the L2" (bench_decode_bandwidth, bench_paged_decode, bench_generate); every
/// distance tried, the sizes that ask nothing, and the kinds of rows left out (quantized blocks;
/// far asks where rows are read in runs) are in `bench/results/cpu-prefetch-ahead.txt`.
#pragma once

#include <algorithm>
#include <cstddef>

namespace kvlab::cpu::detail {

#ifndef KVLAB_PREFETCH_AHEAD
/// How far ahead of a K/V row, in bytes, the CPU attention kernels ask for memory
/// (`cpu::detail::kPrefetchAhead`); define it before including kvlab to tune it for another
/// machine, 0 to ask for nothing ahead.
#define KVLAB_PREFETCH_AHEAD 1024
#endif

/// How far ahead of a K/V row the attention kernels ask for memory into the L1 cache, in bytes
/// (`KVLAB_PREFETCH_AHEAD`; 1024: two 128-value fp32 rows).
constexpr std::size_t kPrefetchAhead = KVLAB_PREFETCH_AHEAD;

/// The fewest bytes of one head's rows that a pass must read for the kernels to ask for rows
/// ahead: a shorter range is in the caches after the first step, and asks would only cost
/// instructions.
constexpr std::size_t kPrefetchMinBytes = std::size_t{64} << 10;

#ifndef KVLAB_PREFETCH_FAR
/// How far ahead of a K/V row, in bytes, the CPU attention kernels also ask for memory to be
/// brought into the L2 cache (`cpu::detail::kPrefetchFar`); define it before including kvlab to
/// tune it for another machine, 0 to ask for nothing that far (with `KVLAB_PREFETCH_AHEAD` 0,
/// nothing is asked for at either distance).
#define KVLAB_PREFETCH_FAR 4096
#endif

/// How far ahead of a K/V row the attention kernels ask for memory into the L2 cache, in bytes
/// (`KVLAB_PREFETCH_FAR`): a 4 KiB page, where the memory's own prefetcher has not yet begun.
/// Into the L2 and not the L1: each ask frees its L1 miss slot when the L2 takes it over.
constexpr std::size_t kPrefetchFar = KVLAB_PREFETCH_FAR;

/// The fewest bytes of one head's rows that a pass must read for the kernels to ask
/// `kPrefetchFar` bytes ahead as well: a shorter range is likely still in the caches from the step
/// before.
constexpr std::size_t kPrefetchFarMinBytes = std::size_t{1} << 20;

/// Rows of `row_bytes` bytes that make up `bytes` bytes (at least one; 0 if `bytes` is 0).
inline int rows_ahead(std::size_t row_bytes, std::size_t bytes = kPrefetchAhead) {
  if (bytes == 0) return 0;
  return static_cast<int>(std::max<std::size_t>(1, bytes / row_bytes));
}

/// The cache a line asked for ahead is brought into (`prefetch_line`).
enum class CacheLevel {
  L1,  ///< the L1 cache (and every level below it): x86's `prefetcht0`
  L2,  ///< the L2 cache (and below), not the L1: x86's `prefetcht1`
};

/// Asks for the 64-byte line at `at` to be brought into the cache `level`, without waiting for
/// it. On x86 it is the instruction itself, in a volatile asm statement: GCC 12 removed calls to a
/// function whose only work was `__builtin_prefetch`, as code without effect. Elsewhere it is
/// `__builtin_prefetch`; nothing where the compiler has neither.
inline void prefetch_line(const char* at, CacheLevel level = CacheLevel::L1) {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  if (level == CacheLevel::L1)
    asm volatile("prefetcht0 %0" : : "m"(*at));
  else
    asm volatile("prefetcht1 %0" : : "m"(*at));
#elif defined(__GNUC__) || defined(__clang__)
  if (level == CacheLevel::L1)
    __builtin_prefetch(at, 0, 3);  // for reading, kept in every cache level
  else
    __builtin_prefetch(at, 0, 2);  // for reading, kept from the L2 down
#else
  (void)at;
  (void)level;
#endif
}

/// Asks for the `bytes` bytes from `row` to be brought into the cache `level`, line by line.
inline void prefetch_row(const void* row, std::size_t bytes, CacheLevel level = CacheLevel::L1) {
  const char* at = static_cast<const char*>(row);
  for (std::size_t line = 0; line < bytes; line += 64) prefetch_line(at + line, level);
}

}  // namespace kvlab::cpu::detail
