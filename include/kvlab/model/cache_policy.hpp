/// \file
/// \brief `CachePolicy`: what a model keeps of past tokens and how — the store, the type K and V
/// are kept as, a sliding window — written as one short text ("paged,kv=int8,window=512") that
/// every program reads the same way, and the `KVStore` that keeps it.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <memory>
#include <string>

#include "kvlab/config.hpp"
#include "kvlab/kv_storage.hpp"
#include "kvlab/model/llama_backend.hpp"
#include "kvlab/model/llama_config.hpp"
#include "kvlab/store/contiguous_store.hpp"
#include "kvlab/store/kv_store.hpp"
#include "kvlab/store/paged_store.hpp"

namespace kvlab {

/// A cache policy: which store keeps K and V (a contiguous cache per sequence or the blocks of a
/// pool), as which type (`KVDtype`), and whether queries see only their last `window` keys.
///
/// Written as comma-separated `key=value` items after an optional store name, defaults left
/// out: `"cached"` (the full fp32 cache, every token), `"cached,kv=int8"`, `"paged,window=512"`,
/// `"paged,kv=int4,window=256,block=32"`. Keys: `kv` (fp32, fp16, bf16, int8, int4), `window`
/// (W >= 1; 0 for none), `block` (tokens per block of the paged store). `name()` writes a policy
/// back in that form, and `parse_cache_policy(p.name())` is `p`.
struct CachePolicy {
  LlamaBackend backend = LlamaBackend::Cached;  ///< `Cached` or `Paged` (naive keeps no K/V)
  KVDtype dtype = KVDtype::fp32;                ///< how K and V are stored
  int window = 0;                               ///< each query sees its last W keys; 0: all
  int block_size = 16;                          ///< tokens per block of the paged store

  /// The policy as text: the store's name, then the items that differ from the defaults.
  std::string name() const {
    std::string text = to_string(backend);
    if (dtype != KVDtype::fp32) text += ",kv=" + dtype_name(dtype);
    if (window != 0) text += ",window=" + std::to_string(window);
    if (backend == LlamaBackend::Paged && block_size != 16)
      text += ",block=" + std::to_string(block_size);
    return text;
  }
};

/// Two policies are equal when every field is.
inline bool operator==(const CachePolicy& a, const CachePolicy& b) {
  return a.backend == b.backend && a.dtype == b.dtype && a.window == b.window &&
         a.block_size == b.block_size;
}

namespace detail {
// The integer `text` of item `key` of policy text `spec`, in [minimum, INT_MAX].
inline int policy_integer(const std::string& spec, const std::string& key, const std::string& text,
                          int minimum) {
  constexpr const char* kWhere = "kvlab::parse_cache_policy";
  const bool digits =
      !text.empty() && text.size() <= 10 &&
      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || std::stoll(text) > INT_MAX || std::stoll(text) < minimum) {
    fail(kWhere, "spec",
         "'" + key + "=' an integer in [" + std::to_string(minimum) + ", " +
             std::to_string(INT_MAX) + "] (in '" + spec + "')",
         "'" + text + "'");
  }
  return static_cast<int>(std::stoll(text));
}
}  // namespace detail

/// The policy written as `spec` (see `CachePolicy`): an optional first item "cached" or
/// "paged" (default cached), then `kv=`, `window=` and `block=` items, each at most once.
/// \throws InvalidArgument naming `spec`, the item and what was expected: an unknown store or key,
///         a repeated key, a type other than fp32, fp16, bf16, int8, int4, a negative window, a
///         block below 1, or `block=` for the contiguous store.
inline CachePolicy parse_cache_policy(const std::string& spec) {
  constexpr const char* kWhere = "kvlab::parse_cache_policy";
  CachePolicy policy;
  std::string seen;  // the keys given, each between commas
  std::size_t begin = 0;
  for (int item = 0; begin <= spec.size(); ++item) {
    const std::size_t end = std::min(spec.find(',', begin), spec.size());
    const std::string text = spec.substr(begin, end - begin);
    begin = end + 1;
    const std::size_t eq = text.find('=');
    if (eq == std::string::npos) {
      if (item == 0 && (text == "cached" || text == "paged")) {
        policy.backend = parse_llama_backend(text);
        continue;
      }
      detail::fail(kWhere, "spec",
                   item == 0 ? "cached or paged, or a key=value item (in '" + spec + "')"
                             : "key=value items: kv, window, block (in '" + spec + "')",
                   "'" + text + "'");
    }
    const std::string key = text.substr(0, eq), value = text.substr(eq + 1);
    if (seen.find("," + key + ",") != std::string::npos) {
      detail::fail(kWhere, "spec", "each key at most once (in '" + spec + "')",
                   "'" + key + "' twice");
    }
    seen += "," + key + ",";
    if (key == "kv") {
      const std::string names[] = {"fp32", "fp16", "bf16", "int8", "int4"};
      if (std::find(std::begin(names), std::end(names), value) == std::end(names)) {
        detail::fail(kWhere, "spec",
                     "'kv=' one of fp32, fp16, bf16, int8, int4 (in '" + spec + "')",
                     "'" + value + "'");
      }
      policy.dtype = parse_kv_dtype(value);
    } else if (key == "window") {
      policy.window = detail::policy_integer(spec, key, value, 0);
    } else if (key == "block") {
      policy.block_size = detail::policy_integer(spec, key, value, 1);
    } else {
      detail::fail(kWhere, "spec", "a key of kv, window, block (in '" + spec + "')",
                   "'" + key + "'");
    }
  }
  if (policy.backend != LlamaBackend::Paged && seen.find(",block,") != std::string::npos) {
    detail::fail(kWhere, "spec", "'block=' with the paged store only (in '" + spec + "')",
                 "a contiguous store");
  }
  return policy;
}

/// The store that keeps `policy` for a model of shape `config`: room for `sequences` sequences
/// of up to `max_tokens` tokens, fed in steps of at most `max_step` tokens each.
///  - contiguous without a window: a `ContiguousStore` reserving `max_tokens` per sequence;
///  - contiguous with a window W: a ring of `min(max_tokens, W − 1 + max_step)` slots per
///    sequence (a step's first query sees the W − 1 keys before it; `max_step` 1 — decoding —
///    keeps exactly W), whose steps take `KVStore::max_step_tokens()` tokens at most (fewer
///    than `max_step` where the ring is cut to `max_tokens`);
///  - paged: a `PagedStore` of `sequences · ceil(max_tokens / block)` blocks, which with a
///    window gives back the blocks wholly before each sequence's window after every step.
/// K and V are kept as `policy.dtype`. A window of `max_tokens` keys or more leaves no key out
/// of any query of such sequences: the store is the full cache then (`window()` 0).
/// \throws InvalidArgument if `max_tokens`, `max_step` or `sequences` is below 1, the policy's
///         store is naive, or as `make_llama_store` (a head_dim int8 and int4 cannot hold, too
///         many blocks).
inline std::shared_ptr<KVStore<float>> make_policy_store(const CachePolicy& policy,
                                                         const LlamaConfig& config, int max_tokens,
                                                         int max_step, int sequences = 1) {
  constexpr const char* kWhere = "kvlab::make_policy_store";
  detail::require_at_least(kWhere, "max_tokens", max_tokens, 1);
  detail::require_at_least(kWhere, "max_step", max_step, 1);
  detail::require_at_least(kWhere, "sequences", sequences, 1);
  detail::require_at_least(kWhere, "policy.window", policy.window, 0);
  if (policy.backend == LlamaBackend::Naive) {
    detail::fail(kWhere, "policy.backend", "cached or paged (a policy keeps K and V)", "naive");
  }
  // A window of max_tokens keys or more never leaves a key out: the full cache.
  const int window = policy.window < max_tokens ? policy.window : 0;
  if (policy.backend == LlamaBackend::Paged || window == 0) {
    return make_llama_store(policy.backend, config, max_tokens, policy.block_size, sequences,
                            policy.dtype, window);
  }
  const int layers = config.n_layers, kv_heads = config.n_kv_heads, head_dim = config.head_dim();
  const int slots = window - 1 + std::min(max_step, max_tokens - window + 1);
  return visit_kv_dtype(policy.dtype, [&](auto tag) -> std::shared_ptr<KVStore<float>> {
    using S = typename decltype(tag)::type;
    return std::make_shared<ContiguousStore<float, S>>(layers, kv_heads, head_dim, slots, window);
  });
}

}  // namespace kvlab
