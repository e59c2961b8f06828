/// \file
/// \brief `pool_dot`: the block tables and block pool of a paged KV cache as a Graphviz dot graph.
///
/// It draws from the cache's own state: one node per sequence's table, an edge from each logical
/// block to its physical block, each block with its holders and how full it is. Checked in
/// `tests/report/test_state_dot.cpp` line by line against the state it draws (a fork, a copy on
/// write, a holder that is not a sequence), and by `dot -Tsvg` where Graphviz is installed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kvlab/cache/block_allocator.hpp"
#include "kvlab/config.hpp"
#include "kvlab/core/paged_view.hpp"

namespace kvlab {

/// What a pool diagram adds to the pool's own state: names and notes that the pool does not
/// know (who its sequences are, who its other holders are). Every field may stay empty.
struct PoolDotOptions {
  /// The diagram's first line, above "pool of N blocks of B tokens: U in use, F free" (empty:
  /// none).
  std::string title;
  /// A name per sequence id ("A", "request 3"); a sequence without one is "seq N".
  std::map<int, std::string> sequence_names;
  /// What the holders of a block that are not sequences are (`PagedKVCache::retain_block`).
  std::string other_holders = "other holder";
  /// A line added under some blocks ("cached, evictable") , by block id.
  std::map<std::int32_t, std::string> block_notes;
};

namespace detail {

/// `text` as the inside of a dot string: `"` and `\` escaped, each '\n' the dot line break
/// `\n`; with `record`, also the characters that split a record label (`{ } | < >`).
inline std::string dot_escape(const std::string& text, bool record = false) {
  std::string out;
  for (char c : text) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '"' || c == '\\' ||
        (record && (c == '{' || c == '}' || c == '|' || c == '<' || c == '>')))
      out += '\\';
    out += c;
  }
  return out;
}

/// Ascending ids as ranges: {3, 5, 6, 7} gives "3, 5-7"; none gives "none".
inline std::string dot_id_ranges(const std::vector<std::int32_t>& ids) {
  std::string out;
  for (std::size_t i = 0; i < ids.size();) {
    std::size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ids[i]);
    if (j > i) out += "-" + std::to_string(ids[j]);
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

/// `text` with each of its lines longer than `width` characters broken at spaces, so that a long
/// title (a program's whole command line) does not make the picture wider than its graph. A word
/// longer than `width` stays whole.
inline std::string dot_wrap(const std::string& text, std::size_t width = 80) {
  std::string out, line;
  const auto flush_word = [&](const std::string& word) {
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  };
  std::string word;
  for (char c : text + "\n") {
    if (c == ' ' || c == '\n') {
      if (!word.empty()) flush_word(word);
      word.clear();
      if (c == '\n') {
        out += line + "\n";
        line.clear();
      }
    } else {
      word += c;
    }
  }
  out.pop_back();  // the '\n' added after the last line
  return out;
}

/// `text` as the text of an HTML-like dot label: `&`, `<`, `>` and `"` as entities, each '\n'
/// a line break `<BR/>`.
inline std::string dot_html(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '\n':
        out += "<BR/>";
        break;
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

/// "1 token", "4 tokens": a count and its noun, singular for 1.
inline std::string dot_count(long long n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

}  // namespace detail

/// The block tables and the pool of `pool` as a Graphviz dot graph (`dot -Tsvg` draws it).
///
/// `Pool` is any paged cache's bookkeeping: `PagedSequences`, `PagedKVCache` (or its base
/// `PagedKVCacheBase`, which `Scheduler::pool` returns) or `cuda::PagedKVCache` — what it reads
/// is `sequences()`, `length(seq)`, `blocks(seq)`, `block_size()` and `allocator()`.
///
/// What is drawn, in a fixed order (sequences and blocks by ascending id), so that the same
/// state always gives the same text:
///  - a cluster `tables`: per live sequence a record node `seq_<id>` whose first field is its
///    name and length and whose fields `<p<j>>` are its logical blocks `j` with their tokens;
///  - a cluster `pool` holding one node `pool`, a table with a row per block in use, top to
///    bottom by ascending id (the cell `<b<id>>`, one line per row of the dot text), each with
///    its holders (reference count, and who: the sequences that list it, plus the holders that
///    are not sequences) and its fill (the most tokens a holding sequence keeps in it), and a
///    last row `<free>` listing the free blocks (one table, not a node per block, so that Graphviz
///    keeps the blocks in order instead of placing them where its edges cross least);
///  - an edge `seq_<id>:p<j> -> pool:b<b>` for each table entry (none for an entry given back
///    out of a sliding window, `kReleasedBlock`).
///
/// A block that two or more sequences hold is filled orange (shared: after a fork, or a prefix
/// hit); a block with a holder that is not a sequence has a thick border, and is filled blue
/// when no sequence holds it.
///
/// \code
/// kvlab::PagedKVCache<float> cache(1, 2, 2, /*block_size=*/4, /*num_blocks=*/8);
/// ... // add sequences, fork, append
/// std::ofstream("pool.dot") << kvlab::pool_dot(cache);  // then: dot -Tsvg pool.dot -o pool.svg
/// \endcode
/// Tutorial 03 draws its pool after a fork and a copy on write this way
/// (`03_paged_cache --dot FILE`); its docs page shows the picture.
/// \throws InvariantViolation if the sequences list a block more often than its reference
///         count says (a pool whose bookkeeping is broken).
template <typename Pool>
std::string pool_dot(const Pool& pool, const PoolDotOptions& options = {}) {
  const BlockAllocator& alloc = pool.allocator();
  const int block_size = pool.block_size();
  const auto name_of = [&options](int seq) {
    const auto it = options.sequence_names.find(seq);
    return it != options.sequence_names.end() ? it->second : "seq " + std::to_string(seq);
  };
  // Who holds each block among the sequences, and the most tokens one of them keeps in it.
  std::map<std::int32_t, std::vector<int>> seq_holders;  // block -> sequences, ascending
  std::map<std::int32_t, int> fill;                      // block -> tokens
  const std::vector<int> seqs = pool.sequences();
  for (int seq : seqs) {
    const std::vector<std::int32_t>& table = pool.blocks(seq);
    for (std::size_t j = 0; j < table.size(); ++j) {
      if (table[j] == kReleasedBlock) continue;
      const int tokens = std::min(block_size, pool.length(seq) - static_cast<int>(j) * block_size);
      seq_holders[table[j]].push_back(seq);
      fill[table[j]] = std::max(fill[table[j]], tokens);
    }
  }

  // The body first (clusters and edges); the header's legend names only the styles it uses.
  std::string out;
  bool any_shared = false, any_other = false, any_orphan = false;

  // The block tables: one record per sequence, a field per logical block.
  out += "  subgraph cluster_tables {\n    label=\"block tables (logical block: tokens)\";\n";
  for (int seq : seqs) {
    const std::vector<std::int32_t>& table = pool.blocks(seq);
    std::string label = "<name> " + detail::dot_escape(name_of(seq), true) + "\\n" +
                        detail::dot_count(pool.length(seq), "token");
    for (std::size_t j = 0; j < table.size(); ++j) {
      const int tokens = std::min(block_size, pool.length(seq) - static_cast<int>(j) * block_size);
      label +=
          "|<p" + std::to_string(j) + "> " + std::to_string(j) + ": " +
          (table[j] == kReleasedBlock ? std::string("released")
                                      : std::to_string(tokens) + "/" + std::to_string(block_size));
    }
    out += "    seq_" + std::to_string(seq) + " [shape=record, label=\"" + label + "\"];\n";
  }
  out += "  }\n";

  // The pool: each block in use, then the free list, as the rows of one table.
  out += "  subgraph cluster_pool {\n    label=\"pool (physical blocks)\";\n";
  out += "    pool [shape=plain, label=<<TABLE BORDER=\"0\" CELLSPACING=\"8\" CELLPADDING=\"4\">\n";
  std::vector<std::int32_t> free_blocks;
  for (std::int32_t b = 0; b < alloc.num_blocks(); ++b) {
    const int refs = alloc.ref_count(b);
    if (refs == 0) {
      free_blocks.push_back(b);
      continue;
    }
    const std::vector<int>& holders = seq_holders[b];
    const int others = refs - static_cast<int>(holders.size());
    if (others < 0) {
      throw InvariantViolation("kvlab::pool_dot: block " + std::to_string(b) + " is listed by " +
                               std::to_string(holders.size()) +
                               " sequences but has reference count " + std::to_string(refs));
    }
    std::string who;
    for (int seq : holders) who += (who.empty() ? "" : ", ") + name_of(seq);
    if (others > 0) {
      who += (who.empty() ? "" : ", ") + (others == 1 ? "" : std::to_string(others) + " x ") +
             options.other_holders;
    }
    std::string label =
        "block " + std::to_string(b) + "\n" + detail::dot_count(refs, "holder") + ": " + who;
    if (!holders.empty())
      label += "\n" + std::to_string(fill[b]) + "/" + std::to_string(block_size) + " tokens";
    const auto note = options.block_notes.find(b);
    if (note != options.block_notes.end()) label += "\n" + note->second;
    any_shared = any_shared || holders.size() > 1;
    any_other = any_other || others > 0;
    any_orphan = any_orphan || holders.empty();
    const char* color = holders.empty() ? "#c6dbef" : holders.size() > 1 ? "#fdd49e" : "#ffffff";
    out += "<TR><TD PORT=\"b" + std::to_string(b) + "\" BGCOLOR=\"" + color + "\" BORDER=\"" +
           (others > 0 ? "3" : "1") + "\">" + detail::dot_html(label) + "</TD></TR>\n";
  }
  out += "<TR><TD PORT=\"free\" BORDER=\"1\" STYLE=\"dashed\"><FONT COLOR=\"#666666\">" +
         detail::dot_html("free: " + detail::dot_id_ranges(free_blocks) + "\n(" +
                          detail::dot_count(static_cast<long long>(free_blocks.size()), "block") +
                          ")") +
         "</FONT></TD></TR>\n</TABLE>>];\n  }\n";

  // Table entries -> physical blocks.
  for (int seq : seqs) {
    const std::vector<std::int32_t>& table = pool.blocks(seq);
    for (std::size_t j = 0; j < table.size(); ++j) {
      if (table[j] == kReleasedBlock) continue;
      out += "  seq_" + std::to_string(seq) + ":p" + std::to_string(j) + " -> pool:b" +
             std::to_string(table[j]) + ";\n";
    }
  }
  out += "}\n";

  std::string label = options.title.empty() ? "" : options.title + "\n";
  label += "pool of " + detail::dot_count(alloc.num_blocks(), "block") + " of " +
           detail::dot_count(block_size, "token") + ": " + std::to_string(alloc.num_used()) +
           " in use, " + std::to_string(alloc.num_free()) + " free";
  std::string legend;
  if (any_shared) legend += "orange: shared by several sequences";
  if (any_other)
    legend += (legend.empty() ? "" : "; ") + ("thick border: held by " + options.other_holders);
  if (any_orphan) legend += (legend.empty() ? "" : "; ") + std::string("blue: held by no sequence");
  if (!legend.empty()) label += "\n" + legend;
  return "digraph kvlab_pool {\n"
         "  graph [rankdir=LR, labelloc=t, fontname=\"Helvetica\", fontsize=12, label=\"" +
         detail::dot_escape(detail::dot_wrap(label)) +
         "\"];\n  node [fontname=\"Helvetica\", fontsize=10];\n" + out;
}

}  // namespace kvlab
