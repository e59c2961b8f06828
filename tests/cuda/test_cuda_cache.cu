// The device KV caches and the GPU decoders against their CPU twins:
//  - cuda::ContiguousKVCache::append and cuda::PagedKVCache::write store exactly (bit for bit)
//    what ContiguousKVCache / PagedKVCache store, in fp32, fp16 and bf16 and both pool layouts,
//    through the same sequence of appends, forks (copy on write), truncations and frees; and
//    for int8/int4 caches the very same q8_0/q4_0 blocks, on rows made to meet every branch of
//    the encodings;
//  - linear (the projections) against Eigen;
//  - cuda::NaiveDecoder, CachedDecoder and PagedDecoder against the CPU decoders at every step
//    (per element, |gpu - cpu| <= 1e-5 + 1e-5 |cpu|: fp32 GEMMs and attention in another order,
//    through two layers), and their counters; and with K/V stored as fp16, bf16, int8 and int4
//    and with a sliding window, against the CPU decoders of the same storage and window;
//  - a window with attention sinks in the device ring and pool, against the CPU caches.
// Without a GPU every test reports itself skipped (cuda_skip_listener.cpp); the CPU emulator
// (emulator/) runs them unchanged.
#include <cuda_runtime.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda_compare.hpp"
#include "kvlab/cache/contiguous_kv_cache.hpp"
#include "kvlab/cache/paged_kv_cache.hpp"
#include "kvlab/core/random.hpp"
#include "kvlab/cpu/decode_attention.hpp"
#include "kvlab/cpu/paged_attention.hpp"
#include "kvlab/cuda/contiguous_kv_cache.cuh"
#include "kvlab/cuda/host_api.cuh"
#include "kvlab/cuda/paged_kv_cache.cuh"
#include "kvlab/model/cuda_decoders.cuh"
#include "kvlab/model/decoders.hpp"

using kvlab::AttentionShape;
using kvlab::KVLayout;
using kvlab::RowMatrix;
using kvlab_test::check_close;
using kvlab_test::random_rounded;
namespace kc = kvlab::cuda;

namespace {

template <typename T>
std::vector<T> download(const T* device, std::size_t count) {
  std::vector<T> host(count);
  KVLAB_CUDA_CHECK(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

// True if the stored T is exactly the float (which is representable in T).
template <typename T>
bool same_bits(T stored, float want) {
  const T expected = kc::from_float<T>(want);
  return std::memcmp(&stored, &expected, sizeof(T)) == 0;
}

}  // namespace

TEMPLATE_TEST_CASE(
    "cuda::ContiguousKVCache::append stores what ContiguousKVCache::append stores, bit for bit", "",
    float, __half, __nv_bfloat16) {
  const AttentionShape shape(8, 2, 24);
  kvlab::Rng rng(1);
  kvlab::ContiguousKVCache<float> cpu(2, shape.num_kv_heads(), shape.head_dim(), 40);
  kc::ContiguousKVCache<TestType> gpu(2, shape.num_kv_heads(), shape.head_dim(), 40);
  for (int n : {1, 5, 17, 1, 16}) {
    for (int layer = 0; layer < 2; ++layer) {
      const RowMatrix<float> k = random_rounded<TestType>(n, shape.kv_width(), rng);
      const RowMatrix<float> v = random_rounded<TestType>(n, shape.kv_width(), rng);
      cpu.append(layer, k, v);
      const kc::DeviceBuffer<TestType> dk = kc::to_device<TestType>(k);
      const kc::DeviceBuffer<TestType> dv = kc::to_device<TestType>(v);
      gpu.append(layer, dk.matrix(n, shape.kv_width()), dv.matrix(n, shape.kv_width()));
      REQUIRE(gpu.length(layer) == cpu.length(layer));
    }
    for (int layer = 0; layer < 2; ++layer) {
      const kvlab::ContiguousKVView<TestType> view = gpu.view(layer);
      const std::size_t size =
          static_cast<std::size_t>(view.num_kv_heads) * view.capacity * view.head_dim;
      const std::vector<TestType> keys = download(view.k, size), values = download(view.v, size);
      long mismatches = 0;
      for (int h = 0; h < shape.num_kv_heads(); ++h)
        for (int pos = 0; pos < cpu.length(layer); ++pos)
          for (int c = 0; c < shape.head_dim(); ++c) {
            const auto at = static_cast<std::size_t>(view.offset(h, pos) + c);
            mismatches += !same_bits(keys[at], cpu.keys(layer, h)(pos, c));
            mismatches += !same_bits(values[at], cpu.values(layer, h)(pos, c));
          }
      CHECK(mismatches == 0);
    }
  }
  // Full: 40 rows taken; one more is a CapacityError and changes nothing.
  const kc::DeviceBuffer<TestType> one(static_cast<std::size_t>(shape.kv_width()));
  CHECK_THROWS_AS(gpu.append(0, one.matrix(1, shape.kv_width()), one.matrix(1, shape.kv_width())),
                  kvlab::CapacityError);
  CHECK(gpu.length(0) == 40);
  gpu.truncate(3);
  CHECK(gpu.length(1) == 3);
}

TEMPLATE_TEST_CASE(
    "cuda::PagedKVCache mirrors PagedKVCache: append, write, fork with copy on write, truncate, "
    "free",
    "", float, __half, __nv_bfloat16) {
  const AttentionShape shape(4, 2, 16);
  for (KVLayout layout : {KVLayout::NHD, KVLayout::HND})
    for (int block_size : {1, 3, 16}) {
      CAPTURE(kvlab::to_string(layout), block_size);
      kvlab::Rng rng(static_cast<std::uint64_t>(block_size));
      kvlab::PagedKVCache<float> cpu(2, shape.num_kv_heads(), shape.head_dim(), block_size, 64,
                                     layout);
      kc::PagedKVCache<TestType> gpu(2, shape.num_kv_heads(), shape.head_dim(), block_size, 64,
                                     layout);
      const auto grow = [&](int cpu_seq, int gpu_seq, int n) {
        const std::vector<std::int64_t> slots = cpu.reserve(cpu_seq, n);
        REQUIRE(gpu.reserve(gpu_seq, n) == slots);
        for (int layer = 0; layer < 2; ++layer) {
          const RowMatrix<float> k = random_rounded<TestType>(n, shape.kv_width(), rng);
          const RowMatrix<float> v = random_rounded<TestType>(n, shape.kv_width(), rng);
          cpu.write(layer, slots, k, v);
          const auto dk = kc::to_device<TestType>(k);
          const auto dv = kc::to_device<TestType>(v);
          gpu.write(layer, slots, dk.matrix(n, shape.kv_width()), dv.matrix(n, shape.kv_width()));
        }
      };
      // Every token of every live sequence, read through both caches' block tables.
      const auto compare = [&]() {
        const std::vector<int> seqs = cpu.sequences();
        REQUIRE(gpu.sequences() == seqs);
        std::vector<int> live;
        for (int s : seqs) {
          REQUIRE(gpu.blocks(s) == cpu.blocks(s));
          if (cpu.length(s) > 0) live.push_back(s);
        }
        if (live.empty()) return;
        const kvlab::BlockTables tables = cpu.tables(live);
        const kc::DeviceBlockTables device_tables(gpu.tables(live));
        for (int layer = 0; layer < 2; ++layer) {
          const kvlab::PagedKVView<float> want = cpu.view(layer, tables);
          const kvlab::PagedKVView<TestType> got = gpu.view(layer, device_tables);
          const std::size_t pool =
              static_cast<std::size_t>(got.num_blocks) * block_size * shape.kv_width();
          const std::vector<TestType> keys = download(got.k, pool), values = download(got.v, pool);
          long mismatches = 0;
          for (int s = 0; s < want.batch; ++s)
            for (int pos = 0; pos < want.seq_len(s); ++pos)
              for (int h = 0; h < shape.num_kv_heads(); ++h) {
                // the same block ids: the same offsets
                const std::ptrdiff_t at = want.offset(s, pos, h);
                for (int c = 0; c < shape.head_dim(); ++c) {
                  mismatches +=
                      !same_bits(keys[static_cast<std::size_t>(at + c)], want.key(s, pos, h)[c]);
                  mismatches += !same_bits(values[static_cast<std::size_t>(at + c)],
                                           want.value(s, pos, h)[c]);
                }
              }
          CHECK(mismatches == 0);
        }
      };
      const int a = cpu.add_sequence();
      REQUIRE(gpu.add_sequence() == a);
      grow(a, a, 2 * block_size + 1);  // a prompt, then decode steps
      compare();
      for (int step = 0; step < 3; ++step) grow(a, a, 1);
      compare();
      const int b = cpu.fork(a);  // shares a's blocks; the next append copies the shared last block
      REQUIRE(gpu.fork(a) == b);
      grow(b, b, 2);
      grow(a, a, 1);
      compare();
      cpu.truncate(a, 2);
      gpu.truncate(a, 2);
      grow(a, a, block_size + 2);
      compare();
      cpu.free_sequence(b);
      gpu.free_sequence(b);
      const int c = cpu.add_sequence();
      REQUIRE(gpu.add_sequence() == c);
      grow(c, c, 3 * block_size);
      compare();
      CHECK(gpu.allocator().num_free() == cpu.allocator().num_free());
    }
}

namespace {

// Rows that meet every branch of the int8/int4 encodings: uniform values, one outlier per
// block, a block of equal values (negative and positive extremes), zeros, values below fp16's
// smallest step, and exact multiples of the scale (ties of the level rounding).
RowMatrix<float> adversarial_rows(int n, int width, kvlab::Rng& rng) {
  RowMatrix<float> m = kvlab::random_matrix<float>(n, width, rng);
  for (int r = 0; r < n; ++r)
    for (int b = 0; b < width / kvlab::kQuantBlock; ++b) {
      float* block = m.row(r).data() + b * kvlab::kQuantBlock;
      switch ((r + b) % 6) {
        case 0:
          break;  // uniform in [-1, 1)
        case 1:
          block[(r * 7 + b) % kvlab::kQuantBlock] = 1000.f;
          break;  // one outlier
        case 2:
          for (int i = 0; i < kvlab::kQuantBlock; ++i) block[i] = -0.75f;
          break;
        case 3:
          for (int i = 0; i < kvlab::kQuantBlock; ++i) block[i] = 0.f;
          break;
        case 4:
          for (int i = 0; i < kvlab::kQuantBlock; ++i) block[i] *= 1e-9f;
          break;  // tiny
        default:
          for (int i = 0; i < kvlab::kQuantBlock; ++i) block[i] = 0.5f * (i - 16);
          break;
      }
    }
  return m;
}

template <typename S>
bool same_block(const S& a, const S& b) {
  return std::memcmp(&a, &b, sizeof(S)) == 0;
}

// Stored elements of K and V at positions [from, want.length), every head, that differ between
// a device contiguous cache (`got`) and the CPU cache (`want`) with the same layout.
template <typename S>
long contiguous_mismatches(const kvlab::ContiguousKVView<S>& got,
                           const kvlab::ContiguousKVView<S>& want, int from) {
  const std::size_t size =
      static_cast<std::size_t>(got.num_kv_heads) * got.capacity * got.row_units();
  const std::vector<S> keys = download(got.k, size), values = download(got.v, size);
  long mismatches = 0;
  for (int h = 0; h < want.num_kv_heads; ++h)
    for (int pos = from; pos < want.length; ++pos)
      for (int u = 0; u < want.row_units(); ++u) {
        const auto at = static_cast<std::size_t>(got.offset(h, pos) + u);
        mismatches += !same_block(keys[at], want.key(h, pos)[u]);
        mismatches += !same_block(values[at], want.value(h, pos)[u]);
      }
  return mismatches;
}

// Stored elements of K and V of the first sequence at positions [from, its length), every head,
// that differ between a device pool (`got`) and the CPU pool (`want`) with the same block ids.
template <typename S>
long paged_mismatches(const kvlab::PagedKVView<S>& got, const kvlab::PagedKVView<S>& want,
                      int from) {
  const std::size_t pool = static_cast<std::size_t>(got.num_blocks) * got.block_size *
                           static_cast<std::size_t>(got.num_kv_heads * got.row_units());
  const std::vector<S> keys = download(got.k, pool), values = download(got.v, pool);
  long mismatches = 0;
  for (int pos = from; pos < want.seq_len(0); ++pos)
    for (int h = 0; h < want.num_kv_heads; ++h)
      for (int u = 0; u < want.row_units(); ++u) {
        const auto at = static_cast<std::size_t>(want.offset(0, pos, h) + u);
        mismatches += !same_block(keys[at], want.key(0, pos, h)[u]);
        mismatches += !same_block(values[at], want.value(0, pos, h)[u]);
      }
  return mismatches;
}

}  // namespace

TEMPLATE_TEST_CASE(
    "an int8 or int4 device cache quantizes each appended row exactly as the CPU "
    "cache does, bit for bit",
    "", kvlab::BlockQ8_0, kvlab::BlockQ4_0) {
  using S = TestType;
  const AttentionShape shape(8, 2, 64);
  kvlab::Rng rng(11);
  SECTION("contiguous") {
    kvlab::ContiguousKVCache<float, S> cpu(2, shape.num_kv_heads(), shape.head_dim(), 40);
    kc::ContiguousKVCache<S> gpu(2, shape.num_kv_heads(), shape.head_dim(), 40);
    for (int n : {1, 5, 17, 1, 16})
      for (int layer = 0; layer < 2; ++layer) {
        const RowMatrix<float> k = adversarial_rows(n, shape.kv_width(), rng);
        const RowMatrix<float> v = adversarial_rows(n, shape.kv_width(), rng);
        cpu.append(layer, k, v);
        const kc::DeviceBuffer<float> dk = kc::to_device<float>(k), dv = kc::to_device<float>(v);
        gpu.append(layer, dk.matrix(n, shape.kv_width()), dv.matrix(n, shape.kv_width()));
      }
    for (int layer = 0; layer < 2; ++layer) {
      const kvlab::ContiguousKVView<S> want = cpu.view(layer), got = gpu.view(layer);
      CHECK(want.length == 40);  // 2 heads, 40 rows, 2 blocks per row
      CHECK(contiguous_mismatches(got, want, 0) == 0);
    }
  }
  SECTION("paged, both layouts") {
    for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
      CAPTURE(kvlab::to_string(layout));
      kvlab::PagedKVCache<float, S> cpu(1, shape.num_kv_heads(), shape.head_dim(), 16, 8, layout);
      kc::PagedKVCache<S> gpu(1, shape.num_kv_heads(), shape.head_dim(), 16, 8, layout);
      const int seq = cpu.add_sequence();
      REQUIRE(gpu.add_sequence() == seq);
      for (int n : {3, 20, 1}) {
        const RowMatrix<float> k = adversarial_rows(n, shape.kv_width(), rng);
        const RowMatrix<float> v = adversarial_rows(n, shape.kv_width(), rng);
        const std::vector<std::int64_t> slots = cpu.append(seq, k, v);
        REQUIRE(gpu.reserve(seq, n) == slots);
        const kc::DeviceBuffer<float> dk = kc::to_device<float>(k), dv = kc::to_device<float>(v);
        gpu.write(0, slots, dk.matrix(n, shape.kv_width()), dv.matrix(n, shape.kv_width()));
      }
      const kvlab::BlockTables tables = cpu.tables({seq});
      const kc::DeviceBlockTables device_tables(gpu.tables({seq}));
      const kvlab::PagedKVView<S> want = cpu.view(0, tables);
      const kvlab::PagedKVView<S> got = gpu.view(0, device_tables);
      CHECK(want.seq_len(0) == 24);
      CHECK(paged_mismatches(got, want, 0) == 0);
    }
  }
  CHECK_THROWS_MATCHES(kc::ContiguousKVCache<S>(1, 2, 48, 4), kvlab::InvalidArgument,
                       kvlab_test::names("head_dim", "a multiple of 32", "48"));
}

// A device cache with a sliding window keeps the ring the CPU cache keeps: chunks of 1 to
// capacity - W + 1 tokens wrap the ring of 12 slots three times, and after each chunk every slot
// that holds a position still in the ring equals the CPU cache's, bit for bit; the chunk's
// queries attend over the device ring as cpu::decode_attention does over the CPU's (fp32
// tolerance, cuda_compare.hpp). A chunk too large for the ring and a truncation below the
// window's reach are refused as the CPU cache refuses them, and change nothing.
TEMPLATE_TEST_CASE("a windowed cuda::ContiguousKVCache keeps the CPU cache's ring, bit for bit", "",
                   float, kvlab::BlockQ8_0) {
  using S = TestType;
  const AttentionShape shape(4, 2, 32);
  const int capacity = 12, window = 5;
  kvlab::Rng rng(29);
  kvlab::ContiguousKVCache<float, S> cpu(2, shape.num_kv_heads(), shape.head_dim(), capacity,
                                         window);
  kc::ContiguousKVCache<S> gpu(2, shape.num_kv_heads(), shape.head_dim(), capacity, window);
  REQUIRE(gpu.window() == window);
  REQUIRE(gpu.max_chunk(0) == cpu.max_chunk(0));
  for (int n : {1, 3, 8, 1, 8, 2, 7, 1, 1, 8}) {
    CAPTURE(n, cpu.length(0));
    RowMatrix<float> q;
    for (int layer = 0; layer < 2; ++layer) {
      const RowMatrix<float> k = kvlab::random_matrix<float>(n, shape.kv_width(), rng);
      const RowMatrix<float> v = kvlab::random_matrix<float>(n, shape.kv_width(), rng);
      cpu.append(layer, k, v);
      const kc::DeviceBuffer<float> dk = kc::to_device<float>(k), dv = kc::to_device<float>(v);
      gpu.append(layer, dk.matrix(n, shape.kv_width()), dv.matrix(n, shape.kv_width()));
      REQUIRE(gpu.length(layer) == cpu.length(layer));
    }
    for (int layer = 0; layer < 2; ++layer) {
      const kvlab::ContiguousKVView<S> want = cpu.view(layer), got = gpu.view(layer);
      REQUIRE(got.window == window);
      CHECK(contiguous_mismatches(got, want, std::max(0, want.length - capacity)) == 0);
    }
    q = kvlab::random_matrix<float>(n, shape.q_width(), rng);  // the chunk's queries
    const kc::DeviceBuffer<float> d_q = kc::to_device<float>(q);
    kc::DeviceBuffer<float> d_out(static_cast<std::size_t>(n) * shape.q_width());
    kc::decode_attention(shape, d_q.matrix(n, shape.q_width()), gpu.view(0),
                         d_out.matrix(n, shape.q_width()));
    check_close<float>(kc::to_host(d_out, n, shape.q_width()),
                       kvlab::cpu::decode_attention(shape, q, cpu.view(0)));
  }
  REQUIRE(cpu.length(0) == 40);  // the ring of 12 slots has wrapped three times
  // A chunk of 9 would overwrite keys its first query sees: refused, as by the CPU cache.
  const kc::DeviceBuffer<float> nine(static_cast<std::size_t>(9) * shape.kv_width());
  CHECK_THROWS_MATCHES(
      gpu.append(0, nine.matrix(9, shape.kv_width()), nine.matrix(9, shape.kv_width())),
      kvlab::CapacityError, kvlab_test::names("k.rows", "at most capacity - window + 1 = 8", "9"));
  // The ring holds positions 28 .. 39: the next token after 31 would need position 27.
  CHECK_THROWS_MATCHES(gpu.truncate(31), kvlab::InvalidArgument,
                       kvlab_test::names("length", "at least 32", "31"));
  CHECK(gpu.length(0) == 40);
  gpu.truncate(32);
  CHECK(gpu.length(1) == 32);
  CHECK_THROWS_MATCHES(kc::ContiguousKVCache<S>(1, 2, 32, 4, 5), kvlab::InvalidArgument,
                       kvlab_test::names("window", "at most capacity (4)", "5"));
}

// A device pool with a sliding window gives back the blocks the CPU pool gives back: after each
// chunk both release the blocks before the next token's window, and their tables, held blocks
// and free lists agree; the blocks still held equal the CPU's bit for bit; a decode query over
// the device pool equals cpu::paged_decode_attention (fp32 tolerance, cuda_compare.hpp); the
// sequence never holds more than ceil((W - 1 + C) / block_size) + 1 blocks while a chunk of C
// runs; and a truncation whose window reaches a block given back is refused by both.
TEMPLATE_TEST_CASE("a windowed cuda::PagedKVCache releases the blocks the CPU pool releases", "",
                   float, kvlab::BlockQ4_0) {
  using S = TestType;
  const AttentionShape shape(4, 2, 32);
  const int block_size = 4, window = 6;
  for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
    CAPTURE(kvlab::to_string(layout));
    kvlab::Rng rng(31);
    kvlab::PagedKVCache<float, S> cpu(1, shape.num_kv_heads(), shape.head_dim(), block_size, 16,
                                      layout, window);
    kc::PagedKVCache<S> gpu(1, shape.num_kv_heads(), shape.head_dim(), block_size, 16, layout,
                            window);
    REQUIRE(gpu.window() == window);
    const int seq = cpu.add_sequence();
    REQUIRE(gpu.add_sequence() == seq);
    for (int n : {3, 1, 5, 1, 1, 4, 2, 6, 1, 9, 1}) {
      CAPTURE(n, cpu.length(seq));
      const RowMatrix<float> k = kvlab::random_matrix<float>(n, shape.kv_width(), rng);
      const RowMatrix<float> v = kvlab::random_matrix<float>(n, shape.kv_width(), rng);
      const std::vector<std::int64_t> slots = cpu.append(seq, k, v);
      REQUIRE(gpu.reserve(seq, n) == slots);
      const kc::DeviceBuffer<float> dk = kc::to_device<float>(k), dv = kc::to_device<float>(v);
      gpu.write(0, slots, dk.matrix(n, shape.kv_width()), dv.matrix(n, shape.kv_width()));
      CHECK(gpu.held_blocks(seq) <= (window - 1 + n + block_size - 1) / block_size + 1);
      // the blocks held: the same ids, the same bytes from the window's first key on
      const kvlab::BlockTables tables = cpu.tables({seq});
      const kc::DeviceBlockTables device_tables(gpu.tables({seq}));
      const kvlab::PagedKVView<S> want = cpu.view(0, tables);
      const kvlab::PagedKVView<S> got = gpu.view(0, device_tables);
      REQUIRE(got.window == window);
      const int length = cpu.length(seq);
      CHECK(paged_mismatches(got, want, kvlab::first_visible_key(length - n, window)) == 0);
      // the last token's query, over each pool
      const RowMatrix<float> q = kvlab::random_matrix<float>(1, shape.q_width(), rng);
      const kc::DeviceBuffer<float> d_q = kc::to_device<float>(q);
      kc::DeviceBuffer<float> d_out(static_cast<std::size_t>(shape.q_width()));
      kc::paged_decode_attention(shape, d_q.matrix(1, shape.q_width()), got,
                                 d_out.matrix(1, shape.q_width()));
      check_close<float>(kc::to_host(d_out, 1, shape.q_width()),
                         kvlab::cpu::paged_decode_attention(shape, q, want));
      // the blocks before the next token's window go back to each pool
      const int released = cpu.release_out_of_window(seq);
      CHECK(gpu.release_out_of_window(seq) == released);
      CHECK(gpu.blocks(seq) == cpu.blocks(seq));
      CHECK(gpu.held_blocks(seq) == cpu.held_blocks(seq));
      CHECK(gpu.allocator().num_free() == cpu.allocator().num_free());
    }
    REQUIRE(cpu.length(seq) == 34);  // the blocks of positions 0 .. 27 are back in the pool
    CHECK(cpu.held_blocks(seq) == 2);
    CHECK_THROWS_MATCHES(cpu.truncate(seq, 30), kvlab::InvalidArgument,
                         kvlab_test::names("length", "at least 33", "30"));
    CHECK_THROWS_MATCHES(gpu.truncate(seq, 30), kvlab::InvalidArgument,
                         kvlab_test::names("length", "at least 33", "30"));
    CHECK(gpu.length(seq) == 34);
    gpu.truncate(seq, 33);
    CHECK(gpu.length(seq) == 33);
  }
  CHECK_THROWS_MATCHES(kc::PagedKVCache<S>(1, 2, 32, 4, 4, KVLayout::NHD, -1),
                       kvlab::InvalidArgument, kvlab_test::names("window", ">= 0", "-1"));
}

// With attention sinks the device caches keep what the CPU caches keep: a ring whose first 2
// slots hold the sinks while the other 10 wrap, and a pool that gives back the blocks before the
// window but the sinks' block; after each chunk the slots and blocks agree bit for bit, and the
// chunk's last query attends over each as cpu::decode_attention or cpu::paged_decode_attention
// does over the CPU's (fp32 tolerance, cuda_compare.hpp).
TEST_CASE("with sinks the device ring and pool keep what the CPU's keep") {
  const AttentionShape shape(4, 2, 32);
  const int window = 5, sinks = 2, capacity = 12, block_size = 4;
  kvlab::Rng rng(37);
  kvlab::ContiguousKVCache<float> cpu_ring(1, 2, 32, capacity, window, sinks);
  kc::ContiguousKVCache<float> gpu_ring(1, 2, 32, capacity, window, sinks);
  kvlab::PagedKVCache<float> cpu_pool(1, 2, 32, block_size, 16, KVLayout::NHD, window, sinks);
  kc::PagedKVCache<float> gpu_pool(1, 2, 32, block_size, 16, KVLayout::NHD, window, sinks);
  REQUIRE(gpu_ring.sinks() == sinks);
  REQUIRE(gpu_pool.sinks() == sinks);
  REQUIRE(gpu_ring.max_chunk(0) == capacity - sinks - window + 1);
  const int seq = cpu_pool.add_sequence();
  REQUIRE(gpu_pool.add_sequence() == seq);
  for (int n : {3, 1, 6, 1, 1, 4, 2, 6, 1, 6, 1, 1}) {
    CAPTURE(n, cpu_ring.length(0));
    const RowMatrix<float> k = kvlab::random_matrix<float>(n, shape.kv_width(), rng);
    const RowMatrix<float> v = kvlab::random_matrix<float>(n, shape.kv_width(), rng);
    const kc::DeviceBuffer<float> dk = kc::to_device<float>(k), dv = kc::to_device<float>(v);
    cpu_ring.append(0, k, v);
    gpu_ring.append(0, dk.matrix(n, shape.kv_width()), dv.matrix(n, shape.kv_width()));
    const std::vector<std::int64_t> slots = cpu_pool.append(seq, k, v);
    REQUIRE(gpu_pool.reserve(seq, n) == slots);
    gpu_pool.write(0, slots, dk.matrix(n, shape.kv_width()), dv.matrix(n, shape.kv_width()));
    const kvlab::ContiguousKVView<float> want_ring = cpu_ring.view(0), got_ring = gpu_ring.view(0);
    REQUIRE(got_ring.sinks == sinks);
    CHECK(contiguous_mismatches(got_ring, want_ring, 0) == 0);
    const kvlab::BlockTables tables = cpu_pool.tables({seq});
    const kc::DeviceBlockTables device_tables(gpu_pool.tables({seq}));
    const kvlab::PagedKVView<float> want_pool = cpu_pool.view(0, tables);
    const kvlab::PagedKVView<float> got_pool = gpu_pool.view(0, device_tables);
    REQUIRE(got_pool.sinks == sinks);
    const int length = cpu_pool.length(seq);
    CHECK(paged_mismatches(got_pool, want_pool, kvlab::first_visible_key(length - n, window)) == 0);
    // the last token's query over each ring and pool
    const RowMatrix<float> q = kvlab::random_matrix<float>(1, shape.q_width(), rng);
    const kc::DeviceBuffer<float> d_q = kc::to_device<float>(q);
    kc::DeviceBuffer<float> d_out(static_cast<std::size_t>(shape.q_width()));
    kc::decode_attention(shape, d_q.matrix(1, shape.q_width()), got_ring,
                         d_out.matrix(1, shape.q_width()));
    check_close<float>(kc::to_host(d_out, 1, shape.q_width()),
                       kvlab::cpu::decode_attention(shape, q, want_ring));
    kc::paged_decode_attention(shape, d_q.matrix(1, shape.q_width()), got_pool,
                               d_out.matrix(1, shape.q_width()));
    check_close<float>(kc::to_host(d_out, 1, shape.q_width()),
                       kvlab::cpu::paged_decode_attention(shape, q, want_pool));
    const int released = cpu_pool.release_out_of_window(seq);
    CHECK(gpu_pool.release_out_of_window(seq) == released);
    CHECK(gpu_pool.blocks(seq) == cpu_pool.blocks(seq));
    CHECK(gpu_pool.blocks(seq).front() != kvlab::kReleasedBlock);  // the sinks' block
  }
  REQUIRE(cpu_ring.length(0) == 33);      // the ring's 10 slots past the sinks wrapped three times
  CHECK(cpu_pool.held_blocks(seq) == 3);  // the sinks' block and the window's two
  CHECK_THROWS_MATCHES(kc::ContiguousKVCache<float>(1, 2, 32, 12, 5, 5), kvlab::InvalidArgument,
                       kvlab_test::names("sinks", "below the window (5)", "5"));
  CHECK_THROWS_MATCHES(kc::PagedKVCache<float>(1, 2, 32, 4, 4, KVLayout::NHD, 0, 1),
                       kvlab::InvalidArgument,
                       kvlab_test::names("sinks", "0 without a window (every key is seen)", "1"));
}

TEST_CASE("cuda::PagedKVCache::write with device slots skips negative slots") {
  const AttentionShape shape(2, 1, 8);
  kc::PagedKVCache<float> gpu(1, 1, 8, 4, 2);
  const int seq = gpu.add_sequence();
  const std::vector<std::int64_t> slots = gpu.reserve(seq, 2);
  const kc::DeviceBuffer<std::int64_t> device_slots(std::vector<std::int64_t>{slots[0], -1});
  std::vector<float> rows(16);
  for (int i = 0; i < 16; ++i) rows[static_cast<std::size_t>(i)] = static_cast<float>(i + 1);
  const kc::DeviceBuffer<float> k(rows);
  const kc::DeviceBuffer<float> v(rows);
  const kc::DeviceBlockTables tables(gpu.tables({seq}));
  const kvlab::PagedKVView<float> view = gpu.view(0, tables);
  KVLAB_CUDA_CHECK(cudaMemset(const_cast<float*>(view.k), 0, 2 * 4 * 8 * sizeof(float)));
  gpu.write(0, device_slots.data(), k.matrix(2, 8), v.matrix(2, 8));
  const std::vector<float> pool = download(view.k, 2 * 4 * 8);
  for (int c = 0; c < 8; ++c) {
    // row 0 written
    CHECK(pool[static_cast<std::size_t>(slots[0] * 8 + c)] == static_cast<float>(c + 1));
    // row 1 skipped
    CHECK(pool[static_cast<std::size_t>(slots[1] * 8 + c)] == 0.f);
  }
}

TEST_CASE("cuda::linear equals Eigen's x W^T, with and without accumulation") {
  kvlab::Rng rng(2);
  for (int n : {1, 7, 33})
    for (int in : {1, 16, 70})
      for (int out : {1, 5, 64}) {
        CAPTURE(n, in, out);
        const RowMatrix<float> x = kvlab::random_matrix<float>(n, in, rng);
        const RowMatrix<float> w = kvlab::random_matrix<float>(out, in, rng);
        const RowMatrix<float> y0 = kvlab::random_matrix<float>(n, out, rng);
        const kc::DeviceBuffer<float> dx(x.data(), static_cast<std::size_t>(x.size()));
        const kc::DeviceBuffer<float> dw(w.data(), static_cast<std::size_t>(w.size()));
        kc::DeviceBuffer<float> dy(y0.data(), static_cast<std::size_t>(y0.size()));
        kc::linear(dx.matrix(n, in), dw.matrix(out, in), dy.matrix(n, out));
        const RowMatrix<float> want = x * w.transpose();  // [n, out]
        // Tolerance: fp32 sums of `in` products in another order (and fused multiply-adds on a
        // GPU) differ by a few roundings of the terms' size Σ_k |x_k w_k|, not of the result's:
        // the terms cancel, and a result near 0 can carry an error far above its own 1e-5 (a
        // real H100 gave 0.039899107 for 0.039897412, in = 70). rtol 1e-5 of Σ_k |x_k w_k|.
        const RowMatrix<float> terms = x.cwiseAbs() * w.cwiseAbs().transpose();  // [n, out]
        const double rtol = kvlab_test::Tolerance<float>::rtol;
        const double atol = kvlab_test::Tolerance<float>::atol;
        check_close(kc::to_host(dy, n, out), want, terms, rtol, atol);
        kc::linear(dx.matrix(n, in), dw.matrix(out, in), dy.matrix(n, out), /*accumulate=*/true);
        check_close(kc::to_host(dy, n, out), RowMatrix<float>(want * 2.f),
                    RowMatrix<float>(terms * 2.f), rtol, atol);
      }
}

TEST_CASE("the GPU decoders equal the CPU decoders at every step, with the same counts") {
  // Tolerances: fp32 on both sides, two layers of projections and attention summed in other
  // orders; 1e-5 absolute + 1e-5 relative per element.
  constexpr double kTol = 1e-5;
  const AttentionShape shape(8, 2, 32);
  const auto stack = kvlab::AttentionStack<float>::random(2, shape, 64, /*seed=*/3);
  kvlab::NaiveDecoder<float> cpu_naive(stack);
  kvlab::CachedDecoder<float> cpu_cached(stack, 64);
  kvlab::PagedDecoder<float> cpu_paged(stack, 4, 40, KVLayout::HND);
  kc::NaiveDecoder<float> gpu_naive(stack);
  kc::CachedDecoder<float> gpu_cached(stack, 64);
  kc::PagedDecoder<float> gpu_paged(stack, 4, 40, KVLayout::HND);
  kvlab::Rng rng(4);
  const RowMatrix<float> tokens = kvlab::random_matrix<float>(40, 64, rng, -2.0, 2.0);

  const auto step = [&](const RowMatrix<float>& x, bool decode) {
    const RowMatrix<float> want = cpu_cached.prefill(x);
    // the CPU decoders agree (as their tests say)
    check_close(cpu_naive.prefill(x), want, kTol, kTol);
    check_close(cpu_paged.prefill(x), want, kTol, kTol);
    check_close(gpu_naive.prefill(x), want, kTol, kTol);
    check_close(gpu_cached.prefill(x), want, kTol, kTol);
    check_close(gpu_paged.prefill(x), want, kTol, kTol);
    CHECK(gpu_naive.last_step() == cpu_naive.last_step());
    for (const kvlab::Decoder<float>* gpu :
         {static_cast<const kvlab::Decoder<float>*>(&gpu_cached),
          static_cast<const kvlab::Decoder<float>*>(&gpu_paged)}) {
      const kvlab::CostCounters& got = gpu->last_step();
      const kvlab::CostCounters& cpu = cpu_cached.last_step();
      CHECK(got.q_projections == cpu.q_projections);
      CHECK(got.kv_projections == cpu.kv_projections);
      CHECK(got.qk_dots == cpu.qk_dots);
      CHECK(got.macs == cpu.macs);
      // a prefill's differs: per query row on the GPU
      if (decode) CHECK(got.kv_bytes_read == cpu.kv_bytes_read);
    }
  };
  step(tokens.topRows(5), false);  // the prompt
  for (int t = 5; t < 30; ++t) {
    CAPTURE(t);
    step(tokens.middleRows(t, 1), true);
  }
  // Rewind three tokens and take another path: the caches drop the rows, the outputs agree again.
  for (kvlab::Decoder<float>* d : {static_cast<kvlab::Decoder<float>*>(&cpu_naive),
                                   static_cast<kvlab::Decoder<float>*>(&cpu_cached),
                                   static_cast<kvlab::Decoder<float>*>(&cpu_paged),
                                   static_cast<kvlab::Decoder<float>*>(&gpu_naive),
                                   static_cast<kvlab::Decoder<float>*>(&gpu_cached),
                                   static_cast<kvlab::Decoder<float>*>(&gpu_paged)})
    d->rewind(27);
  step(tokens.middleRows(35, 2), false);
  step(tokens.middleRows(37, 1), true);

  // A fork continues from the same tokens on both sides.
  const auto cpu_fork = cpu_paged.fork();
  const auto gpu_fork = gpu_paged.fork();
  for (int t = 30; t < 33; ++t) {
    const RowMatrix<float> x = tokens.middleRows(t, 1);
    check_close(gpu_fork->prefill(x), cpu_fork->prefill(x), kTol, kTol);
  }
  check_close(gpu_paged.prefill(tokens.middleRows(38, 1)),
              cpu_paged.prefill(tokens.middleRows(38, 1)), kTol, kTol);
  CHECK(gpu_paged.cache().allocator().num_free() == cpu_paged.cache().allocator().num_free());
}

namespace {

// The CPU storage whose rows a device cache of S holds bit for bit: the same type, or Eigen's
// half and bfloat16 for CUDA's.
template <typename S>
struct CpuStorage {
  using type = S;
};
template <>
struct CpuStorage<__half> {
  using type = Eigen::half;
};
template <>
struct CpuStorage<__nv_bfloat16> {
  using type = Eigen::bfloat16;
};

// [rows, cols] multiples of 1 / scale in [-1, 1) * range: sums of a few dozen products of two such
// matrices are exact in float, whatever the order.
RowMatrix<float> exact_matrix(int rows, int cols, float range, float scale, kvlab::Rng& rng) {
  RowMatrix<float> m = kvlab::random_matrix<float>(rows, cols, rng);
  for (Eigen::Index i = 0; i < m.size(); ++i)
    m.data()[i] = std::round(m.data()[i] * range * scale) / scale;
  return m;
}

}  // namespace

// Every storage and a sliding window through the GPU decoders, against their CPU twins with the
// same storage and window (W = 6: a ring of 12 slots that wraps, blocks of 4 that go back to the
// pool) over a 25-token generation. One layer whose weights (multiples of 1/16 in [-0.5, 0.5))
// and inputs (multiples of 1/8 in [-1, 1)) make every projection exact on both sides: K and V are
// then the same floats, stored as the same fp16 values or the same int8/int4 blocks, and the
// outputs differ by the order of fp32 sums only (|gpu - cpu| <= 1e-5 + 1e-5 |cpu|). The decode
// steps' counts and the blocks each paged decoder holds agree too.
TEMPLATE_TEST_CASE(
    "the GPU decoders keep K/V in every storage and with a window as the CPU "
    "decoders do",
    "", float, __half, __nv_bfloat16, kvlab::BlockQ8_0, kvlab::BlockQ4_0) {
  using S = TestType;
  using CpuS = typename CpuStorage<S>::type;
  constexpr double kTol = 1e-5;
  const AttentionShape shape(4, 2, 32);
  const int d_model = 48;
  kvlab::Rng rng(8);
  std::vector<kvlab::AttentionLayer<float>> layers;
  layers.emplace_back(shape, d_model, exact_matrix(shape.q_width(), d_model, 0.5f, 16, rng),
                      exact_matrix(shape.kv_width(), d_model, 0.5f, 16, rng),
                      exact_matrix(shape.kv_width(), d_model, 0.5f, 16, rng),
                      exact_matrix(d_model, shape.q_width(), 0.5f, 16, rng));
  const auto stack = std::make_shared<const kvlab::AttentionStack<float>>(std::move(layers));
  const RowMatrix<float> tokens = exact_matrix(25, d_model, 1.f, 8, rng);
  for (int window : {0, 6}) {
    CAPTURE(window);
    const int capacity = window > 0 ? 12 : 25;
    kvlab::CachedDecoder<float, CpuS> cpu_cached(stack, capacity, window);
    kvlab::PagedDecoder<float, CpuS> cpu_paged(stack, 4, 12, KVLayout::NHD, window);
    kc::CachedDecoder<float, S> gpu_cached(stack, capacity, window);
    kc::PagedDecoder<float, S> gpu_paged(stack, 4, 12, KVLayout::NHD, window);
    REQUIRE(gpu_cached.cache().window() == window);
    REQUIRE(gpu_paged.cache().window() == window);
    for (int t = 0; t < 25; t = t == 0 ? 5 : t + 1) {
      CAPTURE(t);
      const RowMatrix<float> x = tokens.middleRows(t, t == 0 ? 5 : 1);
      check_close(gpu_cached.prefill(x), cpu_cached.prefill(x), kTol, kTol);
      check_close(gpu_paged.prefill(x), cpu_paged.prefill(x), kTol, kTol);
      if (t > 0) {  // a decode step reads what the CPU's does
        CHECK(gpu_cached.last_step().kv_bytes_read == cpu_cached.last_step().kv_bytes_read);
        CHECK(gpu_paged.last_step().kv_bytes_read == cpu_paged.last_step().kv_bytes_read);
        CHECK(gpu_cached.last_step().qk_dots == cpu_cached.last_step().qk_dots);
      }
      CHECK(gpu_paged.cache().held_blocks(gpu_paged.sequence()) ==
            cpu_paged.cache().held_blocks(cpu_paged.sequence()));
    }
    if (std::is_same<S, float>::value) {  // the windowed naive decoders agree too
      kvlab::NaiveDecoder<float> cpu_naive(stack, window);
      kc::NaiveDecoder<float> gpu_naive(stack, window);
      check_close(gpu_naive.prefill(tokens), cpu_naive.prefill(tokens), kTol, kTol);
      CHECK(gpu_naive.last_step().qk_dots == cpu_naive.last_step().qk_dots);
    }
  }
}
