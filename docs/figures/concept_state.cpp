// The state behind the concept pages' figures, taken from the library itself and written as
// JSON for docs/concept_figures.py (matplotlib), so that a figure cannot drift from the code:
//  - projections: K/V rows projected per decode step by NaiveDecoder and CachedDecoder;
//  - intensity: multiply-adds per byte of cpu::decode_attention's counters, MHA to GQA, fp32
//    and fp16 caches;
//  - paged: three sequences grown in turns in a PagedKVCache, their block tables (CSR), and what
//    a contiguous cache would reserve for them;
//  - window: the token in each slot of a ContiguousKVCache ring after each step;
//  - split_k: one query's scores cut by partition_size into parts, each part's softmax state,
//    and their merge by merge_softmax_states against one pass over all the keys;
//  - quant: a row of 32 values through quantize_block / dequantize as q8_0 and q4_0.
// Each part checks what it writes (a failed check exits 1). Built and run by the docs build.
//
//   concept_state OUT.json
#include <kvlab/kvlab.hpp>

#include "support/json.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using kvlab::RowMatrix;
using kvlab_support::Json;

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "concept_state: check failed: %s\n", what);
    std::exit(1);
  }
}

// K/V rows projected in each of `steps` decode steps, without and with a cache.
Json projections(int steps) {
  const kvlab::AttentionShape shape(/*num_heads=*/2, /*num_kv_heads=*/1, /*head_dim=*/4);
  const auto stack = kvlab::AttentionStack<double>::random(1, shape, /*d_model=*/8, /*seed=*/7);
  kvlab::NaiveDecoder<double> naive(stack);
  kvlab::CachedDecoder<double> cached(stack, /*capacity=*/steps);
  kvlab::Rng rng(/*seed=*/1);
  const auto x = kvlab::random_matrix<double>(steps, 8, rng);  // [steps, d_model]
  Json out{{"steps", steps}, {"naive", Json::array()}, {"cached", Json::array()}};
  for (int t = 0; t < steps; ++t) {
    const RowMatrix<double> a = naive.decode(x.row(t));
    const RowMatrix<double> b = cached.decode(x.row(t));
    check((a - b).cwiseAbs().maxCoeff() < 1e-12, "naive and cached outputs equal");
    out["naive"].push_back(naive.last_step().kv_projections);
    out["cached"].push_back(cached.last_step().kv_projections);
  }
  return out;
}

// Multiply-adds per byte read of one decode step (cpu::decode_attention's counters), for 8
// query heads over 8, 4, 2 and 1 K/V heads, with K and V stored in fp32 and in fp16.
template <typename S>
double macs_per_byte(int kv_heads, int tokens) {
  const kvlab::AttentionShape shape(8, kv_heads, 32);
  kvlab::ContiguousKVCache<float, S> cache(1, kv_heads, 32, tokens);
  kvlab::Rng rng(/*seed=*/3);
  const auto kv = kvlab::random_matrix<float>(tokens, shape.kv_width(), rng);  // [tokens, G * 32]
  for (int t = 0; t < tokens; ++t) cache.append(0, kv.row(t), kv.row(t));
  const auto q = kvlab::random_matrix<float>(1, shape.q_width(), rng);  // [1, 8 * 32]
  kvlab::CostCounters work;
  kvlab::cpu::decode_attention(shape, q, cache.view(0), &work);
  return static_cast<double>(work.macs) / static_cast<double>(work.kv_bytes_read);
}

Json intensity() {
  Json out{{"num_heads", 8}, {"kv_heads", Json::array()}, {"fp32", Json::array()},
           {"fp16", Json::array()}};
  for (int g : {8, 4, 2, 1}) {
    out["kv_heads"].push_back(g);
    out["fp32"].push_back(macs_per_byte<float>(g, 64));
    out["fp16"].push_back(macs_per_byte<Eigen::half>(g, 64));
  }
  check(out["fp32"][0].get<double>() == 0.25, "MHA in fp32: 0.25 multiply-adds per byte");
  return out;
}

// Three sequences grown in turns in a pool of blocks of 4 tokens; a contiguous cache reserves
// max_len tokens for each.
Json paged() {
  const int block_size = 4, max_len = 12;
  const std::vector<int> lengths{5, 2, 9};
  kvlab::PagedKVCache<float> cache(/*num_layers=*/1, /*num_kv_heads=*/1, /*head_dim=*/4,
                                   block_size, /*num_blocks=*/8);
  const RowMatrix<float> row = RowMatrix<float>::Zero(1, 4);  // [1, 4]: the values do not matter
  for (int s = 0; s < 3; ++s) cache.add_sequence();
  for (int pos = 0; pos < 9; ++pos)
    for (int s = 0; s < 3; ++s)
      if (pos < lengths[static_cast<std::size_t>(s)]) cache.append(s, row.row(0), row.row(0));
  const kvlab::BlockTables tables = cache.tables({0, 1, 2});
  check(tables.indptr().back() == 2 + 1 + 3, "6 blocks for 5, 2 and 9 tokens");
  return Json{{"block_size", block_size},  {"num_blocks", tables.num_blocks()},
              {"max_len", max_len},        {"lengths", lengths},
              {"indptr", tables.indptr()}, {"indices", tables.indices()},
              {"last_page_len", tables.last_page_len()}};
}

// A ring of `window` slots (one new token a step): the token each slot holds after each step.
Json window(int window, int tokens) {
  kvlab::ContiguousKVCache<float> ring(1, 1, 1, /*capacity=*/window, window);
  Json slots = Json::array();  // [step][slot]: token, or -1 when empty
  for (int t = 0; t < tokens; ++t) {
    const RowMatrix<float> kv = RowMatrix<float>::Constant(1, 1, static_cast<float>(t));
    ring.append(0, kv.row(0), kv.row(0));
    Json now = Json::array();
    for (int s = 0; s < window; ++s) {
      const int filled = std::min(t + 1, window);
      now.push_back(s < filled ? static_cast<int>(ring.view(0).key(0, 0)[s]) : -1);
    }
    slots.push_back(now);
    check(now[static_cast<std::size_t>(t % window)] == t, "token t in slot t mod window");
  }
  return Json{{"window", window}, {"tokens", tokens}, {"slots", slots}};
}

// One query over `length` keys of one value each, cut into at most `parts` partitions of whole
// blocks of `align` keys; each partition's softmax state and output, merged.
Json split_k(int length, int parts, int align) {
  kvlab::Rng rng(/*seed=*/5);
  const auto scores = kvlab::random_matrix<double>(1, length, rng, -3.0, 3.0);  // [1, length]
  const auto values = kvlab::random_matrix<double>(1, length, rng, -1.0, 1.0);  // [1, length]
  const int size = kvlab::partition_size(length, parts, align);
  const int count = kvlab::partition_count(length, parts, align);
  Json out{{"length", length}, {"parts", parts}, {"align", align}, {"partition_size", size},
           {"scores", Json::array()}, {"partials", Json::array()}};
  for (int j = 0; j < length; ++j) out["scores"].push_back(scores(0, j));
  kvlab::SoftmaxState<double> merged = kvlab::empty_softmax_state<double>();
  double merged_acc = 0.0;
  for (int p = 0; p < count; ++p) {
    const int begin = p * size, end = std::min(length, begin + size);
    kvlab::SoftmaxState<double> state{-INFINITY, 0.0};
    for (int j = begin; j < end; ++j) state.max = std::max(state.max, scores(0, j));
    double acc = 0.0;
    for (int j = begin; j < end; ++j) {
      state.sum += std::exp(scores(0, j) - state.max);
      acc += std::exp(scores(0, j) - state.max) * values(0, j);
    }
    out["partials"].push_back(Json{{"begin", begin}, {"end", end}, {"max", state.max},
                                   {"sum", state.sum}, {"output", acc / state.sum}});
    kvlab::merge_softmax_states(merged, &merged_acc, state, &acc, 1);
  }
  double max = -INFINITY, sum = 0.0, acc = 0.0;  // one pass over every key
  for (int j = 0; j < length; ++j) max = std::max(max, scores(0, j));
  for (int j = 0; j < length; ++j) {
    sum += std::exp(scores(0, j) - max);
    acc += std::exp(scores(0, j) - max) * values(0, j);
  }
  check(std::abs(merged_acc / merged.sum - acc / sum) < 1e-12, "the merge equals one pass");
  out["merged"] = merged_acc / merged.sum;
  out["one_pass"] = acc / sum;
  return out;
}

// A row of 32 values with one outlier, stored as q8_0 and q4_0 (KVStorage's encodings, those of
// the int8 and int4 caches) and read back.
Json quant() {
  using Q8 = kvlab::KVStorage<kvlab::BlockQ8_0>;
  using Q4 = kvlab::KVStorage<kvlab::BlockQ4_0>;
  const int n = kvlab::kQuantBlock;
  kvlab::Rng rng(/*seed=*/8);
  const auto x = kvlab::random_matrix<float>(1, n, rng, -1.0f, 1.0f);  // [1, 32]
  std::vector<float> row(x.data(), x.data() + n);
  row[11] = 1.9f;  // the outlier sets both scales
  kvlab::BlockQ8_0 q8;
  kvlab::BlockQ4_0 q4;
  Q8::encode(row.data(), n, &q8);
  Q4::encode(row.data(), n, &q4);
  std::vector<float> back8(n), back4(n), bound8(n), levels(n);
  Q8::decode(&q8, n, back8.data());
  Q4::decode(&q4, n, back4.data());
  Q8::error_bounds(&q8, n, bound8.data());
  const float scale8 = Q8::levels(q8, levels.data());
  const float scale4 = Q4::levels(q4, levels.data());
  for (int i = 0; i < n; ++i)
    check(std::abs(back8[static_cast<std::size_t>(i)] - row[static_cast<std::size_t>(i)]) <=
              bound8[static_cast<std::size_t>(i)],
          "q8_0 within its error bound");
  return Json{{"values", row},          {"q8_0", back8},          {"q4_0", back4},
              {"q8_0_scale", scale8},   {"q4_0_scale", scale4}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: concept_state OUT.json\n");
    return 2;
  }
  const Json state{{"projections", projections(8)}, {"intensity", intensity()},
                   {"paged", paged()},              {"window", window(4, 10)},
                   {"split_k", split_k(20, 3, 4)},  {"quant", quant()}};
  try {
    kvlab_support::write_json_file(argv[1], state);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "concept_state: %s\n", e.what());
    return 1;
  }
  return 0;
}
