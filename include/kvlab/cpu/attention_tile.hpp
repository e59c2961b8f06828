/// \file
/// \brief The inner loop shared by `cpu::decode_attention` (contiguous cache) and
/// `cpu::paged_decode_attention` / `cpu::paged_prefill_attention` (paged cache): a tile of
/// queries of one GQA group attends to the key and value rows of one K/V head, wherever those
/// rows are stored and in whatever type (`KVStorage`: rows of int8 or int4 blocks, and of fp16 or
/// bf16 values (fp32 for GQA groups of 4 or more) where the build has their vector form, are read
/// in runs of consecutive rows, never decoded into memory, `row_runs.hpp`; other fp32 rows under a
/// tile of several query rows (a prefill) as matrix products over spans of rows; other rows one
/// token's rows at a time, decoded as they are read when not stored as the queries' type;
/// `attend_path_counts` counts which). It computes what
/// `cpu::reference_attention` computes over the rows as stored, for the tile's rows and heads.
/// Internal (`cpu::detail`); tested through the public kernels.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kvlab/core/counters.hpp"
#include "kvlab/core/paged_view.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/core/softmax_state.hpp"
#include "kvlab/core/views.hpp"
#include "kvlab/cpu/row_runs.hpp"
#include "kvlab/kv_storage.hpp"
#include "kvlab/matrix.hpp"

namespace kvlab::cpu {

/// Query rows processed together by the decode kernels (a decode step has one per sequence; a
/// prefill, one tile after another). A prefill tile over fp32 rows computes its scores and value
/// sums as matrix products of this many rows per query head, and Eigen's GEMM computes rows in
/// blocks of three vectors (48 floats with AVX-512, 24 with AVX2): tiles of 48 rows made the
/// attention of a 512-token prefill of the stories15M shape (6 heads of 48) take 0.86× the time of
/// tiles of 16, where 32 took 0.92×, 64 1.05× and 128 1.13× (machine D, `bench/results/README.md`,
/// "the prefill's attention tile").
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
  /// memory's own prefetcher follows (asked for ahead, a decode step measured up to 1.40× slower,
  /// `bench/results/cpu-prefetch-ahead.txt`).
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
/// `value_later`). Kept out of line: inlined into `attend_partial`'s per-row loops, it made them
/// large enough that the compiler stopped inlining the walk over the rows, and stories260K's
/// paged decode (head_dim 8, where no row is asked for) made 10 % fewer tokens per second.
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
  int pos = 0;                      ///< position of the first row
  int count = 0;                    ///< rows in the run
  int first = 0;                    ///< first query of a head that sees them
  int last = 0;                     ///< one past the last
  const S* rows[kRowRun];           ///< [count]: the rows of the tile's first K/V head
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
/// row seeing its last `window` keys (the band; 0: all keys up to itself).
struct AttentionTile {
  int row0 = 0;            ///< first query row of the tile in `q`
  int rows = 1;            ///< query rows, 1 <= rows <= kDecodeQueryTile
  int first_position = 0;  ///< position of row `row0` in its sequence
  int hk0 = 0;             ///< first K/V head
  int heads = 1;           ///< K/V heads, [hk0, hk0 + heads)
  int key_begin = 0;       ///< first key of the range
  int key_end = 0;         ///< one past the last key; the tile's last row sees keys up to it
  int window = 0;          ///< W >= 1: row at position p sees keys (p - W, p]; 0: all up to p
};

/// The unnormalised attention of the query rows of `tile` for the query heads of its K/V heads,
/// over the keys in [key_begin, key_end) that each row sees, read through `source`
/// (`ContiguousRows` or `PagedRows` from head `tile.hk0`; rows of int8 or int4 blocks, and of fp16
/// or bf16 values (and fp32 for groups of 4 or more) where the build has their vector form, in
/// runs of up to `run_rows` rows, `score_row_run` and `add_row_run`; other rows stored as `T`,
/// for a tile of several rows, as matrix products over each span of evenly spaced rows
/// (`key_spans`, `value_spans`: Eigen's GEMM, the tile's queries against the span's rows); other
/// rows stored in another type than `T` decoded one token at a time as they are read,
/// `KVStorage::decode`). Leaves in
/// `scratch`, for query `qi`
/// (K/V head hk0 + j, row i, group member g at qi = (j * rows + i) * group + g): `state[qi]`
/// (max score and Σ exp(score − max)) and `acc.row(qi)` (Σ exp(score − max) · value), the form
/// in which partial results over disjoint key ranges merge (`merge_softmax_states`).
///
/// The queries of the groups and of the tile's rows are gathered; then
///  1. the key rows are streamed once (for each token, the rows of the `heads` K/V heads), and
///     each one is scored against every query of its group that sees it;
///  2. each query's visible scores become exp(score − max), and their sum is kept;
///  3. the value rows are streamed once, and each one is added to every query's sum with its
///     weight exp(score − max).
/// In steps 1 and 3, at each row it reads, it asks for the same heads' row `rows_ahead` positions
/// on (`kPrefetchAhead` bytes), where the source asks ahead (`asks_ahead`: the contiguous cache
/// and the HND pool), the rows are fp32, fp16 or bf16 values (not quantized blocks) and the pass
/// reads at least `kPrefetchMinBytes` of a head's rows: a hint that changes no result.
/// Each query's arithmetic is the same whatever `heads` is: it changes only the order in which
/// rows are read (one head at a time suits the head-major contiguous cache and HND pool, all
/// heads of a token at once suits the token-major NHD pool). A key range other than [0,
/// first_position + rows) — one partition of a split context — is for a single row
/// (`rows == 1`), which sees every key up to its position. With a window each row sees only its
/// last W keys (`cpu::reference_attention`'s band): the keys stream from the first row's first
/// visible key, and each key meets the rows whose band holds it.
template <typename T, typename Source>
void attend_partial(const AttentionShape& shape, const Eigen::Ref<const RowMatrix<T>>& q,
                    const AttentionTile& tile, const Source& source, TileScratch<T>& scratch) {
  const int row0 = tile.row0, rows = tile.rows, first_position = tile.first_position;
  const int hk0 = tile.hk0, heads = tile.heads, key_begin = tile.key_begin;
  const int group = shape.group_size();
  const int hd = shape.head_dim();
  const T scale = static_cast<T>(shape.scale());
  const int per_head = rows * group;  // queries of one K/V head in the tile
  const int m = heads * per_head;
  // keys of the range: [key_begin, span), the tile's last row sees them all
  const int span = tile.key_end;
  const int window = tile.window;
  // the tile's first key: its first row's band starts W - 1 keys before it
  const int key_lo = std::max(key_begin, kvlab::first_visible_key(first_position, window));
  // A token's rows of the tile's heads, as T: where they are stored when stored as T, else
  // decoded into scratch.row (heads * head_dim values, head j at j * head_dim). Only that one
  // token's rows are ever decoded: never a copy of the cache. (Rows read in runs are not decoded
  // into memory at all: steps 1 and 3 read them block by block.)
  using S = typename Source::Stored;
  // Runs of rows (`row_runs.hpp`: each row loaded once for all the queries that see it, several
  // rows in flight, the sums held in registers) are how rows stored in quantized blocks are
  // always read, and fp32, fp16 and bf16 rows where this build has their vector form
  // (`kVectorRows`) and head_dim is whole blocks of 32 — fp32 rows only for GQA groups of four
  // queries or more: for MHA (one query per row) the runs measured 1.7–2.4× slower than reading
  // each row on its own, and groups of 2 and 3 were not measured, so they keep that loop.
  // Otherwise each token's rows are read on their own, decoded first when stored in another type
  // than T.
  constexpr bool kRuns = kQuantizedStorage<S> || kVectorRows<T, S>;
  const bool by_runs = kQuantizedStorage<S> || (kRuns && hd % kQuantBlock == 0 &&
                                                (!std::is_same<S, T>::value || group >= 4));
  // A prefill tile (several query rows) over rows stored as T that runs do not read: the scores
  // and the value sums are matrix products (Eigen's GEMM) over each span of evenly spaced rows
  // (`key_spans`, `value_spans`). They compute every query's score with every key of the tile's
  // range, seen or not; the unseen ones are set to 0 after step 2, so they add nothing in step 3.
  // (Without a window that is the causal corner, at most rows·(rows−1)/2 scores per query head;
  // the counters count the products of the keys each query sees, as for the other two ways.)
  const bool by_products = std::is_same<S, T>::value && !by_runs && rows > 1;
  const bool decoded = !std::is_same<S, T>::value && !by_runs;
  AttendPathCounts& paths = attend_path_counts();
  (by_runs ? paths.runs : by_products ? paths.products : paths.rows).fetch_add(1);
  const std::ptrdiff_t head_stride = decoded ? hd : source.head_stride();  // in the rows as T
  scratch.row.resize(decoded ? static_cast<std::size_t>(heads) * static_cast<std::size_t>(hd) : 0);
  const auto as_t = [&](const S* stored) -> const T* {
    if constexpr (std::is_same<S, T>::value) {
      return stored;
    } else {  // fp16, bf16 read row by row (rows read in runs are not decoded: steps 1 and 3)
      for (int j = 0; j < heads; ++j)
        KVStorage<S>::decode(stored + j * source.head_stride(), hd, scratch.row.data() + j * hd);
      return scratch.row.data();
    }
  };
  RowMatrix<T>& queries = scratch.queries;  // [m, head_dim]
  // [m, padded_span(span - key_lo)]: key pos in column pos - key_lo
  RowMatrix<T>& probs = scratch.probs;
  RowMatrix<T>& acc = scratch.acc;  // [m, head_dim]
  queries.resize(m, hd);
  for (int j = 0; j < heads; ++j)
    for (int i = 0; i < rows; ++i)
      for (int g = 0; g < group; ++g)
        queries.row(j * per_head + i * group + g) =
            q.block(row0 + i, ((hk0 + j) * group + g) * hd, 1, hd);
  // Query qi (< per_head) of a head sees keys [0, shared + qi / group]: all of them see [0,
  // shared), and the tile's later rows see up to `rows - 1` more (the causal corner).
  const int shared = first_position + 1;
  // end of qi's keys
  const auto visible = [&](int qi) { return std::min(span, shared + qi / group); };
  // start of qi's keys: its band's first key (key_lo for the tile's first row)
  const auto band_start = [&](int qi) {
    return std::max(key_lo, kvlab::first_visible_key(first_position + qi / group, window));
  };
  // The first query of a head that sees key `pos` (0 outside the corner).
  const auto first_seeing = [&](int pos) { return pos < shared ? 0 : (pos - shared + 1) * group; };
  // One past the last query of a head that sees key `pos`: with a window, the rows at positions
  // below pos + W.
  const auto last_seeing = [&](int pos) {
    return window > 0 ? std::min(per_head, (pos + window - first_position) * group) : per_head;
  };
  // Runs of consecutive rows seen by the same queries
  // (`for_each_row_run`): f(j, rows, run) for each run and K/V head j, with head j's rows of it.
  // Rows asked for before they are read (`prefetch_row`), where the source asks ahead: at the
  // row of position pos, the same heads' rows `ahead` positions on into the L1 cache and `far`
  // positions on into the L2 (`rows_ahead`: `kPrefetchAhead` and `kPrefetchFar` bytes), wherever
  // the layout puts them (`ask_rows_ahead`).
  const std::size_t row_bytes = storage_row_bytes<S>(hd);  // one head's row as stored
  const std::size_t range_bytes = static_cast<std::size_t>(span - key_lo) * row_bytes;  // per head
  const bool long_range = range_bytes >= kPrefetchMinBytes;
  // Rows of quantized blocks are not asked for: decoding their blocks, not the memory, sets the
  // pace, and the asks cost more than they gave (int4 steps 1.04–1.23× slower, int8 0.75–1.12×,
  // `bench/results/cpu-prefetch-ahead.txt`).
  const int ahead =
      !kQuantizedStorage<S> && source.asks_ahead() && long_range ? rows_ahead(row_bytes) : 0;
  // Rows read one by one (an MHA step) over at least `kPrefetchFarMinBytes` per head are also
  // asked for `far` positions on, into the L2; rows read in runs are not: their GQA step, four
  // multiply-adds per value read, measured 1.10× slower with those asks over a cache in main
  // memory and 1.22–1.25× from the caches, where an MHA step took 0.91–0.94× the time
  // (`bench/results/cpu-prefetch-ahead.txt`, §7).
  const int far = ahead != 0 && !by_runs && range_bytes >= kPrefetchFarMinBytes
                      ? rows_ahead(row_bytes, kPrefetchFar)
                      : 0;
  if (ahead != 0) paths.asked_ahead.fetch_add(1);
  if (far != 0) paths.asked_far.fetch_add(1);
  // At row `row` of position pos: ask for the key (kKeys) or value rows `ahead` and `far`
  // positions on.
  const int nearest = far != 0 ? std::min(ahead, far) : ahead;
  const auto ask_ahead = [&](auto keys, int pos, const S* row) {
    if (pos + nearest < span)
      ask_rows_ahead<decltype(keys)::value>(source, pos, row, ahead, far, span, heads, row_bytes);
  };
  const auto for_each_head_run = [&](const auto& walk, auto keys, const auto& f) {
    for_each_row_run<S>(walk, key_lo, span, run_rows<S>(), first_seeing, last_seeing,
                        [&](const RowRun<S>& run) {
                          if (ahead != 0)
                            for (int r = 0; r < run.count; ++r)
                              ask_ahead(keys, run.pos + r, run.rows[r]);
                          for (int j = 0; j < heads; ++j) {
                            const S* rows_of_j[kRowRun];  // [run.count]: head j's rows of the run
                            for (int r = 0; r < run.count; ++r)
                              rows_of_j[r] = run.rows[r] + j * source.head_stride();
                            f(j, rows_of_j, run);
                          }
                        });
  };

  // 1. Scores: each key row is read once and met by every query of its group that sees it.
  probs.resize(m, padded_span<T>(span - key_lo));
  if (by_runs) {
    if constexpr (kRuns)
      for_each_head_run([&](int b, int e, auto&& f) { source.keys(b, e, f); }, std::true_type{},
                        [&](int j, const S* const* rows_of_j, const RowRun<S>& run) {
                          score_row_run(rows_of_j, run.count, hd,
                                        &queries(j * per_head + run.first, 0), run.last - run.first,
                                        scale, &probs(j * per_head + run.first, run.pos - key_lo),
                                        probs.cols());
                        });
  } else if (by_products) {
    if constexpr (std::is_same<S, T>::value)
      source.key_spans(key_lo, span, [&](int pos, int count, const T* row, std::ptrdiff_t stride) {
        for (int j = 0; j < heads; ++j) {
          // [count, head_dim]: head j's key rows of the span
          const Eigen::Map<const RowMatrix<T>, 0, Eigen::OuterStride<>> keys(
              row + j * head_stride, count, hd, Eigen::OuterStride<>(stride));
          // The scale before the product: Eigen folds it into the GEMM. Written after it, the
          // product went through a temporary and a second pass, and a prefill tile's attention
          // took 1.14× the time.
          probs.block(j * per_head, pos - key_lo, per_head, count).noalias() =
              scale * (queries.middleRows(j * per_head, per_head) * keys.transpose());
        }
      });
  } else if constexpr (!kQuantizedStorage<S>) {
    source.keys(key_lo, span, [&](int pos, const S* stored) {
      const int first = first_seeing(pos), last = last_seeing(pos);
      if (ahead != 0) ask_ahead(std::true_type{}, pos, stored);
      const T* row = as_t(stored);
      for (int j = 0; j < heads; ++j) {
        const T* key = row + j * head_stride;  // [head_dim]
        for (int qi = j * per_head + first; qi < j * per_head + last; ++qi)
          probs(qi, pos - key_lo) = scale * dot_row(&queries(qi, 0), key, hd);
      }
    });
  }
  // 2. exp(score - max) of each query's visible scores (all <= 1, the largest exactly 1), and their
  // sum.
  scratch.state.resize(static_cast<std::size_t>(m));
  for (int qi = 0; qi < m; ++qi) {
    // [visible keys]: the query's band
    const int start = band_start(qi % per_head);
    Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>> x(&probs(qi, start - key_lo),
                                                     visible(qi % per_head) - start);
    const T max = x.maxCoeff();
    x = (x - max).exp();
    scratch.state[static_cast<std::size_t>(qi)] = SoftmaxState<T>{max, x.sum()};
    if (by_products) {  // the scores of keys the query does not see weigh nothing in step 3
      probs.row(qi).head(start - key_lo).setZero();
      probs.row(qi)
          .segment(visible(qi % per_head) - key_lo, span - visible(qi % per_head))
          .setZero();
    }
  }
  // 3. Values: each value row is read once and added to every query's sum. A run's rows are
  // asked for before they are read (`prefetch_rows`), except where the tile's heads of a token
  // lie side by side (the NHD pool: one contiguous read per token), where that measured slower.
  acc.setZero(m, hd);
  if (by_runs) {
    const bool heads_side_by_side =
        heads > 1 &&
        static_cast<std::size_t>(source.head_stride()) * sizeof(S) == storage_row_bytes<S>(hd);
    if constexpr (kRuns)
      for_each_head_run([&](int b, int e, auto&& f) { source.values(b, e, f); }, std::false_type{},
                        [&](int j, const S* const* rows_of_j, const RowRun<S>& run) {
                          add_row_run(rows_of_j, run.count, hd,
                                      &probs(j * per_head + run.first, run.pos - key_lo),
                                      probs.cols(), run.last - run.first,
                                      &acc(j * per_head + run.first, 0), !heads_side_by_side);
                        });
  } else if (by_products) {
    if constexpr (std::is_same<S, T>::value)
      source.value_spans(key_lo, span,
                         [&](int pos, int count, const T* row, std::ptrdiff_t stride) {
                           for (int j = 0; j < heads; ++j) {
                             // [count, head_dim]: head j's value rows of the span
                             const Eigen::Map<const RowMatrix<T>, 0, Eigen::OuterStride<>> values(
                                 row + j * head_stride, count, hd, Eigen::OuterStride<>(stride));
                             acc.middleRows(j * per_head, per_head).noalias() +=
                                 probs.block(j * per_head, pos - key_lo, per_head, count) * values;
                           }
                         });
  } else if constexpr (!kQuantizedStorage<S>) {
    source.values(key_lo, span, [&](int pos, const S* stored) {
      const int first = first_seeing(pos), last = last_seeing(pos);
      if (ahead != 0) ask_ahead(std::false_type{}, pos, stored);
      const T* row = as_t(stored);
      for (int j = 0; j < heads; ++j) {
        const T* value = row + j * head_stride;  // [head_dim]
        for (int qi = j * per_head + first; qi < j * per_head + last; ++qi)
          add_scaled_row(probs(qi, pos - key_lo), value, hd, &acc(qi, 0));
      }
    });
  }
}

/// Attention of the query rows of `tile` over all the keys each sees (the tile's key range is
/// ignored: [0, first_position + rows); see `attend_partial`), normalised — output =
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
/// first_position + i + 1 keys (at most `window` with a window), and each tile streams the rows
/// from its first row's first visible key to its last row, once per K/V head, each row
/// `row_bytes` bytes as stored.
inline void count_tiled_attention(const AttentionShape& shape, std::size_t row_bytes, int q_len,
                                  int first_position, CostCounters& counters, int window = 0) {
  const std::uint64_t keys = visible_keys(first_position, q_len, window);
  std::uint64_t rows_streamed = 0;
  for (int r0 = 0; r0 < q_len; r0 += kDecodeQueryTile) {
    const int end = first_position + r0 + std::min(kDecodeQueryTile, q_len - r0);
    rows_streamed += static_cast<std::uint64_t>(end - first_visible_key(first_position + r0, window));
  }
  add_attention_counts(shape, row_bytes, keys, rows_streamed, counters);
}

}  // namespace detail
}  // namespace kvlab::cpu
