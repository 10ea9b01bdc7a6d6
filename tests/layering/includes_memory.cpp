// Layering probe: a header of the memory layer (src/memory). Compiled as a source of the memory
// layer it must build; as one of the device layer it must not (tests/layering/CMakeLists.txt).
#include "memory/page_pool.hpp"
