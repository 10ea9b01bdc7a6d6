// A process connected to salusd must mean the daemon's GPUs by the daemon's numbers: pages of the
// daemon's device d are mapped as this process's device d. The numbers are each process's own
// (CUDA_VISIBLE_DEVICES renumbers, and the daemon kept the first caller's), so they are matched
// by the driver's UUIDs.
#pragma once

#include "remote/protocol.hpp"
#include "salus/device.hpp"

namespace salus::remote {

// Throws InvalidArgument naming the first device whose UUID differs, or that this process lacks.
void check_same_devices(const Welcome& welcome, const DeviceBackend& local);

}  // namespace salus::remote
