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
#include <utility>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/kv_storage.hpp"
#include "kvlab/model/llama_backend.hpp"
#include "kvlab/model/llama_config.hpp"
#include "kvlab/store/contiguous_store.hpp"
#include "kvlab/store/kv_store.hpp"
#include "kvlab/store/paged_store.hpp"
#include "kvlab/store/selective_store.hpp"

namespace kvlab {

/// A cache policy: which store keeps K and V (a contiguous cache per sequence or the blocks of a
/// pool), as which types (`KVDtype`, keys and values each), whether queries see only their last
/// `window` keys, and what a windowed head keeps besides them: attention sinks, heavy hitters,
/// whole layers or heads kept in full (`SelectiveStore`).
///
/// Written as comma-separated `key=value` items after an optional store name, defaults left
/// out: `"cached"` (the full fp32 cache, every token), `"cached,kv=int8"`, `"paged,window=512"`,
/// `"paged,kv=int4,window=256,block=32"`, `"cached,k=fp16,v=int4"`,
/// `"cached,window=256,sinks=4,h2o=256"`, `"cached,window=256,sinks=4,full_heads=3.1+17.0"`.
/// Keys:
///  - `kv` (fp32, fp16, bf16, int8, int4): keys and values; or `k` and `v` each;
///  - `window` (W >= 1; 0 for none);
///  - with a window, on the contiguous store: `sinks` (S < W: the first S tokens stay visible),
///    `h2o` (H: the H tokens that received the most attention stay too), `full_layers`
///    (layers, joined by '+', that keep every token) and `full_heads` (`layer.kv_head` items,
///    joined by '+', that keep every token);
///  - `block` (tokens per block of the paged store).
/// `name()` writes a policy back in that form, and `parse_cache_policy(p.name())` is `p`.
struct CachePolicy {
  LlamaBackend backend = LlamaBackend::Cached;  ///< `Cached` or `Paged` (naive keeps no K/V)
  KVDtype key_dtype = KVDtype::fp32;            ///< how keys are stored
  KVDtype value_dtype = KVDtype::fp32;          ///< how values are stored
  int window = 0;                               ///< each query sees its last W keys; 0: all
  int sinks = 0;                                ///< first tokens every query sees too (S < W)
  int heavy = 0;                                ///< heavy hitters kept besides the window (H2O)
  std::vector<int> full_layers;                 ///< layers that keep every token, ascending
  std::vector<std::pair<int, int>> full_heads;  ///< (layer, K/V head)s that keep every token
  int block_size = 16;                          ///< tokens per block of the paged store

  /// The policy as text: the store's name, then the items that differ from the defaults.
  std::string name() const {
    std::string text = to_string(backend);
    if (key_dtype == value_dtype && key_dtype != KVDtype::fp32)
      text += ",kv=" + dtype_name(key_dtype);
    if (key_dtype != value_dtype)
      text += ",k=" + dtype_name(key_dtype) + ",v=" + dtype_name(value_dtype);
    if (window != 0) text += ",window=" + std::to_string(window);
    if (sinks != 0) text += ",sinks=" + std::to_string(sinks);
    if (heavy != 0) text += ",h2o=" + std::to_string(heavy);
    for (std::size_t i = 0; i < full_layers.size(); ++i)
      text += (i == 0 ? ",full_layers=" : "+") + std::to_string(full_layers[i]);
    for (std::size_t i = 0; i < full_heads.size(); ++i) {
      text += (i == 0 ? ",full_heads=" : "+") + std::to_string(full_heads[i].first) + "." +
              std::to_string(full_heads[i].second);
    }
    if (backend == LlamaBackend::Paged && block_size != 16)
      text += ",block=" + std::to_string(block_size);
    return text;
  }

  /// True when every head keeps one policy that a `ContiguousStore` or `PagedStore` keeps: K
  /// and V of one type, no heavy hitters or heads kept in full (a window with sinks is one).
  bool uniform() const {
    return key_dtype == value_dtype && heavy == 0 && full_layers.empty() && full_heads.empty();
  }

  /// What K/V head `kv_head` of `layer` keeps under this policy (`SelectiveStore`): every
  /// token where the layer or head is kept in full or there is no window, else the window, the
  /// sinks and the heavy hitters; keys and values as the policy's types.
  HeadPolicy head(int layer, int kv_head) const {
    const bool full =
        window == 0 ||
        std::find(full_layers.begin(), full_layers.end(), layer) != full_layers.end() ||
        std::find(full_heads.begin(), full_heads.end(), std::make_pair(layer, kv_head)) !=
            full_heads.end();
    return full ? HeadPolicy{key_dtype, value_dtype}
                : HeadPolicy{key_dtype, value_dtype, window, sinks, heavy};
  }
};

/// Two policies are equal when every field is.
inline bool operator==(const CachePolicy& a, const CachePolicy& b) {
  return a.backend == b.backend && a.key_dtype == b.key_dtype && a.value_dtype == b.value_dtype &&
         a.window == b.window && a.sinks == b.sinks && a.heavy == b.heavy &&
         a.full_layers == b.full_layers && a.full_heads == b.full_heads &&
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

namespace detail {
// The type `text` of item `key` of policy text `spec`.
inline KVDtype policy_dtype(const std::string& spec, const std::string& key,
                            const std::string& text) {
  const std::string names[] = {"fp32", "fp16", "bf16", "int8", "int4"};
  if (std::find(std::begin(names), std::end(names), text) == std::end(names)) {
    fail("kvlab::parse_cache_policy", "spec",
         "'" + key + "=' one of fp32, fp16, bf16, int8, int4 (in '" + spec + "')",
         "'" + text + "'");
  }
  return parse_kv_dtype(text);
}
// The '+'-joined list `text` of item `key` of policy text `spec`, each part read by `part`.
template <typename Part>
void policy_list(const std::string& text, const Part& part) {
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find('+', begin), text.size());
    part(text.substr(begin, end - begin));
    begin = end + 1;
  }
}
}  // namespace detail

/// The policy written as `spec` (see `CachePolicy`): an optional first item "cached" or
/// "paged" (default cached), then `kv=` (or `k=` and `v=`), `window=`, `sinks=`, `h2o=`,
/// `full_layers=`, `full_heads=` and `block=` items, each at most once.
/// \throws InvalidArgument naming `spec`, the item and what was expected: an unknown store or key,
///         a repeated key, `kv=` with `k=` or `v=`, a type other than fp32, fp16, bf16, int8,
///         int4, a negative window, sinks or h2o, sinks >= window, sinks, h2o or full layers
///         and heads without a window, a layer or head repeated or not a number, K and V of two
///         types, sinks, h2o or full layers and heads on the paged store, a block below 1, or
///         `block=` for the contiguous store. (Whether a layer or head exists is checked by
///         `make_policy_store`, which knows the model.)
inline CachePolicy parse_cache_policy(const std::string& spec) {
  constexpr const char* kWhere = "kvlab::parse_cache_policy";
  CachePolicy policy;
  std::string seen;  // the keys given, each between commas
  const auto given = [&seen](const char* key) {
    return seen.find("," + std::string(key) + ",") != std::string::npos;
  };
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
                             : "key=value items: kv, k, v, window, sinks, h2o, full_layers, "
                               "full_heads, block (in '" +
                                   spec + "')",
                   "'" + text + "'");
    }
    const std::string key = text.substr(0, eq), value = text.substr(eq + 1);
    if (given(key.c_str())) {
      detail::fail(kWhere, "spec", "each key at most once (in '" + spec + "')",
                   "'" + key + "' twice");
    }
    seen += "," + key + ",";
    if (key == "kv") {
      policy.key_dtype = policy.value_dtype = detail::policy_dtype(spec, key, value);
    } else if (key == "k") {
      policy.key_dtype = detail::policy_dtype(spec, key, value);
    } else if (key == "v") {
      policy.value_dtype = detail::policy_dtype(spec, key, value);
    } else if (key == "window") {
      policy.window = detail::policy_integer(spec, key, value, 0);
    } else if (key == "sinks") {
      policy.sinks = detail::policy_integer(spec, key, value, 0);
    } else if (key == "h2o") {
      policy.heavy = detail::policy_integer(spec, key, value, 0);
    } else if (key == "full_layers") {
      detail::policy_list(value, [&](const std::string& part) {
        const int layer = detail::policy_integer(spec, key, part, 0);
        if (std::find(policy.full_layers.begin(), policy.full_layers.end(), layer) !=
            policy.full_layers.end()) {
          detail::fail(kWhere, "spec", "each layer once in 'full_layers=' (in '" + spec + "')",
                       "layer " + part + " twice");
        }
        policy.full_layers.push_back(layer);
      });
      std::sort(policy.full_layers.begin(), policy.full_layers.end());
    } else if (key == "full_heads") {
      detail::policy_list(value, [&](const std::string& part) {
        const std::size_t dot = part.find('.');
        if (dot == std::string::npos) {
          detail::fail(kWhere, "spec",
                       "'full_heads=' items layer.kv_head joined by '+' (in '" + spec + "')",
                       "'" + part + "'");
        }
        const std::pair<int, int> head{detail::policy_integer(spec, key, part.substr(0, dot), 0),
                                       detail::policy_integer(spec, key, part.substr(dot + 1), 0)};
        if (std::find(policy.full_heads.begin(), policy.full_heads.end(), head) !=
            policy.full_heads.end()) {
          detail::fail(kWhere, "spec", "each head once in 'full_heads=' (in '" + spec + "')",
                       "head " + part + " twice");
        }
        policy.full_heads.push_back(head);
      });
      std::sort(policy.full_heads.begin(), policy.full_heads.end());
    } else if (key == "block") {
      policy.block_size = detail::policy_integer(spec, key, value, 1);
    } else {
      detail::fail(kWhere, "spec",
                   "a key of kv, k, v, window, sinks, h2o, full_layers, full_heads, block (in '" +
                       spec + "')",
                   "'" + key + "'");
    }
  }
  if (given("kv") && (given("k") || given("v"))) {
    detail::fail(kWhere, "spec", "'kv=' or 'k=' and 'v=', not both (in '" + spec + "')",
                 given("k") ? "'kv=' and 'k='" : "'kv=' and 'v='");
  }
  for (const char* key : {"sinks", "h2o", "full_layers", "full_heads"}) {
    if (given(key) && policy.window == 0) {
      detail::fail(kWhere, "spec",
                   std::string("a window with '") + key +
                       "=' (without one every token is kept; in '" + spec + "')",
                   "no window");
    }
  }
  if (policy.window > 0 && policy.sinks >= policy.window) {
    detail::fail(
        kWhere, "spec",
        "'sinks=' below the window (" + std::to_string(policy.window) + "; in '" + spec + "')",
        policy.sinks);
  }
  if (policy.backend != LlamaBackend::Paged && given("block")) {
    detail::fail(kWhere, "spec", "'block=' with the paged store only (in '" + spec + "')",
                 "a contiguous store");
  }
  if (policy.backend == LlamaBackend::Paged && !policy.uniform()) {
    detail::fail(kWhere, "spec",
                 "one type for K and V and no h2o, full_layers or full_heads with the paged "
                 "store (its pool stores one type, and a sequence's block table serves every layer "
                 "and head: a block is freed for all of them at once; in '" +
                     spec + "')",
                 "'" + policy.name() + "'");
  }
  return policy;
}

/// The store that keeps `policy` for a model of shape `config`: room for `sequences` sequences
/// of up to `max_tokens` tokens, fed in steps of at most `max_step` tokens each.
///  - contiguous without a window: a `ContiguousStore` reserving `max_tokens` per sequence;
///  - contiguous with a window W and S sinks: a ring of `min(max_tokens, S + W − 1 + max_step)`
///    slots per sequence, the first S for the sinks (a step's first query sees the W − 1 keys
///    before it; `max_step` 1 — decoding — keeps exactly S + W), whose steps take
///    `KVStore::max_step_tokens()` tokens at most (fewer than `max_step` where the ring is cut to
///    `max_tokens`);
///  - paged: a `PagedStore` of `sequences · ceil(max_tokens / block)` blocks, which with a
///    window gives back the blocks wholly before each sequence's window after every step, but
///    the blocks of its sinks;
///  - a policy that is not `uniform()` (K and V of two types, heavy hitters, layers or heads kept
///    in full): a `SelectiveStore` with `policy.head(l, h)` for every head.
/// Keys and values are kept as the policy's types. A window of W keys with S sinks, W + S >=
/// `max_tokens`, leaves no key out of any query of such sequences: every head keeps every token
/// then (the store is the full cache, `window()` 0, unless K and V differ in type).
/// \throws InvalidArgument if `max_tokens`, `max_step` or `sequences` is below 1, the policy's
///         store is naive, a full layer or head is not one of the model's, or as
///         `make_llama_store` (a head_dim int8 and int4 cannot hold, too many blocks).
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
  const int layers = config.n_layers, kv_heads = config.n_kv_heads, head_dim = config.head_dim();
  for (int layer : policy.full_layers) {
    if (layer >= layers) {
      detail::fail(kWhere, "policy.full_layers",
                   "layers in [0, " + std::to_string(layers) + ") (the model's)", layer);
    }
  }
  for (const auto& head : policy.full_heads) {
    if (head.first >= layers || head.second >= kv_heads) {
      detail::fail(kWhere, "policy.full_heads",
                   "heads layer.kv_head with layer in [0, " + std::to_string(layers) +
                       ") and kv_head in [0, " + std::to_string(kv_heads) + ") (the model's)",
                   std::to_string(head.first) + "." + std::to_string(head.second));
    }
  }
  // A window of max_tokens keys or more never leaves a key out: every token is kept.
  CachePolicy kept = policy;
  if (policy.window > 0 && policy.window + policy.sinks >= max_tokens) {
    kept.window = kept.sinks = kept.heavy = 0;
    kept.full_layers.clear();
    kept.full_heads.clear();
  }
  if (!kept.uniform()) {
    if (policy.backend == LlamaBackend::Paged) {
      detail::fail(kWhere, "policy", "a uniform policy with the paged store (`parse_cache_policy`)",
                   policy.name());
    }
    std::vector<HeadPolicy> heads;  // [layers · kv_heads]
    for (int l = 0; l < layers; ++l)
      for (int h = 0; h < kv_heads; ++h) heads.push_back(kept.head(l, h));
    return std::make_shared<SelectiveStore<float>>(layers, kv_heads, head_dim, std::move(heads));
  }
  const int window = kept.window, sinks = kept.sinks;
  if (policy.backend == LlamaBackend::Paged || window == 0) {
    return make_llama_store(policy.backend, config, max_tokens, policy.block_size, sequences,
                            kept.key_dtype, window, sinks);
  }
  const int slots = sinks + window - 1 + std::min(max_step, max_tokens - sinks - window + 1);
  return visit_kv_dtype(kept.key_dtype, [&](auto tag) -> std::shared_ptr<KVStore<float>> {
    using S = typename decltype(tag)::type;
    return std::make_shared<ContiguousStore<float, S>>(layers, kv_heads, head_dim, slots, window,
                                                       sinks);
  });
}

}  // namespace kvlab
