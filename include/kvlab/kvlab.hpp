/// \file
/// \brief Umbrella header of kvlab's CPU side: shapes, counters, the contiguous and paged KV
/// caches, the size calculator, the naive, cached and paged attention paths and the decoders.
#pragma once

#include "kvlab/cache/block_allocator.hpp"
#include "kvlab/cache/block_tables.hpp"
#include "kvlab/cache/contiguous_kv_cache.hpp"
#include "kvlab/cache/kv_cache_size.hpp"
#include "kvlab/cache/memory_accounting.hpp"
#include "kvlab/cache/paged_kv_cache.hpp"
#include "kvlab/cache/paged_sequences.hpp"
#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/paged_view.hpp"
#include "kvlab/core/random.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/core/softmax_state.hpp"
#include "kvlab/core/views.hpp"
#include "kvlab/cpu/decode_attention.hpp"
#include "kvlab/cpu/naive_attention.hpp"
#include "kvlab/cpu/paged_attention.hpp"
#include "kvlab/cpu/softmax.hpp"
#include "kvlab/cpu/types.hpp"
#include "kvlab/model/attention_layer.hpp"
#include "kvlab/model/cached_decoder.hpp"
#include "kvlab/model/decoder.hpp"
#include "kvlab/model/llama_checkpoint.hpp"
#include "kvlab/model/llama_config.hpp"
#include "kvlab/model/llama_generate.hpp"
#include "kvlab/model/llama_model.hpp"
#include "kvlab/model/llama_weights.hpp"
#include "kvlab/model/naive_decoder.hpp"
#include "kvlab/model/paged_decoder.hpp"
#include "kvlab/model/sampler.hpp"
#include "kvlab/model/tokenizer.hpp"

/// kvlab: how a transformer decoder attends to its past — naive, KV-cached and paged attention side
/// by side, with exact cost counters.
namespace kvlab {
/// CPU reference kernels (Eigen).
namespace cpu {}
}  // namespace kvlab
