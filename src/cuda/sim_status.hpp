// Internal: CUDA driver status codes mirrored by the simulator so both backends raise the same
// errors (SimMemory's copy checks, SimStreams' timing events).
#pragma once

#include "salus/device.hpp"

namespace salus::sim {

inline constexpr int kCudaErrorInvalidValue = 1;
inline constexpr int kCudaErrorOutOfMemory = DeviceError::kOutOfMemoryCode;
inline constexpr int kCudaErrorNotReady = 600;

}  // namespace salus::sim
