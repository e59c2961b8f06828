// bench_window: what a sliding window saves over a long generation. One attention layer (GQA:
// 32 query heads, 8 K/V heads, head_dim 128; 8 KiB of K+V per token in fp32) decodes a sequence
// token by token up to --tokens (default 32768), through three stores:
//   full        ContiguousStore holding every token (capacity = --tokens)
//   ring        ContiguousStore with a window of W (default 1024): a ring of 2W - 1 slots
//   paged       PagedStore, blocks of 16, with the same window: the blocks before it go back
// Every --every tokens (default 1024) it records each store's memory held (KVStore::bytes_used;
// paged: the blocks held) and the median time of a decode step over 5 steps (append K/V of one
// token + attention; the projections are not part of it; between those points the tokens are
// only appended). The window's steps stay flat in time
// and memory once the sequence passes W; the full cache's grow linearly. Before timing, the
// windowed stores are checked against each other (same outputs within 1e-5).
//
// Build and run (Release, from the repository root):
//   cmake --build build-bench --target bench_window
//   build-bench/bench/bench_window
// --help lists the options.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <kvlab/kvlab.hpp>

#include "support/cli.hpp"
#include "support/stats.hpp"
#include "timing.hpp"

namespace {

struct Options {
  int tokens = 32768;
  int window = 1024;
  int every = 1024;
  int threads = 1;
};

bool parse(int argc, char** argv, Options& o) {
  using namespace kvlab_support;
  CLI::App app{
      "bench_window: what a sliding window saves over a long generation: memory held and decode "
      "step time of a full cache, a ring and a paged store with blocks given back."};
  add_integer(app, "--tokens", o.tokens, "tokens decoded", 2, 1 << 20);
  add_integer(app, "--window", o.window, "the sliding window", 1, 1 << 20);
  add_integer(app, "--every", o.every, "record memory and step time every E tokens", 1, 1 << 20);
  add_integer(app, "--threads", o.threads, "OpenMP threads", 1, 256);
  return kvlab_support::parse(app, argc, argv);
}

// One decode step of `store` for its sequence `seq`: K/V of one token appended and, when
// `attend`, its query attending (the output in `out`). Between the recorded points the tokens
// are only appended: what a store keeps does not depend on the attention.
void step(kvlab::KVStore<float>& store, int seq, const kvlab::AttentionShape& shape,
          const kvlab::RowMatrix<float>& x, const kvlab::RowMatrix<float>& kv,
          const kvlab::RowMatrix<float>& q, kvlab::RowMatrix<float>& out, bool attend) {
  kvlab::RowMatrix<float> inputs;  // [1, 1]: the store's layer-0 input (unused here)
  store.begin_step({seq}, {0, 1}, x, inputs);
  store.append(0, kv, kv);
  if (attend) store.attend(0, shape, q, {0, 1}, out, nullptr);
  store.end_step();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const auto stop = kvlab_support::read_command_line("bench_window", argc, argv, o, parse))
    return *stop;
  try {
    kvlab_support::set_threads(o.threads);
    const kvlab::AttentionShape shape(32, 8, 128);
    const int w = std::min(o.window, o.tokens);
    kvlab::ContiguousStore<float> full(1, 8, 128, o.tokens);
    kvlab::ContiguousStore<float> ring(1, 8, 128, 2 * w - 1, w);
    kvlab::PagedStore<float> paged(1, 8, 128, 16, (o.tokens + 15) / 16 + 1, kvlab::KVLayout::NHD,
                                   w);
    kvlab::KVStore<float>* stores[] = {&full, &ring, &paged};
    int seqs[3];
    for (int i = 0; i < 3; ++i) seqs[i] = stores[i]->add_sequence();
    kvlab::Rng rng(3);
    const kvlab::RowMatrix<float> x = kvlab::RowMatrix<float>::Zero(1, 1);  // [1, 1]
    kvlab::RowMatrix<float> out, check;
    std::printf("bench_window: GQA 32/8 x 128, window %d, %d tokens, %d thread%s\n", w, o.tokens,
                o.threads, o.threads == 1 ? "" : "s");
    std::printf("%8s | %-10s %10s | %-10s %10s | %-10s %10s\n", "tokens", "full MiB", "step us",
                "ring MiB", "step us", "paged MiB", "step us");
    for (int t = 0; t < o.tokens;) {
      const bool record = (t + 1) % o.every == 0 || t + 6 > o.tokens;
      // [1, kv_width] and [1, q_width]: one token's K (also its V) and query
      const kvlab::RowMatrix<float> kv = kvlab::random_matrix<float>(1, shape.kv_width(), rng);
      const kvlab::RowMatrix<float> q = kvlab::random_matrix<float>(1, shape.q_width(), rng);
      if (!record || t + 5 > o.tokens) {
        for (int i = 0; i < 3; ++i) step(*stores[i], seqs[i], shape, x, kv, q, out, false);
        ++t;
        continue;
      }
      // 5 timed steps per store; the medians printed with the memory after them
      double median_us[3];
      std::vector<double> times[3];
      for (int r = 0; r < 5; ++r, ++t) {
        const kvlab::RowMatrix<float> k_r = kvlab::random_matrix<float>(1, shape.kv_width(), rng);
        for (int i = 0; i < 3; ++i) {
          const auto begin = std::chrono::steady_clock::now();
          step(*stores[i], seqs[i], shape, x, k_r, q, out, true);
          times[i].push_back(
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - begin)
                  .count());
          if (i == 1) check = out;
          if (i == 2 && kvlab_bench::row_relative_difference(out, check) > 1e-5)
            throw std::runtime_error("the ring and the paged store differ at token " +
                                     std::to_string(t));
        }
      }
      for (int i = 0; i < 3; ++i) median_us[i] = kvlab_support::median(times[i]);
      std::printf("%8d | %-10.1f %10.1f | %-10.2f %10.1f | %-10.2f %10.1f\n", t,
                  static_cast<double>(full.bytes_used()) / (1 << 20), median_us[0],
                  static_cast<double>(ring.bytes_reserved()) / (1 << 20), median_us[1],
                  static_cast<double>(paged.bytes_reserved()) / (1 << 20), median_us[2]);
    }
    std::printf(
        "ring: %d slots (2W - 1); paged: blocks of 16, at most ceil((W - 1 + 1) / 16) + 1 "
        "= %d held (%d now)\n",
        2 * w - 1, w / 16 + 1 + (w % 16 != 0 ? 1 : 0), paged.cache().held_blocks(seqs[2]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_window: %s\n", e.what());
    return 1;
  }
  return 0;
}
