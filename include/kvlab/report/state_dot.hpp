/// \file
/// \brief `step_dot` and `scheduler_pool_dot`: a serving engine drawn as Graphviz dot graphs.
///
/// `step_dot` draws the engine's last step (who waited, which chunks ran under the token budget,
/// how the pool stood after it); `scheduler_pool_dot` draws its pool with the prefix cache's blocks
/// marked. Both draw from the engine's own state. Checked in `tests/report/test_state_dot.cpp` line
/// by line against the step log and the scheduler's state, and by `dot -Tsvg` where Graphviz is
/// installed.
#pragma once

#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/report/pool_dot.hpp"
#include "kvlab/serving/engine.hpp"
#include "kvlab/serving/scheduler.hpp"
#include "kvlab/serving/step_plan.hpp"

namespace kvlab {

/// What a serving diagram adds to the engine's state: a first line and the requests' names.
struct ServingDotOptions {
  /// A line above what the diagram says of itself (empty: none).
  std::string title;
  /// [requests] a name per request id ("A", "B", ...); an id past the end, or an empty name,
  /// is "request N".
  std::vector<std::string> request_names;
};

namespace detail {

/// Request `id`'s name in a serving diagram.
inline std::string dot_request_name(const ServingDotOptions& options, int id) {
  const auto i = static_cast<std::size_t>(id);
  if (id >= 0 && i < options.request_names.size() && !options.request_names[i].empty())
    return options.request_names[i];
  return "request " + std::to_string(id);
}

}  // namespace detail

/// The pool of `scheduler` drawn by `pool_dot`, with its sequences named after the requests
/// that hold them and the prefix cache's blocks marked: the cache is the holder that is not a
/// sequence, and a cached block says whether a sequence still holds it or where it stands in
/// the eviction queue (1 is evicted first). A sequence of no request (a static batch's pad
/// rows) is "seq N".
///
/// \code
/// kvlab::Engine engine(weights, config);
/// ... // submit requests, step
/// std::ofstream("pool.dot") << kvlab::scheduler_pool_dot(engine.scheduler());
/// \endcode
/// `kvlab-serve --dot PREFIX --dot-step N` writes it after step N (`PREFIX.pool.dot`); the page
/// of tutorial 07 shows one with prefix-cache hits.
inline std::string scheduler_pool_dot(const Scheduler& scheduler,
                                      const ServingDotOptions& options = {}) {
  const PagedKVCacheBase& pool = scheduler.pool();
  const PrefixCache& cache = scheduler.prefix_cache();
  PoolDotOptions o;
  o.title = options.title;
  o.other_holders = "prefix cache";
  for (int id = 0; id < scheduler.num_requests(); ++id) {
    if (scheduler.forgotten(id)) continue;
    const int seq = scheduler.request(id).seq;
    if (seq >= 0) o.sequence_names[seq] = detail::dot_request_name(options, id);
  }
  const std::vector<std::int32_t> queue = cache.eviction_order();  // next to be evicted first
  std::map<std::int32_t, int> queue_position;                      // block -> 1, 2, ...
  for (std::size_t i = 0; i < queue.size(); ++i) queue_position[queue[i]] = static_cast<int>(i) + 1;
  for (std::int32_t b = 0; b < pool.allocator().num_blocks(); ++b) {
    if (!cache.holds(b)) continue;
    const auto at = queue_position.find(b);
    o.block_notes[b] = at == queue_position.end()
                           ? "cached"
                           : "cached (full), evictable: " + std::to_string(at->second) + " of " +
                                 std::to_string(queue.size()) + " in the queue";
  }
  return pool_dot(pool, o);
}

/// The last step of `engine` as a Graphviz dot graph: the requests waiting after it (front
/// first, those preempted by it marked), each chunk of its batch (whose, prefill, decode or
/// padding, how many tokens; who joined, and, when one request joined alone, how many of its
/// tokens came from the prefix cache; where each request stands after it, or that it finished),
/// the token budget as a record of what each chunk took, and the pool's blocks after it
/// (`StepRecord`'s used, cached, free and promised counts, and the step's prefix hits).
///
/// The step comes from the step log; the waiting queue, each request's position and blocks, and
/// finished requests' outputs are read from the scheduler as they stand now, so call it right
/// after `Engine::step`, before anything is submitted or stepped again.
///
/// Nodes, in a fixed order: `waiting_<id>` (queue order, joined by dashed edges front to back),
/// `chunk_<i>` (the batch's order), `budget` (a record: the budget, then `<c<i>>` per chunk, then
/// what was left), `memory` (a record). Edges `budget:c<i> -> chunk_<i>` link each share of the
/// budget to its chunk.
///
/// \code
/// engine.step();
/// std::ofstream("step.dot") << kvlab::step_dot(engine);  // then: dot -Tsvg step.dot -o step.svg
/// \endcode
/// `kvlab-serve --dot PREFIX --dot-step N` writes it after step N (`PREFIX.step.dot`); the page
/// of tutorial 07 shows one.
/// \throws InvalidArgument if `engine` has not run a step yet.
inline std::string step_dot(const Engine& engine, const ServingDotOptions& options = {}) {
  if (engine.steps() == 0)
    detail::fail("kvlab::step_dot", "engine", "an engine that has run a step", "no step yet");
  const StepRecord& r = engine.last_step();
  const Scheduler& s = engine.scheduler();
  const SchedulerConfig& config = s.config();
  const bool has_budget = config.policy != BatchingPolicy::Static;
  const auto name = [&options](int id) { return detail::dot_request_name(options, id); };
  const auto contains = [](const std::vector<int>& ids, int id) {
    for (int x : ids)
      if (x == id) return true;
    return false;
  };

  std::string out = "digraph kvlab_step {\n";
  std::string title = options.title.empty() ? "" : options.title + "\n";
  char times[64];
  std::snprintf(times, sizeof times, "%g to %g", r.start, r.end);
  title += "step " + std::to_string(r.step) + " (time " + times + ", " + to_string(config.policy) +
           " batching): " + detail::dot_count(r.tokens(), "token") +
           (has_budget ? " of a budget of " + std::to_string(config.max_batched_tokens) : "") +
           ", " + detail::dot_count(static_cast<long long>(r.batch.size()), "chunk") +
           "; after it " + std::to_string(r.running) + " running (at most " +
           std::to_string(config.max_running) + "), " + std::to_string(r.waiting) + " waiting";
  out += "  graph [rankdir=LR, labelloc=t, fontname=\"Helvetica\", fontsize=12, label=\"" +
         detail::dot_escape(detail::dot_wrap(title)) + "\"];\n";
  out += "  node [fontname=\"Helvetica\", fontsize=10];\n";

  // The queue after the step, front first.
  out += "  subgraph cluster_waiting {\n    label=\"waiting after the step (front first)\";\n";
  const std::deque<int>& waiting = s.waiting();
  for (int id : waiting) {
    const RequestState& q = s.request(id);
    std::string label = name(id) + "\n" + detail::dot_count(q.remaining(), "token") +
                        " to compute (prompt " + std::to_string(q.request.prompt.size()) +
                        ", generated " + std::to_string(q.output.tokens.size()) + ")";
    if (contains(r.preempted, id)) label += "\npreempted by this step";
    out += "    waiting_" + std::to_string(id) + " [shape=box, style=filled, fillcolor=\"" +
           (contains(r.preempted, id) ? "#fcbba1" : "#ffffff") + "\", label=\"" +
           detail::dot_escape(label) + "\"];\n";
  }
  if (waiting.empty()) out += "    waiting_none [shape=plaintext, label=\"nobody\"];\n";
  for (std::size_t i = 1; i < waiting.size(); ++i)
    out += "    waiting_" + std::to_string(waiting[i - 1]) + " -> waiting_" +
           std::to_string(waiting[i]) + " [style=dashed];\n";
  out += "  }\n";

  // The batch: one node per chunk.
  out += "  subgraph cluster_batch {\n    label=\"the step's batch\";\n";
  std::vector<int> described;  // requests whose state after the step a chunk already gave
  for (std::size_t i = 0; i < r.batch.size(); ++i) {
    const StepEntry& e = r.batch[i];
    std::string label =
        name(e.request) + "\n" + to_string(e.kind) + " " + detail::dot_count(e.tokens, "token");
    const bool first = !contains(described, e.request);
    described.push_back(e.request);
    const bool known = !s.forgotten(e.request);
    if (first && contains(r.admitted, e.request)) {
      label += "\njoined this step";
      // The step log counts the step's prefix hits, not each admission's; they are this
      // request's when it joined alone (a request's own count adds up all its admissions, a
      // preempted one's earlier ones too). With several joining, the pool's record has the sum.
      if (r.admitted.size() == 1 && r.prefix_hit_tokens > 0)
        label += ": " + detail::dot_count(r.prefix_hit_tokens, "token") + " from the prefix cache";
    }
    if (first && contains(r.finished, e.request)) {
      label += "\nfinished";
      if (known) {
        const RequestOutput& o = s.request(e.request).output;
        label += " (" + std::string(to_string(o.finish)) + "), " +
                 detail::dot_count(static_cast<long long>(o.tokens.size()), "token") + " generated";
      }
    } else if (first && known && e.kind != ChunkKind::Padding) {
      const RequestState& q = s.request(e.request);
      if (q.seq >= 0)
        label += "\nnow " + detail::dot_count(q.computed, "token") + " in seq " +
                 std::to_string(q.seq) + ", " +
                 detail::dot_count(s.pool().held_blocks(q.seq), "block");
    }
    const char* color = e.kind == ChunkKind::Prefill  ? "#c7e9c0"
                        : e.kind == ChunkKind::Decode ? "#c6dbef"
                                                      : "#eeeeee";
    out += "    chunk_" + std::to_string(i) + " [shape=box, style=filled, fillcolor=\"" + color +
           "\", label=\"" + detail::dot_escape(label) + "\"];\n";
  }
  if (r.batch.empty()) out += "    chunk_none [shape=plaintext, label=\"nothing ran\"];\n";
  out += "  }\n";

  // The token budget, split by chunk.
  std::string budget = has_budget ? "token budget: " + std::to_string(config.max_batched_tokens)
                                  : std::string("no token budget (a static batch)");
  for (std::size_t i = 0; i < r.batch.size(); ++i)
    budget += "|<c" + std::to_string(i) + "> " +
              detail::dot_escape(name(r.batch[i].request), true) + ": " +
              std::to_string(r.batch[i].tokens);
  if (has_budget) budget += "|unused: " + std::to_string(config.max_batched_tokens - r.tokens());
  out += "  budget [shape=record, label=\"" + budget + "\"];\n";
  for (std::size_t i = 0; i < r.batch.size(); ++i)
    out += "  budget:c" + std::to_string(i) + " -> chunk_" + std::to_string(i) + ";\n";

  // The pool after the step.
  std::string memory =
      "pool after the step (blocks of " + detail::dot_count(s.pool().block_size(), "token") +
      ")|held by sequences: " + std::to_string(r.blocks_used) +
      "|cached, evictable: " + std::to_string(r.blocks_cached) +
      "|free: " + std::to_string(r.blocks_free) + "|promised: " + std::to_string(r.blocks_reserved);
  if (r.prefix_hit_tokens > 0)
    memory += "|prefix hits this step: " + detail::dot_count(r.prefix_hit_tokens, "token");
  if (r.evicted_blocks > 0) memory += "|evicted this step: " + std::to_string(r.evicted_blocks);
  out += "  memory [shape=record, label=\"" + memory + "\"];\n";
  out += "}\n";
  return out;
}

}  // namespace kvlab
