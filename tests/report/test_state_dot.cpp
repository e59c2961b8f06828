// The state diagrams (include/kvlab/report/pool_dot.hpp, include/kvlab/report/state_dot.hpp):
// the dot text is parsed back into nodes, labels and edges and compared with the state it draws
// — after a fork and a copy on write, with a holder that is not a sequence, with blocks given
// back out of a sliding window, with prefix-cache hits and a waiting queue — and, where Graphviz
// was found at configure time (KVLAB_DOT), `dot -Tsvg` must accept every graph.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kvlab/cache/paged_kv_cache.hpp"
#include "kvlab/cache/paged_sequences.hpp"
#include "kvlab/report/pool_dot.hpp"
#include "kvlab/report/state_dot.hpp"
#include "kvlab/serving/engine.hpp"
#include "model_writers.hpp"

namespace {

// A dot graph as the printers write it: one statement per line, but the pool's table, one row
// per line (pool_dot: a cell <b<id>> per block, <free> last), read as nodes block_<id> and free.
struct Graph {
  std::string title;                          // the graph's label, escapes kept
  std::map<std::string, std::string> labels;  // node id -> its label, escapes kept ("\n", "\"");
                                              // a table cell's as plain text
  std::map<std::string, std::string> attrs;   // node id -> its whole attribute list
  std::vector<std::string> edges;             // "from -> to", in the text's order
  std::vector<std::string> rows;              // the pool table's cells, top to bottom
};

// The plain text of an HTML-like label's cell: <BR/> a newline, other tags dropped, entities
// read back.
std::string cell_text(const std::string& html) {
  std::string text = std::regex_replace(html, std::regex("<BR/>"), "\n");
  text = std::regex_replace(text, std::regex("<[^>]*>"), "");
  for (const auto& [entity, c] : std::vector<std::pair<std::string, std::string>>{
           {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&amp;", "&"}}) {
    text = std::regex_replace(text, std::regex(entity), c);
  }
  return text;
}

Graph parse(const std::string& text) {
  Graph g;
  const std::regex node(R"(^\s+(\w+) \[(.*)\];$)");
  const std::regex edge(R"(^\s+([\w:]+) -> ([\w:]+)( \[.*\])?;$)");
  const std::regex cell(R"re(^<TR><TD PORT="(b(\d+)|free)"([^>]*)>(.*)</TD></TR>$)re");
  const std::regex label(R"re(label="((?:[^"\\]|\\.)*)")re");
  std::istringstream in(text);
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, cell)) {
      const std::string id = m[2].matched ? "block_" + m[2].str() : "free";
      g.attrs[id] = m[3];
      g.labels[id] = cell_text(m[4]);
      g.rows.push_back(id);
    } else if (std::regex_match(line, m, edge)) {
      std::string to = m[2];
      if (to.rfind("pool:b", 0) == 0) to = "block_" + to.substr(6);  // a block's cell
      g.edges.push_back(m[1].str() + " -> " + to);
    } else if (std::regex_match(line, m, node) && m[1] == "graph") {
      const std::string attrs = m[2];
      if (std::regex_search(attrs, m, label)) g.title = m[1];
    } else if (std::regex_match(line, m, node) && m[1] != "node") {
      const std::string id = m[1], attrs = m[2];
      g.attrs[id] = attrs;
      if (std::regex_search(attrs, m, label)) g.labels[id] = m[1];
    }
  }
  return g;
}

// The ids of the nodes whose id starts with `prefix`.
std::set<std::string> nodes_with(const Graph& g, const std::string& prefix) {
  std::set<std::string> ids;
  for (const auto& entry : g.labels)
    if (entry.first.rfind(prefix, 0) == 0) ids.insert(entry.first);
  return ids;
}

// Graphviz accepts `text`: `dot -Tsvg` exits 0 and writes an SVG. Without dot, a warning.
void check_with_dot(const std::string& text, const std::string& name) {
  const std::string dot = KVLAB_DOT;
  if (dot.empty()) {
    WARN("Graphviz's dot was not found at configure time: " << name << " not drawn");
    return;
  }
  // In the temporary directory, under a name no other run of this test takes at the same time.
  const std::string in =
      (std::filesystem::temp_directory_path() /
       ("kvlab_test_state_dot_" + name + "_" + std::to_string(std::random_device{}()) + ".dot"))
          .string();
  const std::string out = in + ".svg";
  std::ofstream(in) << text;
  const std::string command = "\"" + dot + "\" -Tsvg \"" + in + "\" -o \"" + out + "\"";
  REQUIRE(std::system(command.c_str()) == 0);
  std::ifstream svg(out);
  const std::string drawn((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  CHECK(drawn.find("<svg") != std::string::npos);
  std::filesystem::remove(in);
  std::filesystem::remove(out);
}

// Rows of `n` tokens for a pool of 2 heads of 2 values: [n, 4], zeros (the diagram reads no value).
kvlab::RowMatrix<float> rows(int n) { return kvlab::RowMatrix<float>::Zero(n, 4); }

// The engine of the step tests: blocks of 4 tokens, 16 of them, a budget of 32 tokens a step, at
// most `max_running` requests at once, the step clock, invariants checked after every step.
kvlab::EngineConfig small_engine(int max_running) {
  kvlab::EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 16;
  config.clock = kvlab::EngineClock::Steps;
  config.scheduler.max_running = max_running;
  config.scheduler.max_batched_tokens = 32;
  config.check_invariants = true;
  return config;
}

}  // namespace

TEST_CASE("pool_dot draws a fork, a copy on write and a holder that is not a sequence") {
  // Tutorial 03's pool: A holds 6 tokens in blocks 0 and 1; B forks A and appends one token,
  // so B's last block is a copy (block 2); then block 0 gets a holder that is not a sequence.
  kvlab::PagedKVCache<float> cache(/*num_layers=*/1, /*num_kv_heads=*/2, /*head_dim=*/2,
                                   /*block_size=*/4, /*num_blocks=*/8);
  const int a = cache.add_sequence();
  cache.append(a, rows(6), rows(6));
  const int b = cache.fork(a);
  cache.append(b, rows(1), rows(1));
  cache.retain_block(0);
  REQUIRE(cache.blocks(a) == std::vector<std::int32_t>{0, 1});
  REQUIRE(cache.blocks(b) == std::vector<std::int32_t>{0, 2});

  kvlab::PoolDotOptions options;
  options.sequence_names = {{a, "A"}, {b, "B \"forked\""}};
  options.other_holders = "prefix cache";
  options.block_notes = {{2, "B's copy of block 1"}};
  const std::string text = kvlab::pool_dot(cache, options);
  CHECK(text == kvlab::pool_dot(cache, options));  // the same state, the same text
  const Graph g = parse(text);

  SECTION("the title: the pool's counts, and the legend of the styles drawn") {
    CHECK(g.title ==
          "pool of 8 blocks of 4 tokens: 3 in use, 5 free\\norange: shared by several sequences; "
          "thick border: held by prefix cache");
  }
  SECTION("every table entry is an edge to its physical block, and nothing else is") {
    CHECK(g.edges == std::vector<std::string>{"seq_0:p0 -> block_0", "seq_0:p1 -> block_1",
                                              "seq_1:p0 -> block_0", "seq_1:p1 -> block_2"});
  }
  SECTION("the tables: name, length, then each logical block's tokens") {
    CHECK(g.labels.at("seq_0") == "<name> A\\n6 tokens|<p0> 0: 4/4|<p1> 1: 2/4");
    CHECK(g.labels.at("seq_1") == "<name> B \\\"forked\\\"\\n7 tokens|<p0> 0: 4/4|<p1> 1: 3/4");
  }
  SECTION("each block in use: its holders (the reference count), its fill, its note") {
    CHECK(nodes_with(g, "block_") == std::set<std::string>{"block_0", "block_1", "block_2"});
    CHECK(g.labels.at("block_0") == "block 0\n3 holders: A, B \"forked\", prefix cache\n4/4 tokens");
    CHECK(g.labels.at("block_1") == "block 1\n1 holder: A\n2/4 tokens");
    CHECK(g.labels.at("block_2") ==
          "block 2\n1 holder: B \"forked\"\n3/4 tokens\nB's copy of block 1");
    // in order of their ids, top to bottom, the free list last
    CHECK(g.rows == std::vector<std::string>{"block_0", "block_1", "block_2", "free"});
    for (std::int32_t block = 0; block < 3; ++block) {
      const std::string label = g.labels.at("block_" + std::to_string(block));
      const int refs = cache.allocator().ref_count(block);
      CHECK(label.find("\n" + std::to_string(refs) + (refs == 1 ? " holder:" : " holders:")) !=
            std::string::npos);
    }
    // Shared by two sequences: orange; a holder that is not a sequence: a thick border.
    CHECK(g.attrs.at("block_0") == R"( BGCOLOR="#fdd49e" BORDER="3")");
    CHECK(g.attrs.at("block_1") == R"( BGCOLOR="#ffffff" BORDER="1")");
    CHECK(g.attrs.at("block_2") == R"( BGCOLOR="#ffffff" BORDER="1")");
  }
  SECTION("the free blocks, as ranges") { CHECK(g.labels.at("free") == "free: 3-7\n(5 blocks)"); }
  SECTION("a block that no sequence holds any more: blue, no fill") {
    cache.free_sequence(a);
    cache.free_sequence(b);
    const Graph after = parse(kvlab::pool_dot(cache, options));
    CHECK(after.edges.empty());
    CHECK(nodes_with(after, "seq_").empty());
    CHECK(nodes_with(after, "block_") == std::set<std::string>{"block_0"});
    CHECK(after.labels.at("block_0") == "block 0\n1 holder: prefix cache");
    CHECK(after.attrs.at("block_0") == R"( BGCOLOR="#c6dbef" BORDER="3")");
    CHECK(after.labels.at("free") == "free: 1-7\n(7 blocks)");
  }
  check_with_dot(text, "fork");
}

TEST_CASE("pool_dot draws blocks given back out of a sliding window as released entries") {
  // PagedSequences alone (no values): 10 tokens in blocks of 4, the first 8 released.
  kvlab::PagedSequences book(/*block_size=*/4, /*num_blocks=*/5, "test");
  const int seq = book.add_sequence();
  book.reserve(seq, 10, [](std::int32_t, std::int32_t, int) {});
  REQUIRE(book.release_front(seq, 8) == 2);
  const Graph g = parse(kvlab::pool_dot(book));
  CHECK(g.labels.at("seq_0") ==
        "<name> seq 0\\n10 tokens|<p0> 0: released|<p1> 1: released|<p2> 2: 2/4");
  CHECK(g.title == "pool of 5 blocks of 4 tokens: 1 in use, 4 free");  // nothing shared
  CHECK(g.edges == std::vector<std::string>{"seq_0:p2 -> block_2"});
  CHECK(nodes_with(g, "block_") == std::set<std::string>{"block_2"});
  CHECK(g.labels.at("free") == "free: 0-1, 3-4\n(4 blocks)");
  check_with_dot(kvlab::pool_dot(book), "window");
}

TEST_CASE("step_dot and scheduler_pool_dot draw an engine's step with prefix-cache hits") {
  // Blocks of 4 tokens. R0's prompt of 12 tokens fills 3 blocks; it generates 2 tokens and
  // ends in step 1, its 3 full blocks cached. At time 3, R1 (R0's first 8 tokens and 3 of its
  // own) and R2 arrive; one request runs at a time, so R2 waits. R1 takes 2 blocks from the
  // cache and computes its 3 own tokens; R0's third block stays cached, evictable.
  kvlab::Engine engine(kvlab_test::builtin_weights(), small_engine(/*max_running=*/1));
  kvlab::Request r0, r1, r2;
  for (int t = 0; t < 12; ++t) r0.prompt.push_back(t + 1);
  r0.max_new_tokens = 2;
  r1.prompt = {1, 2, 3, 4, 5, 6, 7, 8, 50, 51, 52};
  r2.prompt = {60, 61, 62, 63, 64};
  r1.max_new_tokens = r2.max_new_tokens = 3;
  r1.arrival = r2.arrival = 3;
  for (const kvlab::Request& r : {r0, r1, r2}) engine.submit(r);
  kvlab::ServingDotOptions options;
  options.request_names = {"R0", "R1"};  // R2 has no name: "request 2"
  CHECK_THROWS_AS(kvlab::step_dot(engine, options), kvlab::InvalidArgument);
  // Steps 0 and 1 run R0, then time jumps to 3 (a call that runs nothing), and step 2 admits R1.
  for (int call = 0; call < 4 && engine.last_step().admitted != std::vector<int>{1}; ++call)
    engine.step();
  REQUIRE(engine.last_step().step == 2);
  const kvlab::StepRecord& step = engine.last_step();
  REQUIRE(step.batch.size() == 1);
  REQUIRE(step.prefix_hit_tokens == 8);
  const kvlab::Scheduler& s = engine.scheduler();
  const int seq = s.request(1).seq;
  const std::vector<std::int32_t> table = s.pool().blocks(seq);  // [3]
  REQUIRE(table.size() == 3);

  SECTION("the step: the waiting queue, the chunk, the budget, the pool's counts") {
    const std::string text = kvlab::step_dot(engine, options);
    const Graph g = parse(text);
    CHECK(nodes_with(g, "waiting_") == std::set<std::string>{"waiting_2"});
    CHECK(g.labels.at("waiting_2") == "request 2\\n5 tokens to compute (prompt 5, generated 0)");
    CHECK(nodes_with(g, "chunk_") == std::set<std::string>{"chunk_0"});
    CHECK(g.labels.at("chunk_0") ==
          "R1\\nprefill 3 tokens\\njoined this step: 8 tokens from the prefix cache\\nnow 11 "
          "tokens in seq " +
              std::to_string(seq) + ", 3 blocks");
    CHECK(g.labels.at("budget") == "token budget: 32|<c0> R1: 3|unused: 29");
    CHECK(g.edges == std::vector<std::string>{"budget:c0 -> chunk_0"});
    CHECK(g.labels.at("memory") ==
          "pool after the step (blocks of 4 tokens)|held by sequences: " +
              std::to_string(step.blocks_used) +
              "|cached, evictable: 1|free: " + std::to_string(step.blocks_free) + "|promised: " +
              std::to_string(step.blocks_reserved) + "|prefix hits this step: 8 tokens");
    CHECK(step.blocks_used == 3);
    check_with_dot(text, "step");
  }
  SECTION("the pool: R1 shares two cached blocks, R0's third block waits in the queue") {
    const std::string text = kvlab::scheduler_pool_dot(s, options);
    const Graph g = parse(text);
    CHECK(nodes_with(g, "seq_") == std::set<std::string>{"seq_" + std::to_string(seq)});
    const std::string sid = "seq_" + std::to_string(seq);
    CHECK(g.labels.at(sid) == "<name> R1\\n11 tokens|<p0> 0: 4/4|<p1> 1: 4/4|<p2> 2: 3/4");
    const auto block = [](std::int32_t b) { return "block_" + std::to_string(b); };
    CHECK(g.edges == std::vector<std::string>{sid + ":p0 -> " + block(table[0]),
                                              sid + ":p1 -> " + block(table[1]),
                                              sid + ":p2 -> " + block(table[2])});
    for (int j = 0; j < 2; ++j) {
      CHECK(g.labels.at(block(table[static_cast<std::size_t>(j)])) ==
            "block " + std::to_string(table[static_cast<std::size_t>(j)]) +
                "\n2 holders: R1, prefix cache\n4/4 tokens\ncached");
    }
    CHECK(g.labels.at(block(table[2])) ==
          "block " + std::to_string(table[2]) + "\n1 holder: R1\n3/4 tokens");
    const std::vector<std::int32_t> queue = s.prefix_cache().eviction_order();
    REQUIRE(queue.size() == 1);
    CHECK(g.labels.at(block(queue[0])) ==
          "block " + std::to_string(queue[0]) +
              "\n1 holder: prefix cache\ncached (full), evictable: 1 of 1 in the queue");
    CHECK(nodes_with(g, "block_").size() == 4);  // R1's 3 blocks and the evictable one
    check_with_dot(text, "prefix");
  }
}

TEST_CASE("step_dot gives a joining request's prefix hits only when it joined alone") {
  // R0's prompt of 8 tokens fills 2 blocks and is cached when R0 ends. R1 and R2 arrive later
  // with R0's first 4 tokens and their own, and join in the same step: each takes 1 block (4
  // tokens) from the cache. The step log counts the step's hits (8), not each request's, so
  // neither chunk gives a number and the pool's record gives the sum.
  kvlab::Engine engine(kvlab_test::builtin_weights(), small_engine(/*max_running=*/2));
  kvlab::Request r0, r1, r2;
  r0.prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  r0.max_new_tokens = 1;
  r1.prompt = {1, 2, 3, 4, 40, 41};
  r2.prompt = {1, 2, 3, 4, 50, 51, 52};
  r1.max_new_tokens = r2.max_new_tokens = 2;
  r1.arrival = r2.arrival = 3;
  for (const kvlab::Request& r : {r0, r1, r2}) engine.submit(r);
  for (int call = 0; call < 6 && engine.last_step().admitted.size() != 2; ++call) engine.step();
  const kvlab::StepRecord& step = engine.last_step();
  REQUIRE(step.admitted == std::vector<int>{1, 2});
  REQUIRE(step.prefix_hit_tokens == 8);
  const Graph g = parse(kvlab::step_dot(engine));
  REQUIRE(nodes_with(g, "chunk_") == std::set<std::string>{"chunk_0", "chunk_1"});
  for (const char* chunk : {"chunk_0", "chunk_1"}) {
    const std::string label = g.labels.at(chunk);
    CHECK(label.find("\\njoined this step\\n") != std::string::npos);
    CHECK(label.find("prefix cache") == std::string::npos);
  }
  CHECK(g.labels.at("memory").find("|prefix hits this step: 8 tokens") != std::string::npos);
}

TEST_CASE("a long title is broken at spaces into lines of at most 80 characters, words whole",
          "[report]") {
  // kvlab-serve puts its whole command line in the title: on one line it made the picture wider
  // than its graph (1065 pt where the graph needs 572).
  std::string command = "kvlab-serve";
  for (int i = 0; i < 20; ++i) command += " --option-" + std::to_string(i) + " 12";
  const std::string wrapped = kvlab::detail::dot_wrap(command + "\nstep 12");
  std::vector<std::string> lines;
  std::stringstream in(wrapped);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() >= 3);  // 311 characters and the step's own line
  std::string joined;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    CHECK(lines[i].size() <= 80);
    CHECK(lines[i].front() != ' ');
    CHECK(lines[i].back() != ' ');
    if (i + 1 < lines.size()) joined += lines[i] + (i + 2 == lines.size() ? "\n" : " ");
  }
  CHECK(lines.back() == "step 12");                       // an explicit line break stays one
  CHECK(joined + lines.back() == command + "\nstep 12");  // nothing lost, no word split
  const std::string word(100, 'x');                       // a word longer than a line stays whole
  CHECK(kvlab::detail::dot_wrap("a " + word + " b") == "a\n" + word + "\nb");
}
