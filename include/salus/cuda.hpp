// The CUDA driver backend. libsalus does not link libcuda: the driver is opened with dlopen the
// first time a CUDA backend is made, so the library loads and runs (on simulated GPUs) anywhere.
#pragma once

#include <memory>

#include "salus/device.hpp"
#include "salus/export.hpp"
#include "salus/sim.hpp"

namespace salus {

// True when libcuda.so.1 can be opened, cuInit succeeds and at least one device is present.
[[nodiscard]] SALUS_API bool cuda_available() noexcept;

// Throws NotSupported (no driver, no device) or DeviceError (a driver call failed).
[[nodiscard]] SALUS_API std::shared_ptr<DeviceBackend> make_cuda_backend();

// The CUDA backend where a GPU is present, else simulated GPUs built from `fallback`.
[[nodiscard]] SALUS_API std::shared_ptr<DeviceBackend> make_default_backend(SimConfig fallback);

}  // namespace salus
