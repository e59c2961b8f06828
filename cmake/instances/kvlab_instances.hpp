// Build-time only, for kvlab's own tests, tutorials and programs (never installed): the class
// templates that nearly every one of them instantiates — the caches and stores for every storage
// type, the toy decoders — are declared here as explicitly instantiated elsewhere
// (kvlab_instances.cpp, compiled once per build), so that each translation unit that builds a model
// does not compile them and their attention kernels again. Under the sanitizers a test that
// constructs a LlamaModel otherwise spends about half its compile time on the eleven store classes
// a run-time dtype can choose. The selective store is here too: kvlab/model/cache_policy.hpp, which
// every program that builds a LlamaModel includes, constructs one, and compiling it in each unit
// cost a fourth of a tutorial's compile (tutorial 08 in Release: 22.1 s alone, 16.6 s with it
// shared; a unit of eight test files 42 s, 38 s). CMake force-includes this header (`-include`, see
// CMakeLists.txt next to it) ahead of the source, so the sources stay exactly what a user compiles;
// nothing here changes what any code does.
#pragma once

#include <Eigen/Core>

#include "kvlab/cache/contiguous_kv_cache.hpp"
#include "kvlab/cache/paged_kv_cache.hpp"
#include "kvlab/core/quant_blocks.hpp"
#include "kvlab/model/attention_layer.hpp"
#include "kvlab/model/decoders.hpp"
#include "kvlab/store/contiguous_store.hpp"
#include "kvlab/store/paged_store.hpp"
#include "kvlab/store/recompute_store.hpp"
#include "kvlab/store/selective_store.hpp"

// The caches and stores of values computed in T, stored as S.
#define KVLAB_STORAGE_INSTANCES(T, S)                  \
  KVLAB_INSTANCE class kvlab::ContiguousKVCache<T, S>; \
  KVLAB_INSTANCE class kvlab::PagedKVCache<T, S>;      \
  KVLAB_INSTANCE class kvlab::ContiguousStore<T, S>;   \
  KVLAB_INSTANCE class kvlab::PagedStore<T, S>;

// Everything of one compute type T: every storage type (T itself for full precision), the store
// without a cache, the toy model and its three decoders.
#define KVLAB_COMPUTE_INSTANCES(T)                                        \
  KVLAB_STORAGE_INSTANCES(T, T)                                           \
  KVLAB_STORAGE_INSTANCES(T, Eigen::half)                                 \
  KVLAB_STORAGE_INSTANCES(T, Eigen::bfloat16)                             \
  KVLAB_STORAGE_INSTANCES(T, kvlab::BlockQ8_0)                            \
  KVLAB_STORAGE_INSTANCES(T, kvlab::BlockQ4_0)                            \
  KVLAB_INSTANCE class kvlab::RecomputeStore<T>;                          \
  KVLAB_INSTANCE class kvlab::SelectiveStore<T>;                          \
  KVLAB_INSTANCE class kvlab::AttentionLayer<T>;                          \
  KVLAB_INSTANCE class kvlab::AttentionStack<T>;                          \
  KVLAB_INSTANCE class kvlab::StoreDecoder<T, kvlab::RecomputeStore<T>>;  \
  KVLAB_INSTANCE class kvlab::StoreDecoder<T, kvlab::ContiguousStore<T>>; \
  KVLAB_INSTANCE class kvlab::StoreDecoder<T, kvlab::PagedStore<T>>;      \
  KVLAB_INSTANCE class kvlab::NaiveDecoder<T>;                            \
  KVLAB_INSTANCE class kvlab::CachedDecoder<T>;                           \
  KVLAB_INSTANCE class kvlab::PagedDecoder<T>;

// Here, declarations of both compute types; kvlab_instances_<type>.cpp defines KVLAB_INSTANCE as
// `template` and instantiates one each (two files: they compile in parallel).
#ifndef KVLAB_INSTANCE
#define KVLAB_INSTANCE extern template
KVLAB_COMPUTE_INSTANCES(float)
KVLAB_COMPUTE_INSTANCES(double)
#endif
