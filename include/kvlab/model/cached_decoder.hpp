/// \file
/// \brief `CachedDecoder`: decoding with a contiguous KV cache. Each step projects q, k and v
/// of the new tokens only, appends k and v, and attends to the cache. Checked against
/// `NaiveDecoder` at every step.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "kvlab/cache/contiguous_kv_cache.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/cpu/decode_attention.hpp"
#include "kvlab/cpu/types.hpp"
#include "kvlab/model/attention_layer.hpp"
#include "kvlab/model/decoder.hpp"

namespace kvlab {

/// A decoder that keeps K and V of every past token in a `ContiguousKVCache`.
///
/// At step t (p new tokens) each layer:
///  1. projects q, k and v of the p new tokens only;
///  2. appends k and v to the layer's cache (q is not kept: it is used once, now);
///  3. runs `cpu::decode_attention` of the p queries over the cache (causal within the new
///     tokens, so a prompt can be prefilled at once).
///
/// So each step costs p K/V projections per K/V head per layer, Θ(1) for a decode step, and
/// the scores still cost t per query head (every new query meets every cached key). Memory:
/// the cache, reserved for `capacity` tokens.
template <typename T>
class CachedDecoder : public Decoder<T> {
 public:
  /// A decoder running `stack` with room for `capacity` tokens.
  /// \throws InvalidArgument if `capacity < 1`.
  CachedDecoder(std::shared_ptr<const AttentionStack<T>> stack, int capacity)
      : Decoder<T>(std::move(stack)),
        cache_(this->stack().num_layers(), this->stack().shape().num_kv_heads(),
               this->stack().shape().head_dim(), capacity) {}

  /// The cache (read-only), e.g. to print its contents or its size.
  const ContiguousKVCache<T>& cache() const { return cache_; }

 protected:
  RowMatrix<T> forward(const RowMatrix<T>& x, CostCounters& counters) override {
    const AttentionStack<T>& stack = this->stack();
    const int p = static_cast<int>(x.rows());
    if (p > cache_.capacity() - this->position()) {  // checked before any layer is touched
      detail::fail<CapacityError>("kvlab::CachedDecoder::forward", "x.rows()",
                                  "at most " +
                                      std::to_string(cache_.capacity() - this->position()) +
                                      " (capacity " + std::to_string(cache_.capacity()) +
                                      ", position " + std::to_string(this->position()) + ")",
                                  p);
    }
    RowMatrix<T> h = x;  // [p, d_model]: the current layer's input
    RowMatrix<T> k, v;   // [p, num_kv_heads * head_dim]
    try {
      for (int l = 0; l < stack.num_layers(); ++l) {
        const AttentionLayer<T>& layer = stack.layer(l);
        // 1. q, k, v of the new tokens only.
        layer.project_kv(h, k, v, &counters);
        const RowMatrix<T> q = layer.project_q(h, &counters);  // [p, num_heads * head_dim]
        // 2. Keep k and v for every later step.
        cache_.append(l, k, v);
        // 3. The new queries attend to everything cached, themselves included.
        const RowMatrix<T> attn =
            cpu::decode_attention(layer.shape(), q, cache_.view(l), &counters);
        h += layer.project_out(attn, &counters);
      }
    } catch (...) {
      cache_.truncate(this->position());  // e.g. out of memory in a later layer: undo the appends
      throw;
    }
    return h;  // [p, d_model]
  }

  void truncate(int position) override { cache_.truncate(position); }

 private:
  ContiguousKVCache<T> cache_;
};

}  // namespace kvlab
