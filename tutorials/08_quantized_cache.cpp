// Tutorial 08: a KV cache in less precision.
//
// What you will learn:
//  1. fp16 and bf16 keep a value's leading bits: each value rounds to the nearest number the
//     format holds (ties to even); fp16 keeps 11 significant bits, bf16 8 but float's range.
//  2. int8 (q8_0) and int4 (q4_0) store 32 values of one head as small integers and one fp16
//     scale d: 34 and 18 bytes instead of 128. What comes back is d · q, within d / 2 of what
//     went in (q4_0: within |d| for a value on the far side of the block's extreme).
//  3. A cache encodes each row when it is appended, and the attention kernel decodes each row as
//     it reads it: the step reads a quarter (int8) or a seventh (int4) of the bytes.
//  4. The per-value errors bound the attention's: the tutorial computes the bound and checks it.
//  5. What it does to the next token: the logits of one model with its cache in each precision.
// It checks itself: it exits non-zero if a value or an output lies outside its bound.
//
// Build and run (from the repository root, with `build/` configured by CMake):
//   cmake --build build --target tutorial_08_quantized_cache
//   build/tutorials/08_quantized_cache
// Options (the exercises of its page change them): --outlier X the largest value of Part 2's row
// (1.9), --tokens N the tokens cached in Part 3 (256).
//
// Next: bench_kv_dtype (bench/) times a decode step in each precision, bench_kv_accuracy measures
// the error on whole models; kvlab-generate --kv-dtype runs a model on any of them.

#include <kvlab/kvlab.hpp>

#include "support/command_line.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

namespace {

int failures = 0;

// Prints "ok" or records a failure.
void check(bool ok, const char* what) {
  if (!ok) {
    std::printf("  FAILED: %s\n", what);
    ++failures;
  }
}

// Part 1: a few values through fp16 and bf16.
void part1_rounding() {
  std::printf("1. fp16 and bf16: each value rounds to the nearest one the format holds\n");
  std::printf("   %-14s %-12s %-14s %-12s %-14s\n", "x", "fp16 bits", "fp16 value", "bf16 bits",
              "bf16 value");
  for (float x : {0.1f, 1.0f / 3.0f, 1000.7f, 65504.0f, 1e-6f, 3.0e38f}) {
    // [1]: one value stored, and read back
    Eigen::half h;
    Eigen::bfloat16 b;
    float h_back = 0, b_back = 0;
    const bool fits_fp16 = kvlab::KVStorage<Eigen::half>::first_unrepresentable(&x, 1) < 0;
    if (fits_fp16) {
      kvlab::KVStorage<Eigen::half>::encode(&x, 1, &h);
      kvlab::KVStorage<Eigen::half>::decode(&h, 1, &h_back);
    }
    kvlab::KVStorage<Eigen::bfloat16>::encode(&x, 1, &b);
    kvlab::KVStorage<Eigen::bfloat16>::decode(&b, 1, &b_back);
    if (fits_fp16) {
      std::printf("   %-14.8g 0x%04x       %-14.8g 0x%04x       %-14.8g\n", x,
                  Eigen::numext::bit_cast<std::uint16_t>(h), h_back,
                  Eigen::numext::bit_cast<std::uint16_t>(b), b_back);
    } else {
      std::printf("   %-14.8g (beyond fp16: refused)     0x%04x       %-14.8g\n", x,
                  Eigen::numext::bit_cast<std::uint16_t>(b), b_back);
    }
  }
  std::printf("   (fp16 keeps 11 significant bits up to 65504; bf16 8 bits, with float's range.)\n\n");
}

// Part 2: one row of 32 values through q8_0 and q4_0, byte by byte.
void part2_blocks(float outlier) {
  std::printf("2. One head's row of 32 values, quantized\n");
  // [32]: a row with one larger value, as keys often have
  std::vector<float> row(kvlab::kQuantBlock);
  kvlab::Rng rng(8);
  for (float& x : row) x = static_cast<float>(rng.uniform(-0.5, 0.5));
  row[5] = outlier;  // 1.9: the block's largest magnitude, it sets the scale
  row[20] = -1.2f;  // far side of the extreme, for q4_0

  // [part2]
  kvlab::BlockQ8_0 q8;  // 34 bytes: fp16 scale + 32 int8
  kvlab::KVStorage<kvlab::BlockQ8_0>::encode(row.data(), kvlab::kQuantBlock, &q8);
  kvlab::BlockQ4_0 q4;  // 18 bytes: fp16 scale + 16 bytes of nibbles
  kvlab::KVStorage<kvlab::BlockQ4_0>::encode(row.data(), kvlab::kQuantBlock, &q4);
  float back8[kvlab::kQuantBlock], back4[kvlab::kQuantBlock];  // [32] each: read back
  double bound8[kvlab::kQuantBlock], bound4[kvlab::kQuantBlock];
  kvlab::KVStorage<kvlab::BlockQ8_0>::decode(&q8, kvlab::kQuantBlock, back8);
  kvlab::KVStorage<kvlab::BlockQ4_0>::decode(&q4, kvlab::kQuantBlock, back4);
  kvlab::KVStorage<kvlab::BlockQ8_0>::error_bounds(&q8, kvlab::kQuantBlock, bound8);
  kvlab::KVStorage<kvlab::BlockQ4_0>::error_bounds(&q4, kvlab::kQuantBlock, bound4);
  // [part2]
  const float d8 = kvlab::detail::half_value(q8.d), d4 = kvlab::detail::half_value(q4.d);
  std::printf("   q8_0: %zu bytes; scale d = max|x| / 127, rounded up to fp16 = %.6g (bits 0x%04x)\n",
              sizeof q8, d8, q8.d);
  std::printf("   q4_0: %zu bytes; scale d = extreme / -8, |d| rounded up    = %.6g (bits 0x%04x)\n",
              sizeof q4, d4, q4.d);
  std::printf("   %3s %10s | %5s %10s %9s | %6s %10s %9s\n", "i", "x", "q8", "d*q8", "|err|",
              "nibble", "d*(n-8)", "|err|");
  for (int i = 0; i < kvlab::kQuantBlock; ++i) {
    const int j = i % 16;
    const int nibble = i < 16 ? q4.q[j] & 0x0F : q4.q[j] >> 4;
    const double e8 = std::fabs(double(row[static_cast<std::size_t>(i)]) - back8[i]);
    const double e4 = std::fabs(double(row[static_cast<std::size_t>(i)]) - back4[i]);
    if (i < 8 || i == 20)
      std::printf("   %3d %10.5f | %5d %10.5f %9.2e | %6d %10.5f %9.2e%s\n", i,
                  row[static_cast<std::size_t>(i)], q8.q[i], back8[i], e8, nibble, back4[i] + 0.0f, e4,
                  nibble == 15 ? "  (far side: within |d|)" : "");
    check(e8 <= bound8[i] && bound8[i] == d8 / 2, "q8_0 value within d / 2");
    check(e4 <= bound4[i], "q4_0 value within its bound");
  }
  std::printf("   ... (every value checked: q8_0 within d/2 = %.3g, q4_0 within |d|/2 = %.3g or |d|)\n",
              d8 / 2, std::fabs(d4) / 2);
  std::printf("   bits per value, scale included: q8_0 %.1f, q4_0 %.1f (fp32 32, fp16 16)\n\n",
              kvlab::stored_bits_per_value(kvlab::KVDtype::int8),
              kvlab::stored_bits_per_value(kvlab::KVDtype::int4));
}

// Part 3: a cache in each precision, and the bound on the attention output.
template <typename S>
void attend_with(const kvlab::AttentionShape& shape, const kvlab::RowMatrix<float>& q,
                 const kvlab::RowMatrix<float>& k, const kvlab::RowMatrix<float>& v,
                 const kvlab::RowMatrix<double>& exact) {
  const int n = static_cast<int>(k.rows()), hd = shape.head_dim();
  // K and V, encoded as they are appended: [num_kv_heads, n, head_dim] each, stored as S
  kvlab::ContiguousKVCache<float, S> cache(1, shape.num_kv_heads(), hd, n);
  cache.append(0, k, v);
  kvlab::CostCounters counters;
  const kvlab::RowMatrix<float> out = kvlab::cpu::decode_attention(shape, q, cache.view(0), &counters);
  // The bound: δ = scale · Σ_c |q_c| εk (largest over keys), then
  // |error| <= max_j εv + (e^{2δ} − 1) · max_j |v| for every output value.
  const auto view = cache.view(0);
  double worst_error = 0, worst_bound = 0;
  for (int h = 0; h < shape.num_heads(); ++h) {
    const int hk = h / shape.group_size();
    std::vector<double> ek(static_cast<std::size_t>(hd)), ev(static_cast<std::size_t>(hd));
    double delta = 0, ev_max = 0, v_max = 0;
    for (int j = 0; j < n; ++j) {
      kvlab::KVStorage<S>::error_bounds(view.key(hk, j), hd, ek.data());
      kvlab::KVStorage<S>::error_bounds(view.value(hk, j), hd, ev.data());
      double dj = 0;
      for (int c = 0; c < hd; ++c) {
        dj += std::fabs(double(q(0, h * hd + c))) * ek[static_cast<std::size_t>(c)];
        ev_max = std::max(ev_max, ev[static_cast<std::size_t>(c)]);
        v_max = std::max(v_max, std::fabs(double(v(j, hk * hd + c))));
      }
      delta = std::max(delta, shape.scale() * dj);
    }
    const double bound = ev_max + std::expm1(2 * delta) * v_max + 1e-5 * std::max(1.0, v_max);
    for (int c = 0; c < hd; ++c) {
      const double error = std::fabs(out(0, h * hd + c) - exact(0, h * hd + c));
      worst_error = std::max(worst_error, error);
      check(error <= bound, "attention output within the derived bound");
    }
    worst_bound = std::max(worst_bound, bound);
  }
  std::printf("   %-5s %8llu bytes read   largest error %9.2e   bound %9.2e\n",
              kvlab::KVStorage<S>::name(), static_cast<unsigned long long>(counters.kv_bytes_read),
              worst_error, worst_bound);
}

void part3_attention(int tokens) {
  std::printf("3. One decode step over %d cached tokens (8 heads / 2 K/V heads of 64 values)\n",
              tokens);
  const kvlab::AttentionShape shape(8, 2, 64);
  kvlab::Rng rng(3);
  const kvlab::RowMatrix<float> k = kvlab::random_matrix<float>(tokens, shape.kv_width(), rng);  // [tokens, 128]
  const kvlab::RowMatrix<float> v = kvlab::random_matrix<float>(tokens, shape.kv_width(), rng);  // [tokens, 128]
  const kvlab::RowMatrix<float> q = kvlab::random_matrix<float>(1, shape.q_width(), rng);  // [1, 512]
  // the exact attention over the values appended: [1, 512]
  const kvlab::RowMatrix<double> exact = kvlab::cpu::reference_attention(
      shape, kvlab::RowMatrix<double>(q.cast<double>()), kvlab::RowMatrix<double>(k.cast<double>()),
      kvlab::RowMatrix<double>(v.cast<double>()), tokens - 1);
  attend_with<float>(shape, q, k, v, exact);
  attend_with<Eigen::half>(shape, q, k, v, exact);
  attend_with<Eigen::bfloat16>(shape, q, k, v, exact);
  attend_with<kvlab::BlockQ8_0>(shape, q, k, v, exact);
  attend_with<kvlab::BlockQ4_0>(shape, q, k, v, exact);
  std::printf("   (the bound assumes every error pushes the same way; real errors partly cancel)\n\n");
}

// Part 4: the next token of one model with its cache in each precision.
void part4_next_token() {
  std::printf("4. The next token: a small model (heads of 32 values, random weights), 40 tokens in\n");
  const auto weights = std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::random(
      kvlab::LlamaConfig::tiny().with_dim(64).with_heads(2, 1), 5));
  std::vector<int> prompt;  // [40]
  for (int t = 0; t < 40; ++t) prompt.push_back((37 * t + 11) % weights->config.vocab_size);
  kvlab::LlamaModel fp32(weights, kvlab::LlamaBackend::Cached);
  const kvlab::RowVector<float> want = fp32.prefill(prompt);
  Eigen::Index want_id;
  want.maxCoeff(&want_id);
  for (kvlab::KVDtype d : {kvlab::KVDtype::fp16, kvlab::KVDtype::bf16, kvlab::KVDtype::int8,
                           kvlab::KVDtype::int4}) {
    kvlab::LlamaModel model(weights, kvlab::LlamaBackend::Cached, 16, 0, d);
    const kvlab::RowVector<float> got = model.prefill(prompt);
    Eigen::Index id;
    got.maxCoeff(&id);
    std::printf("   %-5s %5zu bytes per token   largest |logit - fp32 logit| %9.2e   next token %ld%s\n",
                kvlab::dtype_name(d).c_str(), model.store().bytes_per_token(),
                static_cast<double>((got - want).cwiseAbs().maxCoeff()), static_cast<long>(id),
                id == want_id ? " (as fp32)" : " (fp32 draws another)");
  }
  std::printf("   fp32: %zu bytes per token, next token %ld\n", fp32.store().bytes_per_token(),
              static_cast<long>(want_id));
}

}  // namespace

int main(int argc, char** argv) {
  double outlier = 1.9;  // the largest value of Part 2's row
  int tokens = 256;      // the tokens cached in Part 3
  kvlab_support::CommandLine command_line{"Tutorial 08: a KV cache in less precision"};
  command_line.add_number("--outlier", outlier, "the largest value of Part 2's row", 0.5, 1000.0);
  command_line.add_integer("--tokens", tokens, "tokens cached in Part 3", 16, 4096);
  if (const auto stop = command_line.parse("08_quantized_cache", argc, argv))
    return *stop;
  part1_rounding();
  part2_blocks(static_cast<float>(outlier));
  part3_attention(tokens);
  part4_next_token();
  if (failures != 0) {
    std::printf("\n%d checks FAILED\n", failures);
    return 1;
  }
  std::printf("\nEvery value and every output within its bound.\n");
  return 0;
}
