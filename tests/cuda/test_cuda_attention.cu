// The CUDA attention kernels against their CPU twins, every element compared:
// |gpu - ref| <= atol + rtol * |ref| (cuda_compare.hpp: fp32 rtol 1e-5 / atol 1e-6; fp16 and bf16
// rtol 1e-2 / atol 1e-4), the CPU reference in float on the same values the GPU stores.
//  - naive_attention vs cpu::naive_attention;
//  - decode_attention vs cpu::decode_attention, unused cache rows NaN;
//  - paged_decode_attention over vLLM's grid (head sizes 64-256, block sizes 16/32/1/3, MHA
//    (40,40), GQA (64,8) and (32,8), 7 sequences up to 4096 with the last at the maximum, random
//    non-monotonic block tables, NaN in every unused slot), both pool layouts, the number of
//    cases of each layout asserted;
//  - logits of ±1e4 through every kernel (naive, decode, paged decode and prefill, both
//    layouts, single pass and split-K), in fp32, fp16 and bf16;
//  - split-K equals the single pass; paged_prefill_attention vs the CPU; counters; argument
//    checks; CUDA errors as CudaError;
//  - a sliding window through every kernel (naive, decode over a ring, paged decode and prefill
//    with the blocks before the window released and NaN), against the CPU twins, and the same
//    with attention sinks (the ring keeping them, their blocks kept);
//  - int8 and int4 caches (q8_0, q4_0 blocks made by the CPU caches) through the contiguous and
//    paged kernels, against the CPU kernels on the same blocks, at fp32 tolerance.
// Without a GPU every test reports itself skipped (cuda_skip_listener.cpp). On the CPU emulator
// (emulator/, KVLAB_CUDA_EMULATION) the same tests run with shorter contexts, vLLM's
// grid and decode_attention with fewer heads in the same groups, and fp16 alternating the grid's
// pool layouts: see `kContext` below.
#include <cuda_runtime.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "../ragged_batch.hpp"
#include "../test_support.hpp"
#include "cuda_compare.hpp"
#include "kvlab/cache/contiguous_kv_cache.hpp"
#include "kvlab/cache/paged_kv_cache.hpp"
#include "kvlab/cpu/decode_attention.hpp"
#include "kvlab/cpu/naive_attention.hpp"
#include "kvlab/cpu/paged_attention.hpp"
#include "kvlab/cuda/contiguous_kv_cache.cuh"
#include "kvlab/cuda/host_api.cuh"
#include "kvlab/cuda/paged_kv_cache.cuh"

using kvlab::AttentionShape;
using kvlab::KVLayout;
using kvlab::RowMatrix;
using kvlab_test::check_close;
using kvlab_test::random_rounded;
namespace kc = kvlab::cuda;

namespace {

// A contiguous cache on the device, [num_kv_heads, capacity, head_dim] of T for K and V, whose
// rows past `length` hold NaN, filled from token-major host rows k, v ([length, kv_width]).
template <typename T>
struct DeviceContiguous {
  kc::DeviceBuffer<T> k, v;
  kvlab::ContiguousKVView<T> view;

  DeviceContiguous(const AttentionShape& shape, const RowMatrix<float>& keys,
                   const RowMatrix<float>& values, int capacity) {
    const int length = static_cast<int>(keys.rows());
    const std::size_t size =
        static_cast<std::size_t>(shape.num_kv_heads()) * capacity * shape.head_dim();
    std::vector<T> hk(size, kc::from_float<T>(NAN)), hv(size, kc::from_float<T>(NAN));
    view = kvlab::ContiguousKVView<T>{nullptr,          nullptr,  shape.num_kv_heads(),
                                      shape.head_dim(), capacity, length};
    for (int h = 0; h < shape.num_kv_heads(); ++h)
      for (int pos = 0; pos < length; ++pos)
        for (int c = 0; c < shape.head_dim(); ++c) {
          const auto at = static_cast<std::size_t>(view.offset(h, pos) + c);
          hk[at] = kc::from_float<T>(keys(pos, h * shape.head_dim() + c));
          hv[at] = kc::from_float<T>(values(pos, h * shape.head_dim() + c));
        }
    k = kc::DeviceBuffer<T>(hk);
    v = kc::DeviceBuffer<T>(hv);
    view.k = k.data();
    view.v = v.data();
  }
};

// A contiguous cache of `length` rows read by `q_len` queries: the device API against
// cpu::decode_attention on the same (rounded) values.
template <typename T>
void check_decode(const AttentionShape& shape, int length, int q_len, int partitions,
                  kvlab::Rng& rng) {
  CAPTURE(shape.num_heads(), shape.num_kv_heads(), shape.head_dim(), length, q_len, partitions);
  const RowMatrix<float> keys = random_rounded<T>(length, shape.kv_width(), rng);
  const RowMatrix<float> values = random_rounded<T>(length, shape.kv_width(), rng);
  const RowMatrix<float> q = random_rounded<T>(q_len, shape.q_width(), rng);
  kvlab::ContiguousKVCache<float> cache(1, shape.num_kv_heads(), shape.head_dim(), length + 9);
  cache.append(0, keys, values);
  kvlab::CostCounters want_counts;
  const RowMatrix<float> want = kvlab::cpu::decode_attention(shape, q, cache.view(0), &want_counts);

  // 9 NaN rows per head past the end
  const DeviceContiguous<T> device(shape, keys, values, length + 9);
  const kc::DeviceBuffer<T> d_q = kc::to_device<T>(q);
  kc::DeviceBuffer<T> d_out(static_cast<std::size_t>(q_len) * shape.q_width());
  kc::LaunchOptions options;
  options.partitions = partitions;
  kvlab::CostCounters got_counts;
  kc::decode_attention(shape, d_q.matrix(q_len, shape.q_width()), device.view,
                       d_out.matrix(q_len, shape.q_width()), &got_counts, options);
  check_close<T>(kc::to_host(d_out, q_len, shape.q_width()), want);
  CHECK(got_counts.qk_dots == want_counts.qk_dots);
  CHECK(got_counts.macs == want_counts.macs);
  // The CPU cache holds floats; the GPU reads sizeof(T) bytes per value.
  if (q_len == 1 && shape.group_size() <= kc::kMaxGroupTile)
    CHECK(got_counts.kv_bytes_read == want_counts.kv_bytes_read / sizeof(float) * sizeof(T));
}

struct Heads {
  int num_heads, num_kv_heads;
};

// Context lengths. The CPU emulator runs every thread of every block in turn, thousands of times
// slower than a GPU, so under KVLAB_CUDA_EMULATION the long contexts are shorter, yet long enough
// for every branch: more than one key tile (300 keys: two tiles of kKeyTile = 256), split-K
// partitions > 1 of whole units (the unit is 256 keys for blocks of 1 to 16),
// partitions past a short row's last, and (vLLM's grid) every head size, block size, head
// layout, pool layout and storage type.
struct ContextLengths {
  int decode_long;           // decode_attention: the longest cache
  int grid_max;              // vLLM's grid: the longest sequence of the batch
  std::vector<int> split_k;  // split-K: the ragged batch
  int split_k_contiguous;    // split-K: the one long contiguous context
  int prefill_long;          // paged_prefill_attention: the long sequence...
  int prefill_queries;       // ...and its new tokens
};
#if defined(KVLAB_CUDA_EMULATION)
const ContextLengths kContext{300, 300, {4096, 1, 1100, 257, 256, 600}, 4096, 300, 150};
constexpr bool kEveryLayoutInFp16 = false;  // vLLM's grid: fp16 alternates the pool layouts too
// vLLM's grid: its head layouts' groups (1, 8 and 4 query heads per K/V head) with a quarter of
// the heads. The kernels' paths depend on the group, not on the count of heads (one more block of
// threads per head), and the emulator spends its time in proportion to the heads.
const Heads kGridHeads[3] = {{10, 10}, {16, 2}, {8, 2}};
// decode_attention: groups of 1, 3, 8 and 12 with the fewest heads that make them
const Heads kDecodeHeads[4] = {{2, 2}, {3, 1}, {8, 1}, {12, 1}};
// Under AddressSanitizer too (scripts/test.sh's second build, a check of memory: the Release
// build runs every case), where the emulated kernels run about twice as slowly, the largest
// tests take every other point of their grids, alternating so that every value of each
// parameter still runs: decode_attention every other head size per group (each head size meets
// two of the four groups, each group four of the eight head sizes); split-K a quarter of the
// heads in the same group of 4 (8/2 for 32/8); vLLM's grid one of its three head layouts per
// (head size, block size), in turn; paged_prefill_attention one of its two head layouts per
// (pool layout, block size), in turn; the sliding window's paged cases one pool layout per
// (window, block size), in turn.
constexpr bool kFewerUnderSanitizer = kvlab_test::kSanitized;
#else
constexpr bool kFewerUnderSanitizer = false;
const ContextLengths kContext{3000, 4096, {32768, 1, 5000, 257, 256, 4096}, 32768, 600, 300};
constexpr bool kEveryLayoutInFp16 = true;  // vLLM's grid: fp16 runs both pool layouts everywhere
const Heads kGridHeads[3] = {{40, 40}, {64, 8}, {32, 8}};         // vLLM's grid: its head layouts
const Heads kDecodeHeads[4] = {{4, 4}, {6, 2}, {8, 1}, {24, 2}};  // groups of 1, 3, 8 and 12
#endif

}  // namespace

TEMPLATE_TEST_CASE("cuda::naive_attention equals cpu::naive_attention per element", "", float,
                   __half, __nv_bfloat16) {
  std::uint64_t seed = 1;
  for (const AttentionShape& shape : {AttentionShape(4, 4, 64), AttentionShape(8, 2, 80),
                                      AttentionShape(4, 2, 20), AttentionShape(6, 1, 128)})
    for (const std::pair<int, int>& lens :
         {std::pair<int, int>{1, 1}, {1, 300}, {17, 17}, {33, 100}, {200, 200}}) {
      CAPTURE(shape.num_heads(), shape.num_kv_heads(), shape.head_dim(), lens.first, lens.second);
      kvlab::Rng rng(seed++);
      const RowMatrix<float> q = random_rounded<TestType>(lens.first, shape.q_width(), rng);
      const RowMatrix<float> k = random_rounded<TestType>(lens.second, shape.kv_width(), rng);
      const RowMatrix<float> v = random_rounded<TestType>(lens.second, shape.kv_width(), rng);
      kvlab::CostCounters want_counts, got_counts;
      const RowMatrix<float> want = kvlab::cpu::naive_attention(shape, q, k, v, &want_counts);
      const RowMatrix<float> got = kc::naive_attention<TestType>(shape, q, k, v, &got_counts);
      check_close<TestType>(got, want);
      // bytes: sizeof(T) differs
      if (std::is_same<TestType, float>::value) CHECK(got_counts == want_counts);
      CHECK(got_counts.qk_dots == want_counts.qk_dots);
    }
}

TEMPLATE_TEST_CASE(
    "cuda::decode_attention equals cpu::decode_attention per element, rows past the length unread",
    "", float, __half, __nv_bfloat16) {
  kvlab::Rng rng(2);
  const int head_dims[8] = {8, 64, 80, 96, 112, 128, 200, 256};
  int ran = 0;  // (head size, group) pairs run
  for (int d = 0; d < 8; ++d)
    for (int g = 0; g < 4; ++g) {  // groups 1, 3, 8, 12
      if (kFewerUnderSanitizer && (d + g) % 2 == 1) continue;
      ++ran;
      const int head_dim = head_dims[d];
      const Heads& heads = kDecodeHeads[g];
      for (int length : {1, 257, kContext.decode_long})
        for (int partitions : {1, 0, 3}) {
          const AttentionShape shape(heads.num_heads, heads.num_kv_heads, head_dim);
          check_decode<TestType>(shape, length, 1, partitions, rng);
          // causal rows
          if (length > 5 && partitions != 1)
            check_decode<TestType>(shape, length, 5, partitions, rng);
        }
    }
  CHECK(ran == (kFewerUnderSanitizer ? 16 : 32));
}

TEMPLATE_TEST_CASE(
    "cuda::paged_decode_attention over vLLM's grid equals cpu::paged_decode_attention per element",
    "", float, __half, __nv_bfloat16) {
  // MHA and two GQA layouts, as vLLM's test: groups of 1, 8 and 4 (on the CPU emulator a quarter
  // of the heads in the same groups, kGridHeads)
  const Heads* const grid_heads = kGridHeads;
  std::uint64_t seed = 1000;
  // fp16 runs both layouts on every point of the grid; fp32 and bf16 alternate them from point
  // to point (on the CPU emulator fp16 alternates them too): every type sees both layouts.
  const bool every_layout = kEveryLayoutInFp16 && std::is_same<TestType, __half>::value;
  int point = 0;                 // index of the (head_dim, block_size, heads) point run
  int ran[2] = {0, 0};           // cases run per layout: [NHD, HND]
  int ran_heads[3] = {0, 0, 0};  // points run per head layout
  int pair = 0;                  // index of the (head_dim, block_size) pair
  for (int head_dim : {64, 80, 96, 112, 128, 256})
    for (int block_size : {16, 32, 1, 3}) {
      ++pair;
      for (int h = 0; h < 3; ++h) {
        if (kFewerUnderSanitizer && pair % 3 != h) continue;
        const Heads& heads = grid_heads[h];
        ++point;
        ++ran_heads[h];
        for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
          const int layout_index = layout == KVLayout::NHD ? 0 : 1;
          if (!every_layout && point % 2 != layout_index) continue;
          ++ran[layout_index];
          const AttentionShape shape(heads.num_heads, heads.num_kv_heads, head_dim);
          kvlab::Rng rng(seed++);
          const std::vector<int> lengths = kvlab_test::vllm_lengths(7, kContext.grid_max, rng);
          CAPTURE(head_dim, block_size, heads.num_heads, heads.num_kv_heads,
                  kvlab::to_string(layout), lengths);
          const kvlab_test::RaggedBatch<float> batch(shape, block_size, lengths, layout, rng,
                                                     kvlab_test::RoundTo<TestType>{});
          const RowMatrix<float> q = random_rounded<TestType>(7, shape.q_width(), rng);
          const RowMatrix<float> want = kvlab::cpu::paged_decode_attention(shape, q, batch.view);
          const RowMatrix<float> got = kc::paged_decode_attention<TestType>(shape, q, batch.view);
          check_close<TestType>(got, want);
        }
      }
    }
  // Every point ran once per layout, or (alternating) half of the points ran each layout; under
  // the sanitizer a third of the points, each head layout on 8 of the 24 pairs.
  const int points = kFewerUnderSanitizer ? 6 * 4 : 6 * 4 * 3;
  const int per_layout = every_layout ? points : points / 2;
  CHECK(point == points);
  CHECK(ran[0] == per_layout);
  CHECK(ran[1] == per_layout);
  for (int runs : ran_heads) CHECK(runs == points / 3);
}

namespace {

// uniform(-1, 1) to round(64 x): an integer in [-64, 64], exact in fp32, fp16 and bf16.
struct SmallInteger {
  float operator()(float x) const { return std::round(64.0f * x); }
};

// Queries whose every head has one nonzero element, 1280, at a dimension that varies with the
// row and the head. With head_dim 64 (scale 1/8 exactly) and integer keys in [-64, 64], every
// logit is 160 · k: a multiple of 160 in [-10240, 10240], computed exactly in any summation
// order. Keys that tie for the maximum share the weight; every other key's weight is below
// exp(-160), which is 0 in fp32, so the CPU and the GPU average the same value rows.
RowMatrix<float> peaked_queries(const AttentionShape& shape, int rows) {
  RowMatrix<float> q = RowMatrix<float>::Zero(rows, shape.q_width());  // [rows, q_width]
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < shape.num_heads(); ++h)
      q(r, h * shape.head_dim() + (5 * r + 7 * h) % shape.head_dim()) = 1280.0f;
  return q;
}

}  // namespace

// Logits of ±1e4: a kernel that exponentiates a score without first subtracting the row's
// maximum overflows to inf and returns NaN; one that merges split-K partitions without
// rescaling by exp(partition max - row max) does the same. Every CUDA kernel, both pool
// layouts, single pass and split-K, against the CPU kernel on the same values (the outputs are
// averages of tied value rows, summed in other orders; tolerances below).
TEMPLATE_TEST_CASE("logits of +-1e4 stay finite in every CUDA kernel and equal the CPU's", "",
                   float, __half, __nv_bfloat16) {
  const AttentionShape shape(8, 2, 64);  // GQA 4:1; scale 1/8
  REQUIRE(shape.scale() == 0.125);
  kvlab::Rng rng(4000);
  const SmallInteger integer;
  // Tolerances: those of cuda_compare.hpp, which are set for values in [-1, 1], with the absolute
  // one scaled by 64, the size of these values: tied rows that cancel leave a rounding of a value
  // of size 64 (a real H100 gave 2^-24 and the CPU -2^-20 for an exact 0).
  const auto check = [](const RowMatrix<float>& got, const RowMatrix<float>& want) {
    REQUIRE(want.allFinite());
    CHECK(got.allFinite());
    check_close(got, want, kvlab_test::Tolerance<TestType>::rtol,
                64 * kvlab_test::Tolerance<TestType>::atol);
  };
  const int n = 300;  // more than one key tile (kKeyTile = 256)
  RowMatrix<float> keys(n, shape.kv_width()), values(n, shape.kv_width());  // [n, kv_width]
  for (Eigen::Index i = 0; i < keys.size(); ++i) {
    keys.data()[i] = integer(static_cast<float>(rng.uniform(-1.0, 1.0)));
    values.data()[i] = integer(static_cast<float>(rng.uniform(-1.0, 1.0)));
  }
  REQUIRE(keys.maxCoeff() * 160 >= 1e4);  // the largest and smallest logits reach ±1e4
  REQUIRE(keys.minCoeff() * 160 <= -1e4);

  SECTION("naive_attention, causal") {
    const RowMatrix<float> q = peaked_queries(shape, n);
    check(kc::naive_attention<TestType>(shape, q, keys, values),
          kvlab::cpu::naive_attention(shape, q, keys, values));
  }
  SECTION("decode_attention, single pass and split-K") {
    kvlab::ContiguousKVCache<float> cache(1, shape.num_kv_heads(), shape.head_dim(), n);
    cache.append(0, keys, values);
    for (int q_len : {1, 5})
      for (int partitions : {1, 3}) {
        CAPTURE(q_len, partitions);
        const RowMatrix<float> q = peaked_queries(shape, q_len);
        kc::LaunchOptions options;
        options.partitions = partitions;
        check(kc::decode_attention<TestType>(shape, q, cache.view(0), nullptr, options),
              kvlab::cpu::decode_attention(shape, q, cache.view(0)));
      }
  }
  SECTION("paged decode and prefill, both layouts, single pass and split-K") {
    for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
      CAPTURE(kvlab::to_string(layout));
      const kvlab_test::RaggedBatch<float> batch(shape, 16, {n, 1, 77}, layout, rng, integer);
      const RowMatrix<float> q = peaked_queries(shape, 3);
      for (int partitions : {1, 4}) {
        CAPTURE(partitions);
        kc::LaunchOptions options;
        options.partitions = partitions;
        check(kc::paged_decode_attention<TestType>(shape, q, batch.view, nullptr, options),
              kvlab::cpu::paged_decode_attention(shape, q, batch.view));
      }
      const std::vector<std::int32_t> qo_indptr{0, 20, 21, 31};
      const RowMatrix<float> prefill_q = peaked_queries(shape, qo_indptr.back());
      check(kc::paged_prefill_attention<TestType>(shape, prefill_q, qo_indptr, batch.view),
            kvlab::cpu::paged_prefill_attention(shape, prefill_q, qo_indptr, batch.view));
    }
  }
}

TEST_CASE("split-K equals the single pass, for contiguous and paged caches") {
  // fp32, so that the two are compared at rounding level: the same keys merged in other groupings.
  const AttentionShape shape =
      kFewerUnderSanitizer ? AttentionShape(8, 2, 128) : AttentionShape(32, 8, 128);
  kvlab::Rng rng(3);
  const std::vector<int> lengths = kContext.split_k;
  for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
    const kvlab_test::RaggedBatch<float> batch(shape, 16, lengths, layout, rng,
                                               kvlab_test::NoRounding{});
    const RowMatrix<float> q = kvlab::random_matrix<float>(6, shape.q_width(), rng);
    kc::LaunchOptions single;
    single.partitions = 1;
    const RowMatrix<float> one = kc::paged_decode_attention(shape, q, batch.view, nullptr, single);
    check_close<float>(one, kvlab::cpu::paged_decode_attention(shape, q, batch.view));
    for (int partitions : {2, 7, 64, 0, kc::kMaxPartitions}) {
      CAPTURE(kvlab::to_string(layout), partitions);
      kc::LaunchOptions split;
      split.partitions = partitions;
      check_close<float>(kc::paged_decode_attention(shape, q, batch.view, nullptr, split), one);
    }
  }
  // Batch 1, one long contiguous context: the case split-K is for.
  const int context = kContext.split_k_contiguous;
  const RowMatrix<float> keys = kvlab::random_matrix<float>(context, shape.kv_width(), rng);
  const RowMatrix<float> values = kvlab::random_matrix<float>(context, shape.kv_width(), rng);
  kvlab::ContiguousKVCache<float> cache(1, shape.num_kv_heads(), shape.head_dim(), context);
  cache.append(0, keys, values);
  const RowMatrix<float> q = kvlab::random_matrix<float>(1, shape.q_width(), rng);
  kc::LaunchOptions single;
  single.partitions = 1;
  const RowMatrix<float> one = kc::decode_attention(shape, q, cache.view(0), nullptr, single);
  check_close<float>(one, kvlab::cpu::decode_attention(shape, q, cache.view(0)));
  for (int partitions : {3, 0, 256}) {
    CAPTURE(partitions);
    kc::LaunchOptions split;
    split.partitions = partitions;
    check_close<float>(kc::decode_attention(shape, q, cache.view(0), nullptr, split), one);
  }
}

TEMPLATE_TEST_CASE("cuda::paged_prefill_attention equals cpu::paged_prefill_attention per element",
                   "", float, __half) {
  std::uint64_t seed = 2000;
  int pair = 0;         // index of the (layout, block_size) pair
  int ran[2] = {0, 0};  // cases run per head layout
  for (KVLayout layout : {KVLayout::NHD, KVLayout::HND})
    for (int block_size : {1, 3, 16, 32}) {
      ++pair;
      for (int h = 0; h < 2; ++h) {
        if (kFewerUnderSanitizer && pair % 2 != h) continue;
        ++ran[h];
        const Heads heads = h == 0 ? Heads{8, 2} : Heads{4, 4};
        const AttentionShape shape(heads.num_heads, heads.num_kv_heads, 64);
        CAPTURE(kvlab::to_string(layout), block_size, heads.num_heads);
        kvlab::Rng rng(seed++);
        const std::vector<int> lengths{2 * block_size + 1, 37, 1, block_size + 1,
                                       kContext.prefill_long};
        const std::vector<std::int32_t> qo_indptr{0, 2 * block_size + 1, 2 * block_size + 1,
                                                  2 * block_size + 2, 2 * block_size + 4,
                                                  // 0 and many queries too
                                                  2 * block_size + 4 + kContext.prefill_queries};
        const kvlab_test::RaggedBatch<float> batch(shape, block_size, lengths, layout, rng,
                                                   kvlab_test::RoundTo<TestType>{});
        const RowMatrix<float> q = random_rounded<TestType>(qo_indptr.back(), shape.q_width(), rng);
        kvlab::CostCounters want_counts, got_counts;
        const RowMatrix<float> want =
            kvlab::cpu::paged_prefill_attention(shape, q, qo_indptr, batch.view, &want_counts);
        const RowMatrix<float> got =
            kc::paged_prefill_attention<TestType>(shape, q, qo_indptr, batch.view, &got_counts);
        check_close<TestType>(got, want);
        CHECK(got_counts.qk_dots == want_counts.qk_dots);
        CHECK(got_counts.macs == want_counts.macs);
      }
    }
  // Both head layouts on every (layout, block size), or under the sanitizer on half of them each.
  CHECK(ran[0] == (kFewerUnderSanitizer ? 4 : 8));
  CHECK(ran[1] == (kFewerUnderSanitizer ? 4 : 8));
}

// A RaggedBatch read with a sliding window of `window` keys and `sinks` attention sinks: every
// block wholly before the first visible key of a sequence's first query (its last `q_len` tokens
// query) that holds no sink is given back — kReleasedBlock in a copy of the tables, NaN in the
// pool — so a kernel that reads one poisons its output or trips on the table.
template <typename T>
struct WindowedBatch {
  kvlab_test::RaggedBatch<float> batch;
  std::vector<std::int32_t> indices;  // batch.view's tables, released pages set to -1
  kvlab::PagedKVView<float> view;     // batch.view with the window and these tables

  WindowedBatch(const AttentionShape& shape, int block_size, const std::vector<int>& lengths,
                const std::vector<std::int32_t>& qo_indptr, KVLayout layout, int window,
                kvlab::Rng& rng, int sinks = 0)
      : batch(shape, block_size, lengths, layout, rng, kvlab_test::RoundTo<T>{}) {
    view = batch.view;
    view.window = window;
    view.sinks = sinks;
    indices.assign(view.indices, view.indices + view.indptr[view.batch]);
    for (int s = 0; s < view.batch; ++s) {
      const int q_len =
          qo_indptr[static_cast<std::size_t>(s) + 1] - qo_indptr[static_cast<std::size_t>(s)];
      const int first = kvlab::first_visible_key(view.seq_len(s) - q_len, window);
      for (int page = 0; page < first / block_size; ++page) {
        if (page * block_size < sinks) continue;  // holds a sink
        auto& entry = indices[static_cast<std::size_t>(view.indptr[s] + page)];
        for (int pos = page * block_size; pos < (page + 1) * block_size; ++pos)
          for (int h = 0; h < shape.num_kv_heads(); ++h) {
            const auto at = static_cast<std::size_t>(batch.view.offset(s, pos, h));
            for (int c = 0; c < shape.head_dim(); ++c) {
              batch.k[at + static_cast<std::size_t>(c)] = NAN;
              batch.v[at + static_cast<std::size_t>(c)] = NAN;
            }
          }
        entry = kvlab::kReleasedBlock;
      }
    }
    view.indices = indices.data();
  }
};

// Decode over a contiguous ring with a window of `window` keys and `sinks` sinks: S + W − 1 + 7
// slots, filled in chunks of up to 7 tokens, the ring wrapping many times over 90 tokens (the
// sinks kept); after each chunk its queries attend on the device, with split-K 1 and 2, as
// cpu::decode_attention over the same ring, with the same counts.
template <typename T>
void check_ring_decode(const AttentionShape& shape, int window, int sinks, kvlab::Rng& rng) {
  const int chunk = 7;
  kvlab::ContiguousKVCache<float> ring(1, shape.num_kv_heads(), shape.head_dim(),
                                       sinks + window - 1 + chunk, window, sinks);
  const RowMatrix<float> keys = random_rounded<T>(90, shape.kv_width(), rng);
  const RowMatrix<float> values = random_rounded<T>(90, shape.kv_width(), rng);
  for (int pos = 0; pos < 90;) {
    const int n = std::min({chunk, 90 - pos, ring.max_chunk(0)});
    ring.append(0, keys.middleRows(pos, n), values.middleRows(pos, n));
    pos += n;
    const RowMatrix<float> q = random_rounded<T>(n, shape.q_width(), rng);
    for (int partitions : {1, 2}) {
      CAPTURE(window, sinks, pos, n, partitions);
      kc::LaunchOptions options;
      options.partitions = partitions;
      kvlab::CostCounters want_counts, got_counts;
      const RowMatrix<float> want =
          kvlab::cpu::decode_attention(shape, q, ring.view(0), &want_counts);
      check_close<T>(kc::decode_attention<T>(shape, q, ring.view(0), &got_counts, options), want);
      CHECK(got_counts.qk_dots == want_counts.qk_dots);
      CHECK(got_counts.macs == want_counts.macs);
    }
  }
}

// Paged decode (one query per sequence of `lengths`; split-K 1, chosen, 3) and prefill
// (`new_tokens` per sequence, split-K 2) over pools whose blocks before each window went back
// (WindowedBatch), with a window of `window` keys and `sinks` sinks, against the CPU kernels, with
// the same counts.
template <typename T>
void check_paged_window(const AttentionShape& shape, int window, int sinks, KVLayout layout,
                        int block_size, const std::vector<int>& lengths,
                        const std::vector<int>& new_tokens, kvlab::Rng& rng) {
  CAPTURE(window, sinks, kvlab::to_string(layout), block_size);
  std::vector<std::int32_t> one_each(lengths.size() + 1);  // decode: one query per sequence
  for (std::size_t s = 0; s <= lengths.size(); ++s) one_each[s] = static_cast<std::int32_t>(s);
  const WindowedBatch<T> decode(shape, block_size, lengths, one_each, layout, window, rng, sinks);
  const RowMatrix<float> q =
      random_rounded<T>(static_cast<int>(lengths.size()), shape.q_width(), rng);
  kvlab::CostCounters want_counts;
  const RowMatrix<float> want =
      kvlab::cpu::paged_decode_attention(shape, q, decode.view, &want_counts);
  for (int partitions : {1, 0, 3}) {
    CAPTURE(partitions);
    kc::LaunchOptions options;
    options.partitions = partitions;
    kvlab::CostCounters got_counts;
    check_close<T>(kc::paged_decode_attention<T>(shape, q, decode.view, &got_counts, options),
                   want);
    CHECK(got_counts.qk_dots == want_counts.qk_dots);
    CHECK(got_counts.macs == want_counts.macs);
  }
  std::vector<std::int32_t> qo_indptr{0};
  for (int n : new_tokens) qo_indptr.push_back(qo_indptr.back() + n);
  const WindowedBatch<T> prefill(shape, block_size, lengths, qo_indptr, layout, window, rng, sinks);
  const RowMatrix<float> queries = random_rounded<T>(qo_indptr.back(), shape.q_width(), rng);
  kvlab::CostCounters want_prefill, got_prefill;
  const RowMatrix<float> want_rows =
      kvlab::cpu::paged_prefill_attention(shape, queries, qo_indptr, prefill.view, &want_prefill);
  kc::LaunchOptions split;
  split.partitions = 2;
  check_close<T>(
      kc::paged_prefill_attention<T>(shape, queries, qo_indptr, prefill.view, &got_prefill, split),
      want_rows);
  CHECK(got_prefill.qk_dots == want_prefill.qk_dots);
}

TEMPLATE_TEST_CASE(
    "with a sliding window every CUDA kernel equals its CPU twin, and reads only "
    "the window",
    "", float, __half) {
  // Windows of 1 key, shorter than a block, a block and one more, and longer than two blocks;
  // sequences shorter than, equal to and one longer than the window, and long ones.
  const AttentionShape shape(8, 2, 64);
  std::uint64_t seed = 3000;
  for (int window : {1, 5, 16, 17, 40}) {
    kvlab::Rng rng(seed++);
    const int long_len = kContext.prefill_long;
    const std::vector<int> lengths{1,          std::max(1, window - 1), window,
                                   window + 1, 2 * window + 5,          long_len};
    SECTION("naive_attention, window " + std::to_string(window)) {
      for (const std::pair<int, int>& lens : {std::pair<int, int>{1, 40}, {17, 17}, {33, 100}}) {
        CAPTURE(window, lens.first, lens.second);
        const RowMatrix<float> q = random_rounded<TestType>(lens.first, shape.q_width(), rng);
        const RowMatrix<float> k = random_rounded<TestType>(lens.second, shape.kv_width(), rng);
        const RowMatrix<float> v = random_rounded<TestType>(lens.second, shape.kv_width(), rng);
        kvlab::CostCounters want_counts, got_counts;
        const RowMatrix<float> want =
            kvlab::cpu::naive_attention(shape, q, k, v, &want_counts, window);
        check_close<TestType>(kc::naive_attention<TestType>(shape, q, k, v, &got_counts, window),
                              want);
        CHECK(got_counts.qk_dots == want_counts.qk_dots);
      }
    }
    SECTION("decode_attention over a ring, window " + std::to_string(window)) {
      check_ring_decode<TestType>(shape, window, 0, rng);
    }
    for (KVLayout layout : {KVLayout::NHD, KVLayout::HND})
      for (int block_size : {1, 3, 16}) {
        // under the sanitizer one pool layout per (window, block size), in turn
        if (kFewerUnderSanitizer && (window + block_size + (layout == KVLayout::HND)) % 2 == 0)
          continue;
        SECTION("paged decode and prefill, window " + std::to_string(window) + ", " +
                kvlab::to_string(layout) + ", blocks of " + std::to_string(block_size)) {
          // prefill: new tokens per sequence — 1 (all of it), half of W − 1, all W, none,
          // the last W + 1 of 2W + 5, the long sequence's last 20
          check_paged_window<TestType>(shape, window, 0, layout, block_size, lengths,
                                       {1, std::max(1, window - 1) / 2, window, 0, window + 1, 20},
                                       rng);
        }
      }
  }
}

TEMPLATE_TEST_CASE(
    "with attention sinks every CUDA kernel equals its CPU twin, and reads only the sinks and "
    "the window",
    "", float, __half) {
  // Windows shorter than a block and longer than two; 1 and 4 sinks; sequences shorter than the
  // window, around W + S, and long ones.
  const AttentionShape shape(8, 2, 64);
  std::uint64_t seed = 3100;
  for (int window : {5, 40})
    for (int sinks : {1, 4}) {
      kvlab::Rng rng(seed++);
      const std::vector<int> lengths{
          1, window - 1, window + sinks, window + sinks + 1, 2 * window + 5, kContext.prefill_long};
      SECTION("decode_attention over a ring, window " + std::to_string(window) + ", sinks " +
              std::to_string(sinks)) {
        check_ring_decode<TestType>(shape, window, sinks, rng);
      }
      for (KVLayout layout : {KVLayout::NHD, KVLayout::HND})
        for (int block_size : {3, 16}) {
          // under the sanitizer one pool layout per (window, sinks, block size), in turn
          if (kFewerUnderSanitizer && (sinks + block_size + (layout == KVLayout::HND)) % 2 == 0)
            continue;
          SECTION("paged decode and prefill, window " + std::to_string(window) + ", sinks " +
                  std::to_string(sinks) + ", " + kvlab::to_string(layout) + ", blocks of " +
                  std::to_string(block_size)) {
            // prefill chunks that cross the point where the sinks leave the window
            check_paged_window<TestType>(
                shape, window, sinks, layout, block_size, lengths,
                {1, std::max(1, window - 1) / 2, sinks + 1, 0, window + 1, 20}, rng);
          }
        }
    }
}

TEST_CASE("the CUDA kernels refuse a window that reaches a released block, as the CPU's do") {
  const AttentionShape shape(4, 2, 64);
  kvlab::Rng rng(5);
  const std::vector<int> lengths{40};
  const std::vector<std::int32_t> one{0, 1};
  // released for a window of 20 (the first page holds positions 0-15; 40 − 20 = 20 is on page 1)
  const WindowedBatch<float> batch(shape, 16, lengths, one, KVLayout::NHD, 20, rng);
  kvlab::PagedKVView<float> wider = batch.view;
  wider.window = 30;  // position 10 is visible: page 0, released
  const RowMatrix<float> q = kvlab::random_matrix<float>(1, shape.q_width(), rng);
  CHECK_NOTHROW(kc::paged_decode_attention(shape, q, batch.view));
  CHECK_THROWS_MATCHES(
      kc::paged_decode_attention(shape, q, wider), kvlab::InvalidArgument,
      kvlab_test::names("cache.indices[0]", "a block of the pool", "kReleasedBlock"));
  const std::vector<std::int32_t> qo_indptr{0, 1};
  CHECK_THROWS_MATCHES(
      kc::paged_prefill_attention(shape, q, qo_indptr, wider), kvlab::InvalidArgument,
      kvlab_test::names("cache.indices[0]", "a block of the pool", "kReleasedBlock"));
  kvlab::PagedKVView<float> negative = batch.view;
  negative.window = -1;
  CHECK_THROWS_MATCHES(kc::paged_decode_attention(shape, q, negative), kvlab::InvalidArgument,
                       kvlab_test::names("cache.window", ">= 0", "-1"));
}

TEMPLATE_TEST_CASE(
    "int8 and int4 caches: the CUDA kernels decode the blocks as they read them "
    "and equal the CPU kernels on the same blocks",
    "", kvlab::BlockQ8_0, kvlab::BlockQ4_0) {
  // The CPU caches quantize the rows (KVStorage); the device gets the very same blocks. Both
  // decode a value as d·q (exact in float) and compute in fp32, so they differ only by the order
  // of fp32 additions: fp32 tolerance (cuda_compare.hpp), not the quantization error. The
  // counters count the same stored bytes (34 or 18 per 32 values).
  using S = TestType;
  std::uint64_t seed = 4000;
  for (const AttentionShape& shape :
       {AttentionShape(8, 2, 64), AttentionShape(4, 4, 128), AttentionShape(6, 1, 32)}) {
    kvlab::Rng rng(seed++);
    const int length = kContext.prefill_long;
    SECTION("decode_attention, heads " + std::to_string(shape.num_heads()) + "/" +
            std::to_string(shape.num_kv_heads()) + " x " + std::to_string(shape.head_dim())) {
      kvlab::ContiguousKVCache<float, S> cache(1, shape.num_kv_heads(), shape.head_dim(),
                                               length + 5);
      cache.append(0, kvlab::random_matrix<float>(length, shape.kv_width(), rng),
                   kvlab::random_matrix<float>(length, shape.kv_width(), rng));
      for (int q_len : {1, 5})
        for (int partitions : {1, 0, 3}) {
          CAPTURE(q_len, partitions);
          const RowMatrix<float> q = kvlab::random_matrix<float>(q_len, shape.q_width(), rng);
          kc::LaunchOptions options;
          options.partitions = partitions;
          kvlab::CostCounters want_counts, got_counts;
          const RowMatrix<float> want =
              kvlab::cpu::decode_attention(shape, q, cache.view(0), &want_counts);
          check_close<float>(kc::decode_attention(shape, q, cache.view(0), &got_counts, options),
                             want);
          CHECK(got_counts.qk_dots == want_counts.qk_dots);
          if (q_len == 1) CHECK(got_counts == want_counts);  // the same bytes read, as stored
        }
      // a ring of a window of 40: the quantized rows read in their slots
      kvlab::ContiguousKVCache<float, S> ring(1, shape.num_kv_heads(), shape.head_dim(), 46, 40);
      for (int pos = 0; pos < 100; pos += 5) {
        ring.append(0, kvlab::random_matrix<float>(5, shape.kv_width(), rng),
                    kvlab::random_matrix<float>(5, shape.kv_width(), rng));
        const RowMatrix<float> q = kvlab::random_matrix<float>(5, shape.q_width(), rng);
        check_close<float>(kc::decode_attention(shape, q, ring.view(0)),
                           kvlab::cpu::decode_attention(shape, q, ring.view(0)));
      }
    }
    for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
      SECTION("paged decode and prefill, heads " + std::to_string(shape.num_heads()) + "/" +
              std::to_string(shape.num_kv_heads()) + " x " + std::to_string(shape.head_dim()) +
              ", " + kvlab::to_string(layout)) {
        const int block_size = 16;
        const std::vector<int> lengths{1, 17, length};
        kvlab::PagedKVCache<float, S> pool(1, shape.num_kv_heads(), shape.head_dim(), block_size,
                                           64, layout);
        std::vector<int> seqs;
        for (int len : lengths) {
          seqs.push_back(pool.add_sequence());
          pool.append(seqs.back(), kvlab::random_matrix<float>(len, shape.kv_width(), rng),
                      kvlab::random_matrix<float>(len, shape.kv_width(), rng));
        }
        const kvlab::BlockTables tables = pool.tables(seqs);
        const kvlab::PagedKVView<S> view = pool.view(0, tables);
        const RowMatrix<float> q = kvlab::random_matrix<float>(3, shape.q_width(), rng);
        kvlab::CostCounters want_counts;
        const RowMatrix<float> want =
            kvlab::cpu::paged_decode_attention(shape, q, view, &want_counts);
        for (int partitions : {1, 0}) {
          CAPTURE(partitions);
          kc::LaunchOptions options;
          options.partitions = partitions;
          kvlab::CostCounters got_counts;
          check_close<float>(kc::paged_decode_attention(shape, q, view, &got_counts, options),
                             want);
          CHECK(got_counts == want_counts);
        }
        const std::vector<std::int32_t> qo_indptr{0, 1, 9, 9 + 20};  // 1, 8 and 20 new tokens
        const RowMatrix<float> queries = kvlab::random_matrix<float>(29, shape.q_width(), rng);
        kvlab::CostCounters want_prefill, got_prefill;
        const RowMatrix<float> want_rows =
            kvlab::cpu::paged_prefill_attention(shape, queries, qo_indptr, view, &want_prefill);
        check_close<float>(
            kc::paged_prefill_attention(shape, queries, qo_indptr, view, &got_prefill), want_rows);
        CHECK(got_prefill.qk_dots == want_prefill.qk_dots);
      }
    }
  }
}

TEST_CASE("an int8 or int4 cache needs whole blocks per head: head_dim a multiple of 32") {
  const AttentionShape shape(2, 1, 48);  // 48 values: a block and a half
  kc::DeviceBuffer<float> q(96), out(96);
  kc::DeviceBuffer<kvlab::BlockQ8_0> k(8), v(8);
  q.fill_bytes(0);
  const kvlab::ContiguousKVView<kvlab::BlockQ8_0> cache{k.data(), v.data(), 1, 48, 4, 1};
  CHECK_THROWS_MATCHES(
      kc::decode_attention(shape, kc::DeviceMatrix<const float>(q.data(), 1, 96), cache,
                           kc::DeviceMatrix<float>(out.data(), 1, 96)),
      kvlab::InvalidArgument,
      kvlab_test::names("shape.head_dim()", "a multiple of 32 (whole int8 blocks)", "48"));
}

TEST_CASE("cuda decode counters equal the CPU's for a decode step") {
  for (const AttentionShape& shape : {AttentionShape(32, 8, 128), AttentionShape(40, 40, 64)}) {
    kvlab::Rng rng(4);
    const kvlab_test::RaggedBatch<float> batch(shape, 16, {1, 15, 16, 17, 100}, KVLayout::NHD, rng,
                                               kvlab_test::NoRounding{});
    const RowMatrix<float> q = kvlab::random_matrix<float>(5, shape.q_width(), rng);
    kvlab::CostCounters want, got;
    kvlab::cpu::paged_decode_attention(shape, q, batch.view, &want);
    kc::paged_decode_attention(shape, q, batch.view, &got);
    CHECK(got == want);
  }
}

TEST_CASE("the CUDA attention functions reject bad arguments, naming them") {
  using kvlab::InvalidArgument;
  using kvlab_test::names;
  const AttentionShape shape(4, 2, 64);
  kc::DeviceBuffer<__half> q(4 * 256 + 8), out(4 * 256), k(2 * 64 * 16), v(2 * 64 * 16);
  for (kc::DeviceBuffer<__half>* buffer : {&q, &out, &k, &v}) buffer->fill_bytes(0);
  const kvlab::ContiguousKVView<__half> cache{k.data(), v.data(), 2, 64, 16, 10};
  const auto run = [&](const AttentionShape& s, kc::DeviceMatrix<const __half> qm,
                       const kvlab::ContiguousKVView<__half>& c,
                       kc::DeviceMatrix<__half> om) { kc::decode_attention(s, qm, c, om); };
  const kc::DeviceMatrix<const __half> q1(q.data(), 1, 256);
  const kc::DeviceMatrix<__half> out1(out.data(), 1, 256);
  CHECK_NOTHROW(run(shape, q1, cache, out1));
  CHECK_THROWS_MATCHES(
      run(AttentionShape(4, 2, 60), kc::DeviceMatrix<const __half>(q.data(), 1, 240), cache,
          kc::DeviceMatrix<__half>(out.data(), 1, 240)),
      InvalidArgument, names("shape.head_dim()", "a multiple of 8 in [8, 256]", "60"));
  CHECK_THROWS_MATCHES(run(shape, kc::DeviceMatrix<const __half>(q.data(), 1, 128), cache, out1),
                       InvalidArgument, names("q.cols", "256", "128"));
  CHECK_THROWS_MATCHES(
      run(shape, kc::DeviceMatrix<const __half>(q.data() + 1, 1, 256), cache, out1),
      InvalidArgument, names("q.data", "a 16-byte aligned device pointer", ""));
  CHECK_THROWS_MATCHES(run(shape, q1, cache, kc::DeviceMatrix<__half>(q.data() + 128, 1, 256)),
                       InvalidArgument,
                       names("out", "memory that does not overlap q", "an overlap"));
  kvlab::ContiguousKVView<__half> bad = cache;
  bad.length = 17;
  CHECK_THROWS_MATCHES(run(shape, q1, bad, out1), InvalidArgument,
                       names("cache.length", "in [q.rows (1), cache.capacity (16)]", "17"));
  bad = cache;
  bad.num_kv_heads = 1;
  CHECK_THROWS_MATCHES(run(shape, q1, bad, out1), InvalidArgument,
                       names("cache.num_kv_heads", "2", "1"));
  KVLAB_CUDA_CHECK(cudaDeviceSynchronize());
}

namespace {
__global__ void empty_kernel() {}
}  // namespace

TEST_CASE("a failing CUDA call becomes a CudaError naming the call and CUDA's error") {
  try {
    KVLAB_CUDA_CHECK(cudaSetDevice(-1));
    FAIL("cudaSetDevice(-1) succeeded");
  } catch (const kvlab::CudaError& e) {
    const std::string message = e.what();
    CHECK(e.code() == cudaErrorInvalidDevice);
    CHECK(message.find("cudaSetDevice(-1)") != std::string::npos);
    CHECK(message.find(cudaGetErrorString(cudaErrorInvalidDevice)) != std::string::npos);
    CHECK(message.find("test_cuda_attention.cu") != std::string::npos);
  }
  try {
    // More threads per block than any GPU allows.
    kc::detail::launch_kernel("empty_kernel", empty_kernel, dim3(1), dim3(4096), 0, nullptr);
    FAIL("a launch of 4096 threads per block succeeded");
  } catch (const kvlab::CudaError& e) {
    CHECK(std::string(e.what()).find("launch of empty_kernel") != std::string::npos);
  }
  try {  // a CudaError is a std::runtime_error
    kc::DeviceBuffer<float> too_big(std::size_t{1} << 50);
    FAIL("a 4 PiB allocation succeeded");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("cudaMalloc") != std::string::npos);
  }
  // A handled error is not reported again by the next launch.
  CHECK_NOTHROW(
      kc::detail::launch_kernel("empty_kernel", empty_kernel, dim3(1), dim3(32), 0, nullptr));
}
