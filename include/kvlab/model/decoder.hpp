/// \file
/// \brief `Decoder`: the interface shared by kvlab's decoders (prefill a prompt, then decode
/// one token a step), with per-step and total cost counters.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/matrix.hpp"
#include "kvlab/model/attention_layer.hpp"

namespace kvlab {

/// A decoder consumes a token stream through an `AttentionStack` and returns, for each new
/// token, the stack's output at that token's position.
///
/// Tokens arrive as rows of `d_model` values (embedding them is the model's business).
/// `prefill` takes several tokens at once (the prompt; causal within it) and `decode` one
/// token. Implementations differ only in what they keep between steps: `NaiveDecoder` keeps
/// the inputs and recomputes, `CachedDecoder` keeps K and V in one contiguous buffer,
/// `PagedDecoder` keeps them in blocks of a shared pool. Each call records its work in
/// `last_step()` and adds it to `total()`.
template <typename T>
class Decoder {
 public:
  /// A decoder running `stack`.
  /// \throws InvalidArgument if `stack` is null.
  explicit Decoder(std::shared_ptr<const AttentionStack<T>> stack) : stack_(std::move(stack)) {
    if (!stack_) detail::fail("kvlab::Decoder", "stack", "a non-null stack", "nullptr");
  }
  virtual ~Decoder() = default;
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  /// Feeds `x.rows()` tokens at once (a prompt, or a later chunk of one).
  /// \param x  [p, d_model], p >= 1
  /// \return   [p, d_model]: the stack's output at each of the p positions
  /// \throws InvalidArgument for a wrong shape; CapacityError (`CachedDecoder`) or
  ///         OutOfBlocks (`PagedDecoder`) if its cache is full. Either way the decoder is
  ///         unchanged.
  RowMatrix<T> prefill(const RowMatrix<T>& x) {
    constexpr const char* kWhere = "kvlab::Decoder::prefill";
    detail::require_at_least(kWhere, "x.rows()", static_cast<long>(x.rows()), 1L);
    detail::require_equal(kWhere, "x.cols()", static_cast<long>(x.cols()),
                          static_cast<long>(stack_->d_model()), "d_model");
    CostCounters step;
    RowMatrix<T> y = forward(x, step);
    position_ += static_cast<int>(x.rows());
    last_step_ = step;
    total_ += step;
    return y;
  }

  /// Feeds one token.
  /// \param x  [d_model]
  /// \return   [d_model]: the stack's output at the new position
  /// \throws as `prefill`.
  RowVector<T> decode(const RowVector<T>& x) { return prefill(RowMatrix<T>(x)).row(0); }

  /// Number of tokens consumed so far.
  int position() const { return position_; }
  /// The work of the last `prefill` or `decode` call.
  const CostCounters& last_step() const { return last_step_; }
  /// The work of every call since construction or `reset`.
  const CostCounters& total() const { return total_; }
  /// The model this decoder runs.
  const AttentionStack<T>& stack() const { return *stack_; }

  /// Forgets the tokens at positions `position` and after, as if they had never been fed
  /// (counters are kept).
  /// \throws InvalidArgument unless 0 <= position <= position().
  void rewind(int position) {
    if (position < 0 || position > position_) {
      detail::fail("kvlab::Decoder::rewind", "position",
                   "in [0, " + std::to_string(position_) + "]", position);
    }
    truncate(position);
    position_ = position;
  }

  /// Forgets every token and zeroes the counters.
  void reset() {
    rewind(0);
    last_step_ = CostCounters{};
    total_ = CostCounters{};
  }

 protected:
  /// The stack, shared (for a decoder that makes another of its kind, e.g. a fork).
  const std::shared_ptr<const AttentionStack<T>>& stack_pointer() const { return stack_; }
  /// Takes `other`'s position: for a decoder made to continue `other`'s tokens (a fork).
  void continue_from(const Decoder& other) { position_ = other.position_; }

  /// Runs the stack on new tokens `x` ([p, d_model], checked) at positions
  /// [position(), position() + p), adds the work to `counters` and returns [p, d_model].
  /// Must leave the decoder unchanged if it throws.
  virtual RowMatrix<T> forward(const RowMatrix<T>& x, CostCounters& counters) = 0;
  /// Drops the state of positions `position` and after.
  virtual void truncate(int position) = 0;

 private:
  std::shared_ptr<const AttentionStack<T>> stack_;
  int position_ = 0;
  CostCounters last_step_;
  CostCounters total_;
};

}  // namespace kvlab
