/// \file
/// \brief The model a program runs: a GGUF file, a llama2.c checkpoint, or a built-in model with
/// random weights (kvlab-generate, kvlab-serve, bench_generate and bench_serving choose it the
/// same way). Not part of the library.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>

#include <kvlab/model/llama_checkpoint.hpp>
#include <kvlab/model/llama_config.hpp>
#include <kvlab/model/llama_weights.hpp>

namespace kvlab_support {

/// Weights and the words that name them in a program's output.
struct ChosenModel {
  std::shared_ptr<const kvlab::LlamaWeights> weights;
  std::string description;  ///< the file, or "built-in <name> model (random weights, seed S)"
};

/// True when `path` names a GGUF file (by its extension, ".gguf"): the programs read it with
/// kvlab::load_gguf_weights, and its tokenizer from the same file.
inline bool is_gguf(const std::string& path) {
  return path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
}

/// The checkpoint `model` when it is not empty; otherwise the built-in model `builtin`: "tiny"
/// (`LlamaConfig::tiny()`) or "stories15M" (its shape with a separate classifier: with random
/// weights a shared one makes every token predict itself, see `LlamaConfig::tiny`; a decode step
/// reads the same bytes).
/// \throws whatever `load_llama_checkpoint` throws for a bad file.
inline ChosenModel choose_model(const std::string& model, const std::string& builtin) {
  if (is_gguf(model)) {
    return {std::make_shared<const kvlab::LlamaWeights>(kvlab::load_gguf_weights(model)), model};
  }
  if (!model.empty()) {
    return {std::make_shared<const kvlab::LlamaWeights>(kvlab::load_llama_checkpoint(model)),
            model};
  }
  const kvlab::LlamaConfig shape =
      builtin == "stories15M" ? kvlab::LlamaConfig::stories15m().with_shared_classifier(false)
                              : kvlab::LlamaConfig::tiny();
  return {std::make_shared<const kvlab::LlamaWeights>(kvlab::LlamaWeights::builtin(shape)),
          "built-in " + builtin + " model (random weights, seed " +
              std::to_string(kvlab::LlamaWeights::kBuiltinSeed) + ")"};
}

/// Where scripts/get-model.sh puts SmolLM2-135M-Instruct, the default `--model` of kvlab-chat and
/// kvlab-eval: $KVLAB_MODEL_CACHE, else $XDG_CACHE_HOME/kvlab/models, else ~/.cache/kvlab/models,
/// then "/SmolLM2-135M-Instruct.Q4_1.gguf".
inline std::string default_chat_model() {
  const auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? v : "";
  };
  std::string dir = env("KVLAB_MODEL_CACHE");
  if (dir.empty() && !env("XDG_CACHE_HOME").empty()) dir = env("XDG_CACHE_HOME") + "/kvlab/models";
  if (dir.empty()) dir = env("HOME") + "/.cache/kvlab/models";
  return dir + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

/// The real model a tutorial runs: `argument` when not empty, else $KVLAB_REAL_MODEL where set,
/// else `default_chat_model()`.
inline std::string real_model_path(const std::string& argument) {
  if (!argument.empty()) return argument;
  const char* env = std::getenv("KVLAB_REAL_MODEL");
  if (env != nullptr && env[0] != '\0') return env;
  return default_chat_model();
}

/// What `--models-dir` says in a program's help.
inline constexpr const char* kModelsDirHelp =
    "where stories260K.bin is (default $KVLAB_MODELS_DIR, else the folder the build was "
    "configured with: CMake's KVLAB_MODELS_DIR)";

/// The folder of the llama2.c model files: `option` (a program's `--models-dir`) when not empty,
/// else $KVLAB_MODELS_DIR, else the folder the build was configured with (CMake's
/// KVLAB_MODELS_DIR, compiled in as the macro of that name), else "models".
inline std::string models_dir(const std::string& option) {
  if (!option.empty()) return option;
  const char* env = std::getenv("KVLAB_MODELS_DIR");
  if (env != nullptr && env[0] != '\0') return env;
#if defined(KVLAB_MODELS_DIR)
  return KVLAB_MODELS_DIR;
#else
  return "models";
#endif
}

}  // namespace kvlab_support
