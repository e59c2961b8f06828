// Memory accounting: contiguous and paged footprints and budget counts pinned to values
// computed by hand; the formulas against a real PagedKVCache driven through random appends,
// forks, truncations and frees at block sizes 1, 3 and 16; paging wastes less than one block per
// sequence; bad arguments and overflow name the argument, the expected and the actual value.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include "kvlab/analysis/memory_accounting.hpp"
#include "test_support.hpp"

using kvlab::InvalidArgument;
using kvlab::MemoryFootprint;
using kvlab::PagedKVCache;
using kvlab_test::names;

namespace {

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;
// Llama-2-7B in fp16: 2 · 32 layers · 32 K/V heads · 128 · 2 bytes = 524,288 bytes (512 KiB).
constexpr std::uint64_t kLlamaToken = 524288;

// Tokens stored in a live cache, counted independently of paged_cache_footprint: the set of
// distinct slots (block · block_size + offset) that the live sequences' tokens occupy.
std::uint64_t distinct_slots(const PagedKVCache<float>& cache) {
  std::set<std::int64_t> slots;
  const int b = cache.block_size();
  for (int seq : cache.sequences()) {
    const std::vector<std::int32_t>& blocks = cache.blocks(seq);
    for (int pos = 0; pos < cache.length(seq); ++pos) {
      slots.insert(std::int64_t{blocks[static_cast<std::size_t>(pos / b)]} * b + pos % b);
    }
  }
  return slots.size();
}

// Appends `n` tokens to `seq` of a one-layer cache: reserved and written (a fork shares only
// written tokens). Their values do not matter to the accounting.
void append_tokens(PagedKVCache<float>& cache, int seq, int n) {
  const int width = cache.num_kv_heads() * cache.head_dim();
  const kvlab::RowMatrix<float> kv = kvlab::RowMatrix<float>::Zero(n, width);  // [n, width]
  cache.append(seq, kv, kv);
}

std::vector<std::int64_t> live_lengths(const PagedKVCache<float>& cache) {
  std::vector<std::int64_t> lengths;
  for (int seq : cache.sequences()) lengths.push_back(cache.length(seq));
  return lengths;
}

}  // namespace

TEST_CASE("blocks needed for a sequence") {
  CHECK(kvlab::blocks_needed(0, 16) == 0);  // no token, no block
  CHECK(kvlab::blocks_needed(1, 16) == 1);
  CHECK(kvlab::blocks_needed(16, 16) == 1);    // exactly full
  CHECK(kvlab::blocks_needed(17, 16) == 2);    // one past the boundary
  CHECK(kvlab::blocks_needed(700, 16) == 44);  // 43 · 16 = 688 < 700 <= 704
  CHECK(kvlab::blocks_needed(7, 1) == 7);
  const std::int64_t huge = std::numeric_limits<std::int64_t>::max();
  CHECK(kvlab::blocks_needed(huge, 2) == huge / 2 + 1);  // 2^63 - 1 is odd: rounds up, no overflow
}

TEST_CASE("footprints computed by hand") {
  // Four sequences of 100, 2048, 0 and 700 tokens, Llama-2-7B fp16 (524,288 bytes per token).
  const std::vector<std::int64_t> lengths{100, 2048, 0, 700};
  const std::uint64_t used_tokens = 100 + 2048 + 0 + 700;  // 2848

  SECTION("contiguous, max_len 2048") {
    // Reserved: 4 · 2048 = 8192 tokens = 8192 · 524,288 = 4,294,967,296 bytes (4 GiB).
    // Used: 2848 tokens = 1,493,172,224 bytes. Waste: 8192 - 2848 = 5344 tokens,
    // 5344 / 8192 = 0.65234375 of the reservation.
    const MemoryFootprint f = kvlab::contiguous_footprint(lengths, 2048, kLlamaToken);
    CHECK(f.reserved_bytes == 4294967296ULL);
    CHECK(f.used_bytes == 1493172224ULL);
    CHECK(f.used_bytes == used_tokens * kLlamaToken);
    CHECK(f.waste_bytes() == 5344 * kLlamaToken);
    CHECK(f.waste_fraction() == 0.65234375);  // exact in binary: 167 / 256
    CHECK(f.used_fraction() == 1 - 0.65234375);
  }
  SECTION("paged, block_size 16") {
    // Blocks: ceil(100/16) = 7 (112 tokens), ceil(2048/16) = 128 (2048), 0, ceil(700/16) = 44
    // (704). Reserved 112 + 2048 + 704 = 2864 tokens; waste 12 + 0 + 0 + 4 = 16 tokens.
    const MemoryFootprint f = kvlab::paged_footprint(lengths, 16, kLlamaToken);
    CHECK(f.reserved_bytes == 2864 * kLlamaToken);
    CHECK(f.used_bytes == used_tokens * kLlamaToken);
    CHECK(f.waste_bytes() == 16 * kLlamaToken);
    CHECK(f.waste_fraction() == Approx(16.0 / 2864.0).epsilon(1e-15));
  }
  SECTION("paged, block_size 1: nothing wasted") {
    const MemoryFootprint f = kvlab::paged_footprint(lengths, 1, 1);
    CHECK(f.reserved_bytes == used_tokens);
    CHECK(f.waste_bytes() == 0);
    CHECK(f.waste_fraction() == 0.0);
  }
  SECTION("paged, one block larger than any sequence") {
    // Each non-empty sequence takes one block of 4096: 3 · 4096 = 12288 tokens.
    const MemoryFootprint f = kvlab::paged_footprint(lengths, 4096, 1);
    CHECK(f.reserved_bytes == 12288);
    CHECK(f.used_bytes == used_tokens);
  }
  SECTION("nothing reserved") {
    const MemoryFootprint none = kvlab::paged_footprint({}, 16, kLlamaToken);
    CHECK(none.reserved_bytes == 0);
    CHECK(none.waste_fraction() == 0.0);
    CHECK(none.used_fraction() == 1.0);
    const MemoryFootprint empty = kvlab::paged_footprint({0, 0}, 16, kLlamaToken);
    CHECK(empty.reserved_bytes == 0);
    CHECK(kvlab::contiguous_footprint({}, 2048, kLlamaToken).reserved_bytes == 0);
  }
}

TEST_CASE("sequences that fit in a budget, by hand") {
  // Contiguous: each sequence reserves 2048 · 512 KiB = 1 GiB; 20 GiB hold 20 of them.
  CHECK(kvlab::max_contiguous_sequences(20 * kGiB, 2048, kLlamaToken) == 20);
  CHECK(kvlab::max_contiguous_sequences(20 * kGiB - 1, 2048, kLlamaToken) == 19);
  CHECK(kvlab::max_contiguous_sequences(kGiB - 1, 2048, kLlamaToken) == 0);
  // A reservation of 2^62 · 2^10 bytes overflows 64 bits, so it exceeds every budget.
  CHECK(kvlab::max_contiguous_sequences(~std::uint64_t{0}, std::int64_t{1} << 62, 1024) == 0);

  // Paged: blocks of 16 · 512 KiB = 8 MiB; 20 GiB hold 20 · 1024 / 8 = 2560 blocks.
  CHECK(kvlab::blocks_in_budget(20 * kGiB, 16, kLlamaToken) == 2560);
  CHECK(kvlab::blocks_in_budget(20 * kGiB - 1, 16, kLlamaToken) == 2559);
  CHECK(kvlab::blocks_in_budget(15, 16, 1) == 0);
  CHECK(kvlab::blocks_in_budget(~std::uint64_t{0}, 1 << 30, std::uint64_t{1} << 40) == 0);

  // A pool of 10 blocks of 4 tokens (budget 43 bytes at 1 byte per token: floor(43 / 4) = 10).
  // Blocks needed: 5 -> 2, 8 -> 2, 0 -> 0, 13 -> 4, 3 -> 1, 9 -> 3, 1 -> 1. Running total
  // 2, 4, 4, 8, 9, then 9 + 3 = 12 > 10: five are admitted. The last (1 block) would fit, but
  // admission is first come, first served and stops at the first that does not.
  const std::vector<std::int64_t> lengths{5, 8, 0, 13, 3, 9, 1};
  CHECK(kvlab::max_paged_sequences(lengths, 4, 1, 43) == 5);
  CHECK(kvlab::max_paged_sequences(lengths, 4, 1, 44) == 5);  // 11 blocks: 12 still > 11
  CHECK(kvlab::max_paged_sequences(lengths, 4, 1, 48) == 6);  // 12 blocks: 12 fit, 12 + 1 > 12
  CHECK(kvlab::max_paged_sequences(lengths, 4, 1, 52) == 7);  // 13 blocks: all seven fit
  CHECK(kvlab::max_paged_sequences(lengths, 4, 1, 3) == 0);   // no block at all
  CHECK(kvlab::max_paged_sequences({0, 0}, 4, 1, 0) == 2);    // empty sequences need no block
  CHECK(kvlab::max_paged_sequences({}, 4, 1, 100) == 0);
}

TEST_CASE("max_paged_sequences: as many as a real PagedKVCache of that budget admits") {
  for (int block_size : {1, 3, 16}) {
    INFO("block_size " << block_size);
    kvlab::Rng rng(100 + static_cast<std::uint64_t>(block_size));
    std::vector<std::int64_t> lengths;
    for (int i = 0; i < 60; ++i)
      lengths.push_back(1 + static_cast<std::int64_t>(rng.uniform() * 90));
    const std::uint64_t bytes_per_token = 12;  // any value: it scales budget and blocks alike
    const std::uint64_t budget = 1500 * bytes_per_token + 7;
    const auto pool =
        static_cast<int>(kvlab::blocks_in_budget(budget, block_size, bytes_per_token));
    REQUIRE(pool == 1500 / block_size);

    PagedKVCache<float> cache(1, 1, 1, block_size, pool);
    std::size_t admitted = 0;
    for (std::int64_t len : lengths) {
      const int seq = cache.add_sequence();
      try {
        cache.reserve(seq, static_cast<int>(len));
      } catch (const kvlab::OutOfBlocks&) {
        break;
      }
      ++admitted;
    }
    REQUIRE(admitted < lengths.size());  // the budget is the limit, not the list
    CHECK(kvlab::max_paged_sequences(lengths, block_size, bytes_per_token, budget) == admitted);
    // The admitted prefix: the live cache and the formula agree on every byte.
    const std::vector<std::int64_t> prefix(lengths.begin(),
                                           lengths.begin() + static_cast<std::ptrdiff_t>(admitted));
    const MemoryFootprint formula = kvlab::paged_footprint(prefix, block_size, bytes_per_token);
    const MemoryFootprint live = kvlab::paged_cache_footprint(cache, bytes_per_token);
    CHECK(live.reserved_bytes == formula.reserved_bytes);
    CHECK(live.used_bytes == formula.used_bytes);
  }
}

TEST_CASE("a live cache's footprint counts shared blocks once, copies separately") {
  // Block size 4, 1 layer, 1 K/V head, head_dim 2, float: 2 · 1 · 1 · 2 · 4 = 16 bytes per token.
  PagedKVCache<float> cache(1, 1, 2, 4, 10);
  CHECK(kvlab::cache_bytes_per_token(cache) == 16);
  const int a = cache.add_sequence();
  append_tokens(cache, a, 5);   // blocks: [4 tokens][1 token]
  const int b = cache.fork(a);  // shares both blocks
  MemoryFootprint f = kvlab::paged_cache_footprint(cache, 1);
  CHECK(f.reserved_bytes == 8);  // 2 distinct blocks · 4
  CHECK(f.used_bytes == 5);      // 5 tokens, stored once
  // The lengths formula counts each sequence's blocks on their own: 2 · 8 reserved, 2 · 5 used.
  CHECK(kvlab::paged_footprint({5, 5}, 4, 1).reserved_bytes == 16);

  append_tokens(cache, a,
                1);  // copy on write: a gets its own copy of the last block (1 + 1 tokens)
  f = kvlab::paged_cache_footprint(cache, 1);
  CHECK(f.reserved_bytes == 12);     // shared [4], b's [1], a's copy [2]: 3 blocks
  CHECK(f.used_bytes == 4 + 1 + 2);  // the copied token is stored twice
  CHECK(f.waste_bytes() == 3 + 2);   // tails of the two last blocks
  CHECK(kvlab::paged_cache_footprint(cache).reserved_bytes == 12 * 16);  // in the cache's own bytes
  CHECK(kvlab::paged_cache_footprint(cache).used_bytes == 7 * 16);

  cache.free_sequence(b);  // b's last block returns; the first block loses a holder
  f = kvlab::paged_cache_footprint(cache, 1);
  CHECK(f.reserved_bytes == 8);
  CHECK(f.used_bytes == 6);
  CHECK(f.reserved_bytes == kvlab::paged_footprint({6}, 4, 1).reserved_bytes);

  // Truncating a fork: c shares a's two blocks [4][2], then keeps only 5 tokens. Its second
  // block is still the shared one, which holds 2 tokens for a and 1 for c: counted once, with
  // a's 2 tokens. Then a truncated to 1 token leaves slots of block 0 that only c uses.
  const int c = cache.fork(a);
  cache.truncate(c, 5);
  f = kvlab::paged_cache_footprint(cache, 1);
  CHECK(f.reserved_bytes == 8);
  CHECK(f.used_bytes == 6);
  cache.truncate(a, 1);  // a: [1 of block 0]; c: [4 of block 0][1 of block 1]
  f = kvlab::paged_cache_footprint(cache, 1);
  CHECK(f.reserved_bytes == 8);
  CHECK(f.used_bytes == 5);  // block 0 filled 4 (by c), block 1 filled 1 (by c)
  cache.truncate(c, 0);      // c gives up both blocks; block 1 returns to the pool
  f = kvlab::paged_cache_footprint(cache, 1);
  CHECK(f.reserved_bytes == 4);
  CHECK(f.used_bytes == 1);  // the slots a dropped are waste until overwritten
}

TEST_CASE(
    "the formulas agree with a real PagedKVCache under random appends, forks, truncations and "
    "frees") {
  const std::uint64_t bytes_per_token = kLlamaToken;  // account the small cache as Llama-2-7B
  for (int block_size : {1, 3, 16}) {
    for (bool with_forks : {false, true}) {
      INFO("block_size " << block_size << (with_forks ? ", with forks" : ", no forks"));
      PagedKVCache<float> cache(1, 1, 2, block_size, 400);
      kvlab::Rng rng(7 * static_cast<std::uint64_t>(block_size) + (with_forks ? 1 : 0));
      // 3000 operations; 1000 under AddressSanitizer (kSanitized), where each is ~15x slower
      const int operations = kvlab_test::kSanitized ? 1000 : 3000;
      int checks = 0;
      for (int op = 0; op < operations; ++op) {
        const std::vector<int> live = cache.sequences();
        const double r = rng.uniform();
        const int pick =
            live.empty()
                ? -1
                : live[static_cast<std::size_t>(rng.uniform() * static_cast<double>(live.size()))];
        if (live.empty() || r < 0.15) {
          cache.add_sequence();
        } else if (r < 0.75) {
          const int n = 1 + static_cast<int>(rng.uniform() * (2 * block_size + 1));
          try {
            append_tokens(cache, pick, n);
          } catch (const kvlab::OutOfBlocks&) {
            cache.free_sequence(pick);  // the pool is full: end this request
          }
        } else if (r < 0.85 && with_forks) {
          cache.fork(pick);
        } else if (r < 0.92) {  // rewind: keep a random prefix (blocks past it lose a holder)
          cache.truncate(pick, static_cast<int>(rng.uniform() * (cache.length(pick) + 1)));
        } else {
          cache.free_sequence(pick);
        }

        const MemoryFootprint live_f = kvlab::paged_cache_footprint(cache, bytes_per_token);
        const std::vector<std::int64_t> lengths = live_lengths(cache);
        const MemoryFootprint formula =
            kvlab::paged_footprint(lengths, block_size, bytes_per_token);
        // Reserved: exactly the allocator's blocks in use.
        REQUIRE(live_f.reserved_bytes == static_cast<std::uint64_t>(cache.allocator().num_used()) *
                                             static_cast<std::uint64_t>(block_size) *
                                             bytes_per_token);
        // Used: exactly the distinct slots holding a token.
        REQUIRE(live_f.used_bytes == distinct_slots(cache) * bytes_per_token);
        if (!with_forks) {
          // No sharing: the cache holds exactly what the lengths formula says.
          REQUIRE(live_f.reserved_bytes == formula.reserved_bytes);
          REQUIRE(live_f.used_bytes == formula.used_bytes);
        } else {
          // Sharing only saves: never more than the formula without sharing.
          REQUIRE(live_f.reserved_bytes <= formula.reserved_bytes);
          REQUIRE(live_f.used_bytes <= formula.used_bytes);
        }
        // Paging wastes less than one block per live sequence (only last blocks are partial),
        // in the live cache and in the formula.
        const auto live_count = static_cast<std::uint64_t>(lengths.size());
        const std::uint64_t one_block_each =
            live_count * static_cast<std::uint64_t>(block_size - 1) * bytes_per_token;
        REQUIRE(live_f.waste_bytes() <= one_block_each);
        REQUIRE(formula.waste_bytes() <= one_block_each);
        ++checks;
      }
      CHECK(checks == operations);
      if (with_forks) CHECK(cache.allocator().num_used() > 0);
    }
  }
}

TEST_CASE("paging wastes less than one block per sequence, contiguous wastes max_len - len") {
  kvlab::Rng rng(11);
  std::vector<std::int64_t> lengths;
  for (int i = 0; i < 500; ++i)
    lengths.push_back(1 + static_cast<std::int64_t>(rng.uniform() * 2048));
  std::uint64_t total = 0;
  for (std::int64_t len : lengths) total += static_cast<std::uint64_t>(len);
  const MemoryFootprint c = kvlab::contiguous_footprint(lengths, 2048, 1);
  CHECK(c.waste_bytes() == 500 * 2048 - total);
  for (int block_size : {1, 8, 16, 32, 64, 128, 256}) {
    INFO("block_size " << block_size);
    const MemoryFootprint p = kvlab::paged_footprint(lengths, block_size, 1);
    std::uint64_t tails = 0;  // the unused tail of each last block, summed directly
    for (std::int64_t len : lengths) {
      const std::int64_t in_last = len % block_size;
      tails += static_cast<std::uint64_t>(in_last == 0 ? 0 : block_size - in_last);
    }
    CHECK(p.waste_bytes() == tails);
    CHECK(p.waste_bytes() <= 500 * static_cast<std::uint64_t>(block_size - 1));
    CHECK(p.waste_fraction() < c.waste_fraction());
  }
}

TEST_CASE("memory accounting: bad arguments and overflow") {
  const std::int64_t i64_max = std::numeric_limits<std::int64_t>::max();
  CHECK_THROWS_MATCHES(kvlab::blocks_needed(-1, 4), InvalidArgument, names("tokens", ">= 0", "-1"));
  CHECK_THROWS_MATCHES(kvlab::blocks_needed(5, 0), InvalidArgument,
                       names("block_size", ">= 1", "0"));

  CHECK_THROWS_MATCHES(kvlab::contiguous_footprint({1, 3000}, 2048, 1), InvalidArgument,
                       names("lengths[1]", "in [0, max_len (2048)]", "3000"));
  CHECK_THROWS_MATCHES(kvlab::contiguous_footprint({-2}, 2048, 1), InvalidArgument,
                       names("lengths[0]", ">= 0", "-2"));
  CHECK_THROWS_MATCHES(kvlab::contiguous_footprint({1}, 0, 1), InvalidArgument,
                       names("max_len", ">= 1", "0"));
  CHECK_THROWS_MATCHES(kvlab::contiguous_footprint({1}, 2048, 0), InvalidArgument,
                       names("bytes_per_token", ">= 1", "0"));
  // 4 sequences of 2^62 tokens: 2^64 tokens do not fit; at most floor((2^64 - 1) / 2^62) = 3.
  CHECK_THROWS_MATCHES(kvlab::contiguous_footprint({1, 1, 1, 1}, std::int64_t{1} << 62, 1),
                       InvalidArgument,
                       names("lengths.size()",
                             "at most 3 sequences of max_len 4611686018427387904 (so that the "
                             "size fits in std::uint64_t)",
                             "4"));
  // 2^40 tokens · 2^24 bytes = 2^64: at most floor((2^64 - 1) / 2^40) = 2^24 - 1 bytes per token.
  CHECK_THROWS_MATCHES(
      kvlab::contiguous_footprint({1}, std::int64_t{1} << 40, std::uint64_t{1} << 24),
      InvalidArgument,
      names("bytes_per_token",
            "at most 16777215 for 1099511627776 reserved tokens (so that the "
            "size fits in std::uint64_t)",
            "16777216"));

  CHECK_THROWS_MATCHES(kvlab::paged_footprint({1}, 0, 1), InvalidArgument,
                       names("block_size", ">= 1", "0"));
  CHECK_THROWS_MATCHES(kvlab::paged_footprint({4, -1}, 16, 1), InvalidArgument,
                       names("lengths[1]", ">= 0", "-1"));
  CHECK_THROWS_MATCHES(kvlab::paged_footprint({1}, 16, 0), InvalidArgument,
                       names("bytes_per_token", ">= 1", "0"));
  // Three lengths of 2^63 - 1 at block size 1: the first two reserve 2^64 - 2 tokens, so the
  // third may add at most 1.
  CHECK_THROWS_MATCHES(kvlab::paged_footprint({i64_max, i64_max, i64_max}, 1, 1), InvalidArgument,
                       names("lengths[2]",
                             "at most 1 tokens in blocks after the 18446744073709551614 reserved "
                             "before it (so that the size fits in std::uint64_t)",
                             "9223372036854775807"));
  // 2^62 tokens · 4 bytes = 2^64.
  CHECK_THROWS_MATCHES(kvlab::paged_footprint({std::int64_t{1} << 62}, 1, 4), InvalidArgument,
                       names("bytes_per_token",
                             "at most 3 for 4611686018427387904 reserved tokens (so that the size "
                             "fits in std::uint64_t)",
                             "4"));

  CHECK_THROWS_MATCHES(kvlab::max_contiguous_sequences(100, 0, 1), InvalidArgument,
                       names("max_len", ">= 1", "0"));
  CHECK_THROWS_MATCHES(kvlab::max_contiguous_sequences(100, 4, 0), InvalidArgument,
                       names("bytes_per_token", ">= 1", "0"));
  CHECK_THROWS_MATCHES(kvlab::blocks_in_budget(100, 0, 1), InvalidArgument,
                       names("block_size", ">= 1", "0"));
  CHECK_THROWS_MATCHES(kvlab::blocks_in_budget(100, 4, 0), InvalidArgument,
                       names("bytes_per_token", ">= 1", "0"));
  CHECK_THROWS_MATCHES(kvlab::max_paged_sequences({3, -5}, 4, 1, 100), InvalidArgument,
                       names("lengths[1]", ">= 0", "-5"));
  CHECK_THROWS_MATCHES(kvlab::max_paged_sequences({3}, -4, 1, 100), InvalidArgument,
                       names("block_size", ">= 1", "-4"));
  CHECK_THROWS_MATCHES(kvlab::max_paged_sequences({3}, 4, 0, 100), InvalidArgument,
                       names("bytes_per_token", ">= 1", "0"));

  PagedKVCache<float> cache(1, 1, 1, 4, 4);
  cache.reserve(cache.add_sequence(), 3);
  CHECK_THROWS_MATCHES(kvlab::paged_cache_footprint(cache, 0), InvalidArgument,
                       names("bytes_per_token", ">= 1", "0"));
  // 4 reserved tokens · 2^62 bytes = 2^64.
  CHECK_THROWS_MATCHES(kvlab::paged_cache_footprint(cache, std::uint64_t{1} << 62), InvalidArgument,
                       names("bytes_per_token",
                             "at most 4611686018427387903 for 4 reserved tokens (so that the size "
                             "fits in std::uint64_t)",
                             "4611686018427387904"));
}
