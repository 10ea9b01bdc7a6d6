// SimConfig presets, validation and the factory of the sim backend.
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cstring>
#include <set>
#include <string>
#include <system_error>
#include <utility>

#include "cuda/sim_backend.hpp"

namespace salus {
namespace {

constexpr double kNvlinkGbps = 50.0;
constexpr double kPcieGbps = 12.0;
// PCIe peers rank behind NVLink peers, as the driver's performance rank does.
constexpr int kPcieRank = 1;

void check_count(std::size_t count) {
  if (count > static_cast<std::size_t>(kMaxSimDevices)) {
    throw InvalidArgument(fmt::format("sim config: {} devices; at most {} simulated GPUs", count,
                                      kMaxSimDevices));
  }
}

SimConfig with_devices(int count, std::size_t memory_bytes) {
  // Checked before any is made: a count of billions would take that long to refuse.
  if (count > 0) check_count(static_cast<std::size_t>(count));
  SimConfig config;
  for (int i = 0; i < count; ++i) {
    SimDeviceConfig device;
    device.name = fmt::format("Salus simulated GPU {}", i);
    device.memory_bytes = memory_bytes;
    config.devices.push_back(std::move(device));
  }
  return config;
}

void link_all(SimConfig& config, int first, int count, LinkKind kind, double gbps, int rank) {
  for (int a = first; a < first + count; ++a) {
    for (int b = a + 1; b < first + count; ++b) config.links.push_back({a, b, kind, gbps, rank});
  }
}

void check_granularity(std::size_t granularity, const std::string& what) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  if (granularity == 0 || !std::has_single_bit(granularity) || granularity % page != 0) {
    throw InvalidArgument(fmt::format(
        "sim config: {} granularity {} must be a power of two and a multiple of the OS page ({})",
        what, granularity, page));
  }
}

void check_memory(std::size_t bytes, std::size_t granularity, const std::string& what) {
  if (bytes == 0) throw InvalidArgument(fmt::format("sim config: {} has zero memory", what));
  if (bytes % granularity != 0) {
    throw InvalidArgument(
        fmt::format("sim config: {} memory {} bytes is not a multiple of its granularity {}", what,
                    bytes, granularity));
  }
}

}  // namespace

SimConfig SimConfig::uniform(int count, std::size_t memory_bytes) {
  return with_devices(count, memory_bytes);
}

SimConfig SimConfig::nvlink_mesh(int count, std::size_t memory_bytes, double bandwidth_gbps) {
  SimConfig config = with_devices(count, memory_bytes);
  link_all(config, 0, count, LinkKind::nvlink, bandwidth_gbps, 0);
  return config;
}

SimConfig SimConfig::two_islands(int per_island, std::size_t memory_bytes) {
  SimConfig config = with_devices(2 * per_island, memory_bytes);
  link_all(config, 0, per_island, LinkKind::nvlink, kNvlinkGbps, 0);
  link_all(config, per_island, per_island, LinkKind::nvlink, kNvlinkGbps, 0);
  for (int a = 0; a < per_island; ++a) {
    for (int b = per_island; b < 2 * per_island; ++b) {
      config.links.push_back({a, b, LinkKind::pcie, kPcieGbps, kPcieRank});
    }
  }
  return config;
}

SimConfig SimConfig::pcie_only(int count, std::size_t memory_bytes) {
  SimConfig config = with_devices(count, memory_bytes);
  link_all(config, 0, count, LinkKind::pcie, kPcieGbps, kPcieRank);
  return config;
}

std::shared_ptr<DeviceBackend> make_sim_backend(SimConfig config) {
  sim::validate_config(config);
  return std::make_shared<sim::SimBackend>(std::move(config));
}

namespace sim {

void validate_config(const SimConfig& config) {
  if (config.devices.empty()) throw InvalidArgument("sim config: no devices");
  check_count(config.devices.size());
  const int count = static_cast<int>(config.devices.size());
  for (int i = 0; i < count; ++i) {
    const auto& device = config.devices[static_cast<std::size_t>(i)];
    const std::string what = fmt::format("device {} ('{}')", i, device.name);
    check_granularity(device.granularity, what);
    check_memory(device.memory_bytes, device.granularity, what);
  }
  check_granularity(config.host_granularity, "host");
  check_memory(config.host_memory_bytes, config.host_granularity, "host");
  if (config.host_link_bandwidth_gbps < 0 || config.local_bandwidth_gbps < 0) {
    throw InvalidArgument("sim config: negative host or local bandwidth");
  }
  if (config.priorities.greatest > config.priorities.least) {
    throw InvalidArgument(
        fmt::format("sim config: stream priority range greatest {} is numerically above least {}",
                    config.priorities.greatest, config.priorities.least));
  }
  std::set<std::pair<int, int>> seen;
  for (const auto& link : config.links) {
    for (int end : {link.a, link.b}) {
      if (end < 0 || end >= count) {
        throw InvalidArgument(
            fmt::format("sim config: link {}-{} names unknown device {} ({} devices)", link.a,
                        link.b, end, count));
      }
    }
    if (link.a == link.b) {
      throw InvalidArgument(fmt::format("sim config: self-link on device {}", link.a));
    }
    if (link.kind != LinkKind::nvlink && link.kind != LinkKind::pcie) {
      throw InvalidArgument(
          fmt::format("sim config: link {}-{} has kind '{}' (nvlink or pcie only)", link.a, link.b,
                      to_string(link.kind)));
    }
    if (link.bandwidth_gbps <= 0) {
      throw InvalidArgument(fmt::format("sim config: link {}-{} has bandwidth {} GB/s", link.a,
                                        link.b, link.bandwidth_gbps));
    }
    if (!seen.insert(std::minmax(link.a, link.b)).second) {
      throw InvalidArgument(
          fmt::format("sim config: link {}-{} is configured twice", link.a, link.b));
    }
  }
}

}  // namespace sim
}  // namespace salus
