// The byte-level BPE tokenizer on a small vocabulary built here: GPT-2's byte alphabet, the
// pre-tokenizer's split (digits alone, contractions, letters, numbers, punctuation and
// whitespace runs of several scripts), merges in rank order, special tokens parsed only when
// asked, malformed UTF-8 round trips, the refused byte, every constructor error; Unicode classes
// and UTF-8 decoding; Utf8Stream; and llama2.c's Tokenizer behind the same interface. The real
// vocabulary against the Hugging Face reference is in test_real_model.cpp.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "gguf_writer.hpp"
#include "kvlab/kvlab.hpp"
#include "kvlab/model/bpe_tokenizer.hpp"
#include "kvlab/model/text_tokenizer.hpp"
#include "kvlab/model/unicode_classes.hpp"
#include "test_support.hpp"

using kvlab::BpeTokenizer;
using kvlab::CharClass;
using kvlab::InvalidArgument;
using kvlab_test::error_of;

namespace {

// GPT-2's byte alphabet (gguf_writer.hpp), character of byte b.
std::string byte_char(int b) { return kvlab_test::gpt2_byte_chars()[static_cast<std::size_t>(b)]; }

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<std::int64_t> types;
  std::vector<std::string> merges;
  int add(const std::string& t, int type = 1) {
    tokens.push_back(t);
    types.push_back(type);
    return static_cast<int>(tokens.size()) - 1;
  }
};

// Ids 0-2: <|endoftext|>, <|im_start|>, <|im_end|> (control); 3: <tool> (user-defined); then the
// 256 byte characters (id 4 + b), then merged tokens.
Vocab small_vocab() {
  Vocab v;
  v.add("<|endoftext|>", 3);
  v.add("<|im_start|>", 3);
  v.add("<|im_end|>", 3);
  v.add("<tool>", 4);
  for (int b = 0; b < 256; ++b) v.add(byte_char(b));
  const std::string sp = byte_char(' ');  // "Ġ"
  for (const char* m :
       {"h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "Ġwo r", "Ġwor l", "Ġworl d"}) {
    std::string s(m);
    const std::size_t at = s.find("Ġ");
    v.merges.push_back(s);
    std::string merged = s;
    merged.erase(merged.find(' '), 1);
    v.add(merged);
    (void)at;
    (void)sp;
  }
  return v;
}

BpeTokenizer make(const Vocab& v, const std::string& pre = "smollm") {
  return BpeTokenizer(v.tokens, v.types, v.merges, pre, 1, 2);
}

}  // namespace

TEST_CASE("Unicode classes: letters, numbers and spaces of several scripts, from Debian's data") {
  CHECK(std::string(kvlab::unicode_version()).size() >= 5);
  for (char32_t c : {U'a', U'Z', U'é', U'Ж', U'λ', U'中', U'ア', U'한', U'ب', U'א', U'क'})
    CHECK(kvlab::char_class(c) == CharClass::letter);
  for (char32_t c : {U'0', U'9', U'٣', U'३', U'０', U'²', U'½', U'Ⅻ'})
    CHECK(kvlab::char_class(c) == CharClass::number);
  for (char32_t c : {U' ', U'\t', U'\n', U'\r', U'\v', U'\f', U'\u0085', U'\u00A0', U'\u3000',
                     U'\u2028', U'\u2003'})
    CHECK(kvlab::char_class(c) == CharClass::space);
  for (char32_t c : {U'!', U'\'', U'\u0301', U'\u200D', U'😀', U'\u0000', U'\u001F'})
    CHECK(kvlab::char_class(c) == CharClass::other);
  CHECK(kvlab::char_class(0x110000) == CharClass::other);
}

TEST_CASE("encode_utf8: every scalar value's bytes decode back to it, lengths 1 to 4") {
  int lengths[5] = {0, 0, 0, 0, 0};  // [bytes]: code points seen of each length
  for (char32_t c = 0; c <= 0x10FFFF; c += (c < 0x1000 ? 1 : 97)) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    const std::string bytes = kvlab::encode_utf8(c);
    const kvlab::Utf8Char back = kvlab::decode_utf8(bytes, 0);
    CAPTURE(static_cast<std::uint32_t>(c));
    REQUIRE(back.valid);
    REQUIRE(back.code == c);
    REQUIRE(back.length == static_cast<int>(bytes.size()));
    ++lengths[bytes.size()];
  }
  CHECK(kvlab::encode_utf8(U'é') == "\xC3\xA9");
  CHECK(kvlab::encode_utf8(0x10FFFF).size() == 4);
  CHECK(lengths[1] == 128);
  CHECK(lengths[2] == 0x800 - 0x80);
  CHECK(lengths[3] > 0);
  CHECK(lengths[4] > 0);
}

TEST_CASE("decode_utf8: well-formed characters, and every kind of malformed byte alone") {
  const auto at0 = [](const std::string& s) { return kvlab::decode_utf8(s, 0); };
  CHECK(at0("A").code == U'A');
  CHECK(at0("\xC3\xA9").code == U'é');
  CHECK(at0("\xC3\xA9").length == 2);
  CHECK(at0("\xE4\xB8\xAD").code == U'中');
  CHECK(at0("\xF0\x9F\x98\x80").code == U'😀');
  CHECK(at0("\xF0\x9F\x98\x80").length == 4);
  for (const char* bad : {"\x80", "\xBF", "\xC0\x80", "\xC1\xBF", "\xE0\x80\x80", "\xED\xA0\x80",
                          "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\xFF", "\xC3", "\xE4\xB8",
                          "\xC3"
                          "A"}) {
    CAPTURE(bad);
    const kvlab::Utf8Char c = at0(bad);
    CHECK_FALSE(c.valid);
    CHECK(c.length == 1);
    CHECK(c.code == static_cast<unsigned char>(bad[0]));
  }
}

TEST_CASE("BpeTokenizer: the pre-tokenizer's words") {
  const BpeTokenizer t = make(small_vocab());
  using W = std::vector<std::string>;
  CHECK(t.pre_tokenize("Hello world") == W{"Hello", " world"});
  CHECK(t.pre_tokenize("it's we'll I'M they’re") ==
        W{"it", "'s", " we", "'ll", " I", "'", "M", " they", "’", "re"});
  CHECK(t.pre_tokenize("a 123 b") == W{"a", " ", "1", "2", "3", " b"});
  CHECK(t.pre_tokenize("x²+٣") == W{"x", "²", "+", "٣"});
  CHECK(t.pre_tokenize("a  b") == W{"a", " ", " b"});
  CHECK(t.pre_tokenize("a\t\tb") == W{"a", "\t", "\t", "b"});
  CHECK(t.pre_tokenize("a \n\n b") == W{"a", " \n\n", " b"});
  CHECK(t.pre_tokenize("end  ") == W{"end", "  "});
  CHECK(t.pre_tokenize("   ") == W{"   "});
  CHECK(t.pre_tokenize("Ж中文 ?!! ...") == W{"Ж中文", " ?!!", " ..."});
  CHECK(t.pre_tokenize("a\u00A0\u00A0b") == W{"a", "\u00A0", "\u00A0", "b"});
  CHECK(t.pre_tokenize("\xFF\xFE x") == W{"\xFF\xFE", " x"});
  CHECK(t.pre_tokenize("").empty());
  // "gpt2" keeps digit runs whole.
  CHECK(make(small_vocab(), "gpt2").pre_tokenize("a 123 b") == W{"a", " 123", " b"});
}

TEST_CASE("BpeTokenizer: merges in rank order, special tokens only when asked, exact round trips") {
  const Vocab v = small_vocab();
  const BpeTokenizer t = make(v);
  const auto byte_id = [](char c) { return 4 + static_cast<unsigned char>(c); };
  const int hello = t.lookup("hello"), world = t.lookup("Ġworld");
  REQUIRE(hello > 0);
  REQUIRE(world > 0);
  CHECK(t.encode_text("hello world", false) == std::vector<int>{hello, world});
  // "hel": h+e merges (rank 0) before l+l could; "hell" then needs "he ll".
  CHECK(t.encode_text("hel", false) == std::vector<int>{t.lookup("he"), byte_id('l')});
  CHECK(t.encode_text("hell", false) == std::vector<int>{t.lookup("hell")});
  CHECK(t.encode_text("ll", false) == std::vector<int>{t.lookup("ll")});
  // Special tokens: parsed when asked; else ordinary text. <tool> (user-defined): always.
  const std::string chat = "<|im_start|>hello<|im_end|><tool>";
  CHECK(t.encode_text(chat, true) == std::vector<int>{1, hello, 2, 3});
  const std::vector<int> plain = t.encode_text(chat, false);
  CHECK(plain.size() > 4);
  CHECK(plain.front() == byte_id('<'));
  CHECK(plain.back() == 3);
  CHECK(t.decode(plain) == chat);
  CHECK(t.decode(t.encode_text(chat, true)) == chat);
  CHECK(t.is_special(2));
  CHECK_FALSE(t.is_special(3));
  CHECK_FALSE(t.is_special(hello));
  CHECK(t.bos_id() == 1);
  CHECK(t.eos_id() == 2);
  CHECK(t.token(world) == "Ġworld");
  CHECK(t.token_bytes(world) == " world");
  CHECK(t.type(3) == kvlab::TokenType::user_defined);
  // Malformed UTF-8 and every byte value: encoded byte by byte where no merge applies, decoded
  // back exactly.
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  for (const std::string& text :
       {all, std::string("\xC3(\xE2\x82 \xF0\x9F\x98"), std::string("\0a\0", 3)}) {
    CHECK(t.decode(t.encode_text(text, false)) == text);
    CHECK(t.decode(t.encode_text(text, true)) == text);
  }
  CHECK(t.encode_text("", true).empty());
  CHECK(error_of([&] {
          t.token_bytes(v.tokens.size());
        }).find("id: expected an id in [0, 269), got 269") != std::string::npos);
  CHECK(error_of([&] { t.token(-1); }).find("id: expected an id in [0, 269), got -1") !=
        std::string::npos);
}

TEST_CASE("BpeTokenizer: a byte without a token is refused, naming it") {
  Vocab v = small_vocab();
  v.tokens[4 + 4] = "unused0";  // byte 0x04's token is gone
  const BpeTokenizer t = make(v);
  CHECK(error_of([&] { t.encode_text("ab\x04", false); })
            .find("text: expected bytes this vocabulary can encode, got byte 0x04 at offset 2, "
                  "which has no token") != std::string::npos);
  CHECK(t.encode_text("ab", false).size() == 2);
}

TEST_CASE("BpeTokenizer: a token that does not decode to a byte or a merge's parts is not used") {
  // Found by fuzz_gguf: a vocabulary whose token for byte 0xC3 (its text "Ã", U+00C3) was a
  // control token encoded that byte through it, and decoded its text as is (0xC3 0x83). A token
  // counts as a byte only if it decodes to it, and a merge applies only if its token decodes to
  // its parts' bytes: every encoding decodes back. (Where the text is the byte itself — ASCII
  // letters — the token still decodes to it, and is used.)
  Vocab byte = small_vocab();
  byte.types[4 + 0xC3] = 3;  // byte 0xC3's token "Ã": control
  const BpeTokenizer a = make(byte);
  CHECK(a.encode_text("q", false).size() == 1);
  CHECK(error_of([&] {
          a.encode_text("w\xC3\xB6rld", false);
        }).find("got byte 0xC3 at offset 1, which has no token") != std::string::npos);
  Vocab merged = small_vocab();
  merged.types[static_cast<std::size_t>(make(merged).lookup("Ġw"))] = 3;  // "Ġ w": control
  const BpeTokenizer b = make(merged);
  CHECK(b.encode_text(" w", false) ==
        std::vector<int>{4 + static_cast<unsigned char>(' '), 4 + static_cast<unsigned char>('w')});
  for (const std::string& text : {std::string(" w"), std::string("hello world")}) {
    CHECK(b.decode(b.encode_text(text, false)) == text);
  }
}

TEST_CASE("BpeTokenizer: every defect of a vocabulary is refused with the documented error") {
  const auto error = [](Vocab v, const std::string& pre = "smollm", int bos = 1, int eos = 2) {
    return error_of([&] { BpeTokenizer t(v.tokens, v.types, v.merges, pre, bos, eos); });
  };
  CHECK(error(small_vocab()).empty());
  Vocab unknown = small_vocab();
  unknown.merges.push_back("q zz");
  CHECK(error(unknown).find("merges[9]: expected a known right token, got 'zz'") !=
        std::string::npos);
  Vocab no_pair = small_vocab();
  no_pair.merges.push_back("q r");
  CHECK(
      error(no_pair).find("merges[9]: expected a pair whose concatenation is a token, got 'qr'") !=
      std::string::npos);
  Vocab spaces = small_vocab();
  spaces.merges.push_back("a b c");
  CHECK(error(spaces).find("merges[9]: expected two tokens separated by one space, got 'a b c'") !=
        std::string::npos);
  Vocab dup = small_vocab();
  dup.add("hello");
  CHECK(error(dup).find("expected a token not listed before, got 'hello', also id") !=
        std::string::npos);
  Vocab type = small_vocab();
  type.types[7] = 9;
  CHECK(error(type).find("types[7]: expected a token type in 1 to 6, got 9") != std::string::npos);
  Vocab alphabet = small_vocab();
  alphabet.add("a b");  // a space is not in the byte-level alphabet
  CHECK(error(alphabet).find(
            "expected characters of the byte-level alphabet (a normal token), got 'a b'") !=
        std::string::npos);
  Vocab empty = small_vocab();
  empty.tokens[5] = "";
  CHECK(error(empty).find("tokens[5]: expected a non-empty token, got ''") != std::string::npos);
  Vocab sizes = small_vocab();
  sizes.types.pop_back();
  CHECK(error(sizes).find("types.size(): expected 269 (tokens.size()), got 268") !=
        std::string::npos);
  CHECK(
      error(small_vocab(), "llama3").find("pre: expected \"smollm\" or \"gpt2\", got \"llama3\"") !=
      std::string::npos);
  CHECK(
      error(small_vocab(), "smollm", 269).find("bos: expected -1 or an id in [0, 269), got 269") !=
      std::string::npos);
  CHECK(
      error(small_vocab(), "smollm", 1, -2).find("eos: expected -1 or an id in [0, 269), got -2") !=
      std::string::npos);
}

TEST_CASE("Utf8Stream: a character split over tokens prints once whole, bad bytes as U+FFFD") {
  kvlab::Utf8Stream s;
  CHECK(s.push("a\xE4") == "a");  // 中 = E4 B8 AD: held back
  CHECK(s.pending() == 1);
  CHECK(s.push("\xB8") == "");
  CHECK(s.push("\xAD!") == "\xE4\xB8\xAD!");
  CHECK(s.pending() == 0);
  CHECK(s.push("\xF0\x9F") == "");
  CHECK(s.push("\x98\x80") == "\xF0\x9F\x98\x80");
  const std::string fffd = "\xEF\xBF\xBD";
  CHECK(s.push("\x80x") == fffd + "x");                 // a stray continuation byte
  CHECK(s.push("\xC3(") == fffd + "(");                 // a lead byte without its continuation
  CHECK(s.push("\xED\xA0\x80") == fffd + fffd + fffd);  // a surrogate: each byte bad
  CHECK(s.push("\xE2\x82") == "");
  CHECK(s.finish() == fffd + fffd);  // an incomplete character at the end
  CHECK(s.pending() == 0);
}

TEST_CASE("llama2.c's Tokenizer behind the TextTokenizer interface") {
  const kvlab::Tokenizer llama({"<unk>", "\n<s>\n", "\n</s>\n", " ", "a", " a"},
                               {0, 0, 0, 0, 0, 1});
  const kvlab::TextTokenizer& t = llama;
  CHECK(t.vocab_size() == 6);
  CHECK(t.encode_text("a", true) == llama.encode("a", false, false));
  CHECK(t.bos_id() == kvlab::Tokenizer::kBos);
  CHECK(t.eos_id() == kvlab::Tokenizer::kEos);
  CHECK(t.is_special(1));
  CHECK_FALSE(t.is_special(5));
  CHECK(t.token_bytes(5) == " a");
  CHECK(t.token_bytes(5, kvlab::Tokenizer::kBos) == "a");
  CHECK(t.decode({1, 5, 2}) == "a");
}
