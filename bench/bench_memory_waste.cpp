// bench_memory_waste: how much KV-cache memory contiguous max-length preallocation and paging
// waste, and how many sequences each fits in one memory budget, on a stated synthetic workload.
// Deterministic (no timing): the same options print the same table on every run. (Across
// machines, a C library whose log, exp or cos differs in the last bit could move a rare length
// by one token.)
//
// Workload (fixed by --seed): N requests (--requests, 100,000 by default). Each has a total length
// L (prompt + output tokens) drawn from a log-normal distribution, ln L ~ Normal(ln median,
// sigma²), median 256 and sigma 1.0 by default (mean about 256 · e^0.5 ≈ 422 before clamping),
// rounded to the nearest integer and clamped to [2, max_len]; its prompt is P = 1 + floor(u · (L -
// 1)) tokens, u uniform in [0, 1), so a request has at least one prompt and one output token.
// Normal draws use Box–Muller on kvlab::Rng::uniform(). The distribution is chosen to look like a
// chat service (most requests short, a long tail); it is not fitted to any trace.
//
// max_len 2048: a contiguous cache must reserve, when a request starts, room for the most tokens
// it may ever hold, because the output length is not known in advance; 2048 is the context length
// of the GPT-3 / OPT era (Llama-2 allows 4096, which would make contiguous waste larger still).
//
// Model and budget: Llama-2-7B in fp16, 524,288 bytes of K and V per token
// (kvlab::bytes_per_token), and a KV budget of 20 GiB (40,960 tokens). The budget is an
// assumption, of the order of what a 40 GB GPU leaves after the weights (7 B parameters · 2 bytes
// ≈ 14 GB) and the activations; --budget-gib changes it. Waste fractions do not depend on it.
//
// Layouts:
//   contiguous, reserve max_len   each request reserves max_len tokens when it starts
//   contiguous, reserve final L   an oracle that knows each request's final length L
//   paged, block b                blocks of b tokens taken when needed (b = 1, 8, ..., 256)
//
// Figures, each summed over all requests before dividing (so long requests weigh more):
//   waste at finish   (reserved - used) / reserved with every request at its final length L:
//                     the reservation a request holds when it completes.
//   waste, lifetime   the same, summed over every step of every request: a request holds
//                     t = P, P + 1, ..., L tokens, one decode step each (the prompt at once, then
//                     one token per step). If all steps take equal time this is what a snapshot
//                     of a busy server sees on average. For one request, contiguous waste is
//                     largest early, when few reserved slots are filled; summed over steps,
//                     though, long requests weigh more (they take more steps and fill more of
//                     max_len), so this can be below the waste at finish. For the oracle it is
//                     all room reserved for tokens not generated yet.
//   sequences         how many requests fit in the budget at their final lengths, admitted in
//                     arrival order (kvlab::max_paged_sequences: first come, first served). The
//                     request stream is cut into consecutive rounds, each admitting as many as
//                     fit; mean, min and max over the complete rounds. Contiguous: always
//                     floor(budget / (max_len · bytes per token)). The oracle reserves L tokens
//                     per request, so it fits exactly as many as paging with block size 1.
//
// Check: for every block size the first round is replayed on a real kvlab::PagedKVCache<float>
// (1 layer, 1 K/V head, head_dim 1, a pool of the budget's blocks): every admitted request
// prefills P tokens and decodes one token per step until L, and is freed at L. The cache must
// admit the same count (the next request's append must throw OutOfBlocks), its footprint after
// the prefill and the blocks in use summed over all steps must equal the formulas. The program
// exits 1 on any mismatch.
//
// bench/results/README.md puts the results beside vLLM's published figures, with their sources.
//
// Build and run (Release):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target bench_memory_waste
//   build/bench/bench_memory_waste [--requests N] [--seed S] [--budget-gib G] [--max-len M]
//                                  [--median T] [--sigma S] [--json FILE]
// --help lists the options.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <kvlab/analysis/memory_accounting.hpp>
#include <kvlab/kvlab.hpp>

#include "support/cli.hpp"
#include "support/json.hpp"

namespace {

constexpr double kPi = 3.14159265358979323846;
const int kBlockSizes[] = {1, 8, 16, 32, 64, 128, 256};

struct Options {
  long requests = 100000;
  std::uint64_t seed = 1;
  long budget_gib = 20;
  long max_len = 2048;
  long median = 256;
  double sigma = 1.0;
  std::string json;  // empty: no JSON
};

struct Request {
  std::int64_t prompt = 0;  // P tokens, in [1, total - 1]
  std::int64_t total = 0;   // L tokens, prompt + output, in [2, max_len]
};

// The workload: see the comment at the top.
std::vector<Request> make_workload(const Options& o, long& clamped_high, long& clamped_low) {
  kvlab::Rng rng(o.seed);
  std::vector<Request> requests(static_cast<std::size_t>(o.requests));
  clamped_high = clamped_low = 0;
  for (Request& r : requests) {
    const double u1 = 1.0 - rng.uniform();  // (0, 1]: log is finite
    const double u2 = rng.uniform();
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);  // Normal(0, 1)
    const double x = static_cast<double>(o.median) * std::exp(o.sigma * z);
    if (x >= static_cast<double>(o.max_len)) {
      r.total = o.max_len;
      if (std::llround(x) > o.max_len) ++clamped_high;
    } else {
      r.total = std::max<std::int64_t>(2, std::llround(x));
      if (std::llround(x) < 2) ++clamped_low;
    }
    r.prompt = 1 + static_cast<std::int64_t>(rng.uniform() * static_cast<double>(r.total - 1));
  }
  return requests;
}

// Reserved and used tokens summed over requests (at finish) or over all their steps (lifetime).
struct Tokens {
  std::uint64_t reserved = 0;
  std::uint64_t used = 0;
  double waste() const {
    return reserved == 0 ? 0.0
                         : static_cast<double>(reserved - used) / static_cast<double>(reserved);
  }
};

// One line of the table.
struct Row {
  std::string layout;
  int block_size = 0;             // 0 for the contiguous layouts
  kvlab::MemoryFootprint finish;  // bytes, every request at its final length
  Tokens lifetime;
  double tail_per_request = 0;    // mean unused tokens per request at finish
  std::uint64_t pool_blocks = 0;  // blocks in the budget (paged)
  double seq_mean = 0;
  std::size_t seq_min = 0, seq_max = 0, rounds = 0;
  bool checked = false;  // replayed on a real PagedKVCache
};

// Sequences per round over the request stream; complete rounds only.
void rounds(const std::vector<std::int64_t>& lengths, int block_size, std::uint64_t bytes_per_token,
            std::uint64_t budget, Row& row) {
  const std::uint64_t pool = kvlab::blocks_in_budget(budget, block_size, bytes_per_token);
  std::size_t start = 0, count = 0, total = 0;
  row.seq_min = SIZE_MAX;
  row.seq_max = 0;
  while (start < lengths.size()) {
    // A round admits at most `pool` non-empty requests; look one further to see where it stops.
    const std::size_t end = static_cast<std::size_t>(std::min<std::uint64_t>(
        lengths.size(), start + std::min<std::uint64_t>(pool + 1, lengths.size())));
    const std::vector<std::int64_t> window(lengths.begin() + static_cast<std::ptrdiff_t>(start),
                                           lengths.begin() + static_cast<std::ptrdiff_t>(end));
    const std::size_t k = kvlab::max_paged_sequences(window, block_size, bytes_per_token, budget);
    if (k == 0) throw std::runtime_error("a single request does not fit in the budget");
    if (start + k >= lengths.size()) break;  // the stream ran out: an incomplete round
    row.seq_min = std::min(row.seq_min, k);
    row.seq_max = std::max(row.seq_max, k);
    total += k;
    ++count;
    start += k;
  }
  if (count == 0)
    throw std::runtime_error("too few requests for one complete round; raise --requests");
  row.rounds = count;
  row.seq_mean = static_cast<double>(total) / static_cast<double>(count);
}

// Replays the first round on a real PagedKVCache (see the comment at the top). Returns "" or
// what differed.
std::string replay_first_round(const std::vector<Request>& requests, int block_size,
                               std::uint64_t bytes_per_token, std::uint64_t budget) {
  std::vector<std::int64_t> lengths;
  for (const Request& r : requests) lengths.push_back(r.total);
  const std::size_t k = kvlab::max_paged_sequences(lengths, block_size, bytes_per_token, budget);
  const auto pool = static_cast<int>(kvlab::blocks_in_budget(budget, block_size, bytes_per_token));
  kvlab::PagedKVCache<float> cache(1, 1, 1, block_size, pool);
  std::ostringstream error;

  // Admission: each request in turn takes the blocks of its final length, until one cannot.
  {
    kvlab::PagedKVCache<float> probe(1, 1, 1, block_size, pool);
    std::size_t admitted = 0;
    for (const Request& r : requests) {
      try {
        probe.reserve(probe.add_sequence(), static_cast<int>(r.total));
      } catch (const kvlab::OutOfBlocks&) {
        break;
      }
      ++admitted;
    }
    if (admitted != k) error << "admitted " << admitted << " requests, formula " << k << "; ";
  }

  // Prefill every admitted request, then decode one token per step; free each at its length L.
  std::vector<int> seqs(k);
  std::vector<std::int64_t> prompts;
  Tokens formula;  // lifetime sums from the formulas, for the k requests
  for (std::size_t i = 0; i < k; ++i) {
    seqs[i] = cache.add_sequence();
    cache.reserve(seqs[i], static_cast<int>(requests[i].prompt));
    prompts.push_back(requests[i].prompt);
    for (std::int64_t t = requests[i].prompt; t <= requests[i].total; ++t) {
      formula.reserved +=
          static_cast<std::uint64_t>(kvlab::blocks_needed(t, block_size) * block_size);
      formula.used += static_cast<std::uint64_t>(t);
    }
  }
  const kvlab::MemoryFootprint after_prefill = kvlab::paged_cache_footprint(cache, bytes_per_token);
  const kvlab::MemoryFootprint want = kvlab::paged_footprint(prompts, block_size, bytes_per_token);
  if (after_prefill.reserved_bytes != want.reserved_bytes ||
      after_prefill.used_bytes != want.used_bytes) {
    error << "footprint after the prefill differs from paged_footprint; ";
  }
  Tokens live;
  std::size_t remaining = k;
  while (remaining > 0) {
    live.reserved += static_cast<std::uint64_t>(cache.allocator().num_used()) *
                     static_cast<std::uint64_t>(block_size);
    for (std::size_t i = 0; i < k; ++i) {
      if (seqs[i] < 0) continue;
      const std::int64_t len = cache.length(seqs[i]);
      live.used += static_cast<std::uint64_t>(len);
      if (len == requests[i].total) {
        cache.free_sequence(seqs[i]);
        seqs[i] = -1;
        --remaining;
      } else {
        cache.reserve(seqs[i], 1);  // cannot run out: the pool holds every request at length L
      }
    }
  }
  if (live.reserved != formula.reserved || live.used != formula.used) {
    error << "lifetime tokens reserved/used " << live.reserved << "/" << live.used << ", formula "
          << formula.reserved << "/" << formula.used << "; ";
  }
  if (cache.allocator().num_used() != 0) error << "blocks still in use after every request ended; ";
  return error.str();
}

std::string percent(double fraction) {
  char text[32];
  std::snprintf(text, sizeof text, "%6.2f %%", 100.0 * fraction);
  return text;
}

void print_row(const Row& r, double contiguous_sequences) {
  std::printf("%-29s  %9s  %13s  %10.1f  %6.1f  [%4zu, %4zu]  %8.2fx  %s\n", r.layout.c_str(),
              percent(r.finish.waste_fraction()).c_str(), percent(r.lifetime.waste()).c_str(),
              r.tail_per_request, r.seq_mean, r.seq_min, r.seq_max,
              r.seq_mean / contiguous_sequences,
              r.block_size > 0 ? (r.checked ? "yes" : "NO") : "-");
}

void write_json(const std::string& path, const Options& o, const std::vector<Request>& requests,
                const std::vector<std::int64_t>& sorted, double mean_len, long clamped_high,
                long clamped_low, std::uint64_t bytes_per_token, std::uint64_t budget,
                const std::vector<Row>& rows) {
  using kvlab_support::Json;
  const auto pct = [&](double q) {
    return sorted[static_cast<std::size_t>(q * static_cast<double>(sorted.size() - 1))];
  };
  Json json = {
      {"program", "bench_memory_waste"},
      {"workload",
       {{"requests", requests.size()},
        {"seed", o.seed},
        {"total_length", "lognormal, rounded, clamped to [2, max_len]"},
        {"median", o.median},
        {"sigma", o.sigma},
        {"max_len", o.max_len},
        {"prompt", "1 + floor(u * (L - 1)), u uniform in [0, 1)"},
        {"mean_total", mean_len},
        {"p50_total", pct(0.5)},
        {"p90_total", pct(0.9)},
        {"p99_total", pct(0.99)},
        {"clamped_to_max_len", clamped_high},
        {"clamped_to_2", clamped_low}}},
      {"model", {{"name", "Llama-2-7B"}, {"dtype", "fp16"}, {"bytes_per_token", bytes_per_token}}},
      {"budget_bytes", budget},
      {"budget_tokens", budget / bytes_per_token},
      {"layouts", Json::array()}};
  for (const Row& r : rows) {
    json["layouts"].push_back({{"layout", r.layout},
                               {"block_size", r.block_size},
                               {"reserved_bytes_at_finish", r.finish.reserved_bytes},
                               {"used_bytes_at_finish", r.finish.used_bytes},
                               {"waste_at_finish", r.finish.waste_fraction()},
                               {"lifetime_reserved_token_steps", r.lifetime.reserved},
                               {"lifetime_used_token_steps", r.lifetime.used},
                               {"waste_lifetime", r.lifetime.waste()},
                               {"unused_tokens_per_request_at_finish", r.tail_per_request},
                               {"pool_blocks", r.pool_blocks},
                               {"sequences_mean", r.seq_mean},
                               {"sequences_min", r.seq_min},
                               {"sequences_max", r.seq_max},
                               {"rounds", r.rounds},
                               {"replayed_on_paged_kv_cache", r.checked}});
  }
  kvlab_support::write_json_file(path, json);
}

// --- options -------------------------------------------------------------------------------

// Returns false when --help was given (and printed).
bool parse_options(int argc, char** argv, Options& o) {
  using namespace kvlab_support;
  CLI::App app{
      "bench_memory_waste: how much KV-cache memory contiguous max-length preallocation and "
      "paging waste, and how many sequences each fits in one budget, on a synthetic workload of "
      "log-normal lengths (deterministic, no timing)."};
  add_integer(app, "--requests", o.requests, "requests in the synthetic workload", 1, 1000000);
  add_integer(app, "--seed", o.seed, "seed of the workload", 0, 2147483647);
  add_integer(app, "--budget-gib", o.budget_gib, "KV-cache budget in GiB", 1, 1024);
  add_integer(app, "--max-len", o.max_len,
              "tokens a contiguous cache reserves per request; lengths are clamped to it", 2,
              1 << 20);
  add_integer(app, "--median", o.median, "median total length in tokens", 1, 1 << 20);
  add_number(app, "--sigma", o.sigma, "sigma of ln(total length)", 0.0, 4.0);
  add_file(app, "--json", o.json, "also write the results as JSON");
  return kvlab_support::parse(app, argc, argv);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const auto stop =
          kvlab_support::read_command_line("bench_memory_waste", argc, argv, o, parse_options))
    return *stop;
  if (!kvlab_support::can_write("bench_memory_waste", "--json", o.json)) return 2;

  const kvlab::ModelConfig model = kvlab::llama2_7b_config();
  const std::uint64_t bytes_per_token = kvlab::bytes_per_token(model, kvlab::KVDtype::fp16);
  const std::uint64_t budget = static_cast<std::uint64_t>(o.budget_gib) << 30;
  long clamped_high = 0, clamped_low = 0;
  const std::vector<Request> requests = make_workload(o, clamped_high, clamped_low);
  std::vector<std::int64_t> lengths;
  std::uint64_t total_tokens = 0;
  for (const Request& r : requests) {
    lengths.push_back(r.total);
    total_tokens += static_cast<std::uint64_t>(r.total);
  }
  std::vector<std::int64_t> sorted = lengths;
  std::sort(sorted.begin(), sorted.end());
  const double mean_len = static_cast<double>(total_tokens) / static_cast<double>(lengths.size());
  const auto pct = [&](double q) {
    return sorted[static_cast<std::size_t>(q * static_cast<double>(sorted.size() - 1))];
  };

  std::printf("bench_memory_waste: KV-cache memory waste, contiguous preallocation vs paging\n");
  std::printf("model     %s, fp16: %llu bytes (%s) of K and V per token\n", model.name.c_str(),
              static_cast<unsigned long long>(bytes_per_token),
              kvlab::format_bytes(bytes_per_token).c_str());
  std::printf("budget    %s of KV cache = %llu tokens\n", kvlab::format_bytes(budget).c_str(),
              static_cast<unsigned long long>(budget / bytes_per_token));
  std::printf(
      "workload  %zu requests, seed %llu; total length L ~ log-normal (median %ld, sigma %.2f),\n"
      "          rounded, clamped to [2, %ld]; prompt 1 + floor(u (L - 1)), u ~ U[0, 1)\n",
      requests.size(), static_cast<unsigned long long>(o.seed), o.median, o.sigma, o.max_len);
  std::printf(
      "lengths   mean %.1f, p50 %lld, p90 %lld, p99 %lld, max %lld; %ld clamped to %ld, %ld to "
      "2\n\n",
      mean_len, static_cast<long long>(pct(0.5)), static_cast<long long>(pct(0.9)),
      static_cast<long long>(pct(0.99)), static_cast<long long>(sorted.back()), clamped_high,
      o.max_len, clamped_low);

  std::vector<Row> rows;
  bool all_checked = true;
  try {
    // Contiguous, reserve max_len.
    Row c;
    c.layout = "contiguous, reserve max_len";
    c.finish = kvlab::contiguous_footprint(lengths, o.max_len, bytes_per_token);
    for (const Request& r : requests) {
      for (std::int64_t t = r.prompt; t <= r.total; ++t) {
        c.lifetime.reserved += static_cast<std::uint64_t>(o.max_len);
        c.lifetime.used += static_cast<std::uint64_t>(t);
      }
    }
    c.tail_per_request = static_cast<double>(c.finish.waste_bytes() / bytes_per_token) /
                         static_cast<double>(requests.size());
    const std::uint64_t fit = kvlab::max_contiguous_sequences(budget, o.max_len, bytes_per_token);
    if (fit == 0) throw std::runtime_error("one max_len reservation does not fit in the budget");
    c.seq_mean = static_cast<double>(fit);
    c.seq_min = c.seq_max = static_cast<std::size_t>(fit);
    rows.push_back(c);

    // Contiguous, reserve the final length (an oracle): no waste at finish, but the slots for
    // tokens not yet generated are reserved from the start. Fits as many as paging with block 1.
    Row e;
    e.layout = "contiguous, reserve final L";
    e.finish = kvlab::paged_footprint(lengths, 1, bytes_per_token);  // reserved = used = sum L
    for (const Request& r : requests) {
      for (std::int64_t t = r.prompt; t <= r.total; ++t) {
        e.lifetime.reserved += static_cast<std::uint64_t>(r.total);
        e.lifetime.used += static_cast<std::uint64_t>(t);
      }
    }
    rounds(lengths, 1, bytes_per_token, budget, e);
    rows.push_back(e);

    for (int b : kBlockSizes) {
      Row p;
      p.layout = "paged, block " + std::to_string(b);
      p.block_size = b;
      p.finish = kvlab::paged_footprint(lengths, b, bytes_per_token);
      for (const Request& r : requests) {
        for (std::int64_t t = r.prompt; t <= r.total; ++t) {
          p.lifetime.reserved += static_cast<std::uint64_t>(kvlab::blocks_needed(t, b) * b);
          p.lifetime.used += static_cast<std::uint64_t>(t);
        }
      }
      p.tail_per_request = static_cast<double>(p.finish.waste_bytes() / bytes_per_token) /
                           static_cast<double>(requests.size());
      p.pool_blocks = kvlab::blocks_in_budget(budget, b, bytes_per_token);
      rounds(lengths, b, bytes_per_token, budget, p);
      const std::string error = replay_first_round(requests, b, bytes_per_token, budget);
      p.checked = error.empty();
      if (!p.checked) {
        std::fprintf(stderr, "bench_memory_waste: block %d: the real PagedKVCache differs: %s\n", b,
                     error.c_str());
        all_checked = false;
      }
      rows.push_back(p);
    }
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "bench_memory_waste: %s\n", ex.what());
    return 2;
  }

  std::printf("%-29s  %-24s  %10s  %s\n", "", "waste of the reservation", "unused",
              "sequences in the budget");
  std::printf("%-29s  %9s  %13s  %10s  %6s  %12s  %9s  %s\n", "layout", "at finish",
              "over lifetime", "tokens/req", "mean", "[min, max]", "vs contig", "replayed");
  for (const Row& r : rows) print_row(r, rows.front().seq_mean);
  std::printf(
      "\nwaste: (reserved - used) / reserved, summed over the requests at their final length\n"
      "  (at finish), or over every step of every request (over lifetime).\n"
      "unused tokens/req: reserved but unused tokens per request at finish; for paging, the\n"
      "  tail of the last block, always below the block size.\n"
      "sequences: requests admitted in arrival order at their final lengths; mean [min, max]\n"
      "  over the complete rounds of the stream (%zu rounds at block 1, %zu at block 256).\n"
      "replayed: the first round, run on a real PagedKVCache, gave the same admissions,\n"
      "  footprint and lifetime sums as the formulas.\n",
      rows[2].rounds, rows.back().rounds);

  if (!o.json.empty()) {
    try {
      write_json(o.json, o, requests, sorted, mean_len, clamped_high, clamped_low, bytes_per_token,
                 budget, rows);
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "bench_memory_waste: %s\n", ex.what());
      return 2;
    }
  }
  if (!all_checked) {
    std::printf("MISMATCH: a real PagedKVCache disagreed with the formulas (see stderr).\n");
    return 1;
  }
  std::printf("All checks passed.\n");
  return 0;
}
