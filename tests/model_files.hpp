// Where the tests find real model files (llama2.c checkpoints and tokenizers), and how a test
// that needs one reports itself skipped when it is absent.
//
// The directory is the programs' (kvlab_support::models_dir): $KVLAB_MODELS_DIR if set, else the
// folder the build was configured with (CMake's KVLAB_MODELS_DIR). The project does not commit
// these files; README.md says where to get them.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "support/builtin_model.hpp"

namespace kvlab_test {

/// The directory holding the model files.
inline std::string models_dir() { return kvlab_support::models_dir(""); }

/// The path of model file `name`; if it cannot be opened, prints why and exits with 77, which
/// CTest reports as "Skipped" for this test (every Catch2 test runs in a process of its own
/// under CTest; SKIP_RETURN_CODE 77 is set in tests/CMakeLists.txt).
inline std::string model_file_or_skip(const std::string& name) {
  const std::string path = models_dir() + "/" + name;
  if (!std::ifstream(path, std::ios::binary)) {
    std::printf("SKIPPED: %s not found (set KVLAB_MODELS_DIR to the folder holding %s)\n",
                path.c_str(), name.c_str());
    std::fflush(stdout);
    std::exit(77);
  }
  return path;
}

/// The real chat model's GGUF file (SmolLM2-135M-Instruct, Q4_1): $KVLAB_REAL_MODEL if set, else
/// the file `scripts/get-model.sh` puts in its cache folder (KVLAB_TEST_REAL_MODEL, set by
/// tests/CMakeLists.txt from the same rule). If it cannot be opened, prints why and exits with 77
/// (CTest: Skipped), as `model_file_or_skip` does.
inline std::string real_model_or_skip() {
  const char* env = std::getenv("KVLAB_REAL_MODEL");
#if defined(KVLAB_TEST_REAL_MODEL)
  const std::string path = env != nullptr && env[0] != '\0' ? env : KVLAB_TEST_REAL_MODEL;
#else
  const std::string path = env != nullptr ? env : "";
#endif
  if (path.empty() || !std::ifstream(path, std::ios::binary)) {
    std::printf(
        "SKIPPED: the real model '%s' is not there (scripts/get-model.sh fetches it; "
        "KVLAB_REAL_MODEL names another file)\n",
        path.c_str());
    std::fflush(stdout);
    std::exit(77);
  }
  return path;
}

}  // namespace kvlab_test
