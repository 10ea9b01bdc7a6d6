// Everything a C++ user of Salus needs: the whole public C++ API (the C ABI is salus/c_api.h).
#pragma once

#include "salus/blocking.hpp"
#include "salus/contention.hpp"
#include "salus/cuda.hpp"
#include "salus/device.hpp"
#include "salus/error.hpp"
#include "salus/export.hpp"
#include "salus/job_id.hpp"
#include "salus/log.hpp"
#include "salus/memory.hpp"
#include "salus/remote.hpp"
#include "salus/runtime.hpp"
#include "salus/scheduler.hpp"
#include "salus/sim.hpp"
#include "salus/simulation.hpp"
