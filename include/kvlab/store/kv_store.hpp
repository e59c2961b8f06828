/// \file
/// \brief `KVStore`: the one interface for how a model keeps what it needs of past tokens.
///
/// Between steps an implementation recomputes them (`RecomputeStore`), keeps K and V in a
/// contiguous cache per sequence (`ContiguousStore`) or in the blocks of a shared pool
/// (`PagedStore`). `StepBatch` holds the rows of one step over a ragged batch of sequences. The
/// per-layer step (`model/attention_step.hpp`) is written once against this interface; the test
/// suite (`tests/store/test_kv_store.cpp`) runs over every implementation.
///
/// Why an abstract class and not a template parameter (a "concept"): the store is chosen at run
/// time (`kvlab-generate --backend paged`), its calls are per layer and step — a few per layer,
/// never per element — so a virtual call costs nothing measurable, and one class declaration
/// states the whole contract in one place, with the argument checks written once in its
/// non-virtual members. A new way of keeping K/V (a sliding window, a quantized cache) is one
/// more class that overrides the `do_*` members.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/cache/paged_kv_cache.hpp"
#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/matrix.hpp"

namespace kvlab {

/// The sequences of one step over a ragged batch, and the rows that the step computes for each.
///
/// Sequence `seqs[i]` adds `new_tokens(i)` tokens, the rows `[new_indptr[i], new_indptr[i + 1])`
/// of the step's new inputs. The step computes the rows `[row_indptr[i], row_indptr[i + 1])` for
/// it: its tokens at positions `first_position[i]` onwards, the new tokens last. A store that
/// keeps K and V computes the new tokens only (`first_position` is the sequence's length before
/// the step); `RecomputeStore` computes every token of the sequence again (`first_position` 0).
/// Queries always belong to a sequence's last rows: all its computed rows below the top layer,
/// its new tokens at the top (whose outputs are all that the step returns).
struct StepBatch {
  std::vector<int> seqs;                 ///< [batch]: distinct sequence ids, in the rows' order
  std::vector<std::int32_t> new_indptr;  ///< [batch + 1]: new tokens of each sequence (CSR)
  std::vector<std::int32_t> row_indptr;  ///< [batch + 1]: computed rows of each sequence (CSR)
  std::vector<int> first_position;       ///< [batch]: position of each sequence's first row

  /// Sequences in the step.
  int size() const { return static_cast<int>(seqs.size()); }
  /// The id of sequence `i` of the batch.
  /// \throws InvalidArgument if `i` is not in [0, size()) (as the other per-sequence members).
  int seq(int i) const { return seqs[index("kvlab::StepBatch::seq", i)]; }
  /// Position of the first row computed for sequence `i` of the batch.
  int first(int i) const { return first_position[index("kvlab::StepBatch::first", i)]; }
  /// First row of sequence `i` among the step's computed rows.
  int row_begin(int i) const { return row_indptr[index("kvlab::StepBatch::row_begin", i)]; }
  /// First new token of sequence `i` among the step's new inputs.
  int new_begin(int i) const { return new_indptr[index("kvlab::StepBatch::new_begin", i)]; }
  /// Rows the step computes, all sequences together.
  int rows() const { return row_indptr.empty() ? 0 : row_indptr.back(); }
  /// New tokens of the step, all sequences together.
  int new_rows() const { return new_indptr.empty() ? 0 : new_indptr.back(); }
  /// New tokens of sequence `i` of the batch.
  int new_tokens(int i) const {
    const std::size_t s = index("kvlab::StepBatch::new_tokens", i);
    return new_indptr[s + 1] - new_indptr[s];
  }
  /// Rows computed for sequence `i` of the batch.
  int computed(int i) const {
    const std::size_t s = index("kvlab::StepBatch::computed", i);
    return row_indptr[s + 1] - row_indptr[s];
  }
  /// True when the step computes the new tokens only (a store that keeps K and V).
  bool new_rows_only() const { return rows() == new_rows(); }

  /// The query rows of the layer: CSR over the sequences of the rows whose outputs carry on —
  /// every computed row, or in the top layer (`top`) only the new tokens.
  std::vector<std::int32_t> query_indptr(bool top) const { return top ? new_indptr : row_indptr; }

 private:
  // `i` as an index of the per-sequence arrays, checked against the batch (the CSR arrays hold
  // one more entry, `i + 1`, read by new_tokens and computed).
  std::size_t index(const char* where, int i) const {
    if (i < 0 || i >= size()) {
      detail::fail(where, "i", "in [0, " + std::to_string(size()) + ")", i);
    }
    return static_cast<std::size_t>(i);
  }
};

/// How a model keeps what it needs of past tokens between steps, for many sequences at once.
///
/// A step over a batch of sequences is four calls, made by the per-layer step
/// (`attention_step`) and the model around it:
///  1. `begin_step(seqs, new_indptr, new_inputs, inputs)`: room for the new tokens of every
///     sequence, all or nothing (`CapacityError` / `OutOfBlocks` otherwise, nothing changed);
///     it returns the `StepBatch` — which rows the step computes — and the layer-0 inputs of
///     those rows;
///  2. per layer, `append(layer, k, v)`: keep the keys and values of the step's rows;
///  3. per layer, `attend(layer, shape, q, q_indptr, out)`: each sequence's query rows (its
///     last rows) attend causally to the sequence's keys, through this store's kernel;
///  4. `end_step()` (the new tokens are now part of their sequences), or `abort_step()` after an
///     error (every sequence back to its length before the step).
/// A model opens a step with an `OpenStep`, which makes the fourth call for it: `abort_step`
/// unless the step was committed, whatever was thrown inside it.
/// Between steps, sequences are added, forked, truncated and freed.
///
/// Every public member checks its arguments first and throws (`InvalidArgument`, naming the
/// argument, the expected and the actual value) leaving the store unchanged; the checks live
/// here, the work in the `do_*` members of each implementation.
template <typename T>
class KVStore {
 public:
  virtual ~KVStore() = default;
  KVStore(const KVStore&) = delete;
  KVStore& operator=(const KVStore&) = delete;

  /// Layers whose K/V the store keeps.
  int num_layers() const { return num_layers_; }
  /// K/V heads per layer.
  int num_kv_heads() const { return num_kv_heads_; }
  /// Values per head.
  int head_dim() const { return head_dim_; }
  /// The store's name in messages and tables: "recompute", "contiguous" or "paged".
  virtual const char* name() const = 0;
  /// How the store keeps its values: "fp32" (or "fp64" for double), "fp16", "bf16", "int8",
  /// "int4" (`KVStorage`).
  virtual const char* storage_name() const = 0;
  /// Bytes the store keeps per token of a sequence, all layers: K and V as stored, or the
  /// inputs of `RecomputeStore`.
  virtual std::size_t bytes_per_token() const = 0;
  /// The block pool of a paged store (its bookkeeping), or null for the other stores.
  virtual const PagedKVCacheBase* paged_pool() const { return nullptr; }
  /// The sliding window its attention applies: each query sees its last `window()` keys
  /// (`cpu::reference_attention`); 0 for none.
  virtual int window() const { return 0; }
  /// The attention sinks its attention applies besides the window: each query also sees the
  /// first `sinks()` tokens of its sequence (`reference_attention`'s sinks); 0 for none.
  virtual int sinks() const { return 0; }
  /// The most new tokens one step may add to a sequence: a windowed ring's `capacity − W + 1`
  /// (`ContiguousStore`), else no limit (`INT_MAX`; room is checked by `begin_step`).
  virtual int max_step_tokens() const { return INT_MAX; }

  /// Starts an empty sequence and returns its id (ids are never reused).
  /// \throws CapacityError / OutOfBlocks where the store has no room for one more sequence.
  virtual int add_sequence() = 0;
  /// Ends `seq` and releases what it held.
  /// \throws InvalidArgument if `seq` is not live or a step is open.
  void free_sequence(int seq) {
    check_between_steps("free_sequence");
    check_live("free_sequence", seq);
    do_free_sequence(seq);
  }
  /// Starts a sequence that continues `seq` (the same tokens) and returns its id: a copy of its
  /// K/V in a contiguous store, shared blocks (copied on write) in a paged one.
  /// \throws InvalidArgument if `seq` is not live or a step is open.
  int fork(int seq) {
    check_between_steps("fork");
    check_live("fork", seq);
    return do_fork(seq);
  }
  /// Shortens `seq` to its first `length` tokens.
  /// \throws InvalidArgument if `seq` is not live, a step is open, or `length` is not in
  ///         [0, length(seq)].
  void truncate(int seq, int length) {
    check_between_steps("truncate");
    check_live("truncate", seq);
    const int now = do_length(seq);
    if (length < 0 || length > now) {
      detail::fail(where("truncate").c_str(), "length", "in [0, " + std::to_string(now) + "]",
                   length);
    }
    do_truncate(seq, length);
  }
  /// Tokens of `seq`.
  /// \throws InvalidArgument if `seq` is not live.
  int length(int seq) const {
    check_live("length", seq);
    return do_length(seq);
  }
  /// True when `seq` is a live sequence of this store.
  bool contains(int seq) const { return do_contains(seq); }
  /// Ids of the live sequences, ascending.
  virtual std::vector<int> sequences() const = 0;
  /// Bytes the store has reserved for what it keeps (K and V, or the inputs of `RecomputeStore`):
  /// what it holds of memory — a contiguous cache's whole reservation (every slot of a windowed
  /// ring), a paged store's blocks in use, whole.
  virtual std::size_t bytes_reserved() const = 0;
  /// Bytes of those that hold tokens of live sequences: a contiguous cache's filled rows, the
  /// tokens in a paged store's blocks.
  virtual std::size_t bytes_used() const = 0;

  /// Starts a step in which sequence `seqs[i]` adds the rows `[new_indptr[i], new_indptr[i +
  /// 1])` of `new_inputs` (the layer-0 inputs of its new tokens: embeddings, or a toy model's
  /// input rows), and returns which rows the step computes.
  /// \param seqs        [batch]: distinct live sequences, batch >= 1
  /// \param new_indptr  [batch + 1]: 0, then strictly increasing (every sequence adds a token)
  /// \param new_inputs  [new_indptr[batch], input width]
  /// \param inputs      out: [StepBatch::rows(), input width], the layer-0 input of every row
  ///                    the step computes (the new inputs, or for `RecomputeStore` each
  ///                    sequence's kept inputs followed by its new ones)
  /// \param caller      the public function the user called, which error messages name
  /// \throws InvalidArgument for a bad argument or a step already open; CapacityError or
  ///         OutOfBlocks if the store has no room for the new tokens. Nothing changes then.
  const StepBatch& begin_step(const std::vector<int>& seqs,
                              const std::vector<std::int32_t>& new_indptr,
                              const RowMatrix<T>& new_inputs, RowMatrix<T>& inputs,
                              const char* caller = nullptr) {
    const char* at = caller != nullptr ? caller : where_begin_step_.c_str();
    if (open_)
      detail::fail(at, "step", "no step open (end_step or abort_step first)", "a step open");
    detail::require_at_least(at, "seqs.size()", seqs.size(), std::size_t{1});
    detail::require_equal(at, "new_indptr.size()", new_indptr.size(), seqs.size() + 1,
                          "seqs.size() + 1");
    detail::require_equal(at, "new_indptr[0]", new_indptr[0], 0);
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      const auto name = [i] { return "seqs[" + std::to_string(i) + "]"; };
      if (!do_contains(seqs[i])) detail::fail(at, name(), "a live sequence id", seqs[i]);
      for (std::size_t j = 0; j < i; ++j) {  // no allocation: batches are short
        if (seqs[j] == seqs[i])
          detail::fail(at, name(), "a sequence not already in the batch", seqs[i]);
      }
      if (new_indptr[i + 1] <= new_indptr[i]) {
        detail::fail(at, "new_indptr[" + std::to_string(i + 1) + "]",
                     "> new_indptr[" + std::to_string(i) + "] (" + std::to_string(new_indptr[i]) +
                         "): every sequence adds at least one token",
                     new_indptr[i + 1]);
      }
    }
    detail::require_equal(at, "new_inputs.rows()", static_cast<long>(new_inputs.rows()),
                          static_cast<long>(new_indptr.back()), "new_indptr[batch]");
    if (&inputs == &new_inputs) {
      detail::fail(at, "inputs", "a matrix other than new_inputs", "new_inputs");
    }
    StepBatch batch;
    batch.seqs = seqs;
    batch.new_indptr = new_indptr;
    do_begin_step(batch, new_inputs, inputs, at);  // fills row_indptr, first_position
    step_ = std::move(batch);
    open_ = true;
    return step_;
  }

  /// The open step (from `begin_step`).
  /// \throws InvalidArgument if no step is open.
  const StepBatch& step() const {
    check_open("step");
    return step_;
  }

  /// Keeps the keys and values of every row of the open step for `layer`.
  /// \param layer  in [0, num_layers())
  /// \param k  [StepBatch::rows(), num_kv_heads * head_dim], the rows in the step's order (with
  ///           RoPE applied where the model has it)
  /// \param v  the same shape
  /// \throws InvalidArgument for a wrong layer or shape, or no step open.
  void append(int layer, const RowMatrix<T>& k, const RowMatrix<T>& v) {
    check_open("append");
    check_layer("append", layer);
    const long width = static_cast<long>(num_kv_heads_) * head_dim_;
    const char* at = where_append_.c_str();
    detail::require_equal(at, "k.rows()", static_cast<long>(k.rows()),
                          static_cast<long>(step_.rows()), "the step's rows");
    detail::require_equal(at, "k.cols()", static_cast<long>(k.cols()), width,
                          "num_kv_heads * head_dim");
    detail::require_equal(at, "v.rows()", static_cast<long>(v.rows()), static_cast<long>(k.rows()),
                          "k.rows()");
    detail::require_equal(at, "v.cols()", static_cast<long>(v.cols()), width,
                          "num_kv_heads * head_dim");
    do_append(layer, k, v);
  }

  /// Attention of each sequence's query rows over its keys and values in `layer`, by this
  /// store's kernel: sequence i of the step owns rows `[q_indptr[i], q_indptr[i + 1])` of `q`,
  /// its last that many tokens, each seeing its sequence's tokens up to itself.
  /// \param layer     in [0, num_layers())
  /// \param shape     the head layout (num_kv_heads and head_dim those of the store)
  /// \param q         [q_indptr[batch], num_heads * head_dim]
  /// \param q_indptr  [batch + 1]: 1 <= q_indptr[i + 1] - q_indptr[i] <= StepBatch::computed(i)
  /// \param out       out: [q.rows(), num_heads * head_dim] (resized); not `q`
  /// \param counters  if not null, receives the kernel's work
  /// \throws InvalidArgument for a bad argument or no step open.
  void attend(int layer, const AttentionShape& shape, const RowMatrix<T>& q,
              const std::vector<std::int32_t>& q_indptr, RowMatrix<T>& out,
              CostCounters* counters) {
    check_open("attend");
    check_layer("attend", layer);
    const char* at = where_attend_.c_str();
    detail::require_equal(at, "shape.num_kv_heads()", shape.num_kv_heads(), num_kv_heads_,
                          "the store's num_kv_heads");
    detail::require_equal(at, "shape.head_dim()", shape.head_dim(), head_dim_,
                          "the store's head_dim");
    detail::require_equal(at, "q_indptr.size()", q_indptr.size(), step_.seqs.size() + 1,
                          "the step's batch + 1");
    detail::require_equal(at, "q_indptr[0]", q_indptr[0], 0);
    for (int i = 0; i < step_.size(); ++i) {
      const auto s = static_cast<std::size_t>(i);
      const int n = q_indptr[s + 1] - q_indptr[s];
      if (n < 1 || n > step_.computed(i)) {
        detail::fail(at, "q_indptr[" + std::to_string(i + 1) + "]",
                     "q_indptr[" + std::to_string(i) + "] + [1, " +
                         std::to_string(step_.computed(i)) + "] (the rows of sequence " +
                         std::to_string(step_.seq(i)) + ")",
                     q_indptr[s + 1]);
      }
    }
    detail::require_equal(at, "q.rows()", static_cast<long>(q.rows()),
                          static_cast<long>(q_indptr.back()), "q_indptr[batch]");
    detail::require_equal(at, "q.cols()", static_cast<long>(q.cols()),
                          static_cast<long>(shape.q_width()), "num_heads * head_dim");
    if (&out == &q) detail::fail(at, "out", "a matrix other than q", "q");
    do_attend(layer, shape, q, q_indptr, out, counters);
  }

  /// Ends the open step: its new tokens are now part of their sequences.
  /// \throws InvalidArgument if no step is open.
  void end_step() {
    check_open("end_step");
    do_end_step();
    open_ = false;
  }

  /// Ends the open step without it: every sequence of the step goes back to its length before
  /// `begin_step` (after an error in a layer). Does nothing when no step is open.
  void abort_step() noexcept {
    if (!open_) return;
    do_abort_step();
    open_ = false;
  }

 protected:
  /// A store for `num_layers` layers of `num_kv_heads` heads of `head_dim` values.
  /// \throws InvalidArgument (naming `owner`) if any is below 1.
  KVStore(const char* owner, int num_layers, int num_kv_heads, int head_dim)
      : owner_(owner),
        where_begin_step_(where("begin_step")),
        where_append_(where("append")),
        where_attend_(where("attend")),
        num_layers_(num_layers),
        num_kv_heads_(num_kv_heads),
        head_dim_(head_dim) {
    detail::require_at_least(owner, "num_layers", num_layers, 1);
    detail::require_at_least(owner, "num_kv_heads", num_kv_heads, 1);
    detail::require_at_least(owner, "head_dim", head_dim, 1);
  }

  /// "<owner>::<function>", the start of every error message.
  std::string where(const char* function) const { return owner_ + "::" + function; }

  /// Whether `seq` is live.
  virtual bool do_contains(int seq) const = 0;
  /// Tokens of live sequence `seq`.
  virtual int do_length(int seq) const = 0;
  /// `free_sequence` of a live sequence, between steps.
  virtual void do_free_sequence(int seq) = 0;
  /// `fork` of a live sequence, between steps.
  virtual int do_fork(int seq) = 0;
  /// `truncate` of a live sequence to a length in [0, length], between steps.
  virtual void do_truncate(int seq, int length) = 0;
  /// Makes room for the step of `batch` (seqs and new_indptr checked) and fills its
  /// `row_indptr` and `first_position`, and `inputs`; throws (changing nothing) if there is no
  /// room, naming `caller`.
  virtual void do_begin_step(StepBatch& batch, const RowMatrix<T>& new_inputs, RowMatrix<T>& inputs,
                             const char* caller) = 0;
  /// `append` with checked arguments; the open step is `step()`.
  virtual void do_append(int layer, const RowMatrix<T>& k, const RowMatrix<T>& v) = 0;
  /// `attend` with checked arguments.
  virtual void do_attend(int layer, const AttentionShape& shape, const RowMatrix<T>& q,
                         const std::vector<std::int32_t>& q_indptr, RowMatrix<T>& out,
                         CostCounters* counters) = 0;
  /// `end_step`.
  virtual void do_end_step() = 0;
  /// `abort_step`: must not throw.
  virtual void do_abort_step() noexcept = 0;

 private:
  void check_live(const char* function, int seq) const {
    if (!do_contains(seq)) detail::fail(where(function).c_str(), "seq", "a live sequence id", seq);
  }
  void check_open(const char* function) const {
    if (!open_)
      detail::fail(where(function).c_str(), "step", "a step open (begin_step first)", "none");
  }
  void check_between_steps(const char* function) const {
    if (open_) {
      detail::fail(where(function).c_str(), "step", "no step open (end_step or abort_step first)",
                   "a step open");
    }
  }
  void check_layer(const char* function, int layer) const {
    if (layer < 0 || layer >= num_layers_) {
      detail::fail(where(function).c_str(), "layer", "in [0, " + std::to_string(num_layers_) + ")",
                   layer);
    }
  }

  std::string owner_;
  std::string where_begin_step_, where_append_, where_attend_;  // the messages' starts, made once
  int num_layers_;
  int num_kv_heads_;
  int head_dim_;
  StepBatch step_;     // the open step
  bool open_ = false;  // a step is open
};

/// A step of a `KVStore`, open while this object lives: `begin_step` when it is made,
/// `end_step` at `commit`, and `abort_step` when it goes without a commit — so that whatever a
/// layer throws, every sequence is back at its length before the step. The one step protocol of
/// every model (`run_stack`, `LlamaModel`):
/// \code
/// OpenStep<float> step(store, seqs, new_indptr, embedded, x, "kvlab::MyModel::forward");
/// for (int l = 0; l < layers; ++l) { /* attention_step(..., store, l, ...), add_residual */ }
/// step.commit();  // or leave by an exception: the step is aborted
/// \endcode
template <typename T>
class OpenStep {
 public:
  /// Opens a step: `store.begin_step(seqs, new_indptr, new_inputs, inputs, caller)`.
  /// \throws whatever `begin_step` throws (nothing is open then).
  OpenStep(KVStore<T>& store, const std::vector<int>& seqs,
           const std::vector<std::int32_t>& new_indptr, const RowMatrix<T>& new_inputs,
           RowMatrix<T>& inputs, const char* caller)
      : store_(store), batch_(store.begin_step(seqs, new_indptr, new_inputs, inputs, caller)) {}
  OpenStep(const OpenStep&) = delete;
  OpenStep& operator=(const OpenStep&) = delete;
  /// Aborts the step unless it was committed (`KVStore::abort_step`, which does not throw).
  ~OpenStep() {
    if (!committed_) store_.abort_step();
  }

  /// The open step's rows (`KVStore::begin_step`'s result).
  const StepBatch& batch() const { return batch_; }
  /// Ends the step keeping its tokens (`KVStore::end_step`).
  void commit() {
    store_.end_step();
    committed_ = true;
  }

 private:
  KVStore<T>& store_;
  const StepBatch& batch_;  // the store's open step
  bool committed_ = false;
};

}  // namespace kvlab
