// ContiguousKVCache: appends land in the documented layout, views and maps read them back,
// failures leave the cache unchanged, and the byte counts follow their formulas.
#include <catch2/catch.hpp>

#include "kvlab/kvlab.hpp"
#include "test_support.hpp"

using kvlab::CapacityError;
using kvlab::ContiguousKVCache;
using kvlab::InvalidArgument;
using kvlab::RowMatrix;
using kvlab_test::names;

namespace {

// Every K and V value of every layer, for comparing a cache before and after a failed call.
std::vector<float> snapshot(const ContiguousKVCache<float>& cache) {
  std::vector<float> all;
  for (int l = 0; l < cache.num_layers(); ++l)
    for (int h = 0; h < cache.num_kv_heads(); ++h) {
      const auto k = cache.keys(l, h);
      const auto v = cache.values(l, h);
      all.insert(all.end(), k.data(), k.data() + k.size());
      all.insert(all.end(), v.data(), v.data() + v.size());
    }
  return all;
}

}  // namespace

TEST_CASE("append scatters token-major rows into head-major blocks") {
  const int kv_heads = 3, head_dim = 4, capacity = 10;
  ContiguousKVCache<float> cache(2, kv_heads, head_dim, capacity);
  kvlab::Rng rng(11);
  const RowMatrix<float> k1 = kvlab::random_matrix<float>(4, kv_heads * head_dim, rng);
  const RowMatrix<float> v1 = kvlab::random_matrix<float>(4, kv_heads * head_dim, rng);
  const RowMatrix<float> k2 = kvlab::random_matrix<float>(1, kv_heads * head_dim, rng);
  const RowMatrix<float> v2 = kvlab::random_matrix<float>(1, kv_heads * head_dim, rng);
  cache.append(1, k1, v1);  // a prompt of 4 tokens
  cache.append(1, k2, v2);  // one decoded token
  CHECK(cache.length(0) == 0);
  CHECK(cache.length(1) == 5);

  RowMatrix<float> k_all(5, kv_heads * head_dim), v_all(5, kv_heads * head_dim);
  k_all << k1, k2;
  v_all << v1, v2;
  const kvlab::ContiguousKVView<float> view = cache.view(1);
  CHECK(view.length == 5);
  CHECK(view.capacity == capacity);
  for (int h = 0; h < kv_heads; ++h) {
    CHECK(cache.keys(1, h) == k_all.middleCols(h * head_dim, head_dim));
    CHECK(cache.values(1, h) == v_all.middleCols(h * head_dim, head_dim));
    for (int t = 0; t < 5; ++t)
      for (int c = 0; c < head_dim; ++c) {
        // The documented layout: element (head, pos, c) at (head * capacity + pos) * head_dim + c.
        CHECK(view.k[(h * capacity + t) * head_dim + c] == k_all(t, h * head_dim + c));
        CHECK(view.value(h, t)[c] == v_all(t, h * head_dim + c));
      }
  }
}

TEST_CASE("a failed append leaves the cache unchanged") {
  ContiguousKVCache<float> cache(2, 2, 4, 6);
  kvlab::Rng rng(2);
  cache.append(0, kvlab::random_matrix<float>(5, 8, rng), kvlab::random_matrix<float>(5, 8, rng));
  const std::vector<float> before = snapshot(cache);

  SECTION("overflow: 2 more rows where 1 fits") {
    CHECK_THROWS_MATCHES(cache.append(0, kvlab::random_matrix<float>(2, 8, rng),
                                      kvlab::random_matrix<float>(2, 8, rng)),
                         CapacityError, names("k.rows()", "at most 1 (capacity 6, length 5)", "2"));
  }
  SECTION("wrong widths and row counts") {
    CHECK_THROWS_MATCHES(
        cache.append(0, RowMatrix<float>::Zero(1, 7), RowMatrix<float>::Zero(1, 8)),
        InvalidArgument, names("k.cols()", "8 (num_kv_heads * head_dim)", "7"));
    CHECK_THROWS_MATCHES(
        cache.append(0, RowMatrix<float>::Zero(1, 8), RowMatrix<float>::Zero(2, 8)),
        InvalidArgument, names("v.rows()", "1 (k.rows())", "2"));
    CHECK_THROWS_MATCHES(
        cache.append(0, RowMatrix<float>::Zero(1, 8), RowMatrix<float>::Zero(1, 9)),
        InvalidArgument, names("v.cols()", "8", "9"));
    CHECK_THROWS_MATCHES(cache.append(0, RowMatrix<float>(0, 8), RowMatrix<float>(0, 8)),
                         InvalidArgument, names("k.rows()", ">= 1", "0"));
  }
  SECTION("layer out of range") {
    CHECK_THROWS_MATCHES(
        cache.append(2, RowMatrix<float>::Zero(1, 8), RowMatrix<float>::Zero(1, 8)),
        InvalidArgument, names("layer", "in [0, 2)", "2"));
    CHECK_THROWS_MATCHES(
        cache.append(-1, RowMatrix<float>::Zero(1, 8), RowMatrix<float>::Zero(1, 8)),
        InvalidArgument, names("layer", "in [0, 2)", "-1"));
  }
  CHECK(cache.length(0) == 5);
  CHECK(cache.length(1) == 0);
  CHECK(snapshot(cache) == before);
  // The last free slot can still be filled.
  CHECK_NOTHROW(cache.append(0, RowMatrix<float>::Zero(1, 8), RowMatrix<float>::Zero(1, 8)));
  CHECK(cache.length(0) == 6);
}

TEST_CASE("constructor and accessors reject bad sizes, naming them") {
  CHECK_THROWS_MATCHES(ContiguousKVCache<float>(0, 1, 1, 1), InvalidArgument,
                       names("num_layers", ">= 1", "0"));
  CHECK_THROWS_MATCHES(ContiguousKVCache<float>(1, 0, 1, 1), InvalidArgument,
                       names("num_kv_heads", ">= 1", "0"));
  CHECK_THROWS_MATCHES(ContiguousKVCache<float>(1, 1, -2, 1), InvalidArgument,
                       names("head_dim", ">= 1", "-2"));
  CHECK_THROWS_MATCHES(ContiguousKVCache<float>(1, 1, 1, 0), InvalidArgument,
                       names("capacity", ">= 1", "0"));
  CHECK_THROWS_MATCHES(ContiguousKVCache<float>(10000, 1 << 10, 1 << 10, 1 << 30), InvalidArgument,
                       names("capacity", "at most", std::to_string(1 << 30)));
  CHECK_THROWS_MATCHES(ContiguousKVCache<float>(1, 1 << 16, 1 << 16, 1), InvalidArgument,
                       names("num_kv_heads * head_dim", "at most 2147483647", "4294967296"));
  ContiguousKVCache<double> cache(1, 2, 3, 4);
  CHECK_THROWS_MATCHES(cache.keys(0, 2), InvalidArgument, names("kv_head", "in [0, 2)", "2"));
  CHECK_THROWS_MATCHES(cache.values(1, 0), InvalidArgument, names("layer", "in [0, 1)", "1"));
  CHECK_THROWS_MATCHES(cache.view(-1), InvalidArgument, names("layer", "in [0, 1)", "-1"));
  CHECK_THROWS_MATCHES(cache.length(5), InvalidArgument, names("layer", "in [0, 1)", "5"));
}

TEST_CASE("truncate and clear forget tokens but keep the storage") {
  ContiguousKVCache<float> cache(2, 1, 2, 8);
  kvlab::Rng rng(4);
  const RowMatrix<float> k = kvlab::random_matrix<float>(5, 2, rng),
                         v = kvlab::random_matrix<float>(5, 2, rng);
  cache.append(0, k, v);
  cache.append(1, k, v);
  const std::size_t reserved = cache.bytes_reserved();
  cache.truncate(3);
  CHECK(cache.length(0) == 3);
  CHECK(cache.length(1) == 3);
  CHECK(cache.keys(1, 0) == k.topRows(3));
  CHECK_THROWS_MATCHES(cache.truncate(4), InvalidArgument,
                       names("length", "at most the length of layer 0 (3)", "4"));
  CHECK_THROWS_MATCHES(cache.truncate(-1), InvalidArgument, names("length", ">= 0", "-1"));
  CHECK(cache.length(0) == 3);
  cache.clear();
  CHECK(cache.length(0) == 0);
  CHECK(cache.bytes_used() == 0);
  CHECK(cache.bytes_reserved() == reserved);
}

TEST_CASE("bytes reserved and used follow 2 * layers * kv_heads * tokens * head_dim * sizeof") {
  ContiguousKVCache<float> cache(3, 4, 16, 100);
  CHECK(cache.bytes_reserved() == 2u * 3 * 4 * 100 * 16 * sizeof(float));
  CHECK(cache.bytes_used() == 0);
  cache.append(0, RowMatrix<float>::Zero(7, 64), RowMatrix<float>::Zero(7, 64));
  cache.append(1, RowMatrix<float>::Zero(7, 64), RowMatrix<float>::Zero(7, 64));
  CHECK(cache.bytes_used() == 2u * 2 * 4 * 7 * 16 * sizeof(float));
}
