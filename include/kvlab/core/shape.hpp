/// \file
/// \brief `AttentionShape`: the head layout of one attention layer (MHA, GQA or MQA), validated.
#pragma once

#include <climits>
#include <cmath>
#include <string>

#include "kvlab/config.hpp"

namespace kvlab {

/// The head layout of one attention layer.
///
/// A layer has `num_heads` query heads and `num_kv_heads` key/value heads of `head_dim` values
/// each. Query head `h` reads key/value head `h / group_size()`: consecutive query heads share
/// one K/V head, as in Llama's grouped-query attention.
///  - MHA: `num_kv_heads == num_heads` (group size 1);
///  - GQA: `1 < num_kv_heads < num_heads`, e.g. 32 query heads over 8 K/V heads (group size 4);
///  - MQA: `num_kv_heads == 1` (all query heads share one K/V head).
///
/// Activations are token-major: a query matrix is `[tokens, num_heads * head_dim]`, head `h`
/// in columns `[h * head_dim, (h + 1) * head_dim)`; keys and values are
/// `[tokens, num_kv_heads * head_dim]`. The scores are `scale * q . k`, and `scale` defaults to
/// `1 / sqrt(head_dim)`.
///
/// The shape is checked once, on construction, and immutable afterwards.
class AttentionShape {
 public:
  /// A shape with the default scale `1 / sqrt(head_dim)`.
  /// \throws InvalidArgument if a count is below 1, `num_heads` is not a multiple of
  ///         `num_kv_heads`, or `num_heads * head_dim` does not fit in an `int`.
  AttentionShape(int num_heads, int num_kv_heads, int head_dim)
      : AttentionShape(num_heads, num_kv_heads, head_dim,
                       head_dim > 0 ? 1.0 / std::sqrt(static_cast<double>(head_dim)) : 1.0) {}

  /// A shape with an explicit score scale (finite and > 0).
  /// \throws InvalidArgument as the three-argument constructor, or for a bad `scale`.
  AttentionShape(int num_heads, int num_kv_heads, int head_dim, double scale)
      : num_heads_(num_heads), num_kv_heads_(num_kv_heads), head_dim_(head_dim), scale_(scale) {
    constexpr const char* kWhere = "kvlab::AttentionShape";
    detail::require_at_least(kWhere, "num_heads", num_heads, 1);
    detail::require_at_least(kWhere, "num_kv_heads", num_kv_heads, 1);
    detail::require_at_least(kWhere, "head_dim", head_dim, 1);
    if (num_heads % num_kv_heads != 0) {
      detail::fail(kWhere, "num_heads",
                   "a multiple of num_kv_heads (" + std::to_string(num_kv_heads) + ")", num_heads);
    }
    if (num_heads > INT_MAX / head_dim) {
      detail::fail(kWhere, "num_heads * head_dim", "at most " + std::to_string(INT_MAX),
                   1LL * num_heads * head_dim);
    }
    if (!(scale > 0.0) || !std::isfinite(scale)) {
      detail::fail(kWhere, "scale", "a finite value > 0", scale);
    }
  }

  /// Number of query heads.
  KVLAB_HOST_DEVICE int num_heads() const { return num_heads_; }
  /// Number of key/value heads (divides `num_heads()`).
  KVLAB_HOST_DEVICE int num_kv_heads() const { return num_kv_heads_; }
  /// Values per head.
  KVLAB_HOST_DEVICE int head_dim() const { return head_dim_; }
  /// Factor applied to every `q . k` before the softmax.
  KVLAB_HOST_DEVICE double scale() const { return scale_; }
  /// Query heads per K/V head: `num_heads / num_kv_heads`.
  KVLAB_HOST_DEVICE int group_size() const { return num_heads_ / num_kv_heads_; }
  /// Width of a query (or attention output) row: `num_heads * head_dim`.
  KVLAB_HOST_DEVICE int q_width() const { return num_heads_ * head_dim_; }
  /// Width of a key or value row: `num_kv_heads * head_dim`.
  KVLAB_HOST_DEVICE int kv_width() const { return num_kv_heads_ * head_dim_; }
  /// The K/V head that query head `head` reads.
  KVLAB_HOST_DEVICE int kv_head_of(int head) const { return head / group_size(); }

 private:
  int num_heads_;
  int num_kv_heads_;
  int head_dim_;
  double scale_;
};

}  // namespace kvlab
