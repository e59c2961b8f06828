// The llama2.c tokenizer: encode (dummy prefix, UTF-8 code points, byte fallback, best-score
// merges, BOS/EOS) and decode (space after BOS, byte pieces) on a small vocabulary whose results
// are worked out by hand below; the tokenizer.bin reader on files written here (round trip, every
// truncation point, corrupt fields, wrong vocabulary size); and the real Llama 2 vocabulary
// (tokenizer.bin from the folder of model files) against published token ids.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kvlab/kvlab.hpp"
#include "model_files.hpp"
#include "model_writers.hpp"
#include "test_support.hpp"

using kvlab::InvalidArgument;
using kvlab::Tokenizer;
using kvlab_test::names;

namespace {

// --- a small vocabulary -------------------------------------------------------------------------
// ids 0..2: <unk>, BOS, EOS (as llama2.c's export writes them); ids 3..258: the 256 byte pieces
// "<0x00>".."<0xFF>"; then a few pieces whose scores make the merge order visible.
constexpr int kSpace = 259;     // " "      -5
constexpr int kA = 260;         // "a"      -1
constexpr int kB = 261;         // "b"      -1
constexpr int kC = 262;         // "c"      -1
constexpr int kAB = 263;        // "ab"     -3
constexpr int kBC = 264;        // "bc"     -2
constexpr int kSpaceA = 265;    // " a"     -4
constexpr int kAA = 266;        // "aa"     -0.5
constexpr int kCC = 267;        // "cc"     -2e10: below llama2.c's -1e10 threshold, never merges
constexpr int kEAcute = 268;    // "é"      -1 (two bytes, C3 A9)
constexpr int kLoneCont = 269;  // "\x80"   -1 (a lone UTF-8 continuation byte)

/// The token id of raw byte `b` (byte fallback).
int byte_id(unsigned char b) { return b + 3; }

std::string byte_piece(int b) {
  char text[8];
  std::snprintf(text, sizeof text, "<0x%02X>", b);
  return text;
}

std::vector<std::string> small_pieces() {
  std::vector<std::string> pieces = {"<unk>", "\n<s>\n", "\n</s>\n"};
  for (int b = 0; b < 256; ++b) pieces.push_back(byte_piece(b));
  for (const char* p : {" ", "a", "b", "c", "ab", "bc", " a", "aa", "cc", "\xC3\xA9", "\x80"})
    pieces.push_back(p);
  return pieces;
}

std::vector<float> small_scores() {
  std::vector<float> scores(259, 0.0f);
  for (float s : {-5.0f, -1.0f, -1.0f, -1.0f, -3.0f, -2.0f, -4.0f, -0.5f, -2e10f, -1.0f, -1.0f})
    scores.push_back(s);
  return scores;
}

Tokenizer small_tokenizer() { return Tokenizer(small_pieces(), small_scores()); }

// --- writing tokenizer.bin files (model_writers.hpp) ------------------------------------------
using kvlab_test::put_f32;
using kvlab_test::put_i32;
using kvlab_test::tokenizer_bytes;

/// Writes `bytes` to `name` in the working directory (the test's build folder) and returns the
/// path.
std::string write_file(const std::string& name, const std::string& bytes) {
  const std::string path = "test_tokenizer_" + name + ".bin";
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

/// A four-token file: <unk>, BOS, EOS and one ordinary piece, with max_token_length 6.
const std::vector<std::string> kFourPieces = {"<unk>", "\n<s>\n", "\n</s>\n", " the"};
const std::vector<float> kFourScores = {0.0f, 0.0f, 0.0f, -1.5f};

}  // namespace

// ================================================================================================
// The constructor and accessors
// ================================================================================================

TEST_CASE("a tokenizer built from pieces and scores keeps them by id") {
  const Tokenizer tok = small_tokenizer();
  CHECK(tok.vocab_size() == 270);
  CHECK(tok.max_token_length() == 6);  // "\n</s>\n" and "<0xHH>"
  CHECK(tok.piece(Tokenizer::kBos) == "\n<s>\n");
  CHECK(tok.piece(Tokenizer::kEos) == "\n</s>\n");
  CHECK(tok.piece(byte_id('A')) == "<0x41>");
  CHECK(tok.piece(kAB) == "ab");
  CHECK(tok.score(kAA) == -0.5f);
  CHECK(tok.score(kCC) == -2e10f);
  CHECK(tok.pieces() == small_pieces());
  CHECK(tok.scores() == small_scores());
  CHECK(tok.lookup("bc") == kBC);
  CHECK(tok.lookup("\xC3\xA9") == kEAcute);
  CHECK(tok.lookup("abc") == -1);
  CHECK(Tokenizer(small_pieces(), small_scores(), 40).max_token_length() == 40);
}

TEST_CASE("the constructor rejects inconsistent vocabularies") {
  auto pieces = small_pieces();
  auto scores = small_scores();
  CHECK_THROWS_MATCHES(Tokenizer(pieces, std::vector<float>(5, 0.0f)), InvalidArgument,
                       names("scores.size()", "270 (one score per piece)", "5"));
  CHECK_THROWS_MATCHES(Tokenizer({"<unk>", "<s>"}, {0.0f, 0.0f}), InvalidArgument,
                       names("pieces.size()", "3 to 2^31-1", "2"));
  pieces[kB] = "";
  CHECK_THROWS_MATCHES(
      Tokenizer(pieces, scores), InvalidArgument,
      names("pieces[261]", "a non-empty string without NUL bytes", "an empty string"));
  pieces[kB] = std::string("b\0b", 3);
  CHECK_THROWS_MATCHES(
      Tokenizer(pieces, scores), InvalidArgument,
      names("pieces[261]", "a non-empty string without NUL bytes", "a NUL byte at offset 1"));
  pieces = small_pieces();
  scores[kC] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_MATCHES(Tokenizer(pieces, scores), InvalidArgument,
                       names("scores[262]", "a finite number", "nan"));
  scores = small_scores();
  CHECK_THROWS_MATCHES(Tokenizer(pieces, scores, 5), InvalidArgument,
                       names("max_token_length", ">= 6 (the longest piece)", "5"));
}

TEST_CASE("piece score and decode reject ids outside the vocabulary") {
  const Tokenizer tok = small_tokenizer();
  CHECK_THROWS_MATCHES(tok.piece(270), InvalidArgument, names("id", "an id in [0, 270)", "270"));
  CHECK_THROWS_MATCHES(tok.piece(-1), InvalidArgument, names("id", "an id in [0, 270)", "-1"));
  CHECK_THROWS_MATCHES(tok.score(300), InvalidArgument, names("id", "an id in [0, 270)", "300"));
  CHECK_THROWS_MATCHES(tok.decode(Tokenizer::kBos, 270), InvalidArgument,
                       names("token", "an id in [0, 270)", "270"));
  CHECK_THROWS_MATCHES(tok.decode(-5, kA), InvalidArgument,
                       names("prev_token", "an id in [0, 270)", "-5"));
  CHECK_THROWS_MATCHES(tok.decode(std::vector<int>{kA, kB, 9999}), InvalidArgument,
                       names("tokens[2]", "an id in [0, 270)", "9999"));
}

// ================================================================================================
// encode on the small vocabulary: every expectation below is worked out by hand
// ================================================================================================

TEST_CASE("encode adds the dummy space and merges the best-scoring pair first") {
  const Tokenizer tok = small_tokenizer();
  // "abc" -> [" ", a, b, c]; pairs " a" -4, "ab" -3, "bc" -2: "bc" merges first -> [" ", a, bc];
  // then " a" (-4) -> [" a", bc]; " abc" is no piece: done. (Left to right would give "ab" first.)
  CHECK(tok.encode("abc", false, false) == std::vector<int>{kSpaceA, kBC});
  // "ab" -> [" ", a, b]; "ab" (-3) beats " a" (-4), and " ab" is no piece: the space stays alone.
  CHECK(tok.encode("ab", false, false) == std::vector<int>{kSpace, kAB});
  // "a" -> [" ", a] -> [" a"].
  CHECK(tok.encode("a", false, false) == std::vector<int>{kSpaceA});
  // "aaa" -> [" ", a, a, a]; "aa" (-0.5) twice, a tie: the leftmost merges -> [" ", aa, a]; then
  // " aa" and "aaa" are no pieces: done. (Merging the rightmost would end as [" a", aa].)
  CHECK(tok.encode("aaa", false, false) == std::vector<int>{kSpace, kAA, kA});
  // "cc" is a piece, but its score -2e10 is not above llama2.c's starting best score -1e10.
  CHECK(tok.encode("cc", false, false) == std::vector<int>{kSpace, kC, kC});
  // "ba": [" ", b, a]; " b" and "ba" are no pieces.
  CHECK(tok.encode("ba", false, false) == std::vector<int>{kSpace, kB, kA});
}

TEST_CASE("encode falls back to byte tokens for characters that are no piece") {
  const Tokenizer tok = small_tokenizer();
  // ASCII 'x' is no piece: its byte token, 'x' + 3.
  CHECK(tok.encode("x", false, false) == std::vector<int>{kSpace, byte_id('x')});
  CHECK(tok.encode("xa", false, false) == std::vector<int>{kSpace, byte_id('x'), kA});
  // A newline, as in the Llama vocabulary, is byte token 13.
  CHECK(tok.encode("a\n", false, false) == std::vector<int>{kSpaceA, 13});
}

TEST_CASE("encode looks up whole UTF-8 code points and falls back byte by byte") {
  const Tokenizer tok = small_tokenizer();
  // "é" (C3 A9) is a piece of its own: one token.
  CHECK(tok.encode("\xC3\xA9", false, false) == std::vector<int>{kSpace, kEAcute});
  // "ü" (C3 BC) is not: its two bytes.
  CHECK(tok.encode("\xC3\xBC", false, false) ==
        std::vector<int>{kSpace, byte_id(0xC3), byte_id(0xBC)});
  // "你" (E4 BD A0): three bytes; "😀" (F0 9F 98 80): four.
  CHECK(tok.encode("\xE4\xBD\xA0", false, false) ==
        std::vector<int>{kSpace, byte_id(0xE4), byte_id(0xBD), byte_id(0xA0)});
  CHECK(tok.encode("\xF0\x9F\x98\x80", false, false) ==
        std::vector<int>{kSpace, byte_id(0xF0), byte_id(0x9F), byte_id(0x98), byte_id(0x80)});
  // Mixed: "aéü" -> [" a", é, C3, BC].
  CHECK(tok.encode("a\xC3\xA9\xC3\xBC", false, false) ==
        std::vector<int>{kSpaceA, kEAcute, byte_id(0xC3), byte_id(0xBC)});
  // A code point is at most 4 bytes: F0 80 80 80 is one (unknown) group, the fifth byte 80
  // starts a new one, which is the piece "\x80".
  CHECK(tok.encode("\xF0\x80\x80\x80\x80", false, false) ==
        std::vector<int>{kSpace, byte_id(0xF0), byte_id(0x80), byte_id(0x80), byte_id(0x80),
                         kLoneCont});
}

TEST_CASE("encode puts BOS and EOS only when asked and adds nothing for empty text") {
  const Tokenizer tok = small_tokenizer();
  CHECK(tok.encode("", false, false).empty());
  CHECK(tok.encode("", true, false) == std::vector<int>{Tokenizer::kBos});
  CHECK(tok.encode("", false, true) == std::vector<int>{Tokenizer::kEos});
  CHECK(tok.encode("", true, true) == std::vector<int>{Tokenizer::kBos, Tokenizer::kEos});
  CHECK(tok.encode("abc", true, false) == std::vector<int>{Tokenizer::kBos, kSpaceA, kBC});
  CHECK(tok.encode("abc", false, true) == std::vector<int>{kSpaceA, kBC, Tokenizer::kEos});
  CHECK(tok.encode("abc", true, true) ==
        std::vector<int>{Tokenizer::kBos, kSpaceA, kBC, Tokenizer::kEos});
}

TEST_CASE("encode without byte tokens in the vocabulary fails on an unknown character") {
  const Tokenizer tok({"<unk>", "<s>", "</s>", " ", "a"}, {0.0f, 0.0f, 0.0f, -1.0f, -1.0f});
  CHECK(tok.encode("aa", false, false) == std::vector<int>{3, 4, 4});
  CHECK_THROWS_MATCHES(tok.encode("b", false, false), InvalidArgument,
                       names("byte fallback token of byte 98", "an id below vocab_size 5", "101"));
}

// ================================================================================================
// decode on the small vocabulary
// ================================================================================================

TEST_CASE("decode strips the space after BOS and turns byte pieces into bytes") {
  const Tokenizer tok = small_tokenizer();
  CHECK(tok.decode(Tokenizer::kBos, kSpaceA) == "a");   // the dummy space goes
  CHECK(tok.decode(kA, kSpaceA) == " a");               // a space between words stays
  CHECK(tok.decode(Tokenizer::kEos, kSpaceA) == " a");  // only BOS strips
  CHECK(tok.decode(Tokenizer::kBos, kSpace) == "");
  CHECK(tok.decode(Tokenizer::kBos, kAB) == "ab");
  CHECK(tok.decode(kA, byte_id('A')) == "A");                    // "<0x41>" -> 'A'
  CHECK(tok.decode(Tokenizer::kBos, 13) == "\n");                // "<0x0A>" -> newline
  CHECK(tok.decode(kA, byte_id(0x00)) == std::string(1, '\0'));  // "<0x00>" -> a NUL byte
  CHECK(tok.decode(kA, byte_id(0xE4)) == "\xE4");                // one byte of a character
  CHECK(tok.decode(kA, Tokenizer::kBos) == "\n<s>\n");           // special pieces as stored
}

TEST_CASE("decode of a sequence concatenates pieces and gives back the encoded text") {
  const Tokenizer tok = small_tokenizer();
  CHECK(tok.decode(std::vector<int>{}).empty());
  // The first token reads as if after BOS; BOS and EOS add no text; a space after BOS goes.
  CHECK(tok.decode(std::vector<int>{kSpaceA, kBC}) == "abc");
  CHECK(tok.decode(std::vector<int>{kSpaceA, Tokenizer::kBos, kSpaceA, Tokenizer::kEos, kSpaceA}) ==
        "aa a");
  // The byte tokens of "你" come back as the character.
  CHECK(tok.decode(std::vector<int>{kSpace, byte_id(0xE4), byte_id(0xBD), byte_id(0xA0)}) ==
        "\xE4\xBD\xA0");
  for (const std::string text :
       {"", "a", "abc", "aaa", "cc", "ba x", " lead", "a\nb", "\xC3\xA9\xC3\xBC",
        "\xE4\xBD\xA0\xE5\xA5\xBD", "\xF0\x9F\x98\x80!", "\xF0\x80\x80\x80\x80", "tail "}) {
    for (const bool bos : {false, true}) {
      for (const bool eos : {false, true}) {
        CAPTURE(text, bos, eos);
        CHECK(tok.decode(tok.encode(text, bos, eos)) == text);
      }
    }
  }
}

// ================================================================================================
// tokenizer.bin files
// ================================================================================================

TEST_CASE("a tokenizer.bin written here loads back with the same pieces and scores") {
  const auto pieces = small_pieces();
  const auto scores = small_scores();
  const std::string path = write_file("round_trip", tokenizer_bytes(6, pieces, scores));
  const Tokenizer tok = Tokenizer::load(path);
  CHECK(tok.vocab_size() == 270);
  CHECK(tok.max_token_length() == 6);
  CHECK(tok.pieces() == pieces);
  CHECK(tok.scores() == scores);
  CHECK(tok.encode("abc", true, false) == small_tokenizer().encode("abc", true, false));
  const Tokenizer exact = Tokenizer::load(path, 270);
  CHECK(exact.pieces() == pieces);
  CHECK(exact.scores() == scores);
  // A header may declare more than the longest piece.
  const std::string wide = write_file("round_trip_wide", tokenizer_bytes(64, pieces, scores));
  CHECK(Tokenizer::load(wide).max_token_length() == 64);
  std::remove(path.c_str());
  std::remove(wide.c_str());
}

TEST_CASE("a truncated tokenizer.bin names the file and the field where it ends") {
  const std::string full = tokenizer_bytes(6, kFourPieces, kFourScores);
  // Where each field starts: the header [0, 4); token i: score, length, bytes.
  std::vector<std::size_t> token_start;
  std::size_t offset = 4;
  for (const auto& p : kFourPieces) {
    token_start.push_back(offset);
    offset += 8 + p.size();
  }
  REQUIRE(offset == full.size());
  for (std::size_t cut = 0; cut < full.size(); ++cut) {
    const std::string path = write_file("truncated", full.substr(0, cut));
    CAPTURE(cut);
    if (cut < 4) {
      CHECK_THROWS_MATCHES(Tokenizer::load(path), InvalidArgument,
                           names(path + ": max_token_length", "4 bytes", std::to_string(cut)));
      continue;
    }
    std::size_t i = 0;  // the token the cut falls in
    while (i + 1 < token_start.size() && cut >= token_start[i + 1]) ++i;
    const std::string token = path + ": token " + std::to_string(i);
    const std::size_t into = cut - token_start[i];  // bytes of token i present
    if (into == 0) {
      // A cut between two tokens: a shorter, well-formed file. load(path) needs 3 tokens at
      // least (after 3 it succeeds: checked below); load(path, 4) needs all 4.
      if (i < 3) {
        CHECK_THROWS_MATCHES(Tokenizer::load(path), InvalidArgument,
                             names(path + ": token count", ">= 3", std::to_string(i)));
      }
      CHECK_THROWS_MATCHES(Tokenizer::load(path, 4), InvalidArgument,
                           names(path + ": token count", "4 (vocab_size)", std::to_string(i)));
    } else if (into < 4) {
      CHECK_THROWS_MATCHES(Tokenizer::load(path), InvalidArgument,
                           names(token + " score", "4 bytes", std::to_string(into)));
    } else if (into < 8) {
      CHECK_THROWS_MATCHES(Tokenizer::load(path), InvalidArgument,
                           names(token + " length", "4 bytes", std::to_string(into - 4)));
    } else {
      CHECK_THROWS_MATCHES(Tokenizer::load(path, 4), InvalidArgument,
                           names(token + " bytes", std::to_string(kFourPieces[i].size()) + " bytes",
                                 std::to_string(into - 8)));
    }
    std::remove(path.c_str());
  }
  // A cut after the third token is a valid 3-token file for load(path), not for load(path, 4).
  const std::string three = write_file("three_tokens", full.substr(0, token_start[3]));
  CHECK(Tokenizer::load(three).vocab_size() == 3);
  CHECK_THROWS_MATCHES(Tokenizer::load(three, 4), InvalidArgument,
                       names(three + ": token count", "4 (vocab_size)", "3"));
  std::remove(three.c_str());
}

TEST_CASE("a tokenizer.bin with corrupt fields is rejected naming the file and the field") {
  // Builds a file from the four pieces, with token 3's score and length overridable.
  const auto build = [](std::int32_t max_token_length, float score3, std::int32_t length3,
                        const std::string& bytes3) {
    std::string out;
    put_i32(out, max_token_length);
    for (std::size_t i = 0; i < 3; ++i) {
      put_f32(out, kFourScores[i]);
      put_i32(out, static_cast<std::int32_t>(kFourPieces[i].size()));
      out += kFourPieces[i];
    }
    put_f32(out, score3);
    put_i32(out, length3);
    out += bytes3;
    return out;
  };
  SECTION("max_token_length below 1") {
    for (const std::int32_t bad : {0, -1, std::numeric_limits<std::int32_t>::min()}) {
      const std::string path = write_file("bad_max_len", build(bad, -1.0f, 4, " the"));
      CHECK_THROWS_MATCHES(Tokenizer::load(path), InvalidArgument,
                           names(path + ": max_token_length", ">= 1", std::to_string(bad)));
      std::remove(path.c_str());
    }
  }
  SECTION("a piece longer than max_token_length") {
    const std::string path = write_file("long_piece", build(6, -1.0f, 7, " thence"));
    CHECK_THROWS_MATCHES(Tokenizer::load(path), InvalidArgument,
                         names(path + ": token 3 length", "1 to max_token_length (6)", "7"));
    std::remove(path.c_str());
  }
  SECTION("negative zero and absurd lengths") {
    constexpr std::int32_t kMax = std::numeric_limits<std::int32_t>::max();
    constexpr std::int32_t kMin = std::numeric_limits<std::int32_t>::min();
    for (const std::int32_t bad : {-1, 0, kMax, kMin}) {
      const std::string path = write_file("bad_length", build(6, -1.0f, bad, " the"));
      CHECK_THROWS_MATCHES(
          Tokenizer::load(path), InvalidArgument,
          names(path + ": token 3 length", "1 to max_token_length (6)", std::to_string(bad)));
      std::remove(path.c_str());
    }
    // With a huge declared max_token_length, a huge length runs past the end of the file.
    const std::string path = write_file(
        "huge_length", build(std::numeric_limits<std::int32_t>::max(), -1.0f, 1 << 30, " the"));
    CHECK_THROWS_MATCHES(Tokenizer::load(path), InvalidArgument,
                         names(path + ": token 3 bytes", std::to_string(1 << 30) + " bytes", "4"));
    std::remove(path.c_str());
  }
  SECTION("a score that is not a number") {
    const std::string path =
        write_file("nan_score", build(6, std::numeric_limits<float>::quiet_NaN(), 4, " the"));
    CHECK_THROWS_MATCHES(Tokenizer::load(path), InvalidArgument,
                         names(path + ": token 3 score", "a finite number", "nan"));
    std::remove(path.c_str());
  }
  SECTION("a NUL byte inside a piece") {
    const std::string path = write_file("nul_piece", build(6, -1.0f, 4, std::string(" t\0e", 4)));
    CHECK_THROWS_MATCHES(Tokenizer::load(path), InvalidArgument,
                         names(path + ": token 3 bytes", "no NUL byte", "a NUL byte at offset 2"));
    std::remove(path.c_str());
  }
  SECTION("garbage") {
    // Random bytes: whatever field they break first, the error names the file and that field.
    kvlab::Rng rng(2024);
    for (int trial = 0; trial < 50; ++trial) {
      std::string bytes(1 + rng.next_u64() % 200, '\0');
      for (char& c : bytes) c = static_cast<char>(rng.next_u64() & 0xFF);
      const std::string path = write_file("garbage", bytes);
      CAPTURE(trial);
      CHECK_THROWS_WITH(Tokenizer::load(path),
                        Catch::Contains("Tokenizer::load: " + path + ": ") &&
                            (Catch::Contains("max_token_length") || Catch::Contains("token ")));
      std::remove(path.c_str());
    }
  }
  SECTION("a missing file") {
    const std::string path = "test_tokenizer_no_such_file.bin";
    std::remove(path.c_str());
    CHECK_THROWS_MATCHES(
        Tokenizer::load(path), InvalidArgument,
        names(path, "an existing, readable tokenizer.bin file", "a path that cannot be opened"));
    CHECK_THROWS_MATCHES(
        Tokenizer::load(path, 32000), InvalidArgument,
        names(path, "an existing, readable tokenizer.bin file", "a path that cannot be opened"));
  }
}

TEST_CASE("load with a vocabulary size reads exactly that many tokens") {
  const std::string path = write_file("vocab_size", tokenizer_bytes(6, kFourPieces, kFourScores));
  CHECK(Tokenizer::load(path, 4).vocab_size() == 4);
  // Fewer tokens in the file than asked for.
  CHECK_THROWS_MATCHES(Tokenizer::load(path, 5), InvalidArgument,
                       names(path + ": token count", "5 (vocab_size)", "4"));
  // More tokens in the file than asked for: token 3 (12 bytes) is left over.
  CHECK_THROWS_MATCHES(
      Tokenizer::load(path, 3), InvalidArgument,
      names(path + ": token count", "3 (vocab_size)", "more: 12 bytes follow token 2"));
  CHECK_THROWS_MATCHES(Tokenizer::load(path, 2), InvalidArgument, names("vocab_size", ">= 3", "2"));
  std::remove(path.c_str());
}

// ================================================================================================
// The real Llama 2 vocabulary (skipped when tokenizer.bin is absent from the models folder)
// ================================================================================================

TEST_CASE("the Llama 2 tokenizer.bin loads with 32000 pieces") {
  const std::string path = kvlab_test::model_file_or_skip("tokenizer.bin");
  const Tokenizer tok = Tokenizer::load(path);
  CHECK(tok.vocab_size() == 32000);
  CHECK(tok.max_token_length() == 27);
  CHECK(tok.piece(0) == "<unk>");
  CHECK(tok.piece(Tokenizer::kBos) == "\n<s>\n");
  CHECK(tok.piece(Tokenizer::kEos) == "\n</s>\n");
  for (int b = 0; b < 256; ++b) CHECK(tok.piece(b + Tokenizer::kByteOffset) == byte_piece(b));
  CHECK(tok.piece(29871) == " ");
  CHECK(tok.lookup(" ") == 29871);
  CHECK(Tokenizer::load(path, 32000).pieces() == tok.pieces());
  // stories260K's vocabulary size (512) does not fit this file.
  CHECK_THROWS_MATCHES(Tokenizer::load(path, 512), InvalidArgument,
                       names(path + ": token count", "512 (vocab_size)", "more: "));
}

TEST_CASE("the Llama 2 tokenizer encodes prompts to the published token ids") {
  const Tokenizer tok = Tokenizer::load(kvlab_test::model_file_or_skip("tokenizer.bin"));
  // Golden ids from llama2.c's test.c (test_prompt_encodings, karpathy/llama2.c), where they were
  // taken from Meta's Llama 2 SentencePiece tokenizer; they also agree with a separate Python
  // re-implementation of run.c's encode() run on this same file. encode(text, bos = true, eos =
  // false).
  CHECK(tok.encode("", true, false) == std::vector<int>{1});
  CHECK(tok.encode("I believe the meaning of life is", true, false) ==
        std::vector<int>{1, 306, 4658, 278, 6593, 310, 2834, 338});
  CHECK(
      tok.encode("Simply put, the theory of relativity states that ", true, false) ==
      std::vector<int>{1, 3439, 17632, 1925, 29892, 278, 6368, 310, 14215, 537, 5922, 393, 29871});
  CHECK(tok.encode("A brief message congratulating the team on the launch:\n\n        Hi "
                   "everyone,\n\n        I just ",
                   true, false) == std::vector<int>{1,     319,  11473, 2643, 378,   629,   271,
                                                    18099, 278,  3815,  373,  278,   6826,  29901,
                                                    13,    13,   4706,  6324, 14332, 29892, 13,
                                                    13,    4706, 306,   925,  29871});
  CHECK(tok.encode("Translate English to French:\n\n        sea otter => loutre de mer\n        "
                   "peppermint => "
                   "menthe poivr\xC3\xA9"
                   "e\n        plush girafe => girafe peluche\n        cheese =>",
                   true, false) ==
        std::vector<int>{1,     4103, 9632, 4223, 304,   5176, 29901, 13,   13,   4706,
                         7205,  4932, 357,  1149, 301,   449,  276,   316,  2778, 13,
                         4706,  1236, 407,  837,  524,   1149, 6042,  354,  772,  440,
                         29878, 1318, 13,   4706, 715,   1878, 330,   3055, 1725, 1149,
                         330,   3055, 1725, 4639, 28754, 13,   4706,  923,  968,  1149});
  // Golden ids from the Python re-implementation only (run.c's algorithm on this file): a short
  // English sentence, accented letters, Chinese, and an emoji that falls back to its 4 bytes.
  CHECK(tok.encode("Once upon a time", true, true) == std::vector<int>{1, 9038, 2501, 263, 931, 2});
  CHECK(tok.encode("h\xC3\xA9llo w\xC3\xB6rld", true, false) ==
        std::vector<int>{1, 298, 3610, 417, 281, 1340, 430});
  CHECK(tok.encode("\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C", true, false) ==
        std::vector<int>{1, 29871, 30919, 31076, 30214, 30793, 30967});
  CHECK(tok.encode("\xF0\x9F\x98\x80", true, false) ==
        std::vector<int>{1, 29871, 243, 162, 155, 131});
}

TEST_CASE("the Llama 2 tokenizer decodes what it encodes") {
  const Tokenizer tok = Tokenizer::load(kvlab_test::model_file_or_skip("tokenizer.bin"));
  CHECK(tok.decode(Tokenizer::kBos, 9038) == "Once");  // " Once" after BOS
  CHECK(tok.decode(9038, 2501) == " upon");
  CHECK(tok.decode(Tokenizer::kBos, 29871) == "");  // the lone dummy space
  CHECK(tok.decode(29901, 13) == "\n");             // "<0x0A>"
  const std::vector<std::string> texts = {
      "Once upon a time, there was a little girl named Lily.",
      "I believe the meaning of life is",
      "  two leading spaces, a tab\tand\nnew lines\n",
      "h\xC3\xA9llo w\xC3\xB6rld",                                     // héllo wörld
      "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C",  // 你好，世界
      "smile \xF0\x9F\x98\x80 and \xF0\x9F\x91\x8D!",                  // emoji
      // Привет κόσμε
      "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 \xCE\xBA\xCF\x8C\xCF\x83\xCE\xBC\xCE\xB5",
  };
  for (const std::string& text : texts) {
    for (const bool bos : {false, true}) {
      for (const bool eos : {false, true}) {
        CAPTURE(text, bos, eos);
        const std::vector<int> ids = tok.encode(text, bos, eos);
        CHECK(tok.decode(ids) == text);
        // Printing token by token, as a generator streams its output, gives the same text.
        if (bos && !eos) {
          std::string streamed;
          for (std::size_t i = 1; i < ids.size(); ++i) streamed += tok.decode(ids[i - 1], ids[i]);
          CHECK(streamed == text);
        }
      }
    }
  }
  // A long text: many merges, the same text back.
  std::string story;
  for (int i = 0; i < 40; ++i)
    story += "The little dog ran to the park and played with a red ball. ";
  CHECK(tok.decode(tok.encode(story, true, true)) == story);
}
