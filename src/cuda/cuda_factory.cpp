// The public entry points of salus/cuda.hpp: is there a GPU, and which backend to use.
#include <fmt/format.h>

#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "cuda/cuda_backend.hpp"
#include "cuda/driver_api.hpp"
#include "log/log.hpp"
#include "salus/cuda.hpp"
#include "salus/sim.hpp"

namespace salus {

namespace {

struct LoadedDriver {
  std::optional<cuda::DriverApi> api;
  std::string error;  // why there is no api
};

// Loaded once: the table is immutable afterwards, and dlopen'ing on every query would be waste.
// A failure is cached too; a driver installed while the process runs is not picked up.
const LoadedDriver& loaded_driver() {
  static const LoadedDriver driver = []() -> LoadedDriver {
    try {
      return {cuda::load_driver_api(), {}};
    } catch (const std::exception& e) {
      return {std::nullopt, e.what()};
    }
  }();
  return driver;
}

}  // namespace

bool cuda_available() noexcept {
  try {
    const LoadedDriver& driver = loaded_driver();
    if (!driver.api) return false;
    if (driver.api->cuInit(0) != CUDA_SUCCESS) return false;
    int count = 0;
    return driver.api->cuDeviceGetCount(&count) == CUDA_SUCCESS && count > 0;
  } catch (...) {
    return false;
  }
}

std::shared_ptr<DeviceBackend> make_cuda_backend() {
  const LoadedDriver& driver = loaded_driver();
  if (!driver.api) throw NotSupported(fmt::format("no CUDA backend: {}", driver.error));
  return std::make_shared<cuda::CudaBackend>(*driver.api);
}

std::shared_ptr<DeviceBackend> make_default_backend(SimConfig fallback) {
  if (cuda_available()) {
    try {
      auto backend = make_cuda_backend();
      log::info("using the CUDA backend ({} device(s))", backend->device_count());
      return backend;
    } catch (const std::exception& e) {
      log::warn("the CUDA driver is present but unusable ({}); falling back", e.what());
    }
  }
  log::info("no usable CUDA device; using {} simulated GPU(s)", fallback.devices.size());
  return make_sim_backend(std::move(fallback));
}

}  // namespace salus
