// The index arithmetic that kvlab's CUDA kernels share with the host (cuda/attention_plan.hpp and
// core/split_k.hpp), checked on the CPU (no GPU needed): partitions of a context, lanes, GQA
// tiles, the shared-memory layout, the plan's number of partitions, query rows of ragged
// batches, paged addressing, and the kernels' counts against the CPU paths' counts. The kernels
// themselves run on the CPU emulator (emulator/) against the CPU paths, so no model of them is
// kept here: it could drift from the kernel it claims to copy.
//
// Exact: every check is integer arithmetic or a count.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kvlab/cache/contiguous_kv_cache.hpp"
#include "kvlab/core/softmax_state.hpp"
#include "kvlab/cpu/decode_attention.hpp"
#include "kvlab/cpu/paged_attention.hpp"
#include "kvlab/cuda/attention_plan.hpp"
#include "ragged_batch.hpp"
#include "test_support.hpp"

using kvlab::AttentionShape;
using kvlab::KVLayout;
using kvlab::RowMatrix;
using kvlab::SoftmaxState;

TEST_CASE("partition_size, partition_count and partition_keys cut a context into whole units") {
  for (int unit : {1, 3, 16, 256, 258})
    for (int parts = 1; parts <= 9; ++parts)
      for (int length = 0; length <= 3 * unit * parts + 5; length += (length < 40 ? 1 : 7)) {
        CAPTURE(unit, parts, length);
        const int size = kvlab::partition_size(length, parts, unit);
        const int count = kvlab::partition_count(length, parts, unit);
        if (length == 0) {
          CHECK(size == 0);
          CHECK(count == 0);
          continue;
        }
        CHECK(size % unit == 0);
        CHECK(size >= 1);
        CHECK(count >= 1);
        CHECK(count <= parts);
        CHECK(static_cast<long>(count - 1) * size < length);
        CHECK(static_cast<long>(count) * size >= length);
        int covered = 0;  // the partitions tile [0, length) in order, then come empty ones
        for (int p = 0; p < parts + 2; ++p) {
          const kvlab::cuda::KeyRange r = kvlab::cuda::partition_keys(length, parts, unit, p);
          if (p < count) {
            CHECK(r.begin == covered);
            CHECK(r.end > r.begin);
            CHECK(r.begin % unit == 0);
            covered = r.end;
          } else {
            CHECK(r.begin == length);
            CHECK(r.end == length);
          }
        }
        CHECK(covered == length);
      }
}

TEST_CASE(
    "row_partition_keys: a row's partitions cover exactly its window and sinks, cut at block "
    "edges") {
  using namespace kvlab::cuda;
  for (int block_size : {1, 3, 16})
    for (int window : {0, 1, 2, 5, 16, 17, 300, 700})
      for (int sinks : {0, 1, 4})
        for (int keys = 1; keys <= 1200; keys += keys < 40 ? 1 : 37)
          for (int parts : {1, 2, 3, 7, 64}) {
            if (sinks > 0 && sinks >= window) continue;  // sinks only below a window
            CAPTURE(block_size, window, sinks, keys, parts);
            const QueryRow row = query_row(0, keys, window, sinks);
            CHECK(row.first == kvlab::first_visible_key(keys - 1, window));
            CHECK(row.keys - row.first == (window > 0 ? std::min(window, keys) : keys));
            // the sinks that have left the window: the first min(S, first) keys
            CHECK(row.sinks == std::min(sinks, row.first));
            // virtual keys [begin, keys): the sinks at positions 0 .. sinks - 1, then the window
            bool mapped = true;
            for (int i = row.begin(); i < row.keys; ++i)
              mapped = mapped && row.key_position(i) == (i < row.first ? i - row.begin() : i);
            CHECK(mapped);
            const int unit = split_k_unit(block_size);
            const int count = row_partition_count(row, parts, unit, block_size);
            CHECK(count >= 1);
            CHECK(count <= parts);
            int next = row.begin();  // the partitions follow each other from the first key
            for (int p = 0; p < parts; ++p) {
              const KeyRange r = row_partition_keys(row, parts, unit, block_size, p);
              if (p < count) {
                CHECK(r.begin == next);
                CHECK(r.end > r.begin);
                if (p > 0) CHECK(r.begin % block_size == 0);  // whole blocks of the pool
                if (p + 1 < count) CHECK(r.end % block_size == 0);
                next = r.end;
              } else {
                CHECK(r.begin == r.end);  // past the last: empty
              }
            }
            CHECK(next == keys);
          }
}

TEST_CASE("lanes per row, GQA tiles and the split-K unit") {
  using namespace kvlab::cuda;
  for (int head_dim = 1; head_dim <= 300; ++head_dim) {
    CAPTURE(head_dim);
    CHECK(head_dim_supported(head_dim) == (head_dim % 8 == 0 && head_dim <= 256));
    if (!head_dim_supported(head_dim)) continue;
    const int lanes = lanes_per_row(head_dim);
    CHECK((lanes & (lanes - 1)) == 0);            // a power of two: it divides 32
    CHECK(lanes * kValuesPerThread >= head_dim);  // together the lanes hold the row
    CHECK(lanes <= 32);
    CHECK((lanes == 1 || (lanes / 2) * kValuesPerThread < head_dim));  // and no fewer would
  }
  CHECK(lanes_per_row(64) == 8);
  CHECK(lanes_per_row(80) == 16);
  CHECK(lanes_per_row(128) == 16);
  CHECK(lanes_per_row(256) == 32);
  for (int group = 1; group <= 64; ++group) {
    CAPTURE(group);
    const int tile = group_tile(group);
    const int tiles = group_tiles(group);
    CHECK((tile == 1 || tile == 2 || tile == 4 || tile == 8));
    CHECK(tiles * tile >= group);
    CHECK((tiles - 1) * tile < group);
    CHECK((tiles == 1 || tile == kMaxGroupTile));
  }
  for (int block_size = 1; block_size <= 600; ++block_size) {
    const int unit = split_k_unit(block_size);
    CHECK(unit % block_size == 0);
    CHECK(unit >= kKeyTile);
    CHECK(unit - block_size < std::max(kKeyTile, block_size));
  }
}

TEST_CASE("the shared-memory layout: aligned, disjoint, within 48 KiB") {
  using namespace kvlab::cuda;
  for (int tile : {1, 2, 4, 8})
    for (int head_dim = 8; head_dim <= 256; head_dim += 8) {
      CAPTURE(tile, head_dim);
      const AttentionSmemLayout l = attention_smem_layout(tile, head_dim);
      for (std::size_t offset : {l.running, l.scale_a, l.scale_b, l.offsets, l.scores, l.reduce})
        CHECK(offset % 16 == 0);
      const auto t = static_cast<std::size_t>(tile);
      CHECK(l.scale_a >= l.running + t * sizeof(SoftmaxState<float>));
      CHECK(l.scale_b >= l.scale_a + t * sizeof(float));
      CHECK(l.offsets >= l.scale_b + t * sizeof(float));
      CHECK(l.scores >= l.offsets + kKeyTile * sizeof(std::ptrdiff_t));
      CHECK(l.bytes >= l.scores + t * kKeyTile * sizeof(float));
      CHECK(l.reduce >= l.scale_b + t * sizeof(float));  // the running states survive the reduction
      CHECK(l.bytes >=
            l.reduce + kAttentionWarps * t * static_cast<std::size_t>(head_dim) * sizeof(float));
      CHECK(l.bytes <= 48 * 1024);
    }
}

TEST_CASE("plan_attention: single pass on request, otherwise the most partitions within a wave") {
  using namespace kvlab::cuda;
  const AttentionShape gqa(32, 8, 128);
  CHECK(plan_attention(gqa, 1, 16, 132, 1).partitions == 1);
  CHECK(plan_attention(gqa, 1, 16, 132, 7).partitions == 7);
  CHECK(plan_attention(gqa, 1, 16, 132, 100000).partitions == kMaxPartitions);
  // bench_cuda_decode's batches on an H100 (132 multiprocessors, target 4 × 132 = 528 blocks of
  // 8 K/V heads × 1 group tile per row and partition)
  CHECK(plan_attention(gqa, 1, 16, 132, 0).partitions == 66);  // 528 blocks
  CHECK(plan_attention(gqa, 16, 16, 132, 0).partitions == 4);  // 512, not 640 (1.21 waves)
  CHECK(plan_attention(gqa, 64, 16, 132, 0).partitions == 2);  // 1024: long ragged rows cut
  CHECK(plan_attention(gqa, 66, 16, 132, 0).partitions == 1);  // 528 already
  for (int rows : {1, 2, 7, 64, 1000})
    for (int sms : {1, 108, 132})
      for (const AttentionShape& shape : {gqa, AttentionShape(40, 40, 64),
                                          AttentionShape(64, 8, 256), AttentionShape(48, 2, 96)}) {
        CAPTURE(rows, sms, shape.num_heads(), shape.num_kv_heads());
        const AttentionPlan plan = plan_attention(shape, rows, 16, sms, 0);
        const long long per_partition = 1LL * rows * shape.num_kv_heads() * plan.group_tiles;
        const long long target = 1LL * kTargetBlocksPerSm * sms;
        CHECK(plan.partitions >= 1);
        CHECK(plan.partitions <= kMaxPartitions);
        if (per_partition >= target) {
          CHECK(plan.partitions == 1);  // the batch fills the GPU alone
        } else {
          CHECK(plan.partitions >= 2);
          // within one wave of the target, unless that leaves a single partition
          CHECK((plan.partitions == 2 || per_partition * plan.partitions <= target));
          // and the most partitions that stay within it
          CHECK((plan.partitions == kMaxPartitions ||
                 per_partition * (plan.partitions + 1) > target));
        }
        CHECK(plan.lanes == lanes_per_row(shape.head_dim()));
        CHECK(plan.group_tile == group_tile(shape.group_size()));
        CHECK(plan.unit == split_k_unit(16));
        CHECK(plan.smem_bytes == attention_smem_layout(plan.group_tile, shape.head_dim()).bytes);
        const std::size_t bytes = partial_bytes(shape, rows, plan);
        CHECK(bytes ==
              (plan.partitions == 1
                   ? 0
                   : static_cast<std::size_t>(rows) * shape.num_heads() * plan.partitions *
                         (shape.head_dim() * sizeof(float) + sizeof(SoftmaxState<float>))));
      }
}

TEST_CASE("sequence_of_row finds each query row's sequence, skipping sequences without queries") {
  kvlab::Rng rng(5);
  for (int trial = 0; trial < 100; ++trial) {
    const int batch = 1 + static_cast<int>(rng.next_u64() % 9);
    std::vector<std::int32_t> qo_indptr{0};
    for (int s = 0; s < batch; ++s)
      qo_indptr.push_back(qo_indptr.back() + static_cast<std::int32_t>(rng.next_u64() % 4));
    if (qo_indptr.back() == 0) qo_indptr.back() = 1;  // at least one row
    for (int row = 0; row < qo_indptr.back(); ++row) {
      CAPTURE(trial, qo_indptr, row);
      const int s = kvlab::cuda::sequence_of_row(qo_indptr.data(), batch, row);
      REQUIRE(s >= 0);
      REQUIRE(s < batch);
      CHECK(qo_indptr[static_cast<std::size_t>(s)] <= row);
      CHECK(row < qo_indptr[static_cast<std::size_t>(s) + 1]);
    }
  }
}

TEST_CASE("locate_row and row_offset: the keys each row sees and where their rows are") {
  using kvlab::cuda::locate_row;
  using kvlab::cuda::row_offset;
  const AttentionShape shape(8, 2, 16);
  for (KVLayout layout : {KVLayout::NHD, KVLayout::HND})
    for (int block_size : {1, 3, 16}) {
      CAPTURE(kvlab::to_string(layout), block_size);
      kvlab::Rng rng(6);
      const kvlab_test::RaggedBatch<float> batch(shape, block_size, {5, 1, 2 * block_size + 1, 40},
                                                 layout, rng, kvlab_test::NoRounding{});
      const kvlab::PagedKVView<float>& view = batch.view;
      for (int s = 0; s < view.batch; ++s) {  // decode: row s is sequence s, all its keys
        const kvlab::cuda::QueryRow r = locate_row(view, nullptr, view.batch, s);
        CHECK(r.seq == s);
        CHECK(r.keys == batch.lengths[static_cast<std::size_t>(s)]);
      }
      const std::vector<std::int32_t> qo_indptr{0, 3, 3, 4, 44};  // prefill: 3, 0, 1 and 40 queries
      for (int s = 0; s < view.batch; ++s)
        for (int i = 0; i < qo_indptr[static_cast<std::size_t>(s) + 1] -
                                qo_indptr[static_cast<std::size_t>(s)];
             ++i) {
          const int row = qo_indptr[static_cast<std::size_t>(s)] + i;
          const int q_len =
              qo_indptr[static_cast<std::size_t>(s) + 1] - qo_indptr[static_cast<std::size_t>(s)];
          const kvlab::cuda::QueryRow r = locate_row(view, qo_indptr.data(), 44, row);
          CHECK(r.seq == s);
          CHECK(r.keys == batch.lengths[static_cast<std::size_t>(s)] - q_len + i + 1);
        }
      // Every row of every sequence: the offset through the block table, written out by hand.
      for (int s = 0; s < view.batch; ++s)
        for (int pos = 0; pos < batch.lengths[static_cast<std::size_t>(s)]; ++pos)
          for (int h = 0; h < shape.num_kv_heads(); ++h) {
            const std::ptrdiff_t block = batch.tables.indices()[static_cast<std::size_t>(
                batch.tables.indptr()[static_cast<std::size_t>(s)] + pos / block_size)];
            const std::ptrdiff_t slot = pos % block_size;
            const std::ptrdiff_t want =
                layout == KVLayout::NHD
                    ? ((block * block_size + slot) * shape.num_kv_heads() + h) * shape.head_dim()
                    : ((block * shape.num_kv_heads() + h) * block_size + slot) * shape.head_dim();
            CHECK(row_offset(view, s, pos, h) == want);
            // an owned slot, never the NaN padding
            CHECK(!std::isnan(batch.k[static_cast<std::size_t>(want)]));
          }
    }
  // A contiguous cache: row i of 3 new queries over 10 cached rows sees 8 + i keys.
  kvlab::ContiguousKVView<float> contiguous{nullptr, nullptr, 2, 16, 12, 10};
  for (int i = 0; i < 3; ++i) {
    CHECK(locate_row(contiguous, nullptr, 3, i).keys == 8 + i);
    CHECK(locate_row(contiguous, nullptr, 3, i).first == 0);
  }
  CHECK(row_offset(contiguous, 0, 5, 1) == (12 + 5) * 16);
  // With a window of 4 in a ring of 6 slots holding 10 tokens: row i (position 7 + i) sees its
  // last 4 keys, and position p is in slot p % 6.
  kvlab::ContiguousKVView<float> ring{nullptr, nullptr, 2, 16, 6, 10, 4};
  for (int i = 0; i < 3; ++i) {
    CHECK(locate_row(ring, nullptr, 3, i).keys == 8 + i);
    CHECK(locate_row(ring, nullptr, 3, i).first == 4 + i);
  }
  CHECK(row_offset(ring, 0, 9, 1) == (6 + 3) * 16);
}

TEST_CASE("count_attention: a decode step counts what the CPU decode paths count") {
  for (const AttentionShape& shape :
       {AttentionShape(32, 8, 128), AttentionShape(40, 40, 64), AttentionShape(8, 1, 16)}) {
    CAPTURE(shape.num_heads(), shape.num_kv_heads());
    kvlab::Rng rng(10);
    const kvlab_test::RaggedBatch<float> batch(shape, 16, {1, 15, 16, 17, 100}, KVLayout::NHD, rng,
                                               kvlab_test::NoRounding{});
    const RowMatrix<float> q = kvlab::random_matrix<float>(5, shape.q_width(), rng);
    kvlab::CostCounters cpu_counts, gpu_counts;
    kvlab::cpu::paged_decode_attention(shape, q, batch.view, &cpu_counts);
    kvlab::cuda::count_attention(shape, sizeof(float) * shape.head_dim(), 1 + 15 + 16 + 17 + 100,
                                 gpu_counts);
    CHECK(gpu_counts == cpu_counts);
    kvlab::ContiguousKVCache<float> cache(1, shape.num_kv_heads(), shape.head_dim(), 100);
    cache.append(0, kvlab::random_matrix<float>(100, shape.kv_width(), rng),
                 kvlab::random_matrix<float>(100, shape.kv_width(), rng));
    kvlab::CostCounters cpu_step, gpu_step;
    kvlab::cpu::decode_attention(shape, RowMatrix<float>(q.row(0)), cache.view(0), &cpu_step);
    kvlab::cuda::count_attention(shape, sizeof(float) * shape.head_dim(), 100, gpu_step);
    CHECK(gpu_step == cpu_step);
  }
  // More than 8 query heads per K/V head: each of the two GQA tiles reads the rows.
  kvlab::CostCounters wide;
  kvlab::cuda::count_attention(AttentionShape(16, 1, 8), 2 * 8, 10, wide);
  CHECK(wide.kv_bytes_read == 2 * 2 * 10 * 1 * 2 * 8);
}
