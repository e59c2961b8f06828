/// \file
/// \brief The inner loop of the CPU decode and prefill kernels: a tile of queries attends to one
/// K/V head's rows, wherever and however they are stored.
///
/// Shared by `cpu::decode_attention` (contiguous cache) and `cpu::paged_decode_attention` /
/// `cpu::paged_prefill_attention` (paged cache). `attend_partial` computes what
/// `cpu::reference_attention` computes over the rows as stored, for a tile's rows and heads,
/// through `ContiguousRows` or `PagedRows`, by one of three read paths (`read_path`): in runs of
/// consecutive rows (`row_runs.hpp`; int8 and int4 rows always, fp16 and bf16 rows, and fp32 rows
/// for GQA groups of 4 or more, where the build has their vector form), as matrix products over
/// spans of rows (other fp32 rows under a prefill tile), or one token's rows at a time (the rest,
/// decoded as read where stored in another type). `attend_path_counts` counts which ran.
/// Internal (`cpu::detail`); tested through the public kernels.
///
/// \par Measured
/// `bench/results/README.md`: "the prefill's attention tile" (`kDecodeQueryTile`), "after the
/// row-by-row loop left Eigen's dot" (`dot_row`, `add_scaled_row`), "the K/V rows asked for ahead
/// of their reading" and "a second ask, a page ahead, into the L2" (`row_asks`, `ask_rows_ahead`;
/// which pools and rows ask, in `bench/results/cpu-prefetch-ahead.txt`), and "K/V rows read in
/// runs" (which rows take `ReadPath::runs`).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvlab/core/counters.hpp"
#include "kvlab/core/paged_view.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/core/softmax_state.hpp"
#include "kvlab/core/views.hpp"
#include "kvlab/cpu/prefetch.hpp"
#include "kvlab/cpu/row_runs.hpp"
#include "kvlab/kv_storage.hpp"
#include "kvlab/matrix.hpp"

namespace kvlab::cpu {

/// Query rows processed together by the decode kernels (a decode step has one per sequence; a
/// prefill, one tile after another). A prefill tile over fp32 rows computes its scores and value
/// sums as matrix products of this many rows per query head, and Eigen's GEMM computes rows in
/// blocks of three vectors (48 floats with AVX-512, 24 with AVX2).
constexpr int kDecodeQueryTile = 48;

namespace detail {

/// Calls of `attend_partial` (one per tile) since the program started, by how they read their
/// K/V rows: in runs (`row_runs.hpp`), as matrix products over spans of rows, or one row at a
/// time. The choice depends on the storage type, head_dim, the group and the tile's rows; the
/// tests read these counts to assert which way a case went.
struct AttendPathCounts {
  std::atomic<std::uint64_t> runs{0};      ///< rows read in runs
  std::atomic<std::uint64_t> products{0};  ///< scores and sums as matrix products
  std::atomic<std::uint64_t> rows{0};      ///< one row at a time
  /// calls that asked for rows ahead of their reading (`ask_rows_ahead`), whichever way they read
  std::atomic<std::uint64_t> asked_ahead{0};
  /// calls of those that also asked for rows far ahead, into the L2 cache (`kPrefetchFar`)
  std::atomic<std::uint64_t> asked_far{0};
};
/// The counts of every `attend_partial` call of the program.
inline AttendPathCounts& attend_path_counts() {
  static AttendPathCounts counts;
  return counts;
}

/// The rows of a contiguous cache from K/V head `head` on: row `pos` of head `head + j` at
/// `base + (j * capacity + slot(pos)) * row_units` elements (head-major: one head's rows are
/// adjacent; `slot(pos)` is `pos`, or `pos % capacity` in the ring of a windowed cache). `S` is
/// the stored element type.
template <typename S>
struct ContiguousRows {
  using Stored = S;  ///< the stored element type
  const ContiguousKVView<S>& cache;
  int head;

  /// Calls `f(pos, row)` for the key rows `pos` in [begin, end) of head `head`, in order.
  template <typename F>
  void keys(int begin, int end, F&& f) const {
    walk(cache.key(head, 0), begin, end, f);
  }
  /// Calls `f(pos, row)` for the value rows `pos` in [begin, end) of head `head`, in order.
  template <typename F>
  void values(int begin, int end, F&& f) const {
    walk(cache.value(head, 0), begin, end, f);
  }
  /// Calls `f(pos, count, row, stride)` for the key rows [begin, end) of head `head`, in order,
  /// in spans of `count` rows evenly spaced in memory: row pos + i at `row + i * stride`.
  template <typename F>
  void key_spans(int begin, int end, F&& f) const {
    spans(cache.key(head, 0), begin, end, f);
  }
  /// Calls `f(pos, count, row, stride)` for the value rows [begin, end) of head `head`, as
  /// `key_spans`.
  template <typename F>
  void value_spans(int begin, int end, F&& f) const {
    spans(cache.value(head, 0), begin, end, f);
  }
  /// Elements from a row of head h to the same token's row of head h + 1.
  std::ptrdiff_t head_stride() const {
    return static_cast<std::ptrdiff_t>(cache.capacity) * cache.row_units();
  }
  /// Whether the kernels ask for rows ahead of their reading (`prefetch_row`): yes.
  static constexpr bool asks_ahead() { return true; }
  /// Key row `pos + ahead` of head `head`, given `row`, its key row `pos`.
  const S* key_later(int pos, const S* /*row*/, int ahead) const {
    return cache.key(head, pos + ahead);
  }
  /// Value row `pos + ahead` of head `head`, given `row`, its value row `pos`.
  const S* value_later(int pos, const S* /*row*/, int ahead) const {
    return cache.value(head, pos + ahead);
  }

 private:
  // One span, or two where the rows wrap around the ring of a windowed cache.
  template <typename F>
  void spans(const S* base, int begin, int end, F&& f) const {
    for (int pos = begin; pos < end;) {
      const int slot = cache.slot(pos);
      const int count = std::min(end - pos, cache.capacity - slot);  // up to the ring's end
      f(pos, count, base + static_cast<std::ptrdiff_t>(slot) * cache.row_units(),
        static_cast<std::ptrdiff_t>(cache.row_units()));
      pos += count;
    }
  }
  template <typename F>
  void walk(const S* base, int begin, int end, F& f) const {
    spans(base, begin, end, [&](int pos, int count, const S* row, std::ptrdiff_t stride) {
      for (int i = 0; i < count; ++i) f(pos + i, row + i * stride);
    });
  }
};

/// The rows of sequence `seq` in a paged cache from K/V head `head` on, block by block: the
/// block table is read once per block, not once per row. Within a block a head's rows are
/// `token_stride()` apart: whole token rows in the NHD pool (a token's heads adjacent, so the
/// rows of several heads are one contiguous read per token), one head's rows back to back in
/// the HND pool. `S` is the stored element type.
template <typename S>
struct PagedRows {
  using Stored = S;  ///< the stored element type
  const PagedKVView<S>& cache;
  int seq;
  int head;

  /// Calls `f(pos, row)` for the key rows `pos` in [begin, end) of head `head`, in order.
  template <typename F>
  void keys(int begin, int end, F&& f) const {
    walk(cache.k, begin, end, f);
  }
  /// Calls `f(pos, row)` for the value rows `pos` in [begin, end) of head `head`, in order.
  template <typename F>
  void values(int begin, int end, F&& f) const {
    walk(cache.v, begin, end, f);
  }
  /// Calls `f(pos, count, row, stride)` for the key rows [begin, end) of head `head`, in order,
  /// a span per block: row pos + i at `row + i * stride`.
  template <typename F>
  void key_spans(int begin, int end, F&& f) const {
    spans(cache.k, begin, end, f);
  }
  /// Calls `f(pos, count, row, stride)` for the value rows [begin, end) of head `head`, as
  /// `key_spans`.
  template <typename F>
  void value_spans(int begin, int end, F&& f) const {
    spans(cache.v, begin, end, f);
  }
  /// Elements from a row of head h to the same token's row of head h + 1.
  std::ptrdiff_t head_stride() const { return cache.head_stride(); }
  /// Whether the kernels ask for rows ahead of their reading (`prefetch_row`): in the HND pool,
  /// not in the NHD pool, where a token's rows of all heads are one contiguous read that the
  /// memory's own prefetcher follows (asks there made a decode step slower).
  bool asks_ahead() const { return cache.layout == KVLayout::HND; }
  /// Key row `pos + ahead` of head `head`, given `row`, its key row `pos`: in the same block, or
  /// through the block table.
  const S* key_later(int pos, const S* row, int ahead) const {
    return later(cache.k, pos, row, ahead);
  }
  /// Value row `pos + ahead` of head `head`, given `row`, its value row `pos`.
  const S* value_later(int pos, const S* row, int ahead) const {
    return later(cache.v, pos, row, ahead);
  }

 private:
  const S* later(const S* pool, int pos, const S* row, int ahead) const {
    if (pos % cache.block_size + ahead < cache.block_size)
      return row + ahead * cache.token_stride();
    return pool + cache.offset(seq, pos + ahead, head);
  }
  template <typename F>
  void spans(const S* pool, int begin, int end, F&& f) const {
    const std::ptrdiff_t stride = cache.token_stride();  // token to token within a block
    for (int pos = begin; pos < end;) {
      const S* row = pool + cache.offset(seq, pos, head);  // slot pos % block_size of this block
      const int last = std::min(end, (pos / cache.block_size + 1) * cache.block_size);
      f(pos, last - pos, row, stride);
      pos = last;
    }
  }
  template <typename F>
  void walk(const S* pool, int begin, int end, F& f) const {
    spans(pool, begin, end, [&](int pos, int count, const S* row, std::ptrdiff_t stride) {
      for (int i = 0; i < count; ++i) f(pos + i, row + i * stride);
    });
  }
};

/// Scratch buffers of one worker, reused from tile to tile.
template <typename T>
struct TileScratch {
  /// [heads * rows * group, head_dim]: query (K/V head hk0 + j, row i, member g) at (j*rows +
  /// i)*group + g
  RowMatrix<T> queries;
  /// [heads * rows * group, >= keys]: scores, then exp(score - max) (see `padded_span`)
  RowMatrix<T> probs;
  /// [heads * rows * group, head_dim]: Σ exp(score - max) · value
  RowMatrix<T> acc;
  /// [heads * rows * group]: max and Σ exp(score - max) of each query
  std::vector<SoftmaxState<T>> state;
  /// [heads * head_dim]: one token's rows of the tile's heads, decoded (a cache that stores
  /// its rows as fp16 or bf16; unused otherwise)
  std::vector<T> row;
  /// [heads * rows * group, head_dim]: `acc` of the window while `attend_tile` attends the sinks
  RowMatrix<T> window_acc;
  /// [heads * rows * group]: `state` of the window while `attend_tile` attends the sinks
  std::vector<SoftmaxState<T>> window_state;
};

/// Columns to allocate for `span` scores per query: `span` rounded up to whole 64-byte lines,
/// and to an odd number of them. Score rows are then an odd number of lines apart, so the
/// rows of up to 64 queries fall in different sets of an L1 cache with 64-byte lines and 64
/// sets. With exactly `span` columns, a span that is a multiple of 1024 floats puts every row
/// in the same set, and a tile of 32 queries, which writes one score to each row per key,
/// evicts its own lines at every key.
template <typename T>
int padded_span(int span) {
  // elements per line
  constexpr int kLine = 64 / static_cast<int>(sizeof(T)) > 0 ? 64 / static_cast<int>(sizeof(T)) : 1;
  int lines = (span + kLine - 1) / kLine;
  if (lines % 2 == 0) ++lines;
  return lines * kLine;
}

/// a · b over `n` values: one key of `attend_partial`'s row-by-row loop scored against one
/// query. With AVX2, floats are read in order on four chains (`avx2::dot`); otherwise Eigen's
/// dot product.
template <typename T>
T dot_row(const T* a, const T* b, int n) {
#if KVLAB_ROW_RUNS_AVX2
  if constexpr (std::is_same<T, float>::value) return avx2::dot(a, b, n);
#endif
  return Eigen::Map<const RowVector<T>>(a, n).dot(Eigen::Map<const RowVector<T>>(b, n));
}

/// acc += weight · row over `n` values: one value row of `attend_partial`'s row-by-row loop
/// added to one query's sum (`avx2::add_scaled` with AVX2; otherwise Eigen's).
template <typename T>
void add_scaled_row(T weight, const T* row, int n, T* acc) {
#if KVLAB_ROW_RUNS_AVX2
  if constexpr (std::is_same<T, float>::value) return avx2::add_scaled(weight, row, n, acc);
#endif
  Eigen::Map<RowVector<T>>(acc, n) += weight * Eigen::Map<const RowVector<T>>(row, n);
}

/// Asks for the key rows (`kKeys`) or value rows of `heads` heads (from `source`'s first head on,
/// `head_stride()` apart, `row_bytes` each; `prefetch_row`) `ahead` positions after position
/// `pos` into the L1 cache and `far` positions after it into the L2 (each only where that position
/// is before `end`; `far` 0: none), given `row`, the first head's row at `pos` (`key_later`,
/// `value_later`). Kept out of line: inlined into the per-row loops, it made them large enough
/// that the compiler stopped inlining the walk over the rows, which slowed even the steps that ask
/// for nothing.
template <bool kKeys, typename Source, typename S>
#if defined(__GNUC__) || defined(__clang__)
__attribute__((noinline))
#endif
void ask_rows_ahead(const Source& source, int pos, const S* row, int ahead, int far, int end,
                    int heads, std::size_t row_bytes) {
  const auto ask = [&](int on, CacheLevel level) {
    const S* later = kKeys ? source.key_later(pos, row, on) : source.value_later(pos, row, on);
    for (int j = 0; j < heads; ++j)
      prefetch_row(later + j * source.head_stride(), row_bytes, level);
  };
  if (pos + ahead < end) ask(ahead, CacheLevel::L1);
  if (far != 0 && pos + far < end) ask(far, CacheLevel::L2);
}

/// Up to `kRowRun` consecutive rows, at positions pos, pos + 1, …, that the same queries
/// of each head see: [first, last) of each head's queries.
template <typename S>
struct RowRun {
  int pos = 0;             ///< position of the first row
  int count = 0;           ///< rows in the run
  int first = 0;           ///< first query of a head that sees them
  int last = 0;            ///< one past the last
  const S* rows[kRowRun];  ///< [count]: the rows of the tile's first K/V head
};

/// Hands the rows at positions [begin, end) to `on_run` in runs, in order: each run as long as
/// possible, up to `max_run` (<= `kRowRun`) rows seen by the same queries (`first_seeing(pos)`,
/// `last_seeing(pos)`); rows that no query sees are skipped. `walk(b, e, f)` calls f(pos, row)
/// for the rows at positions [b, e) (`ContiguousRows::keys`, `PagedRows::values`, ...).
template <typename S, typename Walk, typename First, typename Last, typename OnRun>
void for_each_row_run(const Walk& walk, int begin, int end, int max_run, const First& first_seeing,
                      const Last& last_seeing, const OnRun& on_run) {
  RowRun<S> run;
  for (int pos = begin; pos < end; pos += run.count) {
    run.pos = pos;
    run.first = first_seeing(pos);
    run.last = last_seeing(pos);
    const int limit = std::min(end, pos + max_run);
    // Both bounds grow with pos: if the run's last candidate is seen by the same queries as its
    // first, so is every row between them (the common case: a decode step, or keys before the
    // causal corner and after a window's edge). Otherwise the run stops where they change.
    const bool same_to_limit =
        first_seeing(limit - 1) == run.first && last_seeing(limit - 1) == run.last;
    int stop = same_to_limit ? limit : pos + 1;  // one past the run's last row
    while (stop < limit && first_seeing(stop) == run.first && last_seeing(stop) == run.last) ++stop;
    run.count = stop - pos;
    if (run.first >= run.last) continue;  // no query sees these rows
    walk(pos, stop, [&](int at, const S* row) { run.rows[at - pos] = row; });
    on_run(run);
  }
}

/// The queries and keys of one call of `attend_partial` or `attend_tile`: query rows [row0,
/// row0 + rows) of `q` — consecutive tokens of one sequence, row `row0` at `first_position` —
/// with the query heads of K/V heads [hk0, hk0 + heads), over keys [key_begin, key_end), each
/// row seeing its last `window` keys (the band; 0: all keys up to itself), and for `attend_tile`
/// also the `sinks` first keys of the sequence that have left its band (`sink_keys`).
struct AttentionTile {
  int row0 = 0;            ///< first query row of the tile in `q`
  int rows = 1;            ///< query rows, 1 <= rows <= kDecodeQueryTile
  int first_position = 0;  ///< position of row `row0` in its sequence
  int hk0 = 0;             ///< first K/V head
  int heads = 1;           ///< K/V heads, [hk0, hk0 + heads)
  int key_begin = 0;       ///< first key of the range
  int key_end = 0;         ///< one past the last key; the tile's last row sees keys up to it
  int window = 0;          ///< W >= 1: row at position p sees keys (p - W, p]; 0: all up to p
  int sinks = 0;           ///< S >= 1 (a window): `attend_tile`'s rows also see keys [0, S)
};

/// The keys that each query of a tile sees, and the queries that see each key: query qi of a K/V
/// head (0 <= qi < `per_head`; row qi / group of the tile, group member qi % group) sees keys
/// [band_start(qi), visible(qi)); key pos is seen by queries [first_seeing(pos), last_seeing(pos))
/// of each head. A query's scores and weights of key pos are in column pos − key_lo of
/// `TileScratch::probs`.
struct TileGeometry {
  int heads = 1;           ///< K/V heads of the tile
  int head_dim = 0;        ///< values per head
  int group = 1;           ///< query heads per K/V head
  int per_head = 1;        ///< queries of one K/V head in the tile: rows · group
  int first_position = 0;  ///< position of the tile's first row
  int window = 0;          ///< W >= 1: each row sees its last W keys; 0: all up to itself
  int key_lo = 0;          ///< the tile's first key: its first row's band start, or key_begin
  int span = 0;            ///< one past the tile's last key; its last row sees up to it
  int shared = 0;          ///< keys [0, shared) are seen by every row (before the causal corner)

  /// The geometry of `tile` under `shape`.
  TileGeometry(const AttentionShape& shape, const AttentionTile& tile)
      : heads(tile.heads),
        head_dim(shape.head_dim()),
        group(shape.group_size()),
        per_head(tile.rows * shape.group_size()),
        first_position(tile.first_position),
        window(tile.window),
        key_lo(
            std::max(tile.key_begin, kvlab::first_visible_key(tile.first_position, tile.window))),
        span(tile.key_end),
        shared(tile.first_position + 1) {}

  /// Queries of the tile, all heads: [heads · per_head].
  int queries() const { return heads * per_head; }
  /// One past query qi's last key.
  int visible(int qi) const { return std::min(span, shared + qi / group); }
  /// Query qi's first key: its band's first key (key_lo for the tile's first row).
  int band_start(int qi) const {
    return std::max(key_lo, kvlab::first_visible_key(first_position + qi / group, window));
  }
  /// The first query of a head that sees key `pos` (0 outside the causal corner).
  int first_seeing(int pos) const { return pos < shared ? 0 : (pos - shared + 1) * group; }
  /// One past the last query of a head that sees key `pos`: with a window, the rows at positions
  /// below pos + W.
  int last_seeing(int pos) const {
    return window > 0 ? std::min(per_head, (pos + window - first_position) * group) : per_head;
  }
};

/// How `attend_partial` reads a tile's K/V rows (`attend_path_counts` counts each).
enum class ReadPath {
  runs,      ///< in runs of consecutive rows (`row_runs.hpp`), never decoded into memory
  products,  ///< scores and value sums as matrix products over spans of rows (Eigen's GEMM)
  rows,      ///< one token's rows at a time, decoded as read where stored in another type
};

/// Whether rows stored as `S` can be read in runs under queries of type `T`: always for quantized
/// blocks, and fp32, fp16 and bf16 rows where this build has their vector form (`kVectorRows`).
template <typename T, typename S>
constexpr bool kReadsRuns = kQuantizedStorage<S> || kVectorRows<T, S>;

/// How a tile of `rows` query rows reads rows stored as `S` (queries of type `T`, `group` queries
/// per K/V head): in runs for quantized blocks, and for other rows that have a vector form when
/// head_dim is whole blocks of 32 — fp32 rows only for groups of four or more, where a row loaded
/// once serves enough queries (for MHA the runs are slower than reading each row on its own);
/// else as matrix products for a prefill tile (several rows) over rows stored as `T`; else one row
/// at a time.
template <typename T, typename S>
ReadPath read_path(int head_dim, int group, int rows) {
  if (kQuantizedStorage<S> || (kReadsRuns<T, S> && head_dim % kQuantBlock == 0 &&
                               (!std::is_same<S, T>::value || group >= 4)))
    return ReadPath::runs;
  if (std::is_same<S, T>::value && rows > 1) return ReadPath::products;
  return ReadPath::rows;
}

/// Which rows `attend_partial` asks for before it reads them (`cpu/prefetch.hpp`): at the row of
/// position pos, the same heads' rows `ahead` positions on into the L1 cache and `far` positions
/// on into the L2 (0: none), where those positions are before `end`.
struct RowAsks {
  int ahead = 0;              ///< positions ahead asked into the L1; 0: no asks at all
  int far = 0;                ///< positions ahead asked into the L2; 0: none
  int nearest = 0;            ///< the nearer of the two (of those asked)
  int end = 0;                ///< one past the last key: nothing asked at or past it
  int heads = 1;              ///< K/V heads asked for at each position
  std::size_t row_bytes = 0;  ///< one head's row as stored

  /// The asks at key rows (`Keys` = std::true_type) or value rows, at position `pos` whose first
  /// head's row is `row`.
  template <typename Keys, typename Source, typename S>
  void at(Keys, const Source& source, int pos, const S* row) const {
    if (ahead != 0 && pos + nearest < end)
      ask_rows_ahead<Keys::value>(source, pos, row, ahead, far, end, heads, row_bytes);
  }
};

/// The asks of a tile of `geometry` over rows stored as `S`, read `by_runs` or not. Asked for:
/// fp32, fp16 and bf16 rows (quantized blocks are paced by their decoding, not by the memory)
/// where the source asks ahead (`asks_ahead`: the contiguous cache and the HND pool) and the pass
/// reads at least `kPrefetchMinBytes` of a head's rows; also `kPrefetchFar` bytes on where rows
/// are read one by one (an MHA step) over at least `kPrefetchFarMinBytes` per head.
template <typename S, typename Source>
RowAsks row_asks(const Source& source, const TileGeometry& geometry, bool by_runs) {
  RowAsks asks;
  asks.end = geometry.span;
  asks.heads = geometry.heads;
  asks.row_bytes = storage_row_bytes<S>(geometry.head_dim);
  const std::size_t range_bytes =  // one head's rows read by the pass
      static_cast<std::size_t>(geometry.span - geometry.key_lo) * asks.row_bytes;
  asks.ahead = !kQuantizedStorage<S> && source.asks_ahead() && range_bytes >= kPrefetchMinBytes
                   ? rows_ahead(asks.row_bytes)
                   : 0;
  asks.far = asks.ahead != 0 && !by_runs && range_bytes >= kPrefetchFarMinBytes
                 ? rows_ahead(asks.row_bytes, kPrefetchFar)
                 : 0;
  asks.nearest = asks.far != 0 ? std::min(asks.ahead, asks.far) : asks.ahead;
  return asks;
}

/// Step 2 of every read path: each query's visible scores in `scratch.probs` become
/// exp(score − max) (all <= 1, the largest exactly 1), and `scratch.state` keeps the max and their
/// sum. `zero_unseen`: the scores of keys outside each query's band are set to 0 (the products
/// path computed them; they must weigh nothing in step 3).
template <typename T>
void exp_scores(const TileGeometry& g, bool zero_unseen, TileScratch<T>& scratch) {
  RowMatrix<T>& probs = scratch.probs;  // [queries, padded span]
  for (int qi = 0; qi < g.queries(); ++qi) {
    const int start = g.band_start(qi % g.per_head), stop = g.visible(qi % g.per_head);
    // [stop - start]: the query's band
    Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>> x(&probs(qi, start - g.key_lo), stop - start);
    const T max = x.maxCoeff();
    x = (x - max).exp();
    scratch.state[static_cast<std::size_t>(qi)] = SoftmaxState<T>{max, x.sum()};
    if (zero_unseen) {
      probs.row(qi).head(start - g.key_lo).setZero();
      probs.row(qi).segment(stop - g.key_lo, g.span - stop).setZero();
    }
  }
}

/// `attend_partial` reading rows in runs (`ReadPath::runs`): each run of consecutive rows seen by
/// the same queries (`for_each_row_run`) is scored against all of them at once (`score_row_run`),
/// then added to their sums (`add_row_run`); each row is loaded once for its whole GQA group.
template <typename T, typename Source>
void attend_by_runs(const TileGeometry g, const RowAsks asks, T scale, const Source& source,
                    TileScratch<T>& scratch) {
  using S = typename Source::Stored;
  RowMatrix<T>& queries = scratch.queries;  // [queries, head_dim]
  RowMatrix<T>& probs = scratch.probs;      // [queries, padded span]
  RowMatrix<T>& acc = scratch.acc;          // [queries, head_dim]
  const int hd = g.head_dim, per_head = g.per_head;
  // f(j, rows_of_j, run) for each run and K/V head j, with head j's rows of the run.
  const auto for_each_head_run = [&](const auto& walk, auto keys, const auto& f) {
    for_each_row_run<S>(
        walk, g.key_lo, g.span, run_rows<S>(), [&](int pos) { return g.first_seeing(pos); },
        [&](int pos) { return g.last_seeing(pos); },
        [&](const RowRun<S>& run) {
          if (asks.ahead != 0)
            for (int r = 0; r < run.count; ++r) asks.at(keys, source, run.pos + r, run.rows[r]);
          for (int j = 0; j < g.heads; ++j) {
            const S* rows_of_j[kRowRun];  // [run.count]: head j's rows of the run
            for (int r = 0; r < run.count; ++r)
              rows_of_j[r] = run.rows[r] + j * source.head_stride();
            f(j, rows_of_j, run);
          }
        });
  };
  // 1. Scores.
  for_each_head_run([&](int b, int e, auto&& f) { source.keys(b, e, f); }, std::true_type{},
                    [&](int j, const S* const* rows_of_j, const RowRun<S>& run) {
                      score_row_run(rows_of_j, run.count, hd, &queries(j * per_head + run.first, 0),
                                    run.last - run.first, scale,
                                    &probs(j * per_head + run.first, run.pos - g.key_lo),
                                    probs.cols());
                    });
  // 2.
  exp_scores(g, false, scratch);
  // 3. Values. A run's rows are asked for before they are read (`prefetch_rows`), except where
  // the tile's heads of a token lie side by side (the NHD pool: one contiguous read per token).
  const bool heads_side_by_side =
      g.heads > 1 &&
      static_cast<std::size_t>(source.head_stride()) * sizeof(S) == storage_row_bytes<S>(hd);
  for_each_head_run([&](int b, int e, auto&& f) { source.values(b, e, f); }, std::false_type{},
                    [&](int j, const S* const* rows_of_j, const RowRun<S>& run) {
                      add_row_run(rows_of_j, run.count, hd,
                                  &probs(j * per_head + run.first, run.pos - g.key_lo),
                                  probs.cols(), run.last - run.first,
                                  &acc(j * per_head + run.first, 0), !heads_side_by_side);
                    });
}

/// `attend_partial` as matrix products (`ReadPath::products`: rows stored as `T`, a tile of several
/// query rows): over each span of evenly spaced rows (`key_spans`, `value_spans`) the scores are
/// the tile's queries times the span's key rows, and the sums the weights times its value rows.
/// Every query is scored against every key of the tile's range, seen or not; step 2 sets the
/// unseen ones to 0. (Without a window that is the causal corner, at most rows·(rows−1)/2 scores
/// per query head; the counters count the products of the keys each query sees, as for the other
/// paths.)
template <typename T, typename Source>
void attend_by_products(const TileGeometry g, T scale, const Source& source,
                        TileScratch<T>& scratch) {
  RowMatrix<T>& queries = scratch.queries;  // [queries, head_dim]
  RowMatrix<T>& probs = scratch.probs;      // [queries, padded span]
  RowMatrix<T>& acc = scratch.acc;          // [queries, head_dim]
  const int hd = g.head_dim, per_head = g.per_head;
  const std::ptrdiff_t head_stride = source.head_stride();
  // 1. Scores. The scale before the product: Eigen folds it into the GEMM (written after it, the
  // product goes through a temporary and a second pass).
  source.key_spans(g.key_lo, g.span, [&](int pos, int count, const T* row, std::ptrdiff_t stride) {
    for (int j = 0; j < g.heads; ++j) {
      // [count, head_dim]: head j's key rows of the span
      const Eigen::Map<const RowMatrix<T>, 0, Eigen::OuterStride<>> keys(
          row + j * head_stride, count, hd, Eigen::OuterStride<>(stride));
      probs.block(j * per_head, pos - g.key_lo, per_head, count).noalias() =
          scale * (queries.middleRows(j * per_head, per_head) * keys.transpose());
    }
  });
  // 2.
  exp_scores(g, true, scratch);
  // 3. Values.
  source.value_spans(g.key_lo, g.span,
                     [&](int pos, int count, const T* row, std::ptrdiff_t stride) {
                       for (int j = 0; j < g.heads; ++j) {
                         // [count, head_dim]: head j's value rows of the span
                         const Eigen::Map<const RowMatrix<T>, 0, Eigen::OuterStride<>> values(
                             row + j * head_stride, count, hd, Eigen::OuterStride<>(stride));
                         acc.middleRows(j * per_head, per_head).noalias() +=
                             probs.block(j * per_head, pos - g.key_lo, per_head, count) * values;
                       }
                     });
}

/// `attend_partial` one token's rows at a time (`ReadPath::rows`): each key row scored against the
/// queries that see it (`dot_row`), each value row added to their sums (`add_scaled_row`). Rows
/// stored in another type than `T` (fp16, bf16 without their vector form) are decoded one token's
/// rows at a time into `scratch.row`: never a copy of the cache.
template <typename T, typename Source>
void attend_row_by_row(const TileGeometry g, const RowAsks asks, T scale, const Source& source,
                       TileScratch<T>& scratch) {
  using S = typename Source::Stored;
  RowMatrix<T>& queries = scratch.queries;  // [queries, head_dim]
  RowMatrix<T>& probs = scratch.probs;      // [queries, padded span]
  RowMatrix<T>& acc = scratch.acc;          // [queries, head_dim]
  const int hd = g.head_dim, per_head = g.per_head;
  constexpr bool kDecoded = !std::is_same<S, T>::value;
  const std::ptrdiff_t head_stride = kDecoded ? hd : source.head_stride();  // in the rows as T
  scratch.row.resize(kDecoded ? static_cast<std::size_t>(g.heads) * static_cast<std::size_t>(hd)
                              : 0);  // [heads * head_dim]
  // A token's rows of the tile's heads as T: where they are stored, or decoded into scratch.row.
  const auto as_t = [&](const S* stored) -> const T* {
    if constexpr (kDecoded) {
      for (int j = 0; j < g.heads; ++j)
        KVStorage<S>::decode(stored + j * source.head_stride(), hd, scratch.row.data() + j * hd);
      return scratch.row.data();
    } else {
      return stored;
    }
  };
  // 1. Scores.
  source.keys(g.key_lo, g.span, [&](int pos, const S* stored) {
    const int first = g.first_seeing(pos), last = g.last_seeing(pos);
    asks.at(std::true_type{}, source, pos, stored);
    const T* row = as_t(stored);
    for (int j = 0; j < g.heads; ++j) {
      const T* key = row + j * head_stride;  // [head_dim]
      for (int qi = j * per_head + first; qi < j * per_head + last; ++qi)
        probs(qi, pos - g.key_lo) = scale * dot_row(&queries(qi, 0), key, hd);
    }
  });
  // 2.
  exp_scores(g, false, scratch);
  // 3. Values.
  source.values(g.key_lo, g.span, [&](int pos, const S* stored) {
    const int first = g.first_seeing(pos), last = g.last_seeing(pos);
    asks.at(std::false_type{}, source, pos, stored);
    const T* row = as_t(stored);
    for (int j = 0; j < g.heads; ++j) {
      const T* value = row + j * head_stride;  // [head_dim]
      for (int qi = j * per_head + first; qi < j * per_head + last; ++qi)
        add_scaled_row(probs(qi, pos - g.key_lo), value, hd, &acc(qi, 0));
    }
  });
}

/// The unnormalised attention of the query rows of `tile` for the query heads of its K/V heads,
/// over the keys in [key_begin, key_end) that each row sees, read through `source`
/// (`ContiguousRows` or `PagedRows` from head `tile.hk0`). Leaves in `scratch`, for query `qi`
/// (K/V head hk0 + j, row i, group member g at qi = (j * rows + i) * group + g): `state[qi]`
/// (max score and Σ exp(score − max)) and `acc.row(qi)` (Σ exp(score − max) · value), the form
/// in which partial results over disjoint key ranges merge (`merge_softmax_states`).
///
/// The queries of the groups and of the tile's rows are gathered; then one of three read paths
/// (`read_path`: `attend_by_runs`, `attend_by_products`, `attend_row_by_row`) computes, each in
/// its own way:
///  1. the key rows are streamed once (for each token, the rows of the `heads` K/V heads), and
///     each one is scored against every query of its group that sees it;
///  2. each query's visible scores become exp(score − max), and their sum is kept (`exp_scores`);
///  3. the value rows are streamed once, and each one is added to every query's sum with its
///     weight exp(score − max).
/// Rows are asked for ahead of their reading where `row_asks` says so: a hint that changes no
/// result. Each query's arithmetic is the same whatever `heads` is: it changes only the order in
/// which rows are read (one head at a time suits the head-major contiguous cache and HND pool, all
/// heads of a token at once suits the token-major NHD pool). A key range other than [0,
/// first_position + rows) — one partition of a split context — is for a single row
/// (`rows == 1`), which sees every key up to its position, or without a window a prefix [0, n)
/// that every row sees (n <= first_position + 1: the sinks). `tile.sinks` is not read here
/// (`attend_tile` attends the sinks). With a window each row sees only its
/// last W keys (`cpu::reference_attention`'s band): the keys stream from the first row's first
/// visible key, and each key meets the rows whose band holds it.
template <typename T, typename Source>
void attend_partial(const AttentionShape& shape, const Eigen::Ref<const RowMatrix<T>>& q,
                    const AttentionTile& tile, const Source& source, TileScratch<T>& scratch) {
  using S = typename Source::Stored;
  const TileGeometry g(shape, tile);
  const ReadPath path = read_path<T, S>(g.head_dim, g.group, tile.rows);
  const RowAsks asks = row_asks<S>(source, g, path == ReadPath::runs);
  AttendPathCounts& counts = attend_path_counts();
  (path == ReadPath::runs       ? counts.runs
   : path == ReadPath::products ? counts.products
                                : counts.rows)
      .fetch_add(1);
  if (asks.ahead != 0) counts.asked_ahead.fetch_add(1);
  if (asks.far != 0) counts.asked_far.fetch_add(1);

  RowMatrix<T>& queries = scratch.queries;  // [heads * rows * group, head_dim]
  queries.resize(g.queries(), g.head_dim);
  for (int j = 0; j < tile.heads; ++j)
    for (int i = 0; i < tile.rows; ++i)
      for (int m = 0; m < g.group; ++m)
        queries.row(j * g.per_head + i * g.group + m) =
            q.block(tile.row0 + i, ((tile.hk0 + j) * g.group + m) * g.head_dim, 1, g.head_dim);
  // [heads * rows * group, padded_span(span - key_lo)]: key pos in column pos - key_lo
  scratch.probs.resize(g.queries(), padded_span<T>(g.span - g.key_lo));
  scratch.state.resize(static_cast<std::size_t>(g.queries()));
  scratch.acc.setZero(g.queries(), g.head_dim);

  const T scale = static_cast<T>(shape.scale());
  switch (path) {
    case ReadPath::runs:
      if constexpr (kReadsRuns<T, S>) attend_by_runs(g, asks, scale, source, scratch);
      break;
    case ReadPath::products:
      if constexpr (std::is_same<S, T>::value) attend_by_products(g, scale, source, scratch);
      break;
    case ReadPath::rows:
      if constexpr (!kQuantizedStorage<S>) attend_row_by_row(g, asks, scale, source, scratch);
      break;
  }
}

/// Calls `f(i0, n, keys)` for each run of consecutive rows [i0, i0 + n) of a tile of `rows` query
/// rows (row 0 at `first_position`) that see the same sinks beside their window: keys [0, keys),
/// `sink_keys` of their positions, keys >= 1 (rows that see none are skipped). The sinks a row
/// sees grow with its position, so a prefill tile has at most S + 1 runs, a decode step one.
template <typename F>
void for_each_sink_run(int first_position, int rows, int window, int sinks, F&& f) {
  for (int i0 = 0; i0 < rows;) {
    const int keys = sink_keys(first_position + i0, window, sinks);
    int end = i0 + 1;
    while (end < rows && sink_keys(first_position + end, window, sinks) == keys) ++end;
    if (keys > 0) f(i0, end - i0, keys);
    i0 = end;
  }
}

/// Adds to the partial results that `attend_partial` left in `scratch` for the rows of `tile`
/// (their windows) the sinks each row sees besides its window (`tile.sinks`): for each run of rows
/// that see the same sinks (`for_each_sink_run`), the partial attention over those keys, merged
/// into each query's state and sum by the log-sum-exp rule (`merge_softmax_states`), as split-K
/// merges two partitions: a query's window and its sinks are disjoint key ranges.
template <typename T, typename Source>
void attend_sinks(const AttentionShape& shape, const Eigen::Ref<const RowMatrix<T>>& q,
                  const AttentionTile& tile, const Source& source, TileScratch<T>& scratch) {
  const int group = shape.group_size();
  const int hd = shape.head_dim();
  std::swap(scratch.acc, scratch.window_acc);  // the window's results aside (no copy)
  std::swap(scratch.state, scratch.window_state);
  for_each_sink_run(
      tile.first_position, tile.rows, tile.window, tile.sinks, [&](int i0, int n, int keys) {
        AttentionTile sinks = tile;  // rows [i0, i0 + n) of the tile over keys [0, keys)
        sinks.row0 = tile.row0 + i0;
        sinks.rows = n;
        sinks.first_position = tile.first_position + i0;
        sinks.key_begin = 0;
        sinks.key_end = keys;
        sinks.window = 0;
        sinks.sinks = 0;
        attend_partial(shape, q, sinks, source, scratch);
        for (int j = 0; j < tile.heads; ++j)
          for (int i = 0; i < n; ++i)
            for (int m = 0; m < group; ++m) {
              const int a = (j * tile.rows + i0 + i) * group + m;  // in the tile
              const int b = (j * n + i) * group + m;               // in the run
              merge_softmax_states(
                  scratch.window_state[static_cast<std::size_t>(a)], &scratch.window_acc(a, 0),
                  scratch.state[static_cast<std::size_t>(b)], &scratch.acc(b, 0), hd);
            }
      });
  std::swap(scratch.acc, scratch.window_acc);
  std::swap(scratch.state, scratch.window_state);
}

/// Attention of the query rows of `tile` over all the keys each sees (the tile's key range is
/// ignored: [0, first_position + rows), the band of each row with a window, and the sinks that
/// have left it with `tile.sinks`; see `attend_partial`, `attend_sinks`), normalised — output =
/// Σ exp(score − max) · value / Σ exp(score − max), the softmax-weighted sum — and written to the
/// same rows and heads of `out` ([q.rows(), num_heads * head_dim]).
template <typename T, typename Source>
void attend_tile(const AttentionShape& shape, const Eigen::Ref<const RowMatrix<T>>& q,
                 const AttentionTile& tile, const Source& source, TileScratch<T>& scratch,
                 RowMatrix<T>& out) {
  AttentionTile all_keys = tile;
  all_keys.key_begin = 0;
  all_keys.key_end = tile.first_position + tile.rows;
  attend_partial(shape, q, all_keys, source, scratch);
  if (tile.sinks > 0) attend_sinks(shape, q, all_keys, source, scratch);
  const int row0 = tile.row0, rows = tile.rows, hk0 = tile.hk0, heads = tile.heads;
  const int group = shape.group_size();
  const int hd = shape.head_dim();
  const int per_head = rows * group;
  for (int j = 0; j < heads; ++j)
    for (int qi = 0; qi < per_head; ++qi) {
      const int at = j * per_head + qi;
      out.block(row0 + qi / group, ((hk0 + j) * group + qi % group) * hd, 1, hd) =
          scratch.acc.row(at) / scratch.state[static_cast<std::size_t>(at)].sum;
    }
}

/// Adds the work of `q_len` query rows of one sequence, the first at position
/// `first_position`, processed in tiles of `kDecodeQueryTile` rows, to `counters`: row i sees
/// first_position + i + 1 keys (at most `window` with a window, and the sinks that have left it
/// with `sinks`), and each tile streams the rows from its first row's first visible key to its
/// last row, and the sinks once per run of rows that see the same (`for_each_sink_run`), once per
/// K/V head, each row `row_bytes` bytes as stored.
inline void count_tiled_attention(const AttentionShape& shape, std::size_t row_bytes, int q_len,
                                  int first_position, CostCounters& counters, int window = 0,
                                  int sinks = 0) {
  const std::uint64_t keys = visible_keys(first_position, q_len, window, sinks);
  std::uint64_t rows_streamed = 0;
  for (int r0 = 0; r0 < q_len; r0 += kDecodeQueryTile) {
    const int rows = std::min(kDecodeQueryTile, q_len - r0);
    const int end = first_position + r0 + rows;
    rows_streamed +=
        static_cast<std::uint64_t>(end - first_visible_key(first_position + r0, window));
    for_each_sink_run(first_position + r0, rows, window, sinks,
                      [&](int, int, int n) { rows_streamed += static_cast<std::uint64_t>(n); });
  }
  add_attention_counts(shape, row_bytes, keys, rows_streamed, counters);
}

}  // namespace detail
}  // namespace kvlab::cpu
