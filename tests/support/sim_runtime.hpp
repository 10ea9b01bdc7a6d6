// Helpers for tests that run a Runtime on one simulated GPU.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "salus/runtime.hpp"
#include "salus/sim.hpp"

namespace salus::testing {

inline std::shared_ptr<DeviceBackend> one_sim_gpu(std::size_t bytes) {
  return make_sim_backend(SimConfig::uniform(1, bytes));
}

inline JobSpec job_named(std::string name, MemoryHints hints = {}) {
  JobSpec spec;
  spec.name = std::move(name);
  spec.hints = hints;
  return spec;
}

}  // namespace salus::testing
