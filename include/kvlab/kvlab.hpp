/// \file
/// \brief Umbrella header of kvlab's CPU side: shapes, counters, the caches, the size and memory
/// calculators, the reference and tuned attention paths, the K/V stores, the models.
///
/// The folders, each reading only the ones above it in this list:
///  - `config.hpp`, `matrix.hpp`, `kv_storage.hpp`: errors, the host-device macro, the Eigen
///    matrix types, how K/V values are stored (fp32, fp16, bf16, int8, int4) and read back;
///  - `core/`: shapes, counters, cache layouts as plain views, split-K arithmetic (host and
///    device, no Eigen);
///  - `cache/`: how K/V are laid out in memory — a contiguous cache, a paged pool (allocator,
///    CSR block tables);
///  - `cpu/`: the reference attention (plain loops, the oracle) and the tuned kernels that
///    compute it over each layout; the layer's matrix products;
///  - `analysis/`: pure calculators — KV-cache size of a model, memory reserved vs used;
///  - `store/`: `KVStore`, one interface for how a model keeps its past between steps, and one
///    class per way (recompute, contiguous, paged), each a cache and its kernel;
///  - `model/`: the per-layer attention step (written once, over a store), the toy attention
///    stack and its decoders, the Llama model, its cache policies as text (`cache_policy.hpp`),
///    its readers (llama2.c checkpoints, GGUF files), tokenizer, sampler and generation loop.
///    The GGUF files' byte-level BPE tokenizer
///    (`kvlab/model/bpe_tokenizer.hpp`) is not included here: it reads a Unicode table that
///    kvlab's CMake build generates (see `unicode_classes.hpp`); include it where you need it;
///  - `serving/`: continuous batching — requests, the schedulers, the prefix cache, the engine;
///  - `report/`: what is shown of the state — the serving run as JSON (`run_json.hpp`, included
///    here) and the Graphviz pictures of a pool and of a scheduler's state (`pool_dot.hpp`,
///    `state_dot.hpp`, included where you draw).
#pragma once

#include "kvlab/analysis/kv_cache_size.hpp"
#include "kvlab/analysis/memory_accounting.hpp"
#include "kvlab/cache/block_allocator.hpp"
#include "kvlab/cache/block_tables.hpp"
#include "kvlab/cache/contiguous_kv_cache.hpp"
#include "kvlab/cache/paged_kv_cache.hpp"
#include "kvlab/cache/paged_sequences.hpp"
#include "kvlab/config.hpp"
#include "kvlab/core/counters.hpp"
#include "kvlab/core/ggml_matrix.hpp"
#include "kvlab/core/ggml_types.hpp"
#include "kvlab/core/paged_view.hpp"
#include "kvlab/core/quant_blocks.hpp"
#include "kvlab/core/random.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/core/softmax_state.hpp"
#include "kvlab/core/split_k.hpp"
#include "kvlab/core/views.hpp"
#include "kvlab/cpu/decode_attention.hpp"
#include "kvlab/cpu/layer_ops.hpp"
#include "kvlab/cpu/naive_attention.hpp"
#include "kvlab/cpu/paged_attention.hpp"
#include "kvlab/cpu/quantized_linear.hpp"
#include "kvlab/cpu/reference_attention.hpp"
#include "kvlab/cpu/softmax.hpp"
#include "kvlab/kv_storage.hpp"
#include "kvlab/matrix.hpp"
#include "kvlab/model/attention_layer.hpp"
#include "kvlab/model/attention_step.hpp"
#include "kvlab/model/cache_policy.hpp"
#include "kvlab/model/decoder.hpp"
#include "kvlab/model/decoders.hpp"
#include "kvlab/model/gguf.hpp"
#include "kvlab/model/gguf_model.hpp"
#include "kvlab/model/llama_backend.hpp"
#include "kvlab/model/llama_checkpoint.hpp"
#include "kvlab/model/llama_config.hpp"
#include "kvlab/model/llama_counters.hpp"
#include "kvlab/model/llama_generate.hpp"
#include "kvlab/model/llama_model.hpp"
#include "kvlab/model/llama_weights.hpp"
#include "kvlab/model/phase_times.hpp"
#include "kvlab/model/rope.hpp"
#include "kvlab/model/sampler.hpp"
#include "kvlab/model/text_tokenizer.hpp"
#include "kvlab/model/tokenizer.hpp"
#include "kvlab/report/run_json.hpp"
#include "kvlab/serving/block_budget.hpp"
#include "kvlab/serving/contiguous_scheduler.hpp"
#include "kvlab/serving/engine.hpp"
#include "kvlab/serving/make_scheduler.hpp"
#include "kvlab/serving/prefix_cache.hpp"
#include "kvlab/serving/request.hpp"
#include "kvlab/serving/scheduler.hpp"
#include "kvlab/serving/scheduler_invariants.hpp"
#include "kvlab/serving/static_scheduler.hpp"
#include "kvlab/serving/step_plan.hpp"
#include "kvlab/serving/summary.hpp"
#include "kvlab/serving/workload.hpp"
#include "kvlab/store/contiguous_store.hpp"
#include "kvlab/store/kv_store.hpp"
#include "kvlab/store/paged_store.hpp"
#include "kvlab/store/recompute_store.hpp"
#include "kvlab/store/selective_store.hpp"

/// kvlab: how a transformer decoder attends to its past — naive, KV-cached and paged attention
/// side by side, with exact cost counters.
namespace kvlab {
/// CPU reference kernels (plain loops) and tuned kernels (Eigen).
namespace cpu {}
}  // namespace kvlab
