#include "remote/device_identity.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <string>

namespace salus::remote {

void check_same_devices(const Welcome& welcome, const DeviceBackend& local) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string hint =
      visible != nullptr ? fmt::format(" (CUDA_VISIBLE_DEVICES here is '{}')", visible)
                         : std::string(" (CUDA_VISIBLE_DEVICES is unset here)");
  const auto count = static_cast<int>(welcome.device_count);
  if (local.device_count() < count) {
    throw InvalidArgument(fmt::format(
        "salusd shares {} GPUs, this process sees {}{}: run it with the daemon's GPUs visible",
        count, local.device_count(), hint));
  }
  for (int d = 0; d < count; ++d) {
    const DeviceUuid& theirs = welcome.device_uuids[static_cast<std::size_t>(d)];
    const DeviceUuid mine = local.properties(d).uuid;
    if (theirs == mine) continue;
    throw InvalidArgument(fmt::format(
        "salusd's GPU {} is {}, this process's GPU {} is {}{}: a process must see the daemon's "
        "GPUs in the daemon's order (start salusd with the same CUDA_VISIBLE_DEVICES)",
        d, salus::to_string(theirs), d, salus::to_string(mine), hint));
  }
}

}  // namespace salus::remote
