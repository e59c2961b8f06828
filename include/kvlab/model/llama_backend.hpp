/// \file
/// \brief `LlamaBackend`: the three ways a `LlamaModel` can keep its past — naive (recompute),
/// cached (contiguous) and paged — by name, and the `KVStore` each one is.
#pragma once

#include <algorithm>
#include <climits>
#include <memory>
#include <string>

#include "kvlab/config.hpp"
#include "kvlab/model/llama_config.hpp"
#include "kvlab/store/contiguous_store.hpp"
#include "kvlab/store/kv_store.hpp"
#include "kvlab/store/paged_store.hpp"
#include "kvlab/store/recompute_store.hpp"
#include "kvlab/store/selective_store.hpp"

namespace kvlab {

/// How a `LlamaModel` attends to its past: which `KVStore` it runs on.
enum class LlamaBackend : int {
  /// No cache (`RecomputeStore`): every step runs the whole sequence through every layer again
  /// and re-projects K and V of every token in every layer (`cpu::naive_attention`).
  Naive = 0,
  /// A contiguous cache per sequence (`ContiguousStore`) holding `max_tokens` positions per
  /// layer; each step projects the new tokens only (`cpu::decode_attention`).
  Cached = 1,
  /// Blocks of a pool (`PagedStore`), taken as the sequence grows; each step projects the new
  /// tokens only and attends through the block tables (`cpu::paged_prefill_attention`).
  Paged = 2,
};

/// Name of a backend: "naive", "cached" or "paged".
inline const char* to_string(LlamaBackend backend) {
  switch (backend) {
    case LlamaBackend::Naive:
      return "naive";
    case LlamaBackend::Cached:
      return "cached";
    case LlamaBackend::Paged:
      return "paged";
  }
  return "unknown";
}

/// The backend named `name` ("naive", "cached" or "paged").
/// \throws InvalidArgument for any other name.
inline LlamaBackend parse_llama_backend(const std::string& name) {
  if (name == "naive") return LlamaBackend::Naive;
  if (name == "cached") return LlamaBackend::Cached;
  if (name == "paged") return LlamaBackend::Paged;
  detail::fail("kvlab::parse_llama_backend", "name", "naive, cached or paged", "'" + name + "'");
}

/// The store of `backend` for a model of shape `config`, with room for `sequences` sequences of
/// `max_tokens` tokens each: a `RecomputeStore` (inputs of `config.dim` values per token), a
/// `ContiguousStore` reserving `max_tokens` per sequence, or a `PagedStore` of
/// `sequences · ceil(max_tokens / block_size)` blocks of `block_size` tokens; the last two
/// store K and V as `dtype` (`KVDtype`). With a sliding window of `window` keys (>= 1) each
/// query attends to its last `window` keys: the recompute store keeps each row's band, and the
/// contiguous store becomes a ring of `min(max_tokens, 2 · window − 1)` slots per sequence,
/// which takes steps of up to `window` tokens (a longer prompt goes in in chunks:
/// `LlamaModel::prefill`), and the paged store gives back the blocks wholly before each
/// sequence's window after every step. With `sinks` attention sinks (cached or paged, below the
/// window) each query also sees its sequence's first `sinks` tokens: the ring gains as many
/// slots, and the paged store keeps their blocks; a window and sinks that together cover
/// `max_tokens` leave no key out, and the cached store is then the full cache.
/// \throws InvalidArgument if `block_size`, `max_tokens` or `sequences` is below 1, `dtype` is
///         not fp32 for the naive backend (it keeps no K/V), the head_dim is not a multiple
///         of 32 for int8 and int4, `window` is negative, or `sinks` is negative, not below a
///         window (none without one) or given to the naive backend.
inline std::shared_ptr<KVStore<float>> make_llama_store(LlamaBackend backend,
                                                        const LlamaConfig& config, int max_tokens,
                                                        int block_size = 16, int sequences = 1,
                                                        KVDtype dtype = KVDtype::fp32,
                                                        int window = 0, int sinks = 0) {
  constexpr const char* kWhere = "kvlab::make_llama_store";
  detail::require_at_least(kWhere, "max_tokens", max_tokens, 1);
  detail::require_at_least(kWhere, "block_size", block_size, 1);
  detail::require_at_least(kWhere, "sequences", sequences, 1);
  const int layers = config.n_layers, kv_heads = config.n_kv_heads, head_dim = config.head_dim();
  detail::check_window_sinks(kWhere, window, sinks);
  if (backend == LlamaBackend::Naive && sinks > 0) {
    detail::fail(kWhere, "sinks", "0 for the naive backend (its store applies a window only)",
                 sinks);
  }
  if (backend == LlamaBackend::Naive && dtype != KVDtype::fp32) {
    detail::fail(kWhere, "dtype", "fp32 for the naive backend (it keeps no K/V to store)",
                 dtype_name(dtype));
  }
  switch (backend) {
    case LlamaBackend::Naive:
      return std::make_shared<RecomputeStore<float>>(layers, kv_heads, head_dim, config.dim,
                                                     window);
    case LlamaBackend::Cached:
      return visit_kv_dtype(dtype, [&](auto tag) -> std::shared_ptr<KVStore<float>> {
        using S = typename decltype(tag)::type;
        // a window and sinks that cover every token: the full cache
        if (sinks > 0 && window + sinks >= max_tokens)
          return std::make_shared<ContiguousStore<float, S>>(layers, kv_heads, head_dim,
                                                             max_tokens);
        // a window's ring: the sinks, the window's keys and a step of up to `window` tokens
        const int slots = window > 0 ? std::min(max_tokens, sinks + 2 * window - 1) : max_tokens;
        return std::make_shared<ContiguousStore<float, S>>(layers, kv_heads, head_dim, slots,
                                                           std::min(window, slots), sinks);
      });
    case LlamaBackend::Paged: {
      const long long blocks = 1LL * sequences * ((max_tokens - 1) / block_size + 1);
      if (blocks > INT_MAX) {
        detail::fail(kWhere, "sequences",
                     "at most " + std::to_string(INT_MAX / ((max_tokens - 1) / block_size + 1)) +
                         " (blocks fit in an int)",
                     sequences);
      }
      return visit_kv_dtype(dtype, [&](auto tag) -> std::shared_ptr<KVStore<float>> {
        using S = typename decltype(tag)::type;
        return std::make_shared<PagedStore<float, S>>(layers, kv_heads, head_dim, block_size,
                                                      static_cast<int>(blocks), KVLayout::NHD,
                                                      window, sinks);
      });
    }
  }
  detail::fail(kWhere, "backend", "naive, cached or paged", static_cast<int>(backend));
}

namespace detail {
// Whether `store` is a `Store<float, S>` for one of the storage types of `KVDtype`.
template <template <typename, typename> class Store>
bool is_store_of_any_storage(const KVStore<float>& store) {
  bool found = false;
  for (KVDtype dtype :
       {KVDtype::fp32, KVDtype::fp16, KVDtype::bf16, KVDtype::int8, KVDtype::int4}) {
    visit_kv_dtype(dtype, [&](auto tag) {
      using S = typename decltype(tag)::type;
      found = found || dynamic_cast<const Store<float, S>*>(&store) != nullptr;
    });
  }
  return found;
}
}  // namespace detail

/// The backend whose store `store` is, told by its type: a `RecomputeStore` is naive, a
/// `ContiguousStore` or `SelectiveStore` cached (a step computes the new tokens only, over K/V
/// kept per sequence) and a `PagedStore` paged, whatever their storage type (and whatever
/// `name()` a class derived from them returns).
/// \throws InvalidArgument for any other `KVStore`.
inline LlamaBackend llama_backend_of(const KVStore<float>& store) {
  if (dynamic_cast<const RecomputeStore<float>*>(&store) != nullptr) return LlamaBackend::Naive;
  if (detail::is_store_of_any_storage<ContiguousStore>(store)) return LlamaBackend::Cached;
  if (detail::is_store_of_any_storage<PagedStore>(store)) return LlamaBackend::Paged;
  if (dynamic_cast<const SelectiveStore<float>*>(&store) != nullptr) return LlamaBackend::Cached;
  detail::fail("kvlab::llama_backend_of", "store",
               "a RecomputeStore, ContiguousStore, PagedStore or SelectiveStore", store.name());
}

}  // namespace kvlab
