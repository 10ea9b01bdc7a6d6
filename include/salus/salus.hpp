// Everything a C++ user of Salus needs.
#pragma once

#include "salus/cuda.hpp"
#include "salus/device.hpp"
#include "salus/error.hpp"
#include "salus/memory.hpp"
#include "salus/sim.hpp"
