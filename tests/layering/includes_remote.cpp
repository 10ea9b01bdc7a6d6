// Layering probe: a header of the remote layer (src/remote). Compiled as a source of the remote
// layer it must build; as one of the sched layer it must not (tests/layering/CMakeLists.txt).
#include "remote/protocol.hpp"
