// The explicit instantiations in float that kvlab_instances.hpp declares, compiled once per build
// and linked into kvlab's own tests, tutorials and programs (see that header).
#define KVLAB_INSTANCE template
#include "kvlab_instances.hpp"

KVLAB_COMPUTE_INSTANCES(float)
