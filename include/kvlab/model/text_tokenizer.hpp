/// \file
/// \brief `TextTokenizer`: the one interface of kvlab's tokenizers, and `Utf8Stream`.
///
/// The tokenizers are llama2.c's `Tokenizer` and the GGUF files' byte-level `BpeTokenizer`; the
/// interface turns text to token ids, and a token id to the bytes it stands for. `Utf8Stream` turns
/// the bytes of tokens decoded one at a time into text that never splits a character. Checked in
/// the tests through both tokenizers.
#pragma once

#include <string>
#include <vector>

#include "kvlab/config.hpp"

namespace kvlab {

/// A piece of text to encode, and whether special tokens may be read in it: a chat template's
/// markers may (`parse_special` true), a user's message may not.
struct TextPart {
  std::string text;            ///< the text (bytes)
  bool parse_special = false;  ///< true: a special token's text in `text` is that token
};

/// What a program needs of a tokenizer: encode text, decode ids, know the special tokens.
///
/// Token ids are in [0, vocab_size()). A decoder never sees text: the tokenizer is the
/// dictionary at both ends. A token stands for a byte string (`token_bytes`), which need not be
/// whole UTF-8 characters: a character may be split over two tokens, so printing tokens one by
/// one goes through a `Utf8Stream`.
class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;

  /// Number of token ids.
  virtual int vocab_size() const = 0;
  /// The token ids of `text` (bytes; UTF-8 expected, any bytes accepted: see each tokenizer).
  /// \param text           the text
  /// \param parse_special  true: the text of a special token (e.g. `<|im_end|>`) in `text` is that
  ///                       token; false: it is ordinary text, encoded like any other (what a
  ///                       user's message needs, so that it cannot close its own turn)
  /// \return [n] ids
  virtual std::vector<int> encode_text(const std::string& text, bool parse_special) const = 0;
  /// The token ids of `parts`, one text after another: by default each part encoded on its own
  /// and the ids concatenated; `BpeTokenizer` encodes the concatenated text as one, with
  /// special tokens read only inside the parts that allow them, so that a chat's ids are those
  /// of its whole rendered text.
  /// \return [n] ids
  virtual std::vector<int> encode_parts(const std::vector<TextPart>& parts) const {
    std::vector<int> ids;
    for (const TextPart& p : parts) {
      const std::vector<int> part = encode_text(p.text, p.parse_special);
      ids.insert(ids.end(), part.begin(), part.end());
    }
    return ids;
  }
  /// The bytes token `id` stands for when it follows token `prev` (-1: none). Only llama2.c's
  /// tokenizer looks at `prev` (no leading space right after BOS).
  /// \throws InvalidArgument if `id` is not in [0, vocab_size()).
  virtual std::string token_bytes(int id, int prev = -1) const = 0;
  /// True for a special (control) token: BOS, EOS, a chat template's markers.
  /// \throws InvalidArgument if `id` is not in [0, vocab_size()).
  virtual bool is_special(int id) const = 0;
  /// The begin-of-sequence id, or -1 when the tokenizer has none.
  virtual int bos_id() const = 0;
  /// The end-of-sequence id (what ends a generation), or -1 when the tokenizer has none.
  virtual int eos_id() const = 0;

  /// The text of `ids`: by default the bytes of each token after its predecessor,
  /// concatenated (llama2.c's tokenizer leaves out BOS and EOS: see `Tokenizer::decode`).
  /// \throws InvalidArgument if an id is not in [0, vocab_size()).
  virtual std::string decode(const std::vector<int>& ids) const {
    std::string out;
    int prev = -1;
    for (int id : ids) {
      out += token_bytes(id, prev);
      prev = id;
    }
    return out;
  }
};

/// Bytes in, whole characters out: the text of tokens decoded one at a time, for a terminal.
///
/// `push` returns the longest prefix of what it has been given that ends on a character
/// boundary and keeps the rest: a token that ends inside a UTF-8 character prints nothing until
/// the character is whole. Bytes that can never become a well-formed character (a stray
/// continuation byte, a lead byte followed by a non-continuation, an overlong form, a
/// surrogate, 0xF5–0xFF) come out as U+FFFD, the replacement character, one per byte, as soon
/// as they are known to be bad. `finish` flushes an incomplete character the same way.
class Utf8Stream {
 public:
  /// Appends `bytes` and returns the text that is now complete.
  std::string push(const std::string& bytes) {
    pending_ += bytes;
    std::string out;
    std::size_t i = 0;
    while (i < pending_.size()) {
      const int need = expected_length(static_cast<unsigned char>(pending_[i]));
      if (need == 0) {  // a byte that starts no character
        out += kReplacement;
        ++i;
        continue;
      }
      std::size_t have = 1;  // bytes of this character seen so far
      bool bad = false;
      while (have < static_cast<std::size_t>(need) && i + have < pending_.size()) {
        if (!continues(pending_, i, have)) {
          bad = true;
          break;
        }
        ++have;
      }
      if (bad) {
        out += kReplacement;
        ++i;
        continue;
      }
      if (have < static_cast<std::size_t>(need)) break;  // incomplete: wait for more bytes
      out.append(pending_, i, have);
      i += have;
    }
    pending_.erase(0, i);
    return out;
  }
  /// Returns what is left (an incomplete character) as U+FFFD per byte, and starts afresh.
  std::string finish() {
    std::string out;
    for (std::size_t i = 0; i < pending_.size(); ++i) out += kReplacement;
    pending_.clear();
    return out;
  }
  /// Bytes held back, waiting for the rest of their character (0 to 3).
  std::size_t pending() const { return pending_.size(); }

 private:
  static constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8
  // Bytes of the character that lead byte `b` starts, or 0 if `b` starts none.
  static int expected_length(unsigned char b) {
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF4) return 4;
    return 0;
  }
  // Whether byte `k` of the character at `i` can follow its first k bytes (RFC 3629's table:
  // the second byte's range depends on the lead, ruling out overlong forms, surrogates and
  // code points above U+10FFFF).
  static bool continues(const std::string& s, std::size_t i, std::size_t k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (k > 1) return (b & 0xC0u) == 0x80u;
    const auto lead = static_cast<unsigned char>(s[i]);
    unsigned char lo = 0x80, hi = 0xBF;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
    return b >= lo && b <= hi;
  }
  std::string pending_;  // bytes of an incomplete character, [0, 3]
};

}  // namespace kvlab
