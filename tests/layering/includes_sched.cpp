// Layering probe: a header of the sched layer (src/iteration_sched). Compiled as a source of the
// sched layer it must build; as one of the memory layer it must not (tests/layering/CMakeLists.txt).
#include "iteration_sched/trace.hpp"
