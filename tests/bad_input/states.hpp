// What the bad-input cases of several folders share (tests/<folder>/test_*_bad_input.cpp): the
// observable state of kvlab's objects, compared before and after a refused call, and a few
// objects to call. Inline functions in a namespace of their own, so that the files can be
// compiled one by one or together in one unit.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kvlab/kvlab.hpp"

namespace kvlab_test::bad_input_states {

// --- observable state ---------------------------------------------------------------------

// Free blocks and every block's reference count.
inline std::vector<int> state_of(const kvlab::BlockAllocator& a) {
  std::vector<int> s{a.num_free()};
  for (std::int32_t b = 0; b < a.num_blocks(); ++b) s.push_back(a.ref_count(b));
  return s;
}

// The pool's sequences (id, length, held blocks, table), then the allocator's state.
inline std::vector<long> state_of(const kvlab::PagedKVCacheBase& c) {
  std::vector<long> s;
  for (int seq : c.sequences()) {
    s.push_back(seq);
    s.push_back(c.length(seq));
    s.push_back(c.held_blocks(seq));
    for (std::int32_t b : c.blocks(seq)) s.push_back(b);
    s.push_back(-2);
  }
  for (int x : state_of(c.allocator())) s.push_back(x);
  return s;
}

// A paged cache's bookkeeping and every key and value of every live sequence, all layers.
inline std::vector<double> state_of(const kvlab::PagedKVCache<double>& c) {
  std::vector<double> s;
  for (long x : state_of(static_cast<const kvlab::PagedKVCacheBase&>(c)))
    s.push_back(static_cast<double>(x));
  for (int seq : c.sequences()) {
    if (c.length(seq) == 0) continue;
    const kvlab::BlockTables t = c.tables({seq});
    for (int l = 0; l < c.num_layers(); ++l) {
      const kvlab::PagedKVView<double> view = c.view(l, t);
      for (int pos = 0; pos < view.seq_len(0); ++pos)
        for (int h = 0; h < view.num_kv_heads; ++h)
          for (int d = 0; d < view.head_dim; ++d) {
            s.push_back(view.key(0, pos, h)[d]);
            s.push_back(view.value(0, pos, h)[d]);
          }
    }
  }
  return s;
}

// A contiguous cache's lengths and every stored key and value.
inline std::vector<double> state_of(const kvlab::ContiguousKVCache<double>& c) {
  std::vector<double> s;
  for (int l = 0; l < c.num_layers(); ++l) {
    s.push_back(c.length(l));
    for (int h = 0; h < c.num_kv_heads(); ++h) {
      const auto k = c.keys(l, h);
      const auto v = c.values(l, h);
      s.insert(s.end(), k.data(), k.data() + k.size());
      s.insert(s.end(), v.data(), v.data() + v.size());
    }
  }
  return s;
}

// Nothing to compare: a constructor or a function of no object.
inline int no_state() { return 0; }

// A paged cache of 2 layers, 2 K/V heads of 2 values, blocks of 4 tokens, 6 blocks: sequence 0
// holds 5 written tokens (2 blocks), sequence 1 is a fork of it, sequence 2 is empty.
inline std::unique_ptr<kvlab::PagedKVCache<double>> small_paged_cache() {
  auto c = std::make_unique<kvlab::PagedKVCache<double>>(2, 2, 2, 4, 6);
  const int a = c->add_sequence();
  const std::vector<std::int64_t> slots = c->reserve(a, 5);
  kvlab::RowMatrix<double> k(5, 4);
  for (Eigen::Index i = 0; i < k.size(); ++i) k.data()[i] = static_cast<double>(i);
  for (int l = 0; l < 2; ++l) c->write(l, slots, k, -k);
  c->fork(a);
  c->add_sequence();
  return c;
}

// The scheduler's observable state: requests, queues, the pool.
inline std::vector<long> state_of(const kvlab::Scheduler& s) {
  std::vector<long> out{s.num_requests(),
                        s.unfinished(),
                        s.kept_records(),
                        static_cast<long>(s.waiting().size()),
                        static_cast<long>(s.running().size()),
                        s.promised_blocks(),
                        s.preemptions()};
  for (long x : state_of(s.pool())) out.push_back(x);
  return out;
}

// A request of `prompt` for at most `max_new_tokens` tokens.
inline kvlab::Request request_of(std::vector<int> prompt, int max_new_tokens = 4) {
  kvlab::Request r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = max_new_tokens;
  return r;
}

}  // namespace kvlab_test::bad_input_states
