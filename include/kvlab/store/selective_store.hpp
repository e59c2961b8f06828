/// \file
/// \brief `SelectiveStore`: a `KVStore` that keeps, for every layer and K/V head on its own, what
/// its `HeadPolicy` says — every token or a window with attention sinks and heavy hitters (H2O),
/// keys and values each in their own precision. The reference of selective caching.
///
/// The other stores apply one policy to every head: one storage type, one window. Here each
/// (layer, K/V head) has its own, so that a retrieval head can keep every token while a
/// streaming head keeps its last W, or keys stay fp16 while values go to int4. It is written as
/// a reference — rows kept per head in position order, attention as matrix products over them
/// with the mask written out as a loop — and checked by the suite that runs over every store
/// (`tests/store/test_kv_store.cpp`) and against the tuned stores where both apply
/// (`tests/store/test_selective_store.cpp`).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/cpu/decode_attention.hpp"
#include "kvlab/cpu/parallel.hpp"
#include "kvlab/kv_storage.hpp"
#include "kvlab/matrix.hpp"
#include "kvlab/store/kv_store.hpp"

namespace kvlab {

/// What one K/V head of one layer keeps of past tokens, and how.
///
/// Without a window (`window` 0) the head keeps every token. With one (W >= 1) the query at
/// position p sees the keys (p − W, p] — its last W — and also:
///  - the first `sinks` tokens (S < W), which are never dropped: the *attention sinks* of
///    StreamingLLM (Xiao et al., 2023), the first tokens that every head's softmax leans on;
///  - up to `heavy` further tokens, the *heavy hitters* of H2O (Zhang et al., 2023): of the
///    tokens that have left the window, those that have received the most attention so far
///    (summed over every query and query head of the group since they were appended).
/// After each step of a sequence of n tokens the head holds the sinks, the last W − 1 tokens (the
/// next query's window, less itself) and at most `heavy` others: `min(n, S + W − 1 + H)` rows.
/// Keys and values are stored as `key` and `value` (`KVDtype`); fp32 stores them as computed.
struct HeadPolicy {
  KVDtype key = KVDtype::fp32;    ///< how the head's keys are stored
  KVDtype value = KVDtype::fp32;  ///< how its values are stored
  int window = 0;                 ///< W >= 1: the last W keys; 0: every token
  int sinks = 0;                  ///< S in [0, W): first tokens kept (with a window only)
  int heavy = 0;                  ///< H >= 0: heavy hitters kept (with a window only)

  /// Rows the head holds after a step once its sequence has `length` tokens: all of them
  /// without a window, else `min(length, S + W − 1 + H)`.
  long long rows_held(long long length) const {
    return window == 0 ? length : std::min(length, 1LL * sinks + window - 1 + heavy);
  }
  /// True when the head keeps every token at fp32: what the full cache keeps.
  bool keeps_everything() const {
    return window == 0 && key == KVDtype::fp32 && value == KVDtype::fp32;
  }
};

/// Two head policies are equal when every field is.
inline bool operator==(const HeadPolicy& a, const HeadPolicy& b) {
  return a.key == b.key && a.value == b.value && a.window == b.window && a.sinks == b.sinks &&
         a.heavy == b.heavy;
}

/// A `KVStore` whose every (layer, K/V head) keeps its past as its own `HeadPolicy` says.
///
/// Per sequence, layer and K/V head it holds the rows it keeps, in position order: each row's
/// position, its key and value encoded as the head's types, and the attention it has received
/// (for heads with heavy hitters). A step:
///  - `append` encodes the new rows after the held ones;
///  - `attend` decodes the held rows of each head, scores each query of its group against them
///    (`scale · q · k`, a matrix product), masks what the query at position p does not see —
///    keys after it, and, in a head with a window and no heavy hitters, keys at or before
///    p − W that are not sinks — and takes the softmax-weighted sum of the values. The
///    probabilities that each row received are added up for the step;
///  - `end_step` adds them to each row's total and drops, in every head with a window, the rows
///    that left the window and are neither sinks nor among the `heavy` rows with the highest
///    totals (ties: the older row goes). `abort_step` drops the step's rows and sums instead.
/// With steps of one token (decoding) a query sees exactly the sinks, the heavy hitters chosen
/// before it and its last W keys — H2O's and StreamingLLM's definition. A step of several tokens
/// chooses the heavy hitters once, at its end: until then its queries see every row held and
/// the step's own rows up to themselves. Without heavy hitters each query sees its own last W keys
/// (and the sinks), whatever the step: with no sinks, what the ring of `ContiguousStore` computes.
///
/// Positions: keys are cached after RoPE, at the token's position in the sequence, and keep it.
/// (StreamingLLM numbers the positions within the cache instead, which needs keys kept before
/// RoPE and rotated again at every step; here a query at position p and a sink at 0 are p apart,
/// as they were when the sink was appended.)
///
/// Memory: each head holds `HeadPolicy::rows_held(length)` rows between steps, each
/// `storage_row_bytes` of its key type plus of its value type; `bytes_reserved()` and
/// `bytes_used()` both count exactly those bytes (the rows of a step, until its end, too). The
/// store reserves nothing ahead: sequences grow without a capacity.
///
/// Cost: as a reference it decodes every held row at every `attend` and computes every score of
/// the held rows for each query (masked ones too, which `CostCounters::qk_dots` counts as
/// computed); the K/V heads of a layer run in parallel when the step is large enough.
template <typename T>
class SelectiveStore : public KVStore<T> {
 public:
  /// A store whose K/V head `h` of layer `l` keeps what `heads[l · num_kv_heads + h]` says.
  /// \throws InvalidArgument if a size is below 1, `heads` does not hold `num_layers ·
  ///         num_kv_heads` policies, or a policy has a negative window, sinks or heavy count,
  ///         sinks or heavy hitters without a window, sinks >= window, or a quantized type and
  ///         a head_dim that is not a multiple of 32 (each message names the head).
  SelectiveStore(int num_layers, int num_kv_heads, int head_dim, std::vector<HeadPolicy> heads)
      : KVStore<T>("kvlab::SelectiveStore", num_layers, num_kv_heads, head_dim) {
    constexpr const char* kWhere = "kvlab::SelectiveStore";
    s_->heads = std::move(heads);
    detail::require_equal(kWhere, "heads.size()", static_cast<long long>(s_->heads.size()),
                          1LL * num_layers * num_kv_heads, "num_layers * num_kv_heads");
    for (std::size_t i = 0; i < s_->heads.size(); ++i) {
      const HeadPolicy& p = s_->heads[i];
      const std::string name = "heads[" + std::to_string(i) + "] (layer " +
                               std::to_string(i / static_cast<std::size_t>(num_kv_heads)) +
                               ", K/V head " +
                               std::to_string(i % static_cast<std::size_t>(num_kv_heads)) + ")";
      detail::require_at_least(kWhere, name + ".window", p.window, 0);
      detail::require_at_least(kWhere, name + ".sinks", p.sinks, 0);
      detail::require_at_least(kWhere, name + ".heavy", p.heavy, 0);
      if (p.window == 0 && (p.sinks > 0 || p.heavy > 0)) {
        detail::fail(kWhere, name + ".window",
                     "at least 1 with sinks or heavy hitters (without a window every token "
                     "is kept)",
                     0);
      }
      if (p.window > 0 && p.sinks >= p.window) {
        detail::fail(kWhere, name + ".sinks", "below the window (" + std::to_string(p.window) + ")",
                     p.sinks);
      }
      for (KVDtype d : {p.key, p.value}) {
        visit_kv_dtype(d, [&](auto tag) {
          detail::require_storage_head_dim<Stored<typename decltype(tag)::type>>(kWhere, head_dim);
        });
      }
      s_->key_bytes.push_back(row_bytes(p.key));
      s_->value_bytes.push_back(row_bytes(p.value));
    }
  }

  const char* name() const override { return "selective"; }
  /// The storage of every head's keys and values when they are all one type ("fp32", "int8",
  /// …), else "mixed".
  const char* storage_name() const override {
    for (const HeadPolicy& p : s_->heads) {
      if (p.key != s_->heads[0].key || p.value != s_->heads[0].value) return "mixed";
    }
    if (s_->heads[0].key != s_->heads[0].value) return "mixed";
    return visit_kv_dtype(s_->heads[0].key, [](auto tag) {
      return KVStorage<Stored<typename decltype(tag)::type>>::name();
    });
  }
  /// Bytes of one token in every head that keeps it: Σ over heads of its key and value row.
  std::size_t bytes_per_token() const override {
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < s_->heads.size(); ++i)
      bytes += s_->key_bytes[i] + s_->value_bytes[i];
    return bytes;
  }

  /// The policy of K/V head `kv_head` of `layer`.
  /// \throws InvalidArgument if either is out of range.
  const HeadPolicy& policy(int layer, int kv_head) const {
    return s_->heads[head_index("kvlab::SelectiveStore::policy", layer, kv_head)];
  }
  /// Every head's policy, layer by layer: `[num_layers · num_kv_heads]`.
  const std::vector<HeadPolicy>& policies() const { return s_->heads; }

  /// Positions of the rows that K/V head `kv_head` of `layer` holds for `seq`, ascending.
  /// \throws InvalidArgument if `seq` is not live or the layer or head is out of range.
  std::vector<int> held_positions(int seq, int layer, int kv_head) const {
    constexpr const char* kWhere = "kvlab::SelectiveStore::held_positions";
    if (!do_contains(seq)) detail::fail(kWhere, "seq", "a live sequence id", seq);
    return s_->sequences.at(seq).heads[head_index(kWhere, layer, kv_head)].positions;
  }

  /// Starts measuring, in every head, the attention that a window of `window` keys with `sinks`
  /// sinks would leave out: each query's probability on its keys at or before p − W that are
  /// not sinks (a "retrieval" head puts much there, a "streaming" head almost none). What a
  /// calibration ranks heads by (`attention_outside()`); measured from the next `attend` on.
  /// \throws InvalidArgument if `window` < 1 or `sinks` is not in [0, window).
  void measure_outside(int window, int sinks) {
    constexpr const char* kWhere = "kvlab::SelectiveStore::measure_outside";
    detail::require_at_least(kWhere, "window", window, 1);
    detail::require_at_least(kWhere, "sinks", sinks, 0);
    if (sinks >= window) {
      detail::fail(kWhere, "sinks", "below the window (" + std::to_string(window) + ")", sinks);
    }
    s_->measure_window = window;
    s_->measure_sinks = sinks;
    s_->outside.assign(s_->heads.size(), 0.0);
    s_->measured.assign(s_->heads.size(), 0);
  }
  /// Per head, layer by layer (`[num_layers · num_kv_heads]`): the mean over the queries and
  /// query heads measured since `measure_outside` of the probability they put outside the sinks
  /// and their window (0 for a head that no query has reached yet).
  /// \throws InvalidArgument if `measure_outside` was not called.
  std::vector<double> attention_outside() const {
    if (s_->measure_window == 0) {
      detail::fail("kvlab::SelectiveStore::attention_outside", "measure_outside", "called first",
                   "not called");
    }
    std::vector<double> mean(s_->heads.size(), 0.0);
    for (std::size_t i = 0; i < s_->heads.size(); ++i)
      if (s_->measured[i] > 0) mean[i] = s_->outside[i] / static_cast<double>(s_->measured[i]);
    return mean;
  }

  int add_sequence() override {
    Sequence s;
    s.heads.resize(s_->heads.size());
    s_->sequences.emplace(s_->next_id, std::move(s));
    return s_->next_id++;
  }
  std::vector<int> sequences() const override {
    std::vector<int> ids;
    for (const auto& entry : s_->sequences) ids.push_back(entry.first);
    return ids;
  }
  /// The bytes of the rows held (nothing is reserved ahead): as `bytes_used()`.
  std::size_t bytes_reserved() const override { return bytes_used(); }
  /// Σ over sequences and heads of the rows held times the head's key and value row bytes.
  std::size_t bytes_used() const override {
    std::size_t bytes = 0;
    for (const auto& entry : s_->sequences) {
      for (std::size_t i = 0; i < s_->heads.size(); ++i) {
        bytes += entry.second.heads[i].positions.size() * (s_->key_bytes[i] + s_->value_bytes[i]);
      }
    }
    return bytes;
  }

 protected:
  bool do_contains(int seq) const override { return s_->sequences.count(seq) != 0; }
  int do_length(int seq) const override { return s_->sequences.at(seq).length; }
  void do_free_sequence(int seq) override { s_->sequences.erase(seq); }
  int do_fork(int seq) override {
    s_->sequences.emplace(s_->next_id, s_->sequences.at(seq));  // a copy of every held row
    return s_->next_id++;
  }
  /// Going back to `length` tokens needs, in every head with a window, the rows the next
  /// token's window reaches (from length − W + 1) still held; the sums of attention the held
  /// rows received from the dropped tokens stay in their totals.
  void do_truncate(int seq, int length) override {
    Sequence& s = s_->sequences.at(seq);
    const auto kv = static_cast<std::size_t>(this->num_kv_heads());
    for (std::size_t i = 0; i < s_->heads.size(); ++i) {
      const HeadPolicy& p = s_->heads[i];
      const std::vector<int>& pos = s.heads[i].positions;
      if (p.window == 0) continue;
      const int from = std::max(p.sinks, length - p.window + 1);
      const int gone = last_missing(pos, from, length);
      if (gone >= 0) {
        detail::fail(this->where("truncate").c_str(), "length",
                     "at least " + std::to_string(gone + p.window) + " (layer " +
                         std::to_string(i / kv) + ", K/V head " + std::to_string(i % kv) +
                         " has dropped position " + std::to_string(gone) +
                         ", which the next token's window would see)",
                     length);
      }
    }
    for (HeadRows& h : s.heads) h.keep_below(length);
    s.length = length;
  }

  void do_begin_step(StepBatch& batch, const RowMatrix<T>& new_inputs, RowMatrix<T>& inputs,
                     const char*) override {
    batch.row_indptr = batch.new_indptr;  // the new tokens only
    batch.first_position.clear();
    for (int i = 0; i < batch.size(); ++i) {
      const Sequence& s = s_->sequences.at(batch.seq(i));
      if (1LL * s.length + batch.new_tokens(i) > INT_MAX) {
        detail::fail<CapacityError>(
            this->where("begin_step").c_str(),
            "new tokens of sequence " + std::to_string(batch.seq(i)),
            "at most " + std::to_string(INT_MAX - s.length) + " (positions fit in an int)",
            batch.new_tokens(i));
      }
      batch.first_position.push_back(s.length);
    }
    inputs = new_inputs;
  }

  void do_append(int layer, const RowMatrix<T>& k, const RowMatrix<T>& v) override {
    const StepBatch& batch = this->step();
    const int kv_heads = this->num_kv_heads(), head_dim = this->head_dim();
    // Every value storable first, so that nothing changes when one is not.
    for (int h = 0; h < kv_heads; ++h) {
      const std::size_t i = static_cast<std::size_t>(layer * kv_heads + h);
      check_storable(s_->heads[i].key, "k", k.middleCols(h * head_dim, head_dim));
      check_storable(s_->heads[i].value, "v", v.middleCols(h * head_dim, head_dim));
    }
    for (int b = 0; b < batch.size(); ++b) {
      Sequence& s = s_->sequences.at(batch.seq(b));
      for (int h = 0; h < kv_heads; ++h) {
        const std::size_t i = static_cast<std::size_t>(layer * kv_heads + h);
        HeadRows& rows = s.heads[i];
        for (int t = 0; t < batch.computed(b); ++t) {
          const int r = batch.row_begin(b) + t;
          rows.positions.push_back(batch.first(b) + t);
          rows.received.push_back(0);
          rows.pending.push_back(0);
          append_encoded(s_->heads[i].key, k.row(r).data() + h * head_dim, rows.keys);
          append_encoded(s_->heads[i].value, v.row(r).data() + h * head_dim, rows.values);
        }
      }
    }
  }

  void do_attend(int layer, const AttentionShape& shape, const RowMatrix<T>& q,
                 const std::vector<std::int32_t>& q_indptr, RowMatrix<T>& out,
                 CostCounters* counters) override {
    const StepBatch& batch = this->step();
    const int kv_heads = shape.num_kv_heads(), group = shape.group_size(),
              head_dim = shape.head_dim();
    out.resize(q.rows(), shape.q_width());
    std::vector<std::uint64_t> dots(static_cast<std::size_t>(kv_heads), 0),
        rows_read(static_cast<std::size_t>(kv_heads), 0);
    long long work = 0;  // scores of the step: threads pay only for a large one
    for (int b = 0; b < batch.size(); ++b) {
      const auto s = static_cast<std::size_t>(b);
      work += 1LL * (q_indptr[s + 1] - q_indptr[s]) * do_length(batch.seq(b)) * head_dim;
    }
    cpu::detail::parallel_for(
        kv_heads, work * kv_heads >= cpu::kDecodeParallelMinElements, [&](int h) {
          const std::size_t i = static_cast<std::size_t>(layer * kv_heads + h);
          const HeadPolicy& p = s_->heads[i];
          for (int b = 0; b < batch.size(); ++b) {
            HeadRows& rows = s_->sequences.at(batch.seq(b)).heads[i];
            const auto s = static_cast<std::size_t>(b);
            const int q0 = q_indptr[s], nq = q_indptr[s + 1] - q_indptr[s];
            const int held = static_cast<int>(rows.positions.size());
            // The held rows, decoded.
            RowMatrix<T> keys(held, head_dim), values(held, head_dim);  // [held, head_dim] each
            for (int r = 0; r < held; ++r) {
              decode_row(p.key, rows.keys, r, keys.row(r).data());
              decode_row(p.value, rows.values, r, values.row(r).data());
            }
            // The group's queries: row (t · group + j) is query row t of query head h · group + j.
            RowMatrix<T> queries(nq * group, head_dim);  // [nq · group, head_dim]
            for (int t = 0; t < nq; ++t) {
              for (int j = 0; j < group; ++j) {
                queries.row(t * group + j) =
                    q.row(q0 + t).segment((h * group + j) * head_dim, head_dim);
              }
            }
            RowMatrix<T> scores = (queries * keys.transpose()) * static_cast<T>(shape.scale());
            // [nq · group, held]: masked, then each row's softmax
            const int first = batch.first(b) + batch.new_tokens(b) - nq;  // position of query 0
            for (int t = 0; t < nq; ++t) {
              const int position = first + t;
              for (int r = 0; r < held; ++r) {
                const int key = rows.positions[static_cast<std::size_t>(r)];
                const bool seen = key <= position && (p.window == 0 || p.heavy > 0 ||
                                                      key > position - p.window || key < p.sinks);
                if (!seen)
                  for (int j = 0; j < group; ++j) scores(t * group + j, r) = -inf();
              }
            }
            // every entry of the score matrix was computed, masked ones too
            dots[static_cast<std::size_t>(h)] += static_cast<std::uint64_t>(nq) *
                                                 static_cast<std::uint64_t>(group) *
                                                 static_cast<std::uint64_t>(held);
            for (Eigen::Index row = 0; row < scores.rows(); ++row) {
              const T max = scores.row(row).maxCoeff();  // finite: a query sees itself
              scores.row(row) = (scores.row(row).array() - max).exp();
              scores.row(row) /= scores.row(row).sum();
            }
            const RowMatrix<T> weighted = scores * values;  // [nq · group, head_dim]
            for (int t = 0; t < nq; ++t) {
              for (int j = 0; j < group; ++j) {
                out.row(q0 + t).segment((h * group + j) * head_dim, head_dim) =
                    weighted.row(t * group + j);
              }
            }
            if (s_->measure_window > 0) {  // the attention outside the measured window and sinks
              for (int t = 0; t < nq; ++t) {
                const int edge =
                    first + t - s_->measure_window;  // keys at or before it are outside
                for (int j = 0; j < group; ++j) {
                  for (int r = 0; r < held && rows.positions[static_cast<std::size_t>(r)] <= edge;
                       ++r) {
                    if (rows.positions[static_cast<std::size_t>(r)] >= s_->measure_sinks)
                      s_->outside[i] += scores(t * group + j, r);
                  }
                }
              }
              s_->measured[i] += static_cast<std::uint64_t>(nq) * static_cast<std::uint64_t>(group);
            }
            if (p.heavy > 0) {  // the attention each row received, for the end of the step
              for (int r = 0; r < held; ++r)
                rows.pending[static_cast<std::size_t>(r)] +=
                    static_cast<double>(scores.col(r).sum());
            }
            rows_read[static_cast<std::size_t>(h)] += static_cast<std::uint64_t>(held);
          }
        });
    if (counters != nullptr) {
      for (int h = 0; h < kv_heads; ++h) {
        const std::size_t i = static_cast<std::size_t>(layer * kv_heads + h);
        const auto hh = static_cast<std::size_t>(h);
        counters->qk_dots += dots[hh];
        counters->macs += 2 * dots[hh] * static_cast<std::uint64_t>(head_dim);
        counters->kv_bytes_read += rows_read[hh] * (s_->key_bytes[i] + s_->value_bytes[i]);
      }
    }
  }

  void do_end_step() override {
    const StepBatch& batch = this->step();
    for (int b = 0; b < batch.size(); ++b) {
      Sequence& s = s_->sequences.at(batch.seq(b));
      s.length = batch.first(b) + batch.new_tokens(b);
      for (std::size_t i = 0; i < s_->heads.size(); ++i) s.heads[i].evict(s_->heads[i], s.length);
    }
  }
  void do_abort_step() noexcept override {
    const StepBatch& batch = this->step();
    for (int b = 0; b < batch.size(); ++b) {
      Sequence& s = s_->sequences.at(batch.seq(b));
      for (HeadRows& h : s.heads) {
        h.keep_below(batch.first(b));
        std::fill(h.pending.begin(), h.pending.end(), 0.0);
      }
    }
  }

 private:
  // fp32 is kept as computed (T itself: double in the double-precision tests).
  template <typename S>
  using Stored = std::conditional_t<std::is_same<S, float>::value, T, S>;

  // The rows one (layer, K/V head) holds for one sequence, in position order.
  struct HeadRows {
    std::vector<int> positions;         // [held]
    std::vector<unsigned char> keys;    // [held · key row bytes]: encoded
    std::vector<unsigned char> values;  // [held · value row bytes]
    std::vector<double> received;       // [held]: attention received in ended steps
    std::vector<double> pending;        // [held]: ... in the open step

    // Drops the rows at `length` and after.
    void keep_below(int length) {
      const auto end = std::lower_bound(positions.begin(), positions.end(), length);
      resize(static_cast<std::size_t>(end - positions.begin()));
    }
    void resize(std::size_t held) {
      const std::size_t key_row = positions.empty() ? 0 : keys.size() / positions.size();
      const std::size_t value_row = positions.empty() ? 0 : values.size() / positions.size();
      positions.resize(held);
      keys.resize(held * key_row);
      values.resize(held * value_row);
      received.resize(held);
      pending.resize(held);
    }
    // The end of a step at `length` tokens: the step's attention added to the totals, then the
    // rows that left the window dropped, but the sinks and the `heavy` highest totals.
    void evict(const HeadPolicy& p, int length) {
      for (std::size_t r = 0; r < positions.size(); ++r) {
        received[r] += pending[r];
        pending[r] = 0;
      }
      if (p.window == 0) return;
      const int recent = length - p.window + 1;  // the next query's window starts here
      std::vector<std::size_t> candidates;       // held rows neither sinks nor recent
      for (std::size_t r = 0; r < positions.size(); ++r) {
        if (positions[r] >= p.sinks && positions[r] < recent) candidates.push_back(r);
      }
      if (candidates.size() <= static_cast<std::size_t>(p.heavy)) return;
      // The heavy hitters: the highest totals, the later row first among equals.
      std::stable_sort(candidates.begin(), candidates.end(), [&](std::size_t a, std::size_t b) {
        return received[a] > received[b] || (received[a] == received[b] && a > b);
      });
      std::vector<char> drop(positions.size(), 0);
      for (std::size_t c = static_cast<std::size_t>(p.heavy); c < candidates.size(); ++c)
        drop[candidates[c]] = 1;
      const std::size_t key_row = keys.size() / positions.size();
      const std::size_t value_row = values.size() / positions.size();
      std::size_t kept = 0;
      for (std::size_t r = 0; r < positions.size(); ++r) {
        if (drop[r]) continue;
        positions[kept] = positions[r];
        received[kept] = received[r];
        std::memmove(keys.data() + kept * key_row, keys.data() + r * key_row, key_row);
        std::memmove(values.data() + kept * value_row, values.data() + r * value_row, value_row);
        ++kept;
      }
      resize(kept);
    }
  };

  struct Sequence {
    int length = 0;
    std::vector<HeadRows> heads;  // [num_layers · num_kv_heads]
  };

  static T inf() { return std::numeric_limits<T>::infinity(); }

  std::size_t head_index(const char* where, int layer, int kv_head) const {
    if (layer < 0 || layer >= this->num_layers()) {
      detail::fail(where, "layer", "in [0, " + std::to_string(this->num_layers()) + ")", layer);
    }
    if (kv_head < 0 || kv_head >= this->num_kv_heads()) {
      detail::fail(where, "kv_head", "in [0, " + std::to_string(this->num_kv_heads()) + ")",
                   kv_head);
    }
    return static_cast<std::size_t>(layer) * this->num_kv_heads() + kv_head;
  }

  // The last position in [from, length) that `positions` (ascending) does not hold, or -1.
  static int last_missing(const std::vector<int>& positions, int from, int length) {
    for (int pos = length - 1; pos >= from; --pos) {
      if (!std::binary_search(positions.begin(), positions.end(), pos)) return pos;
    }
    return -1;
  }

  std::size_t row_bytes(KVDtype dtype) const {
    return visit_kv_dtype(dtype, [&](auto tag) {
      return storage_row_bytes<Stored<typename decltype(tag)::type>>(this->head_dim());
    });
  }

  template <typename Block>
  void check_storable(KVDtype dtype, const char* name, const Block& x) const {
    visit_kv_dtype(dtype, [&](auto tag) {
      detail::require_storable<Stored<typename decltype(tag)::type>>(this->where("append").c_str(),
                                                                     name, RowMatrix<T>(x));
    });
  }

  // Encodes one head's row of `head_dim` values at the end of `bytes`.
  void append_encoded(KVDtype dtype, const T* x, std::vector<unsigned char>& bytes) const {
    visit_kv_dtype(dtype, [&](auto tag) {
      using S = Stored<typename decltype(tag)::type>;
      std::vector<S> row(storage_row_bytes<S>(this->head_dim()) / sizeof(S));
      KVStorage<S>::encode(x, this->head_dim(), row.data());
      const std::size_t at = bytes.size();
      bytes.resize(at + row.size() * sizeof(S));
      std::memcpy(bytes.data() + at, row.data(), row.size() * sizeof(S));
    });
  }

  // Decodes held row `r` of `bytes` into `head_dim` values.
  void decode_row(KVDtype dtype, const std::vector<unsigned char>& bytes, int r, T* x) const {
    visit_kv_dtype(dtype, [&](auto tag) {
      using S = Stored<typename decltype(tag)::type>;
      thread_local std::vector<S> row;
      row.resize(storage_row_bytes<S>(this->head_dim()) / sizeof(S));
      std::memcpy(row.data(), bytes.data() + static_cast<std::size_t>(r) * row.size() * sizeof(S),
                  row.size() * sizeof(S));
      KVStorage<S>::decode(row.data(), this->head_dim(), x);
    });
  }

  // What the store keeps, behind one pointer, so that the store object is its base and a
  // pointer. (GCC 12 at -O3 speculatively inlines a KVStore's virtual calls into this class's
  // members even where the object is another store, and -Warray-bounds then reports this
  // class's members as beyond that object's end: a false positive, which this avoids.)
  struct State {
    std::vector<HeadPolicy> heads;              // [num_layers · num_kv_heads]
    std::vector<std::size_t> key_bytes;         // [num_layers · num_kv_heads]: a key row
    std::vector<std::size_t> value_bytes;       // [num_layers · num_kv_heads]: a value row
    std::map<int, Sequence> sequences;          // seq -> what its heads hold
    int measure_window = 0, measure_sinks = 0;  // measure_outside's; 0: not measuring
    std::vector<double> outside;                // [num_layers · num_kv_heads]: summed
    std::vector<std::uint64_t> measured;        // [num_layers · num_kv_heads]: query heads
    int next_id = 0;
  };
  std::unique_ptr<State> s_ = std::make_unique<State>();
};

}  // namespace kvlab
