// Says once, when a test run starts, that the CUDA tests run on the CPU emulator (emulator/)
// and not on a GPU (the counterpart of tests/cuda/cuda_skip_listener.cpp).
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>

#include <cstdio>

namespace {

struct EmulationListener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testRunStarting(Catch::TestRunInfo const& info) override {
    std::printf("kvlab: CUDA kernels run on the CPU emulator (emulator/), not on a GPU\n");
    TestEventListenerBase::testRunStarting(info);
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(EmulationListener)
