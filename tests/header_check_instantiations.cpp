// Part of the header check (tests/CMakeLists.txt): every class template of kvlab instantiated
// and every function template called, for float and double, so that the warnings a course turns
// on (-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wsign-conversion, as errors) are checked
// inside the templates too, not only in the code the compiler sees without instantiating them.
// Every public header is included, so the templates their own code instantiates are checked
// here too (the one-header units skip a part of those: tests/CMakeLists.txt). Compiled, never run.
#include "every_header.hpp"  // every public header (tests/CMakeLists.txt writes it)

#include <memory>
#include <vector>

template class kvlab::ContiguousKVCache<float>;
template class kvlab::ContiguousKVCache<double>;
template class kvlab::PagedKVCache<float>;
template class kvlab::PagedKVCache<double>;
template class kvlab::ContiguousKVCache<float, Eigen::half>;
template class kvlab::ContiguousKVCache<float, Eigen::bfloat16>;
template class kvlab::ContiguousKVCache<float, kvlab::BlockQ8_0>;
template class kvlab::ContiguousKVCache<double, kvlab::BlockQ4_0>;
template class kvlab::PagedKVCache<float, Eigen::half>;
template class kvlab::PagedKVCache<float, Eigen::bfloat16>;
template class kvlab::PagedKVCache<float, kvlab::BlockQ8_0>;
template class kvlab::PagedKVCache<double, kvlab::BlockQ4_0>;
template class kvlab::ContiguousStore<float, kvlab::BlockQ4_0>;
template class kvlab::PagedStore<float, kvlab::BlockQ8_0>;
template class kvlab::RecomputeStore<float>;
template class kvlab::RecomputeStore<double>;
template class kvlab::ContiguousStore<float>;
template class kvlab::ContiguousStore<double>;
template class kvlab::PagedStore<float>;
template class kvlab::PagedStore<double>;
template class kvlab::AttentionLayer<float>;
template class kvlab::AttentionLayer<double>;
template class kvlab::AttentionStack<float>;
template class kvlab::AttentionStack<double>;
template class kvlab::NaiveDecoder<float>;
template class kvlab::NaiveDecoder<double>;
template class kvlab::CachedDecoder<float>;
template class kvlab::CachedDecoder<double>;
template class kvlab::PagedDecoder<float>;
template class kvlab::PagedDecoder<double>;
template class kvlab::CachedDecoder<float, kvlab::BlockQ4_0>;
template class kvlab::PagedDecoder<float, Eigen::half>;

namespace {

template <typename T>
void call_every_function_template() {
  using kvlab::RowMatrix;
  const kvlab::AttentionShape shape(4, 2, 8);
  kvlab::Rng rng(1);
  const RowMatrix<T> q = kvlab::random_matrix<T>(2, shape.q_width(), rng);
  const RowMatrix<T> k = kvlab::random_matrix<T>(2, shape.kv_width(), rng);
  kvlab::CostCounters counters;
  (void)kvlab::cpu::reference_attention(shape, q, k, k);
  (void)kvlab::cpu::naive_attention(shape, q, k, k, &counters);
  kvlab::ContiguousKVCache<T> cache(1, 2, 8, 4);
  cache.append(0, k, k);
  (void)kvlab::cpu::decode_attention(shape, q, cache.view(0), &counters);
  kvlab::PagedKVCache<T> pool(1, 2, 8, 4, 4);
  const int seq = pool.add_sequence();
  pool.append(seq, k, k);
  const kvlab::BlockTables tables = pool.tables({seq});
  (void)kvlab::cpu::paged_decode_attention(shape, q.topRows(1), pool.view(0, tables), &counters);
  (void)kvlab::cpu::paged_prefill_attention(shape, q, {0, 2}, pool.view(0, tables), &counters);
  (void)kvlab::paged_cache_footprint(pool);
  RowMatrix<T> out;
  kvlab::cpu::linear(q, RowMatrix<T>(RowMatrix<T>::Zero(3, shape.q_width())), out);
  const auto stack = kvlab::AttentionStack<T>::random(1, shape, 16, 1);
  kvlab::PagedStore<T> store(1, 2, 8, 4, 4);
  const int s = store.add_sequence();
  (void)kvlab::run_stack(*stack, store, {s}, {0, 2}, RowMatrix<T>(RowMatrix<T>::Zero(2, 16)));
  std::vector<int> order{0, 1, 2};
  kvlab::shuffle(order, rng);
  // every storage type through both kernels
  const kvlab::AttentionShape wide(4, 2, 32);
  const RowMatrix<T> kw = kvlab::random_matrix<T>(2, wide.kv_width(), rng);
  const RowMatrix<T> qw = kvlab::random_matrix<T>(2, wide.q_width(), rng);
  kvlab::visit_kv_dtype(kvlab::KVDtype::int4, [&](auto tag) {
    using S = typename decltype(tag)::type;
    kvlab::ContiguousKVCache<T, S> stored(1, 2, 32, 4);
    stored.append(0, kw, kw);
    (void)kvlab::cpu::decode_attention(wide, qw, stored.view(0), &counters);
    kvlab::PagedKVCache<T, S> paged(1, 2, 32, 4, 4);
    const int p = paged.add_sequence();
    paged.append(p, kw, kw);
    const kvlab::BlockTables t = paged.tables({p});
    (void)kvlab::cpu::paged_prefill_attention(wide, qw, {0, 2}, paged.view(0, t), &counters);
    return 0;
  });
}

}  // namespace

void kvlab_header_check_instantiations() {
  call_every_function_template<float>();
  call_every_function_template<double>();
  const auto weights = std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin());
  kvlab::LlamaModel model(weights, kvlab::LlamaBackend::Paged);
  kvlab::Sampler sampler(256, 0.0f, 1.0f, 1);
  (void)kvlab::generate(model, sampler, {1}, 2);
  (void)model.forward_batch({{model.sequence(), {3}}});
}
