// Simulated GPUs: a faithful host-memory stand-in for the CUDA backend. Each simulated device's
// physical memory is a memfd; mapping a chunk is mmap(MAP_FIXED | MAP_SHARED) into a reserved range,
// so remapping keeps addresses and real bytes move. Streams are worker threads.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "salus/device.hpp"
#include "salus/export.hpp"

namespace salus {

inline constexpr std::size_t KiB = std::size_t{1} << 10;
inline constexpr std::size_t MiB = std::size_t{1} << 20;
inline constexpr std::size_t GiB = std::size_t{1} << 30;

struct SimDeviceConfig {
  std::string name = "Salus simulated GPU";
  std::size_t memory_bytes = 1 * GiB;
  std::size_t granularity = 2 * MiB;
};

// A symmetric link between two simulated devices. Unlisted pairs have no peer access and copy
// through the host link.
struct SimLinkConfig {
  int a = 0;
  int b = 0;
  LinkKind kind = LinkKind::nvlink;
  double bandwidth_gbps = 50.0;
  int performance_rank = 0;
};

struct SALUS_API SimConfig {
  std::vector<SimDeviceConfig> devices;
  std::vector<SimLinkConfig> links;
  std::size_t host_memory_bytes = 4 * GiB;
  std::size_t host_granularity = 2 * MiB;
  double host_link_bandwidth_gbps = 16.0;  // device <-> host, each direction
  double local_bandwidth_gbps = 0.0;       // device-local copies; 0 = unthrottled
  // When false copies run at host memcpy speed; when true they take bytes / link bandwidth.
  bool throttle_copies = false;
  StreamPriorityRange priorities{0, -2};

  // `count` identical devices with no peer links.
  static SimConfig uniform(int count, std::size_t memory_bytes = 1 * GiB);
  // `count` devices, every pair linked by NVLink.
  static SimConfig nvlink_mesh(int count, std::size_t memory_bytes = 1 * GiB,
                               double bandwidth_gbps = 50.0);
  // Two NVLink meshes of `per_island` devices each; islands reach each other over PCIe.
  static SimConfig two_islands(int per_island, std::size_t memory_bytes = 1 * GiB);
  // `count` devices that reach each other only over PCIe (peer access, low bandwidth).
  static SimConfig pcie_only(int count, std::size_t memory_bytes = 1 * GiB);
};

// Throws InvalidArgument when the configuration is inconsistent (no devices, granularity not a
// power of two multiple of the OS page, a link naming an unknown device...).
[[nodiscard]] SALUS_API std::shared_ptr<DeviceBackend> make_sim_backend(SimConfig config);

}  // namespace salus
