// Every tensor of two LlamaWeights compared exactly (Catch2 checks, naming the layer): the round
// trips of the llama2.c and GGUF readers.
#pragma once

#include <catch2/catch.hpp>

#include <cstddef>

#include "kvlab/model/llama_weights.hpp"

namespace kvlab_test {

inline void check_equal(const kvlab::LlamaWeights& a, const kvlab::LlamaWeights& b) {
  REQUIRE(a.config == b.config);
  CHECK(a.token_embedding == b.token_embedding);
  REQUIRE(a.layers.size() == b.layers.size());
  for (std::size_t l = 0; l < a.layers.size(); ++l) {
    CAPTURE(l);
    CHECK(a.layers[l].rms_att == b.layers[l].rms_att);
    CHECK(a.layers[l].wq == b.layers[l].wq);
    CHECK(a.layers[l].wk == b.layers[l].wk);
    CHECK(a.layers[l].wv == b.layers[l].wv);
    CHECK(a.layers[l].wo == b.layers[l].wo);
    CHECK(a.layers[l].rms_ffn == b.layers[l].rms_ffn);
    CHECK(a.layers[l].w1 == b.layers[l].w1);
    CHECK(a.layers[l].w2 == b.layers[l].w2);
    CHECK(a.layers[l].w3 == b.layers[l].w3);
  }
  CHECK(a.rms_final == b.rms_final);
  CHECK(a.wcls.rows() == b.wcls.rows());
  if (!a.config.shared_classifier) CHECK(a.wcls == b.wcls);
}

}  // namespace kvlab_test
