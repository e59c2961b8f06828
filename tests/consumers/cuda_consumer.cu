// A .cu program built against the installed kvlab::cuda target (tests/CMakeLists.txt,
// consume_find_package_cuda): it checks that the exported target carries the include path,
// the CUDA runtime and the compile definitions that kvlab's CUDA headers need. Built, not run.
#include <cstdio>

#include "kvlab/kvlab_cuda.cuh"

int main() {
  const kvlab::AttentionShape shape(8, 2, 64);
  std::printf("kvlab::cuda storage %s, %d query heads per K/V head, GPU count %d\n",
              kvlab::cuda::storage_name<__half>(), shape.group_size(), kvlab::cuda::device_count());
  return 0;
}
