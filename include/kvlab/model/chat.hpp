/// \file
/// \brief A multi-turn chat over one model whose KV cache is kept across turns.
///
/// `ChatTemplate` is the ChatML template of a GGUF file and its default system prompt. In a
/// `ChatSession` each turn prefills only its new message, then decodes the reply a token at a time.
/// Checked in the tests: a second turn prefills only its own tokens and gives the ids that one
/// prefill of the whole conversation gives; a user's `<|im_end|>` is text, not the marker.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/model/gguf.hpp"
#include "kvlab/model/llama_model.hpp"
#include "kvlab/model/sampler.hpp"
#include "kvlab/model/text_tokenizer.hpp"

namespace kvlab {

/// The ChatML chat template (what SmolLM2, Qwen and many others use): each message is
/// `<|im_start|>` role `\n` content `<|im_end|>` `\n`, and a reply starts after
/// `<|im_start|>assistant\n` and ends with the model's `<|im_end|>`.
///
/// GGUF files carry their template as Jinja source (`tokenizer.chat_template`); kvlab has no
/// Jinja engine, so `from_gguf` recognises ChatML by its markers and reads the default system
/// prompt out of the template's text (SmolLM2's: "You are a helpful AI assistant named SmolLM,
/// trained by Hugging Face"). The markers are parsed as special tokens; a message's content
/// never is (`TextPart`), so a user cannot close their own turn by typing `<|im_end|>`.
class ChatTemplate {
 public:
  /// ChatML with `default_system` as the system prompt used when none is given.
  explicit ChatTemplate(std::string default_system = "")
      : default_system_(std::move(default_system)) {}

  /// The template of GGUF `file` (`tokenizer.chat_template`).
  /// \throws InvalidArgument naming the file and the key when the template is missing or is
  ///         not ChatML (it lacks `<|im_start|>` or `<|im_end|>`).
  static ChatTemplate from_gguf(const GgufFile& file) {
    const std::string& t = file.get_string("tokenizer.chat_template");
    if (t.find("<|im_start|>") == std::string::npos || t.find("<|im_end|>") == std::string::npos) {
      detail::fail("kvlab::ChatTemplate::from_gguf",
                   file.path() + ": key 'tokenizer.chat_template'",
                   "a ChatML template (<|im_start|> role, content, <|im_end|>)",
                   "a template without those markers");
    }
    const std::string open = "<|im_start|>system\n";
    const std::size_t at = t.find(open);
    std::string system;
    if (at != std::string::npos) {
      const std::size_t begin = at + open.size(), end = t.find("<|im_end|>", begin);
      if (end != std::string::npos) system = t.substr(begin, end - begin);
    }
    return ChatTemplate(system);
  }

  /// The system prompt used when the chat sets none ("" if the template has none).
  const std::string& default_system() const { return default_system_; }

  /// One message: `<|im_start|>` role `\n` (markers parsed), `content` (never parsed),
  /// `<|im_end|>` `\n` (parsed).
  std::vector<TextPart> message(const std::string& role, const std::string& content) const {
    return {TextPart{"<|im_start|>" + role + "\n", true}, TextPart{content, false},
            TextPart{"<|im_end|>\n", true}};
  }
  /// What starts the model's reply: `<|im_start|>assistant\n`.
  std::vector<TextPart> reply_prompt() const { return {TextPart{"<|im_start|>assistant\n", true}}; }
  /// What follows a reply in the conversation's text: the `\n` after its `<|im_end|>`.
  std::vector<TextPart> after_reply() const { return {TextPart{"\n", true}}; }
  /// A conversation's opening: the system message (none when `system` is empty), the user's
  /// message and the reply prompt. What `ChatSession`'s first turn prefills, and what a server
  /// sends for a one-message request (`kvlab-serve`): requests with the same system prompt
  /// share these tokens up to the user's text.
  std::vector<TextPart> prompt(const std::string& system, const std::string& user) const {
    std::vector<TextPart> parts;
    if (!system.empty()) parts = message("system", system);
    for (TextPart& p : message("user", user)) parts.push_back(std::move(p));
    for (TextPart& p : reply_prompt()) parts.push_back(std::move(p));
    return parts;
  }

 private:
  std::string default_system_;
};

/// What one turn of a `ChatSession` did.
struct ChatTurn {
  std::string text;        ///< the reply, as text (without its closing `<|im_end|>`)
  std::vector<int> reply;  ///< the reply's ids, as generated (the closing EOS included if any)
  int reused = 0;          ///< tokens of the conversation already in the cache (not recomputed)
  int prefilled = 0;       ///< tokens this turn fed at once: the new message and the reply prompt
  int generated = 0;       ///< tokens decoded one at a time
  double prefill_seconds = 0;  ///< time of the prefill
  double decode_seconds = 0;   ///< time of the decode steps
  std::size_t kv_bytes = 0;    ///< bytes of K and V the store holds after the turn
  bool ended = false;  ///< the model closed its reply (EOS); false: the token limit or context
  bool context_full = false;  ///< the reply stopped at the model's context limit
};

/// A conversation with one model: the cache holds every token so far, so each turn prefills
/// only its new message.
///
/// A turn appends, as ids: (after an earlier reply) the `\n` that follows its `<|im_end|>`; the
/// system message on the first turn; the user's message; the reply prompt. Those tokens are
/// prefilled in one step; then the reply is sampled and decoded one token a step until the
/// model emits EOS (`<|im_end|>`), `max_new_tokens` is reached or the context is full (the
/// reply is then closed with an EOS the model did not choose, so the template stays whole).
///
/// The cache holds the ids the model generated. Decoding those ids to text and encoding the
/// text again can give other ids (BPE finds one segmentation of a text; the model may have
/// produced another): the cache keeps the model's own, as a server must.
///
/// On the naive backend nothing is kept but the tokens: every step recomputes the whole
/// conversation (`reused` counts the tokens it holds, which it then recomputes).
class ChatSession {
 public:
  /// A chat over `model`'s own sequence (a model built with a `LlamaBackend`), encoded by
  /// `tokenizer`, in `chat_template`, sampled by `sampler`, with `system` as the system prompt.
  /// `model` and `tokenizer` must outlive the session.
  /// \throws InvalidArgument if the tokenizer's vocabulary is not the model's, or it has no EOS.
  ChatSession(LlamaModel& model, const TextTokenizer& tokenizer, ChatTemplate chat_template,
              Sampler sampler, std::string system)
      : model_(model),
        tokenizer_(tokenizer),
        template_(std::move(chat_template)),
        sampler_(std::move(sampler)),
        system_(std::move(system)) {
    constexpr const char* kWhere = "kvlab::ChatSession";
    detail::require_equal(kWhere, "tokenizer.vocab_size()", tokenizer.vocab_size(),
                          model.config().vocab_size, "the model's vocab_size");
    if (tokenizer.eos_id() < 0) detail::fail(kWhere, "tokenizer.eos_id()", "an EOS token", -1);
  }

  /// The ids this turn would prefill for `user` (checked by `turn` against the context).
  std::vector<int> new_tokens(const std::string& user) const {
    if (model_.position() == 0) return tokenizer_.encode_parts(template_.prompt(system_, user));
    std::vector<TextPart> parts = template_.after_reply();
    for (TextPart& p : template_.message("user", user)) parts.push_back(std::move(p));
    for (TextPart& p : template_.reply_prompt()) parts.push_back(std::move(p));
    return tokenizer_.encode_parts(parts);
  }

  /// One turn: prefills the new tokens for `user`, then decodes the reply, handing each piece
  /// of text that is complete (`Utf8Stream`) to `on_text` as it comes.
  /// \param user            the user's message (special-token text in it stays text)
  /// \param max_new_tokens  the longest reply, >= 1
  /// \param on_text         called with each complete piece of the reply's text (may be empty)
  /// \throws CapacityError, with nothing changed, if the new tokens and one reply token do not
  ///         fit in the model's context (`LlamaModel::max_tokens`); InvalidArgument for
  ///         `max_new_tokens < 1` or text the tokenizer refuses.
  ChatTurn turn(const std::string& user, int max_new_tokens,
                const std::function<void(const std::string&)>& on_text = {}) {
    constexpr const char* kWhere = "kvlab::ChatSession::turn";
    detail::require_at_least(kWhere, "max_new_tokens", max_new_tokens, 1);
    const std::vector<int> fresh = new_tokens(user);
    ChatTurn t;
    t.reused = model_.position();
    const int room = model_.max_tokens() - model_.position();
    if (static_cast<long>(fresh.size()) + 1 > room) {
      detail::fail<CapacityError>(
          kWhere, "the conversation",
          "room for this turn's " + std::to_string(fresh.size()) +
              " tokens and a reply in the "
              "context of " +
              std::to_string(model_.max_tokens()) + " tokens",
          std::to_string(model_.position()) + " tokens held (start a new conversation)");
    }
    t.prefilled = static_cast<int>(fresh.size());
    const auto start = std::chrono::steady_clock::now();
    RowVector<float> logits = model_.prefill(fresh);  // [vocab_size]
    const auto prefilled = std::chrono::steady_clock::now();
    t.prefill_seconds = std::chrono::duration<double>(prefilled - start).count();
    Utf8Stream stream;
    const auto emit = [&](const std::string& bytes) {
      const std::string text = stream.push(bytes);
      t.text += text;
      if (on_text && !text.empty()) on_text(text);
    };
    while (true) {
      const int id = sampler_.sample(logits);
      if (id == tokenizer_.eos_id()) {
        t.reply.push_back(id);
        t.ended = true;
        break;
      }
      if (model_.position() + 2 > model_.max_tokens()) {  // no room for id and the closing EOS
        t.context_full = true;
        t.reply.push_back(tokenizer_.eos_id());  // an EOS the model did not choose
        break;
      }
      t.reply.push_back(id);
      emit(tokenizer_.token_bytes(id));
      ++t.generated;
      if (t.generated >= max_new_tokens) {  // the limit: id joins the cache, then an EOS
        model_.decode(id);
        t.reply.push_back(tokenizer_.eos_id());
        break;
      }
      logits = model_.decode(id);
    }
    // The last id (EOS) joins the cache: the next turn starts right after it.
    model_.decode(t.reply.back());
    const std::string rest = stream.finish();
    t.text += rest;
    if (on_text && !rest.empty()) on_text(rest);
    t.decode_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - prefilled).count();
    t.kv_bytes = model_.store().bytes_used();
    return t;
  }

  /// Forgets the conversation (the cache is emptied; the system prompt stays).
  void reset() { model_.reset(); }
  /// Tokens of the conversation so far (all of them in the cache).
  int tokens() const { return model_.position(); }
  /// The model.
  const LlamaModel& model() const { return model_; }

 private:
  LlamaModel& model_;
  const TextTokenizer& tokenizer_;
  ChatTemplate template_;
  Sampler sampler_;
  std::string system_;
};

}  // namespace kvlab
