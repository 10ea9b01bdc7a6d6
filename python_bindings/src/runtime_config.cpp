// The simulated GPUs and the spilling a Python Runtime asks for by name (module.cpp).
#include <string>

#include "bindings.hpp"
#include "salus/error.hpp"
#include "salus/sim.hpp"

namespace salus::python {

SimConfig sim_config(int devices, std::size_t memory, const std::string& topology) {
  // A simulated GPU is whole pages: said here, where the argument's name is known, in MiB.
  const std::size_t page = SimDeviceConfig{}.granularity;
  if (memory % page != 0) {
    const auto size = [](std::size_t bytes) {
      return bytes % MiB == 0 ? std::to_string(bytes / MiB) + "MiB" : std::to_string(bytes) + "B";
    };
    const std::size_t below = memory / page * page;
    const std::string say = below == 0 ? size(page) : size(below) + " or " + size(below + page);
    throw InvalidArgument("memory=" + size(memory) + ": a simulated GPU's memory is whole pages "
                          "of " + size(page) + "; say " + say);
  }
  if (topology == "none") return SimConfig::uniform(devices, memory);
  if (topology == "nvlink_mesh") return SimConfig::nvlink_mesh(devices, memory);
  if (topology == "two_islands") {
    if (devices % 2 != 0) {
      throw InvalidArgument("topology 'two_islands' needs an even device count, not " +
                            std::to_string(devices));
    }
    return SimConfig::two_islands(devices / 2, memory);
  }
  if (topology == "pcie_only") return SimConfig::pcie_only(devices, memory);
  throw InvalidArgument("unknown topology '" + topology +
                        "' (known: none, nvlink_mesh, two_islands, pcie_only)");
}

SpillPolicy spill_policy(const std::string& spill) {
  if (spill == "none") return SpillPolicy::none;
  if (spill == "host_only") return SpillPolicy::host_only;
  if (spill == "peer_then_host") return SpillPolicy::peer_then_host;
  throw InvalidArgument("unknown spill policy '" + spill +
                        "' (known: none, host_only, peer_then_host)");
}

}  // namespace salus::python
