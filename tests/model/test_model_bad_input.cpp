// The bad-input cases of include/kvlab/model/: each calls a public function declared there with one
// bad argument. The rules of the table are in tests/bad_input/ (entry_points.txt lists the entry
// points and is checked against the headers by the test bad_input_table; bad_input.hpp runs a
// case): each input class that applies — wrong shape, zero or negative size, empty, an index or id
// out of range, a call the object's state does not allow, overflow-sized arguments, values that
// cannot be stored — is tried, and each case asserts kvlab's exception type, a message naming the
// argument with the expected and the actual value, and the object's observable state unchanged
// (compared before and after).
#include <catch2/catch.hpp>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bad_input/bad_input.hpp"
#include "bad_input/states.hpp"
#include "gguf_writer.hpp"
#include "kvlab/kvlab.hpp"
#include "kvlab/model/bpe_tokenizer.hpp"
#include "kvlab/model/cache_policy.hpp"
#include "kvlab/model/chat.hpp"
#include "model_writers.hpp"

using kvlab::InvalidArgument;
using kvlab::RowMatrix;
using kvlab_test::names;
using kvlab_test::refuses;
using kvlab_test::bad_input_states::no_state;
using kvlab_test::bad_input_states::state_of;
namespace input = kvlab_test::input;

namespace {
// A KVStore of none of kvlab's kinds (a student's own): it holds nothing and is never stepped;
// only its type matters to `llama_backend_of`.
class ForeignStore : public kvlab::KVStore<float> {
 public:
  ForeignStore(int layers, int kv_heads, int head_dim)
      : KVStore<float>("ForeignStore", layers, kv_heads, head_dim) {}
  const char* name() const override { return "foreign"; }
  const char* storage_name() const override { return "fp32"; }
  std::size_t bytes_per_token() const override { return 0; }
  int add_sequence() override { return 0; }
  std::vector<int> sequences() const override { return {}; }
  std::size_t bytes_reserved() const override { return 0; }
  std::size_t bytes_used() const override { return 0; }

 protected:
  bool do_contains(int) const override { return false; }
  int do_length(int) const override { return 0; }
  void do_free_sequence(int) override {}
  int do_fork(int) override { return 0; }
  void do_truncate(int, int) override {}
  void do_begin_step(kvlab::StepBatch&, const RowMatrix<float>&, RowMatrix<float>&,
                     const char*) override {}
  void do_append(int, const RowMatrix<float>&, const RowMatrix<float>&) override {}
  void do_attend(int, const kvlab::AttentionShape&, const RowMatrix<float>&,
                 const std::vector<std::int32_t>&, RowMatrix<float>&,
                 kvlab::CostCounters*) override {}
  void do_end_step() override {}
  void do_abort_step() noexcept override {}
};
}  // namespace

TEST_CASE("Sampler, Tokenizer and the backend's name parser: bad input is refused") {
  const char* ctor =
      "kvlab::Sampler::Sampler(int vocab_size, float temperature, float top_p, std::uint64_t seed)";
  refuses<InvalidArgument>(
      ctor, input::kSize, no_state, [] { kvlab::Sampler s(0, 0.0f, 1.0f, 1); },
      names("vocab_size", ">= 1", "0"));
  refuses<InvalidArgument>(
      ctor, input::kValue, no_state, [] { kvlab::Sampler s(4, std::nanf(""), 1.0f, 1); },
      names("temperature", "a finite value >= 0", "nan"));
  refuses<InvalidArgument>(
      ctor, input::kValue, no_state, [] { kvlab::Sampler s(4, 1.0f, 0.0f, 1); },
      names("top_p", "a value in (0, 1]", "0"));
  refuses<InvalidArgument>(
      ctor, input::kValue, no_state, [] { kvlab::Sampler s(4, 1.0f, 1.5f, 1); },
      names("top_p", "a value in (0, 1]", "1.5"));
  kvlab::Sampler sampler(4, 1.0f, 0.9f, 7);
  const kvlab::RowVector<float> logits = kvlab::RowVector<float>::LinSpaced(4, 0.0f, 1.0f);
  // The state: the token the sampler draws next (a refused call must not have moved its
  // generator).
  const auto next_draw = [&] { return kvlab::Sampler(sampler).sample(logits); };
  refuses<InvalidArgument>(
      "kvlab::Sampler::sample(const RowVector< float > &logits)", input::kShape, next_draw,
      [&] { (void)sampler.sample(kvlab::RowVector<float>::Zero(5)); },
      names("logits.size()", "4 (vocab_size)", "5"));

  const kvlab::Tokenizer tok({"<unk>", "<s>", "</s>", "a", "b", "ab"}, {0, 0, 0, -1, -1, 1});
  const char* tok_ctor =
      "kvlab::Tokenizer::Tokenizer(std::vector< std::string > pieces, std::vector< float > scores)";
  refuses<InvalidArgument>(
      tok_ctor, input::kShape, no_state,
      [] {
        kvlab::Tokenizer t({"<unk>", "<s>", "</s>"}, {0, 0});
      },
      names("scores.size()", "3 (one score per piece)", "2"));
  refuses<InvalidArgument>(
      tok_ctor, input::kSize, no_state,
      [] {
        kvlab::Tokenizer t({"<unk>", "<s>"}, {0, 0});
      },
      names("pieces.size()", "3 to 2^31-1 (ids 0, 1, 2 are <unk>, BOS, EOS)", "2"));
  refuses<InvalidArgument>(
      tok_ctor, input::kEmpty, no_state,
      [] {
        kvlab::Tokenizer t({"<unk>", "<s>", "</s>", ""}, {0, 0, 0, 0});
      },
      names("pieces[3]", "a non-empty string without NUL bytes", "an empty string"));
  refuses<InvalidArgument>(
      tok_ctor, input::kValue, no_state,
      [] {
        kvlab::Tokenizer t({"<unk>", "<s>", "</s>"}, {0, 0, INFINITY});
      },
      names("scores[2]", "a finite number", "inf"));
  const char* tok_ctor3 =
      "kvlab::Tokenizer::Tokenizer(std::vector< std::string > pieces, std::vector< float > scores, "
      "int max_token_length)";
  refuses<InvalidArgument>(
      tok_ctor3, input::kShape, no_state,
      [] {
        kvlab::Tokenizer t({"<unk>", "<s>", "</s>"}, {0, 0, 0}, 3);
      },
      names("max_token_length", ">= 5 (the longest piece)", "3"));
  for (const char* e :
       {"kvlab::Tokenizer::piece(int id) const", "kvlab::Tokenizer::score(int id) const"}) {
    const bool piece = std::string(e).find("piece") != std::string::npos;
    const auto call = [&](int id) {
      if (piece)
        (void)tok.piece(id);
      else
        (void)tok.score(id);
    };
    refuses<InvalidArgument>(
        e, input::kRange, no_state, [&] { call(6); }, names("id", "an id in [0, 6)", "6"));
    refuses<InvalidArgument>(
        e, input::kRange, no_state, [&] { call(-1); }, names("id", "an id in [0, 6)", "-1"));
  }
  refuses<InvalidArgument>(
      "kvlab::Tokenizer::decode(int prev_token, int token) const", input::kRange, no_state,
      [&] { (void)tok.decode(1, 6); }, names("token", "an id in [0, 6)", "6"));
  refuses<InvalidArgument>(
      "kvlab::Tokenizer::decode(int prev_token, int token) const", input::kRange, no_state,
      [&] { (void)tok.decode(-1, 3); }, names("prev_token", "an id in [0, 6)", "-1"));
  refuses<InvalidArgument>(
      "kvlab::Tokenizer::decode(const std::vector< int > &tokens) const override", input::kRange,
      no_state,
      [&] {
        (void)tok.decode(std::vector<int>{3, 9});
      },
      names("tokens[1]", "an id in [0, 6)", "9"));
  refuses<InvalidArgument>(
      "kvlab::Tokenizer::encode(const std::string &text, bool bos, bool eos) const", input::kValue,
      no_state, [&] { (void)tok.encode("c", false, false); },
      names("byte fallback token of byte 32", "an id below vocab_size 6", "35"));
  refuses<InvalidArgument>(
      "kvlab::Tokenizer::load(const std::string &path)", input::kEmpty, no_state,
      [] { (void)kvlab::Tokenizer::load("/nonexistent/tokenizer.bin"); },
      names("/nonexistent/tokenizer.bin", "an existing, readable tokenizer.bin file",
            "a path that cannot be opened"));
  refuses<InvalidArgument>(
      "kvlab::Tokenizer::load(const std::string &path, int vocab_size)", input::kSize, no_state,
      [] { (void)kvlab::Tokenizer::load("/nonexistent/tokenizer.bin", 2); },
      names("vocab_size", ">= 3 (ids 0, 1, 2 are <unk>, BOS, EOS)", "2"));

  refuses<InvalidArgument>(
      "kvlab::parse_llama_backend(const std::string &name)", input::kValue, no_state,
      [] { (void)kvlab::parse_llama_backend("Paged"); },
      names("name", "naive, cached or paged", "'Paged'"));
}

TEST_CASE("LlamaConfig setters, the model and the decoders refuse bad sizes") {
  const auto weights = std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin());
  const char* model_ctor =
      "kvlab::LlamaModel::LlamaModel(std::shared_ptr< const LlamaWeights > weights, LlamaBackend "
      "backend, int block_size=16, int max_tokens=0, KVDtype kv_dtype=KVDtype::fp32, int window=0)";
  refuses<InvalidArgument>(
      model_ctor, input::kEmpty, no_state,
      [] { kvlab::LlamaModel m(nullptr, kvlab::LlamaBackend::Cached); },
      names("weights", "non-null weights", "nullptr"));
  refuses<InvalidArgument>(
      model_ctor, input::kRange, no_state,
      [&] { kvlab::LlamaModel m(weights, kvlab::LlamaBackend::Cached, 16, 513); },
      names("max_tokens", "in [0, seq_len (512)]", "513"));
  refuses<InvalidArgument>(
      model_ctor, input::kSize, no_state,
      [&] { kvlab::LlamaModel m(weights, kvlab::LlamaBackend::Paged, 0); },
      names("block_size", ">= 1", "0"));
  kvlab::LlamaModel model(weights, kvlab::LlamaBackend::Cached, 16, 8);
  model.prefill({1, 2, 3});
  const auto model_state = [&] { return model.tokens(); };
  refuses<InvalidArgument>(
      "kvlab::LlamaModel::decode(int token)", input::kRange, model_state,
      [&] { (void)model.decode(256); }, names("token", "an id in [0, 256)", "256"));
  kvlab::LlamaModel full(weights, kvlab::LlamaBackend::Cached, 16, 3);
  full.prefill({1, 2, 3});
  refuses<kvlab::CapacityError>(
      "kvlab::LlamaModel::decode(int token)", input::kOverflow, [&] { return full.tokens(); },
      [&] { (void)full.decode(4); },
      names("position()", "below max_tokens (3): a position for the token", "3"));
  refuses<InvalidArgument>(
      "kvlab::LlamaModel::forward(const std::vector< int > &tokens)", input::kEmpty, model_state,
      [&] { (void)model.forward({}); }, names("tokens.size()", ">= 1", "0"));
  refuses<kvlab::CapacityError>(
      "kvlab::LlamaModel::forward(const std::vector< int > &tokens)", input::kOverflow, model_state,
      [&] {
        (void)model.forward({1, 2, 3, 4, 5, 6});
      },
      names("tokens.size()", "at most 5 (max_tokens 8, position 3)", "6"));
  refuses<InvalidArgument>(
      "kvlab::LlamaModel::prefill(const std::vector< int > &tokens)", input::kRange, model_state,
      [&] { (void)model.prefill({-1}); }, names("tokens[0]", "an id in [0, 256)", "-1"));

  const auto stack = kvlab::AttentionStack<double>::random(1, kvlab::AttentionShape(2, 1, 4), 8, 5);
  refuses<InvalidArgument>(
      "kvlab::CachedDecoder::CachedDecoder(std::shared_ptr< const AttentionStack< T > > stack, int "
      "capacity, int window=0)",
      input::kSize, no_state, [&] { kvlab::CachedDecoder<double> d(stack, 0); },
      names("capacity", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::NaiveDecoder::NaiveDecoder(std::shared_ptr< const AttentionStack< T > > stack, int "
      "window=0)",
      input::kEmpty, no_state, [] { kvlab::NaiveDecoder<double> d(nullptr); },
      names("stack", "a non-null stack", "nullptr"));
  refuses<InvalidArgument>(
      "kvlab::PagedDecoder::PagedDecoder(std::shared_ptr< const AttentionStack< T > > stack, int "
      "block_size, int num_blocks, KVLayout layout=KVLayout::NHD, int window=0)",
      input::kSize, no_state, [&] { kvlab::PagedDecoder<double> d(stack, 4, 0); },
      names("num_blocks", ">= 1", "0"));
  {
    const char* partial =
        "kvlab::PartialCacheDecoder::PartialCacheDecoder(std::shared_ptr< const AttentionStack< T "
        "> > stack, int capacity, std::vector< int > uncached_layers)";
    const auto deep =
        kvlab::AttentionStack<double>::random(3, kvlab::AttentionShape(2, 1, 4), 8, 5);
    refuses<InvalidArgument>(
        partial, input::kSize, no_state,
        [&] { kvlab::PartialCacheDecoder<double> d(deep, 0, {1}); },
        names("capacity", ">= 1", "0"));
    refuses<InvalidArgument>(
        partial, input::kRange, no_state,
        [&] { kvlab::PartialCacheDecoder<double> d(deep, 4, {3}); },
        names("uncached_layers[0]", "in [0, 3) (ascending layers of the stack)", "3"));
    refuses<InvalidArgument>(
        partial, input::kRange, no_state,
        [&] { kvlab::PartialCacheDecoder<double> d(deep, 4, {-1}); },
        names("uncached_layers[0]", "in [0, 3)", "-1"));
    refuses<InvalidArgument>(
        partial, input::kValue, no_state,
        [&] {
          kvlab::PartialCacheDecoder<double> d(deep, 4, {1, 1});
        },
        names("uncached_layers[1]", "in [2, 3) (ascending layers of the stack)", "1"));
    refuses<InvalidArgument>(
        partial, input::kEmpty, no_state,
        [&] { kvlab::PartialCacheDecoder<double> d(nullptr, 4, {0}); },
        names("stack", "a non-null stack", "nullptr"));
  }
  kvlab::CachedDecoder<double> decoder(stack, 4);
  decoder.prefill(RowMatrix<double>::Ones(2, 8));
  const auto decoder_state = [&] { return decoder.position(); };
  refuses<InvalidArgument>(
      "kvlab::Decoder::decode(const RowVector< T > &x)", input::kShape, decoder_state,
      [&] { (void)decoder.decode(kvlab::RowVector<double>::Ones(7)); },
      names("x.cols()", "8 (d_model)", "7"));
  refuses<kvlab::CapacityError>(
      "kvlab::Decoder::prefill(const RowMatrix< T > &x)", input::kOverflow, decoder_state,
      [&] { (void)decoder.prefill(RowMatrix<double>::Ones(3, 8)); },
      names("new tokens of sequence 0", "at most 2 (capacity 4, length 2)", "3"));
  refuses<InvalidArgument>(
      "kvlab::Decoder::rewind(int position)", input::kRange, decoder_state,
      [&] { decoder.rewind(3); }, names("position", "in [0, 2]", "3"));
}

TEST_CASE("RoPE, the loaders and the sampling functions refuse bad input") {
  const char* rope =
      "kvlab::RotaryEmbedding::RotaryEmbedding(int head_dim, int max_positions, float "
      "base=10000.0f)";
  refuses<InvalidArgument>(
      rope, input::kShape, no_state, [] { kvlab::RotaryEmbedding r(3, 8); },
      names("head_dim", "an even number", "3"));
  refuses<InvalidArgument>(
      rope, input::kSize, no_state, [] { kvlab::RotaryEmbedding r(4, 0); },
      names("max_positions", ">= 1", "0"));
  refuses<InvalidArgument>(
      rope, input::kValue, no_state, [] { kvlab::RotaryEmbedding r(4, 8, 1.0f); },
      names("base", "a finite number > 1", "1"));
  const kvlab::RotaryEmbedding r(4, 8);
  RowMatrix<float> x = RowMatrix<float>::Ones(2, 8);
  const auto x_state = [&] { return std::vector<float>(x.data(), x.data() + x.size()); };
  refuses<InvalidArgument>(
      "kvlab::RotaryEmbedding::apply(Eigen::Ref< RowMatrix< float > > x, int first_position) const",
      input::kRange, x_state, [&] { r.apply(x, 7); },
      names("first_position", "positions within [0, 8)", "7 + 2 rows"));
  RowMatrix<double> xd = RowMatrix<double>::Ones(2, 6);
  const auto xd_state = [&] { return std::vector<double>(xd.data(), xd.data() + xd.size()); };
  refuses<InvalidArgument>(
      "kvlab::RotaryEmbedding::apply(Eigen::Ref< RowMatrix< double > > x, int first_position) "
      "const",
      input::kShape, xd_state, [&] { r.apply(xd, 0); },
      names("x.cols()", "a multiple of head_dim (4)", "6"));

  refuses<InvalidArgument>(
      "kvlab::load_llama_checkpoint(const std::string &path)", input::kEmpty, no_state,
      [] { (void)kvlab::load_llama_checkpoint("/nonexistent/model.bin"); },
      names("/nonexistent/model.bin", "an existing, readable llama2.c checkpoint",
            "a path that cannot be opened"));
  refuses<InvalidArgument>(
      "kvlab::read_llama_config(const std::string &path)", input::kEmpty, no_state,
      [] { (void)kvlab::read_llama_config(""); },
      names("path", "the name of a llama2.c checkpoint", "''"));
  refuses<InvalidArgument>(
      "kvlab::Tokenizer::load(const std::string &path)", input::kEmpty, no_state,
      [] { (void)kvlab::Tokenizer::load(""); },
      names("path", "the name of a tokenizer.bin file", "''"));

  const float probs[3] = {0.2f, 0.3f, 0.5f};
  refuses<InvalidArgument>(
      "kvlab::sample_argmax(const float *values, int n)", input::kSize, no_state,
      [&] { (void)kvlab::sample_argmax(probs, 0); }, names("n", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::sample_mult(const float *probs, int n, float coin)", input::kSize, no_state,
      [&] { (void)kvlab::sample_mult(probs, -1, 0.5f); }, names("n", ">= 1", "-1"));
  std::vector<kvlab::ProbIndex> scratch;
  // n from a volatile: with a constant 0, GCC follows the inlined call past its check and warns
  // about the read of element -1 that the check prevents (-Warray-bounds).
  volatile int zero = 0;
  refuses<InvalidArgument>(
      "kvlab::sample_topp(const float *probs, int n, float top_p, float coin, std::vector< "
      "ProbIndex > &scratch)",
      input::kSize, no_state, [&] { (void)kvlab::sample_topp(probs, zero, 0.9f, 0.5f, scratch); },
      names("n", ">= 1", "0"));
}

TEST_CASE("The model's layers, weights, batch, generation and paged decoder refuse bad input") {
  const kvlab::AttentionShape shape(2, 1, 4);
  refuses<InvalidArgument>(
      "kvlab::AttentionLayer::AttentionLayer(const AttentionShape &shape, int d_model, RowMatrix< "
      "T > wq, RowMatrix< T > wk, RowMatrix< T > wv, RowMatrix< T > wo)",
      input::kShape, no_state,
      [&] {
        kvlab::AttentionLayer<double> l(
            shape, 8, RowMatrix<double>::Zero(8, 7), RowMatrix<double>::Zero(8, 4),
            RowMatrix<double>::Zero(8, 4), RowMatrix<double>::Zero(8, 8));
      },
      names("wq shape", "[8, 8]", "[8, 7]"));
  kvlab::Rng rng(1);
  refuses<InvalidArgument>(
      "kvlab::AttentionLayer::random(const AttentionShape &shape, int d_model, Rng &rng)",
      input::kSize, no_state, [&] { (void)kvlab::AttentionLayer<double>::random(shape, 0, rng); },
      names("d_model", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::AttentionStack::AttentionStack(std::vector< AttentionLayer< T > > layers)",
      input::kEmpty, no_state,
      [] { kvlab::AttentionStack<double> s(std::vector<kvlab::AttentionLayer<double>>{}); },
      names("layers.size()", ">= 1", "0"));
  const auto stack = kvlab::AttentionStack<double>::random(1, shape, 8, 1);
  refuses<InvalidArgument>(
      "kvlab::AttentionStack::layer(int l) const", input::kRange, no_state,
      [&] { (void)stack->layer(5); }, names("l", "in [0, 1)", "5"));
  refuses<InvalidArgument>(
      "kvlab::AttentionStack::random(int num_layers, const AttentionShape &shape, int d_model, "
      "std::uint64_t seed)",
      input::kSize, no_state, [&] { (void)kvlab::AttentionStack<double>::random(0, shape, 8, 1); },
      names("num_layers", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::LlamaWeights::zeros(const LlamaConfig &config)", input::kSize, no_state,
      [] { (void)kvlab::LlamaWeights::zeros(kvlab::LlamaConfig::tiny().with_dim(0)); },
      names("dim", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::LlamaWeights::random(const LlamaConfig &config, std::uint64_t seed)", input::kShape,
      no_state,
      [] { (void)kvlab::LlamaWeights::random(kvlab::LlamaConfig::tiny().with_heads(6, 4), 1); },
      names("n_heads", "a multiple of n_kv_heads (4)", "6"));
  refuses<InvalidArgument>(
      "kvlab::LlamaWeights::builtin(const LlamaConfig &config=LlamaConfig::tiny())", input::kSize,
      no_state,
      [] { (void)kvlab::LlamaWeights::builtin(kvlab::LlamaConfig::tiny().with_vocab_size(0)); },
      names("vocab_size", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::LlamaWeights::check(const char *where=\"kvlab::LlamaWeights::check\") const",
      input::kShape, no_state,
      [] {
        kvlab::LlamaWeights w = kvlab::LlamaWeights::builtin();
        w.token_embedding.resize(3, 3);
        w.check();
      },
      names("token_embedding shape", "[256, 48]", "[3, 3]"));
  refuses<InvalidArgument>(
      "kvlab::LlamaConfig::validate(const char *where, const std::string &prefix=\"\") const",
      input::kSize, no_state, [] { kvlab::LlamaConfig::tiny().with_layers(0).validate("here"); },
      names("n_layers", ">= 1", "0"));
  refuses<InvalidArgument>(
      "kvlab::LlamaConfig::num_parameters(const char "
      "*where=\"kvlab::LlamaConfig::num_parameters\", const std::string &prefix=\"\") const",
      input::kOverflow, no_state,
      [] {
        (void)kvlab::LlamaConfig::tiny()
            .with_dim(1 << 30)
            .with_hidden_dim(1 << 30)
            .with_vocab_size(1 << 30)
            .num_parameters();
      },
      names("n_layers", "at most 1 (so that the size fits in std::int64_t)", "3"));
  refuses<InvalidArgument>(
      "kvlab::make_llama_store(LlamaBackend backend, const LlamaConfig &config, int max_tokens, "
      "int block_size=16, int sequences=1, KVDtype dtype=KVDtype::fp32, int window=0, int "
      "sinks=0)",
      input::kSize, no_state,
      [] {
        (void)kvlab::make_llama_store(kvlab::LlamaBackend::Paged, kvlab::LlamaConfig::tiny(), 16,
                                      0);
      },
      names("block_size", ">= 1", "0"));

  const auto weights = std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin());
  const char* store_ctor =
      "kvlab::LlamaModel::LlamaModel(std::shared_ptr< const LlamaWeights > weights, "
      "std::shared_ptr< KVStore< float > > store, int max_tokens=0)";
  refuses<InvalidArgument>(
      store_ctor, input::kEmpty, no_state,
      [&] { kvlab::LlamaModel m(weights, std::shared_ptr<kvlab::KVStore<float>>()); },
      names("store", "a non-null store", "nullptr"));
  refuses<InvalidArgument>(
      store_ctor, input::kShape, no_state,
      [&] {
        kvlab::LlamaModel m(weights, std::make_shared<kvlab::ContiguousStore<float>>(1, 1, 8, 16));
      },
      names("store->num_layers()", "3 (n_layers)", "1"));
  refuses<InvalidArgument>(
      store_ctor, input::kValue, no_state,
      [&] { kvlab::LlamaModel m(weights, std::make_shared<ForeignStore>(3, 2, 8)); },
      names("store", "a RecomputeStore, ContiguousStore, PagedStore or SelectiveStore", "foreign"));
  const char* policy_ctor =
      "kvlab::LlamaModel::LlamaModel(std::shared_ptr< const LlamaWeights > weights, const "
      "CachePolicy &policy, int max_tokens=0)";
  const kvlab::CachePolicy sinks = kvlab::parse_cache_policy("cached,window=8,sinks=2");
  refuses<InvalidArgument>(
      policy_ctor, input::kValue, no_state, [&] { kvlab::LlamaModel m(weights, sinks, 513); },
      names("max_tokens", "in [0, seq_len (512)]", "513"));
  refuses<InvalidArgument>(
      policy_ctor, input::kValue, no_state,
      [&] {
        kvlab::LlamaModel m(weights, kvlab::parse_cache_policy("cached,window=8,full_layers=3"));
      },
      names("policy.full_layers", "layers in [0, 3) (the model's)", "3"));
  refuses<InvalidArgument>(
      "kvlab::llama_backend_of(const KVStore< float > &store)", input::kValue, no_state,
      [] { (void)kvlab::llama_backend_of(ForeignStore(3, 2, 8)); },
      names("store", "a RecomputeStore, ContiguousStore, PagedStore or SelectiveStore", "foreign"));
  auto store = std::make_shared<kvlab::PagedStore<float>>(3, 2, 8, 4, 16);
  kvlab::LlamaModel batched(weights, store);
  const int s = store->add_sequence();
  const auto store_state = [&] { return state_of(*store->paged_pool()); };
  const char* batch =
      "kvlab::LlamaModel::forward_batch(const std::vector< SequenceChunk > &batch, bool "
      "every_token=false)";
  refuses<InvalidArgument>(
      batch, input::kEmpty, store_state, [&] { (void)batched.forward_batch({}); },
      names("batch.size()", ">= 1", "0"));
  refuses<InvalidArgument>(
      batch, input::kRange, store_state,
      [&] {
        (void)batched.forward_batch({kvlab::SequenceChunk{s + 5, {1}}});
      },
      names("batch[0].seq", "a live sequence of the store", std::to_string(s + 5)));
  refuses<InvalidArgument>(
      batch, input::kRange, store_state,
      [&] {
        (void)batched.forward_batch({kvlab::SequenceChunk{s, {999}}});
      },
      names("batch[0].tokens[0]", "an id in [0, 256)", "999"));
  kvlab::LlamaModel model(weights, kvlab::LlamaBackend::Cached, 16, 16);
  kvlab::Sampler sampler(256, 0.0f, 1.0f, 1);
  const auto model_state = [&] { return model.tokens(); };
  const char* generate =
      "kvlab::generate(LlamaModel &model, Sampler &sampler, const std::vector< int > &prompt, int "
      "steps, const std::function< void(int)> &on_token=nullptr, int stop_token=-1)";
  refuses<InvalidArgument>(
      generate, input::kEmpty, model_state, [&] { (void)kvlab::generate(model, sampler, {}, 4); },
      names("prompt.size()", ">= 1", "0"));
  refuses<InvalidArgument>(
      generate, input::kSize, model_state, [&] { (void)kvlab::generate(model, sampler, {1}, -1); },
      names("steps", ">= 1", "-1"));
  refuses<InvalidArgument>(
      generate, input::kRange, model_state,
      [&] { (void)kvlab::generate(model, sampler, {1}, 2, nullptr, 999); },
      names("stop_token", "-1 (none) or an id in [0, 256)", "999"));
  const char* paged_decoder =
      "kvlab::PagedDecoder::PagedDecoder(std::shared_ptr< const AttentionStack< T > > stack, "
      "std::shared_ptr< PagedKVCache< T, S > > pool)";
  refuses<InvalidArgument>(
      paged_decoder, input::kEmpty, no_state,
      [&] { kvlab::PagedDecoder<double> d(stack, std::shared_ptr<kvlab::PagedKVCache<double>>()); },
      names("pool", "a non-null pool", "nullptr"));
  refuses<InvalidArgument>(
      paged_decoder, input::kShape, no_state,
      [&] {
        kvlab::PagedDecoder<double> d(stack,
                                      std::make_shared<kvlab::PagedKVCache<double>>(2, 1, 4, 4, 8));
      },
      names("pool->num_layers()", "1 (stack's num_layers)", "2"));
}

TEST_CASE("The model's layer projections, run_stack, steps and size functions refuse bad input") {
  // A layer of 1 head of 2 values over d_model 4, and a contiguous store with one step open:
  // one sequence adding 2 tokens.
  const kvlab::AttentionShape shape(1, 1, 2);
  const auto stack = kvlab::AttentionStack<double>::random(1, shape, 4, 1);
  const kvlab::AttentionLayer<double>& layer = stack->layer(0);
  const RowMatrix<double> x = RowMatrix<double>::Ones(2, 4);
  const RowMatrix<double> narrow = RowMatrix<double>::Ones(2, 3);
  RowMatrix<double> k = RowMatrix<double>::Constant(1, 2, 5.0), v = k;
  const auto kv_state = [&] { return std::vector<double>{k(0, 0), v(0, 0), double(k.rows())}; };
  refuses<InvalidArgument>(
      "kvlab::AttentionLayer::project_q(const RowMatrix< T > &x, CostCounters "
      "*counters=nullptr) const",
      input::kShape, no_state, [&] { (void)layer.project_q(narrow); },
      names("x.cols()", "4 (d_model)", "3"));
  const char* project_kv =
      "kvlab::AttentionLayer::project_kv(const RowMatrix< T > &x, RowMatrix< T > &k, RowMatrix< T "
      "> &v, CostCounters *counters=nullptr) const";
  refuses<InvalidArgument>(
      project_kv, input::kShape, kv_state, [&] { layer.project_kv(narrow, k, v); },
      names("x.cols()", "4 (d_model)", "3"));
  refuses<InvalidArgument>(
      project_kv, input::kState, kv_state, [&] { layer.project_kv(x, k, k); },
      names("k, v", "two matrices distinct from x and each other", "an alias"));
  refuses<InvalidArgument>(
      "kvlab::AttentionLayer::project_out(const RowMatrix< T > &attn, CostCounters "
      "*counters=nullptr) const",
      input::kShape, no_state, [&] { (void)layer.project_out(narrow); },
      names("attn.cols()", "2 (num_heads * head_dim)", "3"));
  refuses<InvalidArgument>(
      "kvlab::Decoder::Decoder(std::shared_ptr< const AttentionStack< T > > stack)", input::kEmpty,
      no_state, [] { kvlab::CachedDecoder<double> d(nullptr, 8); },
      names("stack", "a non-null stack", "nullptr"));

  // run_stack: a store of the wrong depth, inputs of the wrong width.
  const char* run_stack =
      "kvlab::run_stack(const AttentionStack< T > &stack, KVStore< T > &store, const std::vector< "
      "int > &seqs, const std::vector< std::int32_t > &x_indptr, const RowMatrix< T > &x, "
      "CostCounters *counters=nullptr, const char *caller=\"kvlab::run_stack\")";
  kvlab::ContiguousStore<double> deep(2, 1, 2, 8);
  const int deep_seq = deep.add_sequence();
  refuses<InvalidArgument>(
      run_stack, input::kShape, [&] { return deep.length(deep_seq); },
      [&] {
        (void)kvlab::run_stack(*stack, deep, {deep_seq}, {0, 2}, x);
      },
      names("store.num_layers()", "1 (the stack's num_layers)", "2"));
  kvlab::ContiguousStore<double> store(1, 1, 2, 8);
  const int seq = store.add_sequence();
  refuses<InvalidArgument>(
      run_stack, input::kShape, [&] { return store.length(seq); },
      [&] {
        (void)kvlab::run_stack(*stack, store, {seq}, {0, 2}, narrow);
      },
      names("x.cols()", "4 (d_model)", "3"));

  // attention_step with a step open, and new_token_rows.
  RowMatrix<double> inputs;
  const kvlab::StepBatch& batch = store.begin_step({seq}, {0, 2}, x, inputs, nullptr);
  RowMatrix<double> out = RowMatrix<double>::Constant(1, 4, 7.0);
  const auto out_state = [&] {
    std::vector<double> s(out.data(), out.data() + out.size());
    s.push_back(store.length(seq));
    return s;
  };
  kvlab::StepScratch<double> scratch;
  kvlab::CostCounters counters;
  refuses<InvalidArgument>(
      "kvlab::attention_step(const AttentionShape &shape, const AttentionWeights< T > &w, const "
      "RotaryEmbedding *rope, KVStore< T > &store, int layer, bool top, const RowMatrix< T > &xb, "
      "RowMatrix< T > &out, StepScratch< T > &scratch, CostCounters &counters, PhaseTimes "
      "*times=nullptr)",
      input::kShape, out_state,
      [&] {
        kvlab::attention_step(shape, layer.weights(), nullptr, store, 0, true,
                              RowMatrix<double>(RowMatrix<double>::Ones(3, 4)), out, scratch,
                              counters);
      },
      names("xb.rows()", "2 (the step's rows)", "3"));
  const char* new_token_rows =
      "kvlab::new_token_rows(const StepBatch &batch, const RowMatrix< T > &x, RowMatrix< T > &out)";
  refuses<InvalidArgument>(
      new_token_rows, input::kShape, out_state,
      [&] { kvlab::new_token_rows(batch, RowMatrix<double>(RowMatrix<double>::Ones(3, 4)), out); },
      names("x.rows()", "2 (batch.rows())", "3"));
  RowMatrix<double> rows = RowMatrix<double>::Ones(2, 4);
  refuses<InvalidArgument>(
      new_token_rows, input::kState, [&] { return rows.rows(); },
      [&] { kvlab::new_token_rows(batch, rows, rows); },
      names("out", "a matrix other than x", "x"));
  const char* add_residual =
      "kvlab::add_residual(const StepBatch &batch, RowMatrix< T > &x, const RowMatrix< T > &out)";
  const auto rows_state = [&] {
    return std::vector<double>(rows.data(), rows.data() + rows.size());
  };
  refuses<InvalidArgument>(
      add_residual, input::kShape, rows_state,
      [&] { kvlab::add_residual(batch, rows, RowMatrix<double>(RowMatrix<double>::Ones(3, 4))); },
      names("out.rows()", "2 (x.rows() or the step's new rows)", "3"));
  refuses<InvalidArgument>(
      add_residual, input::kShape, rows_state,
      [&] { kvlab::add_residual(batch, rows, RowMatrix<double>(RowMatrix<double>::Ones(2, 3))); },
      names("out.cols()", "4 (x.cols())", "3"));
  store.abort_step();

  // The model's size functions and its size calculator's terms.
  const kvlab::LlamaConfig huge =
      kvlab::LlamaConfig::tiny().with_dim(1 << 30).with_hidden_dim(1 << 30).with_vocab_size(1
                                                                                            << 30);
  refuses<InvalidArgument>(
      "kvlab::LlamaConfig::num_weights(const char *where=\"kvlab::LlamaConfig::num_weights\", "
      "const std::string &prefix=\"\") const",
      input::kOverflow, no_state, [&] { (void)huge.num_weights(); },
      names("n_layers", "at most 1 (so that the size fits in std::int64_t)", "3"));
  // 2^61 and more weights fit in std::int64_t, their 4-byte floats do not.
  const kvlab::LlamaConfig wide = kvlab::LlamaConfig::tiny()
                                      .with_layers(1)
                                      .with_dim(1 << 30)
                                      .with_hidden_dim(1)
                                      .with_vocab_size(1);
  const std::uint64_t floats = wide.num_weights();
  refuses<InvalidArgument>(
      "kvlab::LlamaConfig::checkpoint_bytes(const char "
      "*where=\"kvlab::LlamaConfig::checkpoint_bytes\", const std::string &prefix=\"\") const",
      input::kOverflow, no_state, [&] { (void)wide.checkpoint_bytes(); },
      names("weight count", "at most 2305843009213693951 (so that the size fits in std::int64_t)",
            std::to_string(floats)));
  refuses<InvalidArgument>(
      "kvlab::to_model_config(const LlamaConfig &config, const std::string &name=\"llama\")",
      input::kShape, no_state,
      [] { (void)kvlab::to_model_config(kvlab::LlamaConfig::tiny().with_heads(6, 4)); },
      names("n_heads", "a multiple of n_kv_heads (4)", "6"));
}

TEST_CASE("Refusals that no case had reached: a store's backend and dtype, the weights' layers") {
  // Found by scripts/coverage.sh: each check below was written, and no test had ever taken it.
  const char* store =
      "kvlab::make_llama_store(LlamaBackend backend, const LlamaConfig &config, int max_tokens, "
      "int block_size=16, int sequences=1, KVDtype dtype=KVDtype::fp32, int window=0, int "
      "sinks=0)";
  const kvlab::LlamaConfig tiny = kvlab::LlamaConfig::tiny();
  refuses<InvalidArgument>(
      store, input::kValue, no_state,
      [&] {
        (void)kvlab::make_llama_store(kvlab::LlamaBackend::Naive, tiny, 16, 16, 1,
                                      kvlab::KVDtype::fp16);
      },
      names("dtype", "fp32 for the naive backend (it keeps no K/V to store)", "fp16"));
  refuses<InvalidArgument>(
      store, input::kValue, no_state,
      [&] {
        (void)kvlab::make_llama_store(kvlab::LlamaBackend::Naive, tiny, 16, 16, 1,
                                      kvlab::KVDtype::fp32, 8, 2);
      },
      names("sinks", "0 for the naive backend (its store applies a window only)", "2"));
  refuses<InvalidArgument>(
      store, input::kRange, no_state,
      [&] {
        (void)kvlab::make_llama_store(kvlab::LlamaBackend::Cached, tiny, 16, 16, 1,
                                      kvlab::KVDtype::fp32, 4, 4);
      },
      names("sinks", "below the window (4)", "4"));
  refuses<InvalidArgument>(
      store, input::kOverflow, no_state,
      [&] {
        (void)kvlab::make_llama_store(kvlab::LlamaBackend::Paged, tiny, 16, 1, INT_MAX / 16 + 1);
      },
      names("sequences", "at most " + std::to_string(INT_MAX / 16) + " (blocks fit in an int)",
            std::to_string(INT_MAX / 16 + 1)));
  refuses<InvalidArgument>(
      store, input::kRange, no_state,
      [&] { (void)kvlab::make_llama_store(static_cast<kvlab::LlamaBackend>(7), tiny, 16); },
      names("backend", "naive, cached or paged", "7"));

  refuses<InvalidArgument>(
      "kvlab::LlamaWeights::check(const char *where=\"kvlab::LlamaWeights::check\") const",
      input::kShape, no_state,
      [] {
        kvlab::LlamaWeights w = kvlab::LlamaWeights::builtin();
        w.layers.pop_back();
        w.check();
      },
      names("layers.size()", std::to_string(kvlab::LlamaConfig::tiny().n_layers),
            std::to_string(kvlab::LlamaConfig::tiny().n_layers - 1)));
}

TEST_CASE("Cache policies: their text and their stores") {
  const char* parse = "kvlab::parse_cache_policy(const std::string &spec)";
  const auto policy = [](const std::string& spec) {
    return [spec] { (void)kvlab::parse_cache_policy(spec); };
  };
  refuses<InvalidArgument>(
      parse, input::kValue, no_state, policy("fast,kv=int8"),
      names("spec", "cached or paged, or a key=value item (in 'fast,kv=int8')", "'fast'"));
  refuses<InvalidArgument>(
      parse, input::kValue, no_state, policy("cached,paged"),
      names("spec",
            "key=value items: kv, k, v, window, sinks, h2o, full_layers, full_heads, block (in "
            "'cached,paged')",
            "'paged'"));
  refuses<InvalidArgument>(
      parse, input::kValue, no_state, policy("cached,streams=4"),
      names("spec",
            "a key of kv, k, v, window, sinks, h2o, full_layers, full_heads, block (in "
            "'cached,streams=4')",
            "'streams'"));
  refuses<InvalidArgument>(
      parse, input::kState, no_state, policy("kv=int8,v=int4"),
      names("spec", "'kv=' or 'k=' and 'v=', not both (in 'kv=int8,v=int4')", "'kv=' and 'v='"));
  refuses<InvalidArgument>(
      parse, input::kValue, no_state, policy("k=fp8"),
      names("spec", "'k=' one of fp32, fp16, bf16, int8, int4 (in 'k=fp8')", "'fp8'"));
  refuses<InvalidArgument>(
      parse, input::kState, no_state, policy("cached,sinks=4"),
      names("spec", "a window with 'sinks=' (without one every token is kept; in 'cached,sinks=4')",
            "no window"));
  refuses<InvalidArgument>(
      parse, input::kValue, no_state, policy("window=4,sinks=4"),
      names("spec", "'sinks=' below the window (4; in 'window=4,sinks=4')", "4"));
  refuses<InvalidArgument>(
      parse, input::kValue, no_state, policy("window=4,h2o=-1"),
      names("spec", "'h2o=' an integer in [0, 2147483647] (in 'window=4,h2o=-1')", "'-1'"));
  refuses<InvalidArgument>(
      parse, input::kValue, no_state, policy("window=4,full_layers=1+1"),
      names("spec", "each layer once in 'full_layers=' (in 'window=4,full_layers=1+1')",
            "layer 1 twice"));
  refuses<InvalidArgument>(
      parse, input::kValue, no_state, policy("window=4,full_heads=1"),
      names("spec", "'full_heads=' items layer.kv_head joined by '+' (in 'window=4,full_heads=1')",
            "'1'"));
  refuses<InvalidArgument>(
      parse, input::kValue, no_state, policy("window=4,full_heads=1.0+1.0"),
      names("spec", "each head once in 'full_heads=' (in 'window=4,full_heads=1.0+1.0')",
            "head 1.0 twice"));
  refuses<InvalidArgument>(
      parse, input::kEmpty, no_state, policy("window=4,full_layers="),
      names("spec", "'full_layers=' an integer in [0, 2147483647] (in 'window=4,full_layers=')",
            "''"));
  refuses<InvalidArgument>(
      parse, input::kState, no_state, policy("paged,window=8,h2o=4"),
      names("spec",
            "one type for K and V and no h2o, full_layers or full_heads with the paged store (its "
            "pool stores one type, and a sequence's block table serves every layer and head: a "
            "block is freed for all of them at once; in 'paged,window=8,h2o=4')",
            "'paged,window=8,h2o=4'"));
  refuses<InvalidArgument>(
      parse, input::kValue, no_state, policy("window=4,window=8"),
      names("spec", "each key at most once (in 'window=4,window=8')", "'window' twice"));
  refuses<InvalidArgument>(
      parse, input::kValue, no_state, policy("kv=int3"),
      names("spec", "'kv=' one of fp32, fp16, bf16, int8, int4 (in 'kv=int3')", "'int3'"));
  refuses<InvalidArgument>(
      parse, input::kValue, no_state, policy("window=-1"),
      names("spec", "'window=' an integer in [0, 2147483647] (in 'window=-1')", "'-1'"));
  refuses<InvalidArgument>(
      parse, input::kOverflow, no_state, policy("window=2147483648"),
      names("spec", "'window=' an integer in [0, 2147483647] (in 'window=2147483648')",
            "'2147483648'"));
  refuses<InvalidArgument>(
      parse, input::kSize, no_state, policy("paged,block=0"),
      names("spec", "'block=' an integer in [1, 2147483647] (in 'paged,block=0')", "'0'"));
  refuses<InvalidArgument>(
      parse, input::kState, no_state, policy("block=8"),
      names("spec", "'block=' with the paged store only (in 'block=8')", "a contiguous store"));

  const char* make =
      "kvlab::make_policy_store(const CachePolicy &policy, const LlamaConfig &config, int "
      "max_tokens, int max_step, int sequences=1)";
  const kvlab::LlamaConfig tiny = kvlab::LlamaConfig::tiny();
  const kvlab::CachePolicy cached;
  refuses<InvalidArgument>(
      make, input::kSize, no_state, [&] { (void)kvlab::make_policy_store(cached, tiny, 0, 1); },
      names("max_tokens", ">= 1", "0"));
  refuses<InvalidArgument>(
      make, input::kSize, no_state, [&] { (void)kvlab::make_policy_store(cached, tiny, 8, 0); },
      names("max_step", ">= 1", "0"));
  refuses<InvalidArgument>(
      make, input::kSize, no_state, [&] { (void)kvlab::make_policy_store(cached, tiny, 8, 1, 0); },
      names("sequences", ">= 1", "0"));
  kvlab::CachePolicy naive;
  naive.backend = kvlab::LlamaBackend::Naive;
  refuses<InvalidArgument>(
      make, input::kValue, no_state, [&] { (void)kvlab::make_policy_store(naive, tiny, 8, 1); },
      names("policy.backend", "cached or paged (a policy keeps K and V)", "naive"));
  kvlab::CachePolicy negative;
  negative.window = -2;
  refuses<InvalidArgument>(
      make, input::kValue, no_state, [&] { (void)kvlab::make_policy_store(negative, tiny, 8, 1); },
      names("policy.window", ">= 0", "-2"));
  kvlab::CachePolicy int8;
  int8.key_dtype = int8.value_dtype = kvlab::KVDtype::int8;
  refuses<InvalidArgument>(
      make, input::kShape, no_state, [&] { (void)kvlab::make_policy_store(int8, tiny, 8, 1); },
      names("head_dim", "a multiple of 32 (the values of one int8 block)", "8"));
  // tiny: 3 layers of 2 K/V heads
  const kvlab::CachePolicy layer3 = kvlab::parse_cache_policy("window=4,full_layers=3");
  refuses<InvalidArgument>(
      make, input::kValue, no_state, [&] { (void)kvlab::make_policy_store(layer3, tiny, 8, 1); },
      names("policy.full_layers", "layers in [0, 3) (the model's)", "3"));
  const kvlab::CachePolicy head2 = kvlab::parse_cache_policy("window=4,full_heads=0.0+1.2");
  refuses<InvalidArgument>(
      make, input::kValue, no_state, [&] { (void)kvlab::make_policy_store(head2, tiny, 8, 1); },
      names("policy.full_heads",
            "heads layer.kv_head with layer in [0, 3) and kv_head in [0, 2) (the model's)", "1.2"));
  kvlab::CachePolicy paged_h2o = kvlab::parse_cache_policy("window=4,h2o=2");
  paged_h2o.backend = kvlab::LlamaBackend::Paged;  // past the parser's check
  refuses<InvalidArgument>(
      make, input::kState, no_state, [&] { (void)kvlab::make_policy_store(paged_h2o, tiny, 8, 1); },
      names("policy", "a uniform policy with the paged store (`parse_cache_policy`)",
            "paged,window=4,h2o=2"));
}

TEST_CASE("GGUF files, the model read from one, and the tokenizers behind TextTokenizer") {
  // A small GGUF file of every tensor type the reader needs here, written by the tests' writer.
  kvlab_test::GgufWriter w;
  w.str("s", "text");
  w.u32("n", 7);
  w.strings("list", {"a"});
  w.tensor("t", {2}, 0, std::string(8, '\0'));
  const std::string path = "kvlab_bad_input.gguf";
  kvlab_test::write_bytes(path, w.bytes());
  const kvlab::GgufFile g(path);
  const char* ctor = "kvlab::GgufFile::GgufFile(const std::string &path)";
  refuses<InvalidArgument>(
      ctor, input::kEmpty, no_state, [] { kvlab::GgufFile f(""); },
      names("path", "the name of a GGUF file", "''"));
  refuses<InvalidArgument>(
      ctor, input::kValue, no_state, [] { kvlab::GgufFile f("/nonexistent/model.gguf"); },
      names("/nonexistent/model.gguf", "an existing, readable GGUF file",
            "a path that cannot be opened"));
  refuses<InvalidArgument>(
      "kvlab::GgufFile::at(const std::string &key) const", input::kRange, no_state,
      [&] { (void)g.at("nope"); }, names(path + ": key 'nope'", "present", "missing"));
  refuses<InvalidArgument>(
      "kvlab::GgufFile::get_int(const std::string &key) const", input::kValue, no_state,
      [&] { (void)g.get_int("s"); }, names(path + ": key 's'", "an integer", "a string"));
  refuses<InvalidArgument>(
      "kvlab::GgufFile::get_float(const std::string &key) const", input::kValue, no_state,
      [&] { (void)g.get_float("n"); },
      names(path + ": key 'n'", "a float32 or float64", "a uint32"));
  refuses<InvalidArgument>(
      "kvlab::GgufFile::get_string(const std::string &key) const", input::kValue, no_state,
      [&] { (void)g.get_string("n"); }, names(path + ": key 'n'", "a string", "a uint32"));
  refuses<InvalidArgument>(
      "kvlab::GgufFile::get_strings(const std::string &key) const", input::kValue, no_state,
      [&] { (void)g.get_strings("s"); },
      names(path + ": key 's'", "an array of strings", "a string"));
  refuses<InvalidArgument>(
      "kvlab::GgufFile::get_ints(const std::string &key) const", input::kValue, no_state,
      [&] { (void)g.get_ints("list"); },
      names(path + ": key 'list'", "an array of integers", "an array of string"));
  refuses<InvalidArgument>(
      "kvlab::GgufFile::tensor(const std::string &name) const", input::kRange, no_state,
      [&] { (void)g.tensor("x"); }, names(path + ": tensor 'x'", "present", "missing"));
  refuses<InvalidArgument>(
      "kvlab::GgufFile::read_matrix(const std::string &name, const std::vector< std::uint64_t > "
      "&expected_dims={}) const",
      input::kShape, no_state, [&] { (void)g.read_matrix("t", {3}); },
      names(path + ": tensor 't': dims", "[3]", "[2]"));
  kvlab_test::GgufWriter nan;
  nan.tensor("t", {1}, 0, std::string("\x00\x00\xC0\x7F", 4));
  kvlab_test::write_bytes(path, nan.bytes());
  const kvlab::GgufFile gn(path);
  float value = 0;
  const auto value_state = [&] { return value; };
  refuses<InvalidArgument>(
      "kvlab::GgufFile::read_tensor(const GgufTensorInfo &info, float *out) const", input::kValue,
      value_state, [&] { gn.read_tensor(gn.tensor("t"), &value); },
      names(path + ": tensor 't'", "finite values", "nan at index 0"));
  const char* read_ggml =
      "kvlab::GgufFile::read_ggml_matrix(const std::string &name, const "
      "std::vector< std::uint64_t > &expected_dims={}) const";
  refuses<InvalidArgument>(
      read_ggml, input::kValue, no_state, [&] { (void)gn.read_ggml_matrix("t"); },
      names(path + ": tensor 't'", "finite values", "nan at index 0"));
  refuses<InvalidArgument>(
      read_ggml, input::kRange, no_state, [&] { (void)gn.read_ggml_matrix("x"); },
      names(path + ": tensor 'x'", "present", "missing"));
  refuses<InvalidArgument>(
      read_ggml, input::kShape, no_state, [&] { (void)g.read_ggml_matrix("t", {3}); },
      names(path + ": tensor 't': dims", "[3]", "[2]"));
  refuses<InvalidArgument>(
      "kvlab::llama_config_from_gguf(const GgufFile &file)", input::kEmpty, no_state,
      [&] { (void)kvlab::llama_config_from_gguf(gn); },
      names(path + ": key 'general.architecture'", "present", "missing"));
  refuses<InvalidArgument>(
      "kvlab::load_gguf_weights(const GgufFile &file)", input::kEmpty, no_state,
      [&] { (void)kvlab::load_gguf_weights(gn); },
      names(path + ": key 'general.architecture'", "present", "missing"));
  refuses<InvalidArgument>(
      "kvlab::load_gguf_weights(const std::string &path)", input::kEmpty, no_state,
      [] { (void)kvlab::load_gguf_weights(""); }, names("path", "the name of a GGUF file", "''"));
  refuses<InvalidArgument>(
      "kvlab::BpeTokenizer::from_gguf(const GgufFile &file)", input::kEmpty, no_state,
      [&] { (void)kvlab::BpeTokenizer::from_gguf(gn); },
      names(path + ": key 'tokenizer.ggml.model'", "present", "missing"));

  const unsigned char bytes[34] = {};
  float out[32] = {};
  const auto out_state = [&] { return std::vector<float>(out, out + 32); };
  refuses<InvalidArgument>(
      "kvlab::dequantize_row(GgmlType type, const unsigned char *data, std::int64_t n, float *out)",
      input::kShape, out_state,
      [&] { kvlab::dequantize_row(kvlab::GgmlType::Q8_0, bytes, 31, out); },
      names("n", "a multiple of 32 (a Q8_0 block)", "31"));
  refuses<InvalidArgument>(
      "kvlab::dequantize_row(GgmlType type, const unsigned char *data, std::int64_t n, float *out)",
      input::kSize, out_state, [&] { kvlab::dequantize_row(kvlab::GgmlType::F32, bytes, -1, out); },
      names("n", ">= 0", "-1"));
  // GgmlMatrix: a weight kept in its type, one row of two Q8_0 blocks (68 bytes).
  const char* ggml_ctor =
      "kvlab::GgmlMatrix::GgmlMatrix(GgmlType type, std::int64_t rows, "
      "std::int64_t cols, std::vector< unsigned char > bytes)";
  const std::vector<unsigned char> two_blocks(68);
  refuses<InvalidArgument>(
      ggml_ctor, input::kValue, no_state,
      [&] { kvlab::GgmlMatrix m(static_cast<kvlab::GgmlType>(12), 1, 64, two_blocks); },
      names("type", "F32, F16, BF16, Q8_0, Q4_0 or Q4_1", "Q4_K"));
  refuses<InvalidArgument>(
      ggml_ctor, input::kSize, no_state,
      [&] { kvlab::GgmlMatrix m(kvlab::GgmlType::Q8_0, -1, 64, two_blocks); },
      names("rows", ">= 0", "-1"));
  refuses<InvalidArgument>(
      ggml_ctor, input::kSize, no_state,
      [&] { kvlab::GgmlMatrix m(kvlab::GgmlType::Q8_0, 1, -32, two_blocks); },
      names("cols", ">= 0", "-32"));
  refuses<InvalidArgument>(
      ggml_ctor, input::kShape, no_state,
      [&] { kvlab::GgmlMatrix m(kvlab::GgmlType::Q8_0, 1, 48, two_blocks); },
      names("cols", "a multiple of 32 (a Q8_0 block)", "48"));
  refuses<InvalidArgument>(
      ggml_ctor, input::kShape, no_state,
      [&] { kvlab::GgmlMatrix m(kvlab::GgmlType::Q8_0, 2, 64, two_blocks); },
      names("bytes.size()", "136 (rows * 68 bytes of a row)", "68"));
  refuses<InvalidArgument>(
      ggml_ctor, input::kOverflow, no_state,
      [&] { kvlab::GgmlMatrix m(kvlab::GgmlType::Q8_0, std::int64_t{1} << 60, 64, two_blocks); },
      names("rows", "at most 135637824071393761 (so that the size fits in std::int64_t)",
            "1152921504606846976"));
  const kvlab::GgmlMatrix one_row(kvlab::GgmlType::Q8_0, 1, 64, two_blocks);
  refuses<InvalidArgument>(
      "kvlab::GgmlMatrix::row(std::int64_t r) const", input::kRange, no_state,
      [&] { (void)one_row.row(1); }, names("r", "in [0, 1) (rows)", "1"));
  float row_out[64] = {};
  const auto row_state = [&] { return std::vector<float>(row_out, row_out + 64); };
  refuses<InvalidArgument>(
      "kvlab::GgmlMatrix::decode_row(std::int64_t r, float *out) const", input::kRange, row_state,
      [&] { one_row.decode_row(-1, row_out); }, names("r", "in [0, 1) (rows)", "-1"));
  refuses<InvalidArgument>(
      "kvlab::ggml_row_bytes(GgmlType type, std::uint64_t n)", input::kShape, no_state,
      [] { (void)kvlab::ggml_row_bytes(kvlab::GgmlType::Q4_1, 33); },
      names("n", "a multiple of 32 (a Q4_1 block)", "33"));
  refuses<InvalidArgument>(
      "kvlab::ggml_block_bytes(GgmlType type)", input::kRange, no_state,
      [] { (void)kvlab::ggml_block_bytes(static_cast<kvlab::GgmlType>(12)); },
      names("type", "F32, F16, BF16, Q8_0, Q4_0 or Q4_1", "Q4_K"));

  // A byte-level vocabulary: the 256 byte characters, then <|im_end|> (control).
  std::vector<std::string> tokens = kvlab_test::gpt2_byte_chars();
  tokens.push_back("<|im_end|>");
  std::vector<std::int64_t> types(257, 1);
  types[256] = 3;
  refuses<InvalidArgument>(
      "kvlab::BpeTokenizer::BpeTokenizer(std::vector< std::string > tokens, const std::vector< "
      "std::int64_t > &types, const std::vector< std::string > &merges, const std::string &pre, "
      "int bos, int eos)",
      input::kValue, no_state,
      [&] { kvlab::BpeTokenizer t(tokens, types, {"a zz"}, "smollm", -1, 256); },
      names("merges[0]", "a known right token", "'zz'"));
  refuses<InvalidArgument>(
      "kvlab::BpeTokenizer::BpeTokenizer(std::vector< std::string > tokens, const std::vector< "
      "std::int64_t > &types, const std::vector< std::string > &merges, const std::string &pre, "
      "int bos, int eos)",
      input::kRange, no_state,
      [&] { kvlab::BpeTokenizer t(tokens, types, {}, "smollm", 257, 256); },
      names("bos", "-1 or an id in [0, 257)", "257"));
  const kvlab::BpeTokenizer bpe(tokens, types, {}, "smollm", -1, 256);
  refuses<InvalidArgument>(
      "kvlab::BpeTokenizer::token(int id) const", input::kRange, no_state,
      [&] { (void)bpe.token(257); }, names("id", "an id in [0, 257)", "257"));
  refuses<InvalidArgument>(
      "kvlab::BpeTokenizer::type(int id) const", input::kRange, no_state,
      [&] { (void)bpe.type(-1); }, names("id", "an id in [0, 257)", "-1"));
  refuses<InvalidArgument>(
      "kvlab::BpeTokenizer::token_bytes(int id, int=-1) const override", input::kRange, no_state,
      [&] { (void)bpe.token_bytes(300); }, names("id", "an id in [0, 257)", "300"));
  refuses<InvalidArgument>(
      "kvlab::BpeTokenizer::is_special(int id) const override", input::kRange, no_state,
      [&] { (void)bpe.is_special(257); }, names("id", "an id in [0, 257)", "257"));
  refuses<InvalidArgument>(
      "kvlab::TextTokenizer::decode(const std::vector< int > &ids) const", input::kRange, no_state,
      [&] {
        (void)bpe.decode({0, 999});
      },
      names("id", "an id in [0, 257)", "999"));
  std::vector<std::string> missing = tokens;
  missing[4] = "unused";  // byte 0x04 has no token
  const kvlab::BpeTokenizer holes(missing, types, {}, "smollm", -1, 256);
  refuses<InvalidArgument>(
      "kvlab::BpeTokenizer::encode_text(const std::string &text, bool parse_special) const "
      "override",
      input::kValue, no_state, [&] { (void)holes.encode_text("a\x04", true); },
      names("text", "bytes this vocabulary can encode",
            "byte 0x04 at offset 1, which has no token"));

  refuses<InvalidArgument>(
      "kvlab::BpeTokenizer::encode_parts(const std::vector< TextPart > &parts) const override",
      input::kValue, no_state,
      [&] {
        (void)holes.encode_parts({{"<|im_end|>", true}, {"\x04", false}});
      },
      names("text", "bytes this vocabulary can encode",
            "byte 0x04 at offset 10, which has no token"));

  // A chat over a random model whose vocabulary is the byte tokenizer's (257 ids).
  auto chat_weights = std::make_shared<const kvlab::LlamaWeights>(
      kvlab::LlamaWeights::random(kvlab::LlamaConfig::tiny().with_vocab_size(257), 5));
  auto small_weights = std::make_shared<const kvlab::LlamaWeights>(
      kvlab::LlamaWeights::random(kvlab::LlamaConfig::tiny(), 5));  // 256 ids
  kvlab::LlamaModel small_model(small_weights, kvlab::LlamaBackend::Cached, 16, 64);
  refuses<InvalidArgument>(
      "kvlab::ChatSession::ChatSession(LlamaModel &model, const TextTokenizer &tokenizer, "
      "ChatTemplate chat_template, Sampler sampler, std::string system)",
      input::kShape, no_state,
      [&] {
        kvlab::ChatSession c(small_model, bpe, kvlab::ChatTemplate(), kvlab::Sampler(257, 0, 1, 1),
                             "");
      },
      names("tokenizer.vocab_size()", "256 (the model's vocab_size)", "257"));
  kvlab::LlamaModel chat_model(chat_weights, kvlab::LlamaBackend::Cached, 16, 24);
  kvlab::ChatSession chat(chat_model, bpe, kvlab::ChatTemplate("sys"), kvlab::Sampler(257, 0, 1, 1),
                          "sys");
  const auto chat_state = [&] { return chat_model.tokens(); };
  const char* turn =
      "kvlab::ChatSession::turn(const std::string &user, int max_new_tokens, const std::function< "
      "void(const std::string &)> &on_text={})";
  refuses<InvalidArgument>(
      turn, input::kSize, chat_state, [&] { (void)chat.turn("hi", 0); },
      names("max_new_tokens", ">= 1", "0"));
  refuses<kvlab::CapacityError>(
      turn, input::kState, chat_state, [&] { (void)chat.turn("a long message, too long", 4); },
      names("the conversation",
            "room for this turn's 89 tokens and a reply in the context of 24 tokens",
            "0 tokens held (start a new conversation)"));
  kvlab_test::GgufWriter no_template;
  no_template.str("tokenizer.chat_template", "{{ messages }}");
  kvlab_test::write_bytes(path, no_template.bytes());
  const kvlab::GgufFile gt(path);
  refuses<InvalidArgument>(
      "kvlab::ChatTemplate::from_gguf(const GgufFile &file)", input::kValue, no_state,
      [&] { (void)kvlab::ChatTemplate::from_gguf(gt); },
      names(path + ": key 'tokenizer.chat_template'",
            "a ChatML template (<|im_start|> role, content, <|im_end|>)",
            "a template without those markers"));
  std::remove(path.c_str());

  refuses<InvalidArgument>(
      "kvlab::encode_utf8(char32_t c)", input::kRange, no_state,
      [&] { (void)kvlab::encode_utf8(0xD800); },
      names("c", "a Unicode scalar value (at most U+10FFFF, no surrogate)", "U+D800"));
  refuses<InvalidArgument>(
      "kvlab::encode_utf8(char32_t c)", input::kRange, no_state,
      [&] { (void)kvlab::encode_utf8(0x110000); },
      names("c", "a Unicode scalar value (at most U+10FFFF, no surrogate)", "U+110000"));
  CHECK(kvlab::encode_utf8(0x10FFFF) == "\xF4\x8F\xBF\xBF");  // the largest is encoded
  const kvlab::Tokenizer llama({"<unk>", "\n<s>\n", "\n</s>\n", "a"}, {0, 0, 0, 0});
  refuses<InvalidArgument>(
      "kvlab::Tokenizer::token_bytes(int id, int prev=-1) const override", input::kRange, no_state,
      [&] { (void)llama.token_bytes(4); }, names("token", "an id in [0, 4)", "4"));
  refuses<InvalidArgument>(
      "kvlab::Tokenizer::is_special(int id) const override", input::kRange, no_state,
      [&] { (void)llama.is_special(-1); }, names("id", "an id in [0, 4)", "-1"));
  refuses<InvalidArgument>(
      "kvlab::LlamaConfig::with_rope_theta(float value)", input::kValue, no_state,
      [] { kvlab::LlamaConfig::tiny().with_rope_theta(0.5f).validate("v"); },
      names("rope_theta", "a finite base > 1", "0.5"));
  refuses<InvalidArgument>(
      "kvlab::LlamaConfig::with_norm_eps(float value)", input::kValue, no_state,
      [] { kvlab::LlamaConfig::tiny().with_norm_eps(-1.f).validate("v"); },
      names("norm_eps", "a finite epsilon > 0", "-1"));
}
