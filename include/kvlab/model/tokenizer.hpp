/// \file
/// \brief `Tokenizer`: llama2.c's byte-pair-encoding tokenizer, from text to token ids and back.
///
/// Its vocabulary is the Llama 2 SentencePiece vocabulary in llama2.c's `tokenizer.bin` format.
/// `encode` and `decode` follow llama2.c's `run.c` step by step; they are checked against the
/// encodings pinned in llama2.c's `test.c` (taken from Meta's Llama 2 tokenizer).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/model/text_tokenizer.hpp"

namespace kvlab {

/// The tokenizer of llama2.c: a vocabulary of pieces (byte strings) with one score each, and the
/// greedy byte-pair merge that turns text into token ids.
///
/// A decoder never sees text: it reads token ids and writes token ids. The tokenizer is the
/// dictionary at both ends. Token id `i` stands for the byte string `piece(i)`; ids 0, 1 and 2
/// are `<unk>`, BOS (begin of sequence, `kBos`) and EOS (end of sequence, `kEos`), and in the
/// Llama vocabulary ids 3..258 are the 256 single bytes, written `"<0x00>"`..`"<0xFF>"`. The
/// Llama vocabulary marks a word start with a space (SentencePiece's `▁`, turned into a plain
/// space by llama2.c's export), so `" the"` is one piece and `"the"` another.
///
/// Encoding (`encode`, as llama2.c's `encode()`):
///  1. optionally BOS;
///  2. a dummy space in front of non-empty text, so that the first word is encoded like every
///     other word (SentencePiece's `add_dummy_prefix`);
///  3. one token per UTF-8 code point that is a piece of its own; a code point that is not is
///     written byte by byte with the byte tokens (id = byte + 3: "byte fallback");
///  4. again and again: among all adjacent pairs whose concatenation is a piece, merge the pair
///     whose piece has the highest score (the leftmost on a tie), until no pair merges;
///  5. optionally EOS.
///
/// Decoding (`decode(prev, token)`) gives the text of one token as llama2.c prints it: the piece,
/// without its leading space right after BOS (that space is the dummy prefix of step 2), and a
/// byte piece `"<0xHH>"` as the raw byte HH (a multi-byte character that fell back to bytes comes
/// back whole once its bytes are concatenated).
///
/// A `Tokenizer` is immutable once built; all of its functions are `const` and may be called
/// from several threads at once.
class Tokenizer : public TextTokenizer {
 public:
  /// Token id of BOS, the begin-of-sequence token (llama2.c and Llama 2: 1).
  static constexpr int kBos = 1;
  /// Token id of EOS, the end-of-sequence token (llama2.c and Llama 2: 2).
  static constexpr int kEos = 2;
  /// Byte fallback: the token id of raw byte `b` is `b + kByteOffset`, after `<unk>`, BOS, EOS.
  static constexpr int kByteOffset = 3;

  /// A tokenizer over `pieces` (token id i stands for `pieces[i]`) with merge scores `scores`;
  /// `max_token_length()` is the length of the longest piece.
  /// \param pieces [vocab_size] byte strings, none empty, none holding a NUL byte.
  /// \param scores [vocab_size] finite merge scores: a higher score merges first.
  /// \throws InvalidArgument if the sizes differ, there are fewer than 3 pieces (ids 0..2 must
  ///         exist), or a piece is empty, holds a NUL byte, or a score is not finite.
  Tokenizer(std::vector<std::string> pieces, std::vector<float> scores)
      : pieces_(std::move(pieces)), scores_(std::move(scores)) {
    check_and_index(0, false);
  }

  /// As `Tokenizer(pieces, scores)`, with the `max_token_length` that a `tokenizer.bin` header
  /// declares (an upper bound on the length of every piece, in bytes).
  /// \throws InvalidArgument as the other constructor, and if `max_token_length` is smaller than
  ///         the longest piece.
  Tokenizer(std::vector<std::string> pieces, std::vector<float> scores, int max_token_length)
      : pieces_(std::move(pieces)), scores_(std::move(scores)) {
    check_and_index(max_token_length, true);
  }

  /// Reads a llama2.c `tokenizer.bin` to its end: an int32 `max_token_length`, then per token a
  /// float32 score, an int32 length and that many bytes of piece (all little-endian).
  /// \throws InvalidArgument, naming `path` and the field (for example
  ///         `".../tokenizer.bin: token 1234 length"`), if the file cannot be opened, ends inside a
  ///         field, holds a length below 1 or above `max_token_length`, a piece with a NUL byte, a
  ///         score that is not finite, or fewer than 3 tokens.
  static Tokenizer load(const std::string& path) { return read_file(path, -1); }

  /// Reads exactly `vocab_size` tokens from a llama2.c `tokenizer.bin`, as llama2.c's
  /// `build_tokenizer` does with the model's vocabulary size, and checks that the file ends there.
  /// \throws InvalidArgument as `load(path)`, and if `vocab_size` < 3 or the file holds fewer or
  ///         more tokens than `vocab_size` (argument `"<path>: token count"`).
  static Tokenizer load(const std::string& path, int vocab_size) {
    if (vocab_size < 3) {
      detail::fail("Tokenizer::load", "vocab_size", ">= 3 (ids 0, 1, 2 are <unk>, BOS, EOS)",
                   vocab_size);
    }
    return read_file(path, vocab_size);
  }

  /// Number of pieces (token ids are 0 .. vocab_size() - 1).
  int vocab_size() const override { return static_cast<int>(pieces_.size()); }

  /// Upper bound on the length of a piece in bytes: the file header's value, or the longest piece.
  int max_token_length() const { return max_token_length_; }

  /// The byte string that token `id` stands for, as stored (BOS is `"\n<s>\n"` in llama2.c's
  /// export of the Llama vocabulary; byte tokens are `"<0xHH>"`).
  /// \throws InvalidArgument if `id` is not in [0, vocab_size()).
  const std::string& piece(int id) const {
    check_id("Tokenizer::piece", "id", id);
    return pieces_[static_cast<std::size_t>(id)];
  }

  /// The merge score of token `id`: when several adjacent pairs can merge, the pair whose merged
  /// piece has the highest score merges first.
  /// \throws InvalidArgument if `id` is not in [0, vocab_size()).
  float score(int id) const {
    check_id("Tokenizer::score", "id", id);
    return scores_[static_cast<std::size_t>(id)];
  }

  /// All pieces, indexed by token id: [vocab_size].
  const std::vector<std::string>& pieces() const { return pieces_; }

  /// All scores, indexed by token id: [vocab_size].
  const std::vector<float>& scores() const { return scores_; }

  /// The token id whose piece is exactly `text`, or -1 if no piece is (llama2.c's `str_lookup`).
  int lookup(const std::string& text) const {
    const auto found = index_.find(text);
    return found == index_.end() ? -1 : found->second;
  }

  /// The token ids of `text` (UTF-8), exactly as llama2.c's `encode()`: optional BOS, a dummy
  /// space before non-empty text, one token per code point (byte tokens for a code point that is
  /// not a piece), then repeated best-score merges of adjacent pairs, then optional EOS.
  ///
  /// Every byte of `text` is encoded, a NUL byte too (it falls back to its byte token), where
  /// llama2.c's C string would end at it. Should the vocabulary lack the piece `" "`, the dummy
  /// space falls back to its byte token like any other character.
  /// \param text UTF-8 text (any bytes are accepted).
  /// \param bos put BOS (`kBos`) first.
  /// \param eos put EOS (`kEos`) last.
  /// \return [n] token ids.
  /// \throws InvalidArgument if a byte has to fall back to a byte token (id byte + 3) that does
  ///         not exist in this vocabulary (vocabularies without the 256 byte tokens).
  std::vector<int> encode(const std::string& text, bool bos, bool eos) const {
    std::vector<int> tokens;  // [at most bos + 1 + text.size() + eos] ids; shrinks as pairs merge
    tokens.reserve(text.size() + 3);

    // 1. BOS, if asked for. Like llama2.c, it stays in the list during the merges of step 4
    //    (its piece "\n<s>\n" joins with no other piece of the Llama vocabulary).
    if (bos) tokens.push_back(kBos);

    // 2. The dummy prefix: a space in front of non-empty text, so that its first word becomes
    //    " word" like every word after a space.
    if (!text.empty()) push_code_point(" ", tokens);

    // 3. Split the bytes into UTF-8 code points (a lead byte and up to 3 continuation bytes
    //    10xxxxxx); each becomes its own token, or its bytes' tokens if it is not a piece.
    for (std::size_t start = 0; start < text.size();) {
      std::size_t length = 1;  // bytes in this code point, 1..4
      while (start + length < text.size() && is_continuation_byte(text[start + length]) &&
             length < 4)
        ++length;
      push_code_point(text.substr(start, length), tokens);
      start += length;
    }

    // 4. Merge: find the adjacent pair whose concatenation is a piece with the best score, replace
    //    the pair by that piece's token, and repeat until no adjacent pair is a piece.
    //    merged[i] = the id of piece(tokens[i]) + piece(tokens[i + 1]), or -1 if that is no piece.
    std::vector<int> merged(tokens.empty() ? 0 : tokens.size() - 1);  // [tokens.size() - 1]
    for (std::size_t i = 0; i < merged.size(); ++i) merged[i] = pair_id(tokens[i], tokens[i + 1]);
    while (true) {
      //    a. the best pair: highest score, leftmost on a tie; like llama2.c, a score must beat
      //       -1e10 to count at all.
      float best_score = kNoMergeScore;
      std::size_t best = merged.size();  // position of the best pair; merged.size() = none
      for (std::size_t i = 0; i < merged.size(); ++i) {
        if (merged[i] != -1 && scores_[static_cast<std::size_t>(merged[i])] > best_score) {
          best_score = scores_[static_cast<std::size_t>(merged[i])];
          best = i;
        }
      }
      //    b. no pair merges: done.
      if (best == merged.size()) break;
      //    c. the pair (best, best + 1) becomes one token.
      tokens[best] = merged[best];
      tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(best) + 1);
      merged.erase(merged.begin() + static_cast<std::ptrdiff_t>(best));
      //    d. only the two pairs that touch the new token have changed.
      if (best > 0) merged[best - 1] = pair_id(tokens[best - 1], tokens[best]);
      if (best < merged.size()) merged[best] = pair_id(tokens[best], tokens[best + 1]);
    }

    // 5. EOS, if asked for.
    if (eos) tokens.push_back(kEos);
    return tokens;
  }

  /// `encode(text, false, false)`: llama2.c's vocabulary has no special tokens to parse in
  /// text (BOS and EOS are added by `encode`'s flags), so `parse_special` changes nothing.
  std::vector<int> encode_text(const std::string& text, bool /*parse_special*/) const override {
    return encode(text, false, false);
  }
  /// `decode(prev, id)`, with `<unk>` (0) standing for no predecessor (`prev` = -1).
  /// \throws InvalidArgument if `id` or `prev` (when not -1) is not in [0, vocab_size()).
  std::string token_bytes(int id, int prev = -1) const override {
    return decode(prev < 0 ? 0 : prev, id);
  }
  /// True for `<unk>`, BOS and EOS (ids 0, 1, 2).
  /// \throws InvalidArgument if `id` is not in [0, vocab_size()).
  bool is_special(int id) const override {
    check_id("Tokenizer::is_special", "id", id);
    return id <= kEos;
  }
  /// `kBos`.
  int bos_id() const override { return kBos; }
  /// `kEos`.
  int eos_id() const override { return kEos; }

  /// The text of `token` when it follows `prev_token`, as llama2.c's `decode()` gives it for
  /// printing: the piece, less its leading space if `prev_token` is BOS, and a byte piece
  /// `"<0xHH>"` as the single raw byte HH (which may be one byte of a multi-byte character).
  /// llama2.c's printer then drops unprintable control bytes; `decode` returns every byte.
  /// \throws InvalidArgument if `prev_token` or `token` is not in [0, vocab_size()).
  std::string decode(int prev_token, int token) const {
    check_id("Tokenizer::decode", "prev_token", prev_token);
    check_id("Tokenizer::decode", "token", token);
    return piece_text(prev_token, token);
  }

  /// The text of a whole token sequence: `decode(prev, token)` of every token, concatenated, with
  /// BOS as the `prev` of the first token (so the dummy space of `encode` disappears), and no text
  /// for BOS and EOS themselves: they mark where a sequence begins and ends (llama2.c's generate
  /// never prints the BOS it starts from; SentencePiece's decoder skips both). So, with the Llama
  /// vocabulary, `decode(encode(text, bos, eos)) == text` for UTF-8 text and any flags.
  /// \param tokens [n] token ids.
  /// \throws InvalidArgument if a token is not in [0, vocab_size()) (argument `tokens[i]`).
  std::string decode(const std::vector<int>& tokens) const override {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      check_id("Tokenizer::decode", "tokens[" + std::to_string(i) + "]", tokens[i]);
    }
    std::string text;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      // BOS and EOS only mark the ends of a sequence: they add no text.
      if (tokens[i] == kBos || tokens[i] == kEos) continue;
      // The first token reads as if it followed BOS.
      const int prev = i == 0 ? kBos : tokens[i - 1];
      text += piece_text(prev, tokens[i]);
    }
    return text;
  }

 private:
  /// The constructors' checks, then the piece -> id index. `declared`: `max_token_length` comes
  /// from the caller (else the longest piece sets it).
  void check_and_index(int max_token_length, bool declared) {
    const char* where = "Tokenizer";
    require_same_size(where, "scores.size()", scores_.size(), pieces_.size(),
                      "one score per piece");
    if (pieces_.size() < 3 ||
        pieces_.size() > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
      detail::fail(where, "pieces.size()", "3 to 2^31-1 (ids 0, 1, 2 are <unk>, BOS, EOS)",
                   pieces_.size());
    }
    int longest = 0;  // length of the longest piece, in bytes
    for (std::size_t i = 0; i < pieces_.size(); ++i) {
      const std::string name = "pieces[" + std::to_string(i) + "]";
      const std::string problem = piece_problem(pieces_[i]);
      if (!problem.empty())
        detail::fail(where, name, "a non-empty string without NUL bytes", problem);
      if (!std::isfinite(scores_[i])) {
        detail::fail(where, "scores[" + std::to_string(i) + "]", "a finite number", scores_[i]);
      }
      if (pieces_[i].size() > static_cast<std::size_t>(longest))
        longest = static_cast<int>(pieces_[i].size());
    }
    if (declared && max_token_length < longest) {
      detail::fail(where, "max_token_length",
                   ">= " + std::to_string(longest) + " (the longest piece)", max_token_length);
    }
    max_token_length_ = declared ? max_token_length : longest;
    // The lookup table piece -> id (llama2.c sorts the vocabulary and binary-searches it; a hash
    // map does the same job). Should a piece appear twice, the lower id wins.
    index_.reserve(pieces_.size());
    for (std::size_t i = 0; i < pieces_.size(); ++i)
      index_.emplace(pieces_[i], static_cast<int>(i));
  }

  /// llama2.c's starting "best score": a merge counts only if its score is above this.
  static constexpr float kNoMergeScore = -1e10f;

  /// True for a UTF-8 continuation byte (10xxxxxx), which never starts a code point.
  static bool is_continuation_byte(char byte) {
    return (static_cast<unsigned char>(byte) & 0xC0u) == 0x80u;
  }

  /// Empty if `piece` is acceptable, else what is wrong with it (for an error message).
  static std::string piece_problem(const std::string& piece) {
    if (piece.empty()) return "an empty string";
    const std::size_t nul = piece.find('\0');
    if (nul != std::string::npos) return "a NUL byte at offset " + std::to_string(nul);
    return "";
  }

  /// Throws unless `id` is a token id of this vocabulary.
  void check_id(const char* where, const std::string& argument, int id) const {
    if (id < 0 || id >= vocab_size()) {
      detail::fail(where, argument, "an id in [0, " + std::to_string(vocab_size()) + ")", id);
    }
  }

  /// Throws unless `value == expected` (two sizes); `why` says why they must agree.
  static void require_same_size(const char* where, const std::string& argument, std::size_t value,
                                std::size_t expected, const std::string& why) {
    if (value != expected)
      detail::fail(where, argument, std::to_string(expected) + " (" + why + ")", value);
  }

  /// Appends the token of one code point (`code_point`: 1..4 bytes), or, if it is not a piece,
  /// the byte tokens of its bytes (byte fallback).
  void push_code_point(const std::string& code_point, std::vector<int>& tokens) const {
    const int id = lookup(code_point);
    if (id != -1) {
      tokens.push_back(id);
      return;
    }
    for (const char c : code_point) {
      const int byte = static_cast<unsigned char>(c);
      const int byte_id = byte + kByteOffset;  // ids 0..2 are <unk>, BOS, EOS; bytes follow
      if (byte_id >= vocab_size()) {
        detail::fail("Tokenizer::encode", "byte fallback token of byte " + std::to_string(byte),
                     "an id below vocab_size " + std::to_string(vocab_size()), byte_id);
      }
      tokens.push_back(byte_id);
    }
  }

  /// The id of the piece piece(left) + piece(right), or -1 if that string is not a piece.
  int pair_id(int left, int right) const {
    return lookup(pieces_[static_cast<std::size_t>(left)] +
                  pieces_[static_cast<std::size_t>(right)]);
  }

  /// The value of hex digit `c`, or -1 if `c` is not one (0-9, A-F, a-f).
  static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  }

  /// The byte that a byte piece `"<0xHH>"` (from offset `start` of `piece`) stands for, or -1 if
  /// the text is not exactly of that form (llama2.c's `sscanf("<0x%02hhX>")` is looser; the two
  /// agree on every piece of the Llama vocabulary).
  static int byte_of_piece(const std::string& piece, std::size_t start) {
    if (piece.size() != start + 6) return -1;
    const char* p = piece.data() + start;  // [6] '<', '0', 'x', H, H, '>'
    if (p[0] != '<' || p[1] != '0' || p[2] != 'x' || p[5] != '>') return -1;
    const int high = hex_value(p[3]);
    const int low = hex_value(p[4]);
    return (high < 0 || low < 0) ? -1 : high * 16 + low;
  }

  /// `decode(prev_token, token)` without the id checks.
  std::string piece_text(int prev_token, int token) const {
    const std::string& piece = pieces_[static_cast<std::size_t>(token)];
    // After BOS, the leading space is the dummy prefix of encode(): drop it.
    const std::size_t start = (prev_token == kBos && piece[0] == ' ') ? 1 : 0;
    // A byte piece "<0xHH>" stands for the raw byte HH.
    const int byte = byte_of_piece(piece, start);
    if (byte >= 0) return std::string(1, static_cast<char>(byte));
    return piece.substr(start);
  }

  /// Reads a tokenizer.bin: to its end if `vocab_size` < 0, else exactly `vocab_size` tokens.
  static Tokenizer read_file(const std::string& path, int vocab_size) {
    const char* where = "Tokenizer::load";
    std::ifstream file(path, std::ios::binary);
    if (path.empty()) detail::fail(where, "path", "the name of a tokenizer.bin file", "''");
    if (!file)
      detail::fail(where, path, "an existing, readable tokenizer.bin file",
                   "a path that cannot be opened");
    // [file size]
    const std::string bytes((std::istreambuf_iterator<char>(file)),
                            std::istreambuf_iterator<char>());
    if (file.bad()) detail::fail(where, path, "a readable tokenizer.bin file", "a read error");
    FileReader reader{path, bytes, 0};

    // Header: the length of the longest piece, in bytes.
    const std::int32_t max_token_length = reader.read_i32("max_token_length");
    if (max_token_length < 1)
      detail::fail(where, path + ": max_token_length", ">= 1", max_token_length);

    std::vector<std::string> pieces;  // [vocab_size] as read
    std::vector<float> scores;        // [vocab_size] as read
    for (int i = 0; vocab_size < 0 ? !reader.at_end() : i < vocab_size; ++i) {
      const std::string token = "token " + std::to_string(i);
      // A file that ends cleanly between two tokens holds too few of them.
      if (reader.at_end()) {
        detail::fail(where, path + ": token count", std::to_string(vocab_size) + " (vocab_size)",
                     i);
      }
      // Per token: float32 score, int32 length, `length` bytes of piece.
      const float score = reader.read_f32(token + " score");
      if (!std::isfinite(score))
        detail::fail(where, path + ": " + token + " score", "a finite number", score);
      const std::int32_t length = reader.read_i32(token + " length");
      if (length < 1 || length > max_token_length) {
        detail::fail(where, path + ": " + token + " length",
                     "1 to max_token_length (" + std::to_string(max_token_length) + ")", length);
      }
      std::string piece = reader.read_bytes(static_cast<std::size_t>(length), token + " bytes");
      const std::string problem = piece_problem(piece);
      if (!problem.empty())
        detail::fail(where, path + ": " + token + " bytes", "no NUL byte", problem);
      pieces.push_back(std::move(piece));
      scores.push_back(score);
    }
    if (vocab_size < 0 && pieces.size() < 3) {
      detail::fail(where, path + ": token count", ">= 3 (ids 0, 1, 2 are <unk>, BOS, EOS)",
                   pieces.size());
    }
    if (!reader.at_end()) {
      detail::fail(where, path + ": token count", std::to_string(vocab_size) + " (vocab_size)",
                   "more: " + std::to_string(bytes.size() - reader.offset) +
                       " bytes follow token " + std::to_string(vocab_size - 1));
    }
    return Tokenizer(std::move(pieces), std::move(scores), max_token_length);
  }

  /// A cursor over the bytes of a file, reading little-endian fields and naming the file and the
  /// field in its errors.
  struct FileReader {
    const std::string& path;   ///< the file, for error messages
    const std::string& bytes;  ///< [file size] its contents
    std::size_t offset;        ///< the next byte to read

    /// True when every byte has been read.
    bool at_end() const { return offset == bytes.size(); }

    /// The next `count` bytes; throws, naming `field`, if the file ends before.
    std::string read_bytes(std::size_t count, const std::string& field) {
      const std::size_t left = bytes.size() - offset;
      if (left < count) {
        detail::fail(
            "Tokenizer::load", path + ": " + field, std::to_string(count) + " bytes",
            std::to_string(left) + " (the file ends at byte " + std::to_string(bytes.size()) + ")");
      }
      std::string out = bytes.substr(offset, count);
      offset += count;
      return out;
    }

    /// The next 4 bytes as a little-endian unsigned integer.
    std::uint32_t read_u32(const std::string& field) {
      const std::string b = read_bytes(4, field);
      std::uint32_t value = 0;
      for (int i = 3; i >= 0; --i)
        value = (value << 8) | static_cast<unsigned char>(b[static_cast<std::size_t>(i)]);
      return value;
    }

    /// The next little-endian int32.
    std::int32_t read_i32(const std::string& field) {
      const std::uint32_t u = read_u32(field);
      std::int32_t value = 0;
      std::memcpy(&value, &u, sizeof value);  // two's complement: the same 32 bits
      return value;
    }

    /// The next little-endian IEEE-754 float32.
    float read_f32(const std::string& field) {
      const std::uint32_t u = read_u32(field);
      float value = 0;
      std::memcpy(&value, &u, sizeof value);
      return value;
    }
  };

  std::vector<std::string> pieces_;  // [vocab_size] token id -> piece
  std::vector<float> scores_;        // [vocab_size] token id -> merge score
  int max_token_length_ = 0;         // longest piece allowed, in bytes
  // [vocab_size] piece -> token id (lowest on duplicates)
  std::unordered_map<std::string, int> index_;
};

}  // namespace kvlab
