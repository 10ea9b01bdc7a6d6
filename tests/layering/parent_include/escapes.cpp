// Input of Layering.ParentDirectoryIncludeIsRefused: check_includes.cmake must refuse this file.
#include "../../src/iteration_sched/trace.hpp"
