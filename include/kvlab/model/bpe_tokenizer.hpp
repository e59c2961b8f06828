/// \file
/// \brief `BpeTokenizer`: the byte-level byte-pair encoding of GPT-2 and its descendants.
///
/// The encoding is read as GGUF files describe it (`tokenizer.ggml.model` "gpt2": tokens, merges,
/// token types), with the `smollm` pre-tokenizer (every digit alone, then GPT-2's split). Checked
/// in the tests against the Hugging Face `tokenizers` library configured from the same file, on a
/// committed corpus (`tests/golden/tokenizer_ids.json`), and by a fuzz target.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/model/gguf.hpp"
#include "kvlab/model/text_tokenizer.hpp"
#include "kvlab/model/unicode_classes.hpp"

namespace kvlab {

/// What a token of a GGUF vocabulary is (`tokenizer.ggml.token_type`, llama.cpp's
/// `llama_token_type`).
enum class TokenType : int {
  normal = 1,        ///< a piece of text, written in the byte-level alphabet
  unknown = 2,       ///< the unknown token
  control = 3,       ///< a special token: BOS, EOS, a chat template's markers
  user_defined = 4,  ///< text that is always one token, wherever it appears
  unused = 5,        ///< a placeholder
  byte = 6           ///< a raw byte
};

/// GPT-2's byte-level BPE tokenizer, configured as a GGUF file describes it.
///
/// **The byte-level alphabet.** Every byte b stands for one printable character
/// (`byte_char(b)`): the bytes of `!`..`~`, `¡`..`¬` and `®`..`ÿ` for themselves, the other 68
/// (controls, space, …) for U+0100, U+0101, … in order; so a space is written `Ġ` and a newline
/// `Ċ`. A normal token is a string of these characters and stands for their bytes: any byte
/// string can be encoded and decoded exactly.
///
/// **Encoding** (`encode_text`):
///  1. special tokens: where `parse_special` is true, the text of a control token (e.g.
///     `<|im_end|>`) is that token; user-defined tokens are always matched (the leftmost
///     match first, the longest of those starting there);
///  2. pre-tokenization of the text between them, character by character (UTF-8; a byte that
///     starts no well-formed character is a character of its own of class `other`): the
///     `smollm` pre-tokenizer first isolates every character of class number (`\p{N}`: each
///     digit of any script its own piece), then splits each piece with GPT-2's pattern
///     `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+` (the first
///     alternative that matches at each position; "gpt2" skips the digit step);
///  3. each word's bytes become byte-level characters, each a token; then, again and again, the
///     adjacent pair whose merge comes first in the file's merge list (the leftmost on a tie)
///     becomes the merged token, until no adjacent pair is a merge.
///
/// **Decoding**: a normal token gives its bytes, a control or user-defined token its text.
/// The character classes are Debian's Unicode data (`unicode_classes.hpp`).
class BpeTokenizer : public TextTokenizer {
 public:
  /// A tokenizer over a vocabulary and its merges.
  /// \param tokens  [vocab_size] token strings: id i is `tokens[i]`
  /// \param types   [vocab_size] a `TokenType` per token
  /// \param merges  [merge count] "A B" each: tokens A and B whose concatenation is a token;
  ///                earlier merges first
  /// \param pre  the pre-tokenizer: "smollm" (digits isolated, then GPT-2's split) or "gpt2"
  /// \param bos  the begin-of-sequence id, or -1
  /// \param eos  the end-of-sequence id, or -1
  /// \throws InvalidArgument naming the first defect: sizes that differ, an empty token, a type
  ///         outside 1–6, a duplicate token, a normal token with a character outside the
  ///         byte-level alphabet, a merge without exactly one space
  ///         or naming an unknown token or a pair whose concatenation is no token, another
  ///         pre-tokenizer, or a bos/eos id out of range. Nothing is built.
  BpeTokenizer(std::vector<std::string> tokens, const std::vector<std::int64_t>& types,
               const std::vector<std::string>& merges, const std::string& pre, int bos, int eos)
      : tokens_(std::move(tokens)), bos_(bos), eos_(eos) {
    constexpr const char* kWhere = "kvlab::BpeTokenizer";
    if (tokens_.empty()) detail::fail(kWhere, "tokens.size()", ">= 1", 0);
    detail::require_equal(kWhere, "types.size()", types.size(), tokens_.size(), "tokens.size()");
    if (pre != "smollm" && pre != "gpt2") {
      detail::fail(kWhere, "pre", "\"smollm\" or \"gpt2\"", "\"" + pre + "\"");
    }
    split_digits_ = pre == "smollm";
    const int n = static_cast<int>(tokens_.size());
    for (const auto& [name, id] : {std::pair<const char*, int>{"bos", bos}, {"eos", eos}}) {
      if (id < -1 || id >= n) {
        detail::fail(kWhere, name, "-1 or an id in [0, " + std::to_string(n) + ")", id);
      }
    }
    build_byte_alphabet();
    types_.resize(tokens_.size());
    bytes_.resize(tokens_.size());
    for (int id = 0; id < n; ++id) {
      const std::string& t = tokens_[static_cast<std::size_t>(id)];
      const std::string at = "tokens[" + std::to_string(id) + "]";
      if (t.empty()) detail::fail(kWhere, at, "a non-empty token", "''");
      const std::int64_t type = types[static_cast<std::size_t>(id)];
      if (type < 1 || type > 6) {
        detail::fail(kWhere, "types[" + std::to_string(id) + "]", "a token type in 1 to 6", type);
      }
      types_[static_cast<std::size_t>(id)] = static_cast<TokenType>(type);
      if (!index_.emplace(t, id).second) {
        detail::fail(kWhere, at, "a token not listed before",
                     "'" + t + "', also id " + std::to_string(index_.at(t)));
      }
      if (type == static_cast<int>(TokenType::control) ||
          type == static_cast<int>(TokenType::user_defined)) {
        bytes_[static_cast<std::size_t>(id)] = t;  // its text, as is
        specials_.push_back(id);
      } else {
        bytes_[static_cast<std::size_t>(id)] = alphabet_bytes(t, at);
      }
    }
    // -1: the vocabulary cannot encode byte b (see encode_text). A token counts as byte b only
    // if it decodes to b: a control or user-defined token with that text decodes to the text.
    for (int b = 0; b < 256; ++b) {
      const auto it = index_.find(byte_char(static_cast<unsigned char>(b)));
      const bool decodes = it != index_.end() && bytes_[static_cast<std::size_t>(it->second)] ==
                                                     std::string(1, static_cast<char>(b));
      byte_token_[static_cast<std::size_t>(b)] = decodes ? it->second : -1;
    }
    for (std::size_t r = 0; r < merges.size(); ++r) {
      const std::string& m = merges[r];
      const std::string at = "merges[" + std::to_string(r) + "]";
      const std::size_t space = m.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == m.size() ||
          m.find(' ', space + 1) != std::string::npos) {
        detail::fail(kWhere, at, "two tokens separated by one space", "'" + m + "'");
      }
      const std::string left = m.substr(0, space), right = m.substr(space + 1);
      const auto l = index_.find(left), rt = index_.find(right), both = index_.find(left + right);
      if (l == index_.end()) detail::fail(kWhere, at, "a known left token", "'" + left + "'");
      if (rt == index_.end()) detail::fail(kWhere, at, "a known right token", "'" + right + "'");
      if (both == index_.end()) {
        detail::fail(kWhere, at, "a pair whose concatenation is a token", "'" + left + right + "'");
      }
      // A merge whose token does not decode to its two parts' bytes (a control or user-defined
      // token among the three) would break decode(encode(text)) == text: it never applies.
      const auto bytes_of = [&](int id) -> const std::string& {
        return bytes_[static_cast<std::size_t>(id)];
      };
      if (bytes_of(both->second) != bytes_of(l->second) + bytes_of(rt->second)) continue;
      ranks_.emplace(pair_key(l->second, rt->second),
                     std::make_pair(static_cast<int>(r), both->second));  // the first one wins
    }
    // Longest special texts first, so that the longest of those starting at a position wins.
    std::sort(specials_.begin(), specials_.end(), [&](int a, int b) {
      return tokens_[static_cast<std::size_t>(a)].size() >
             tokens_[static_cast<std::size_t>(b)].size();
    });
  }

  /// The tokenizer that GGUF `file` describes: `tokenizer.ggml.model` must be "gpt2";
  /// `tokenizer.ggml.tokens`, `tokenizer.ggml.token_type` (all normal when absent),
  /// `tokenizer.ggml.merges`, `tokenizer.ggml.pre` ("gpt2" when absent),
  /// `tokenizer.ggml.bos_token_id` and `eos_token_id` (-1 when absent).
  /// \throws InvalidArgument naming the file and the key, or as the constructor.
  static BpeTokenizer from_gguf(const GgufFile& file) {
    constexpr const char* kWhere = "kvlab::BpeTokenizer::from_gguf";
    const std::string& model = file.get_string("tokenizer.ggml.model");
    if (model != "gpt2") {
      detail::fail(kWhere, file.path() + ": key 'tokenizer.ggml.model'",
                   "\"gpt2\" (byte-level BPE)", "\"" + model + "\"");
    }
    std::vector<std::string> tokens = file.get_strings("tokenizer.ggml.tokens");
    const std::vector<std::int64_t> types =
        file.find("tokenizer.ggml.token_type") != nullptr
            ? file.get_ints("tokenizer.ggml.token_type")
            : std::vector<std::int64_t>(tokens.size(), static_cast<int>(TokenType::normal));
    const std::string pre = file.find("tokenizer.ggml.pre") != nullptr
                                ? file.get_string("tokenizer.ggml.pre")
                                : std::string("gpt2");
    const auto id_of = [&](const std::string& key) -> int {
      if (file.find(key) == nullptr) return -1;
      const std::int64_t id = file.get_int(key);
      if (id < 0 || id >= static_cast<std::int64_t>(tokens.size())) {
        detail::fail(kWhere, file.path() + ": key '" + key + "'",
                     "an id in [0, " + std::to_string(tokens.size()) + ")", id);
      }
      return static_cast<int>(id);
    };
    const int bos = id_of("tokenizer.ggml.bos_token_id"),
              eos = id_of("tokenizer.ggml.eos_token_id");
    try {
      return BpeTokenizer(std::move(tokens), types, file.get_strings("tokenizer.ggml.merges"), pre,
                          bos, eos);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(file.path() + ": " + e.what());
    }
  }

  int vocab_size() const override { return static_cast<int>(tokens_.size()); }
  int bos_id() const override { return bos_; }
  int eos_id() const override { return eos_; }

  /// The token string of `id`, as the file stores it (byte-level characters: " the" is "Ġthe").
  /// \throws InvalidArgument if `id` is not in [0, vocab_size()).
  const std::string& token(int id) const {
    check_id("kvlab::BpeTokenizer::token", id);
    return tokens_[static_cast<std::size_t>(id)];
  }
  /// The type of token `id`.
  /// \throws InvalidArgument if `id` is not in [0, vocab_size()).
  TokenType type(int id) const {
    check_id("kvlab::BpeTokenizer::type", id);
    return types_[static_cast<std::size_t>(id)];
  }
  /// The id of the token whose string is `text` (as stored), or -1.
  int lookup(const std::string& text) const {
    const auto it = index_.find(text);
    return it == index_.end() ? -1 : it->second;
  }
  /// The byte-level character that stands for byte `b`, in UTF-8 (`"Ġ"` for a space).
  std::string byte_char(unsigned char b) const { return byte_chars_[b]; }

  bool is_special(int id) const override { return type(id) == TokenType::control; }
  std::string token_bytes(int id, int /*prev*/ = -1) const override {
    check_id("kvlab::BpeTokenizer::token_bytes", id);
    return bytes_[static_cast<std::size_t>(id)];
  }

  /// The token ids of `text` (see the class: special tokens, pre-tokenization, merges).
  ///
  /// Malformed UTF-8 is accepted: a byte that is not part of a well-formed character is a
  /// character of class `other` on its own, encoded by its byte's token, so `decode` gives back
  /// `text` exactly, well-formed or not. A vocabulary may lack the token of a byte that its
  /// training text never held (SmolLM2's lacks 21: the controls 0x04, 0x06, 0x13, 0x14, 0x16,
  /// 0x1D and the bytes 0xC0, 0xC1, 0xF1, 0xF2, 0xF5–0xFF, most of which no well-formed UTF-8
  /// holds); `tokenizers` and llama.cpp drop such a byte without a word, kvlab refuses the text.
  /// \throws InvalidArgument naming the first byte that has no token, and its offset.
  std::vector<int> encode_text(const std::string& text, bool parse_special) const override {
    return encode_parts({TextPart{text, parse_special}});
  }

  /// The ids of the parts' concatenated text, as `encode_text` gives them, where a control
  /// token's text is read as that token only when it lies wholly inside a part whose
  /// `parse_special` is true (user-defined tokens: anywhere). Pre-tokenization sees the text
  /// across the parts' boundaries, as it would see the whole rendered text.
  /// \throws InvalidArgument as `encode_text`.
  std::vector<int> encode_parts(const std::vector<TextPart>& parts) const override {
    std::string text;                                       // the parts, concatenated
    std::vector<std::pair<std::size_t, std::size_t>> open;  // [begin, end) of the parts that parse
    for (const TextPart& p : parts) {
      if (p.parse_special) open.emplace_back(text.size(), text.size() + p.text.size());
      text += p.text;
    }
    for (std::size_t i = 0; i < text.size(); ++i) {
      const auto b = static_cast<unsigned char>(text[i]);
      if (byte_token_[b] < 0) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned>(b));
        detail::fail("kvlab::BpeTokenizer::encode_text", "text", "bytes this vocabulary can encode",
                     "byte " + std::string(hex) + " at offset " + std::to_string(i) +
                         ", which has no token");
      }
    }
    const auto allowed = [&](std::size_t begin, std::size_t end) {
      for (const auto& [b, e] : open)
        if (begin >= b && end <= e) return true;
      return false;
    };
    std::vector<int> ids;
    std::size_t pos = 0;
    while (pos < text.size()) {
      // 1. The next special token's text that counts: the leftmost, the longest there.
      std::size_t best = std::string::npos;
      int best_id = -1;
      for (int id : specials_) {
        const std::string& t = tokens_[static_cast<std::size_t>(id)];
        const bool control = types_[static_cast<std::size_t>(id)] == TokenType::control;
        for (std::size_t at = text.find(t, pos); at < best; at = text.find(t, at + 1)) {
          if (!control || allowed(at, at + t.size())) {
            best = at, best_id = id;  // longest first: a tie keeps the longer
            break;
          }
        }
      }
      const std::size_t end = best == std::string::npos ? text.size() : best;
      encode_plain(text.substr(pos, end - pos), ids);
      if (best == std::string::npos) break;
      ids.push_back(best_id);
      pos = best + tokens_[static_cast<std::size_t>(best_id)].size();
    }
    return ids;
  }

  /// The words that pre-tokenization (step 2 of the class's list) splits `text` into, with no
  /// special tokens matched: what `tokenizers`' `pre_tokenize_str` shows, for teaching and tests.
  std::vector<std::string> pre_tokenize(const std::string& text) const {
    std::vector<std::string> words;
    for_each_word(text, [&](const std::string& w) { words.push_back(w); });
    return words;
  }

 private:
  static std::uint64_t pair_key(int a, int b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) |
           static_cast<std::uint32_t>(b);
  }
  void check_id(const char* where, int id) const {
    if (id < 0 || id >= vocab_size())
      detail::fail(where, "id", "an id in [0, " + std::to_string(vocab_size()) + ")", id);
  }

  // GPT-2's bytes_to_unicode: the printable bytes stand for themselves, the others for
  // U+0100 + n in byte order.
  void build_byte_alphabet() {
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const char32_t c = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
      byte_chars_[static_cast<std::size_t>(b)] = encode_utf8(c);
      char_byte_.emplace(c, static_cast<unsigned char>(b));
    }
  }
  // The bytes a normal token's byte-level characters stand for.
  std::string alphabet_bytes(const std::string& token, const std::string& at) const {
    std::string out;
    for (std::size_t i = 0; i < token.size();) {
      const Utf8Char ch = decode_utf8(token, i);
      const auto it = ch.valid ? char_byte_.find(ch.code) : char_byte_.end();
      if (it == char_byte_.end()) {
        detail::fail("kvlab::BpeTokenizer", at,
                     "characters of the byte-level alphabet (a normal token)",
                     "'" + token + "' (byte " + std::to_string(i) + ")");
      }
      out.push_back(static_cast<char>(it->second));
      i += static_cast<std::size_t>(ch.length);
    }
    return out;
  }

  // Step 2: calls `emit(word)` for each word of `text`, in order.
  template <typename Emit>
  void for_each_word(const std::string& text, Emit&& emit) const {
    struct Char {
      std::size_t begin, end;  // its bytes in text
      char32_t code;           // the code point (an invalid byte: 0xFFFFFFFF, class other)
      CharClass cls;
    };
    std::vector<Char> chars;  // [characters of text]
    for (std::size_t i = 0; i < text.size();) {
      const Utf8Char c = decode_utf8(text, i);
      const char32_t code = c.valid ? c.code : 0xFFFFFFFFu;
      chars.push_back(Char{i, i + static_cast<std::size_t>(c.length), code,
                           c.valid ? char_class(c.code) : CharClass::other});
      i += static_cast<std::size_t>(c.length);
    }
    // a. the pieces: every number character alone (smollm), the runs between them whole.
    std::size_t piece = 0;
    while (piece < chars.size()) {
      std::size_t piece_end = piece + 1;
      if (!(split_digits_ && chars[piece].cls == CharClass::number)) {
        while (piece_end < chars.size() &&
               !(split_digits_ && chars[piece_end].cls == CharClass::number))
          ++piece_end;
      }
      // b. GPT-2's pattern over the piece [piece, piece_end).
      std::size_t i = piece;
      const auto is = [&](std::size_t k, CharClass cls) {
        return k < piece_end && chars[k].cls == cls;
      };
      const auto run = [&](std::size_t k, CharClass cls) {  // end of the run of `cls` from k
        while (k < piece_end && chars[k].cls == cls) ++k;
        return k;
      };
      const auto ascii = [&](std::size_t k, char c) {
        return k < piece_end && chars[k].code == static_cast<char32_t>(c);
      };
      while (i < piece_end) {
        std::size_t end = i;
        const std::size_t after_space = ascii(i, ' ') ? i + 1 : i;  // the optional ' '
        if (ascii(i, '\'') &&
            (ascii(i + 1, 's') || ascii(i + 1, 't') || ascii(i + 1, 'm') || ascii(i + 1, 'd'))) {
          end = i + 2;  // 's 't 'm 'd
        } else if (ascii(i, '\'') && ((ascii(i + 1, 'r') && ascii(i + 2, 'e')) ||
                                      (ascii(i + 1, 'v') && ascii(i + 2, 'e')) ||
                                      (ascii(i + 1, 'l') && ascii(i + 2, 'l')))) {
          end = i + 3;  // 're 've 'll
        } else if (is(after_space, CharClass::letter)) {
          end = run(after_space, CharClass::letter);  //  ?\p{L}+
        } else if (is(after_space, CharClass::number)) {
          end = run(after_space, CharClass::number);  //  ?\p{N}+
        } else if (is(after_space, CharClass::other)) {
          end = run(after_space, CharClass::other);  //  ?[^\s\p{L}\p{N}]+
        } else {
          // \s+(?!\S): the whitespace run, less its last character when a non-space follows
          // (that character then starts the next word); else \s+: one character.
          const std::size_t r = run(i, CharClass::space);
          end = r == piece_end || r - i == 1 ? r : r - 1;
        }
        emit(text.substr(chars[i].begin, chars[end - 1].end - chars[i].begin));
        i = end;
      }
      piece = piece_end;
    }
  }

  // Steps 2 and 3 over text without special tokens: appends the ids to `ids`.
  void encode_plain(const std::string& text, std::vector<int>& ids) const {
    for_each_word(text, [&](const std::string& word) {
      std::vector<int> symbols;  // [word bytes]: one token per byte, merged below
      symbols.reserve(word.size());
      for (char ch : word) symbols.push_back(byte_token_[static_cast<unsigned char>(ch)]);
      while (symbols.size() > 1) {
        int best_rank = -1, merged = -1;
        std::size_t best = 0;  // the first symbol of the pair to merge
        for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
          const auto it = ranks_.find(pair_key(symbols[i], symbols[i + 1]));
          if (it != ranks_.end() && (best_rank < 0 || it->second.first < best_rank)) {
            best_rank = it->second.first;
            merged = it->second.second;
            best = i;
          }
        }
        if (best_rank < 0) break;  // no pair merges
        symbols[best] = merged;
        symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
      }
      ids.insert(ids.end(), symbols.begin(), symbols.end());
    });
  }

  std::vector<std::string> tokens_;             // [vocab]: as the file stores them
  std::vector<TokenType> types_;                // [vocab]
  std::vector<std::string> bytes_;              // [vocab]: what each token decodes to
  std::unordered_map<std::string, int> index_;  // token string -> id
  std::unordered_map<std::uint64_t, std::pair<int, int>> ranks_;  // pair -> (rank, merged id)
  std::vector<int> specials_;                // control and user-defined ids, longest first
  std::array<std::string, 256> byte_chars_;  // byte -> its character, UTF-8
  std::unordered_map<char32_t, unsigned char> char_byte_;  // character -> byte
  std::array<int, 256> byte_token_{};                      // byte -> its character's token, or -1
  bool split_digits_ = true;
  int bos_ = -1, eos_ = -1;
};

}  // namespace kvlab
