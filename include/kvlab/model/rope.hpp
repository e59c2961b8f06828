/// \file
/// \brief `RotaryEmbedding`: rotary position embedding (RoPE), tabulated once.
///
/// It applies RoPE exactly as llama2.c's `run.c` applies it. Checked in the tests: identity at
/// position 0, lengths kept, scores that depend on relative positions only.
#pragma once

#include <cmath>
#include <string>

#include "kvlab/config.hpp"
#include "kvlab/matrix.hpp"

namespace kvlab {

/// Rotary position embedding (RoPE) exactly as llama2.c's run.c applies it: within each head,
/// values `(i, i + 1)` for even `i` are a pair, rotated by the angle `pos * freq` with
/// `freq = 1 / base^(i / head_dim)` (in float, as run.c computes it; base 10000 there).
///
/// Adjacent pairs are also what GGUF files of the llama architecture expect (llama.cpp's
/// "normal" RoPE): Hugging Face's Llama rotates the pairs `(i, i + head_dim/2)` instead, and
/// llama.cpp's converter permutes the rows of `wq` and `wk` within each head so that its pairs
/// land side by side. The scores are the same; only the order of values within a head differs,
/// and the cache holds K in the file's order.
///
/// A rotation keeps each pair's length, and the dot product of a query rotated to position m
/// with a key rotated to position n depends on m - n only: attention sees relative positions.
/// The angles are tabulated once for `max_positions` positions, so every backend rotates with
/// the very same numbers.
class RotaryEmbedding {
 public:
  /// A table for positions [0, max_positions) of heads of `head_dim` values, turning at `base`
  /// (`LlamaConfig::rope_theta`).
  /// \throws InvalidArgument if `head_dim` is not even and >= 2, `max_positions < 1`, or
  ///         `base` is not a finite number > 1.
  RotaryEmbedding(int head_dim, int max_positions, float base = 10000.0f) : head_dim_(head_dim) {
    constexpr const char* kWhere = "kvlab::RotaryEmbedding";
    detail::require_at_least(kWhere, "head_dim", head_dim, 2);
    if (head_dim % 2 != 0) detail::fail(kWhere, "head_dim", "an even number", head_dim);
    detail::require_at_least(kWhere, "max_positions", max_positions, 1);
    if (!(base > 1.0f) || !std::isfinite(base))
      detail::fail(kWhere, "base", "a finite number > 1", base);
    cos_.resize(max_positions, head_dim / 2);
    sin_.resize(max_positions, head_dim / 2);
    for (int pos = 0; pos < max_positions; ++pos) {
      for (int j = 0; j < head_dim / 2; ++j) {
        const float freq =
            1.0f / std::pow(base, static_cast<float>(2 * j) / static_cast<float>(head_dim));
        const float angle = static_cast<float>(pos) * freq;
        cos_(pos, j) = std::cos(angle);
        sin_(pos, j) = std::sin(angle);
      }
    }
  }

  /// Values per head.
  int head_dim() const { return head_dim_; }
  /// Positions in the table.
  int max_positions() const { return static_cast<int>(cos_.rows()); }

  /// Rotates every head of every row of `x` in place; row `r` is the token at position
  /// `first_position + r`. `x` may be a matrix or a block of rows of one (the rows of one
  /// sequence in a batch).
  /// \param x               [n, heads * head_dim]: queries or keys, token-major
  /// \param first_position  the position of row 0
  /// \throws InvalidArgument if `x.cols()` is not a multiple of head_dim or a position is
  ///         outside [0, max_positions).
  void apply(Eigen::Ref<RowMatrix<float>> x, int first_position) const {
    rotate(x, first_position);
  }

  /// `apply` for double matrices (the angles are the same floats, widened).
  void apply(Eigen::Ref<RowMatrix<double>> x, int first_position) const {
    rotate(x, first_position);
  }

 private:
  template <typename T>
  void rotate(Eigen::Ref<RowMatrix<T>>& x, int first_position) const {
    constexpr const char* kWhere = "kvlab::RotaryEmbedding::apply";
    if (x.cols() % head_dim_ != 0) {
      detail::fail(kWhere, "x.cols()", "a multiple of head_dim (" + std::to_string(head_dim_) + ")",
                   x.cols());
    }
    if (first_position < 0 || first_position + x.rows() > max_positions()) {
      detail::fail(kWhere, "first_position",
                   "positions within [0, " + std::to_string(max_positions()) + ")",
                   std::to_string(first_position) + " + " + std::to_string(x.rows()) + " rows");
    }
    const Eigen::Index heads = x.cols() / head_dim_;
    for (Eigen::Index r = 0; r < x.rows(); ++r) {
      const Eigen::Index pos = first_position + r;
      T* row = x.row(r).data();  // [heads * head_dim]
      for (Eigen::Index h = 0; h < heads; ++h) {
        for (int j = 0; j < head_dim_ / 2; ++j) {
          T* pair = row + h * head_dim_ + 2 * j;  // values (i, i + 1), i = 2j within head h
          const T c = static_cast<T>(cos_(pos, j)), s = static_cast<T>(sin_(pos, j));
          const T v0 = pair[0], v1 = pair[1];
          pair[0] = v0 * c - v1 * s;
          pair[1] = v0 * s + v1 * c;
        }
      }
    }
  }

  int head_dim_;
  RowMatrix<float> cos_;  // [max_positions, head_dim / 2]
  RowMatrix<float> sin_;  // [max_positions, head_dim / 2]
};

}  // namespace kvlab
