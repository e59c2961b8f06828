// The bad-input cases of include/kvlab/analysis/: each calls a public function declared there with
// one bad argument. The rules of the table are in tests/bad_input/ (entry_points.txt lists the
// entry points and is checked against the headers by the test bad_input_table; bad_input.hpp runs a
// case): each input class that applies — wrong shape, zero or negative size, empty, an index or id
// out of range, a call the object's state does not allow, overflow-sized arguments, values that
// cannot be stored — is tried, and each case asserts kvlab's exception type, a message naming the
// argument with the expected and the actual value, and the object's observable state unchanged
// (compared before and after).
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>

#include "bad_input/bad_input.hpp"
#include "bad_input/states.hpp"
#include "kvlab/kvlab.hpp"

using kvlab::InvalidArgument;
using kvlab_test::names;
using kvlab_test::refuses;
using kvlab_test::bad_input_states::no_state;
namespace input = kvlab_test::input;

TEST_CASE("The analysis functions refuse bad sizes, lengths and overflow") {
  refuses<InvalidArgument>(
      "kvlab::blocks_needed(std::int64_t tokens, int block_size)", input::kSize, no_state,
      [] { (void)kvlab::blocks_needed(-1, 16); }, names("tokens", ">= 0", "-1"));
  refuses<InvalidArgument>(
      "kvlab::blocks_needed(std::int64_t tokens, int block_size)", input::kSize, no_state,
      [] { (void)kvlab::blocks_needed(5, 0); }, names("block_size", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::max_contiguous_sequences(std::uint64_t budget_bytes, std::int64_t max_len, "
      "std::uint64_t bytes_per_token)",
      input::kSize, no_state, [] { (void)kvlab::max_contiguous_sequences(1024, 0, 4); },
      names("max_len", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::blocks_in_budget(std::uint64_t budget_bytes, int block_size, std::uint64_t "
      "bytes_per_token)",
      input::kSize, no_state, [] { (void)kvlab::blocks_in_budget(1024, 16, 0); },
      names("bytes_per_token", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::paged_footprint(const std::vector< std::int64_t > &lengths, int block_size, "
      "std::uint64_t bytes_per_token)",
      input::kSize, no_state,
      [] {
        (void)kvlab::paged_footprint({3, -2}, 16, 4);
      },
      names("lengths[1]", ">= 0", "-2"));
  refuses<InvalidArgument>(
      "kvlab::contiguous_footprint(const std::vector< std::int64_t > &lengths, std::int64_t "
      "max_len, std::uint64_t bytes_per_token)",
      input::kRange, no_state,
      [] {
        (void)kvlab::contiguous_footprint({3, 9}, 8, 4);
      },
      names("lengths[1]", "in [0, max_len (8)]", "9"));
  refuses<InvalidArgument>(
      "kvlab::max_paged_sequences(const std::vector< std::int64_t > &lengths, int block_size, "
      "std::uint64_t bytes_per_token, std::uint64_t budget_bytes)",
      input::kSize, no_state, [] { (void)kvlab::max_paged_sequences({3}, 0, 4, 1024); },
      names("block_size", ">= 1", "0"));
  const kvlab::ModelConfig model = kvlab::to_model_config(kvlab::LlamaConfig::tiny());
  refuses<InvalidArgument>(
      "kvlab::kv_cache_bytes(const ModelConfig &config, std::int64_t tokens, std::int64_t batch, "
      "KVDtype dtype, std::int64_t window=0)",
      input::kSize, no_state,
      [&] { (void)kvlab::kv_cache_bytes(model, -1, 1, kvlab::KVDtype::fp32); },
      names("tokens", ">= 0", "-1"));
  refuses<InvalidArgument>(
      "kvlab::kv_cache_bytes(const ModelConfig &config, std::int64_t tokens, std::int64_t batch, "
      "KVDtype dtype, std::int64_t window=0)",
      input::kOverflow, no_state,
      [&] { (void)kvlab::kv_cache_bytes(model, INT64_MAX, INT64_MAX, kvlab::KVDtype::fp32); },
      names("tokens", "at most 48038396025285290 (so that the size fits in std::uint64_t)",
            "9223372036854775807"));
}

TEST_CASE("bytes_per_token, stored_bytes_per_token and paged_cache_footprint refuse bad input") {
  const kvlab::ModelConfig model_config = kvlab::to_model_config(kvlab::LlamaConfig::tiny());
  refuses<InvalidArgument>(
      "kvlab::bytes_per_token(const ModelConfig &config, KVDtype dtype)", input::kValue, no_state,
      [&] { (void)kvlab::bytes_per_token(model_config, static_cast<kvlab::KVDtype>(9)); },
      names("dtype", "one of fp32, fp16, bf16, int8, int4", "9"));
  refuses<InvalidArgument>(
      "kvlab::stored_bytes_per_token(const ModelConfig &config, KVDtype dtype)", input::kShape,
      no_state, [&] { (void)kvlab::stored_bytes_per_token(model_config, kvlab::KVDtype::int8); },
      names("config.head_dim", "a multiple of 32 (the values of one int8 block)", "8"));
  auto pool = std::make_shared<kvlab::PagedKVCache<float>>(1, 1, 2, 4, 8);
  refuses<InvalidArgument>(
      "kvlab::paged_cache_footprint(const PagedKVCacheBase &cache, std::uint64_t bytes_per_token)",
      input::kSize, no_state, [&] { (void)kvlab::paged_cache_footprint(*pool, 0); },
      names("bytes_per_token", ">= 1", "0"));
}
