/// \file
/// \brief The `--policy` option of the programs (kvlab-chat, kvlab-generate, kvlab-serve,
/// kvlab-eval): a cache policy as `kvlab::parse_cache_policy` reads it, checked when the command
/// line is read. Not part of the library.
#pragma once

#include <string>
#include <vector>

#include <kvlab/model/cache_policy.hpp>

#include "support/cli.hpp"

namespace kvlab_support {

/// The text every program's --policy help ends with: what a policy is written as.
inline const char* policy_syntax() {
  return "a store name and key=value items (kvlab::CachePolicy): cached or paged; "
         "kv=fp32|fp16|bf16|int8|int4, or k= and v= each; window=W (each query sees its last W "
         "keys); with a window on the cached store: sinks=S (the first S tokens too), h2o=H (and "
         "the H that received the most attention), full_layers=L+L and full_heads=L.H+L.H (kept "
         "whole); block=N (paged). Examples: cached,kv=int8  cached,k=fp16,v=int4  "
         "paged,window=512  cached,window=256,sinks=4,h2o=256";
}

namespace detail {
// The check of a --policy value: kvlab::parse_cache_policy's message, or "".
inline CLI::Validator policy_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          (void)kvlab::parse_cache_policy(text);
        } catch (const kvlab::InvalidArgument& e) {
          return e.what();
        }
        return "";
      },
      "");
}
}  // namespace detail

/// Declares the option `name`, which sets `spec` to a cache policy's text.
inline CLI::Option* add_policy(CLI::App& app, const std::string& name, std::string& spec,
                               const std::string& help) {
  return app.add_option(name, spec, help)->check(detail::policy_check())->type_name("POLICY");
}

/// Declares the repeatable option `name`, which adds a cache policy's text to `specs` each time.
inline CLI::Option* add_policies(CLI::App& app, const std::string& name,
                                 std::vector<std::string>& specs, const std::string& help) {
  return app.add_option(name, specs, help)
      ->check(detail::policy_check())
      ->type_name("POLICY")
      ->capture_default_str();
}

}  // namespace kvlab_support
