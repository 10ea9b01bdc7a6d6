// Simulated GPUs: a faithful host-memory stand-in for the CUDA backend. Each simulated device's
// physical memory is a memfd; mapping a chunk is mmap(MAP_FIXED | MAP_SHARED) into a reserved range,
// so remapping keeps addresses and real bytes move. Streams are worker threads. Simulated kernels
// (launch_sim_kernel) that run at once on one device share its compute as a contention model says.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "salus/contention.hpp"
#include "salus/device.hpp"
#include "salus/export.hpp"

namespace salus {

inline constexpr std::size_t KiB = std::size_t{1} << 10;
inline constexpr std::size_t MiB = std::size_t{1} << 20;
inline constexpr std::size_t GiB = std::size_t{1} << 30;

// The most simulated GPUs one backend holds (SALUS_MAX_SIM_DEVICES in c_api.h, MAX_SIM_DEVICES
// in Python). Each is a memfd and a stream thread or more; far more than a machine has GPUs, and
// a count past it is a mistake (a size or an id given as a count), refused before any is made.
inline constexpr int kMaxSimDevices = 1024;

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
  // How simulated kernels running at once on one device share it; null: processor_sharing.
  std::shared_ptr<const ContentionModel> contention;

  // The presets throw InvalidArgument for a count above kMaxSimDevices.
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

// Throws InvalidArgument when the configuration is inconsistent (no devices or more than
// kMaxSimDevices, granularity not a power of two multiple of the OS page, a link naming an unknown
// device...).
[[nodiscard]] SALUS_API std::shared_ptr<DeviceBackend> make_sim_backend(SimConfig config);

// Enqueues on `stream` (0: `device`'s default stream) a simulated kernel: it takes `seconds` of
// device time when it runs alone and keeps `occupancy` of the device busy. Kernels of different
// streams of one device that run at once progress at the rates of SimConfig::contention; a
// stream runs its work in order, so its next task starts when the kernel is done. Throws
// InvalidArgument when `backend` is not the sim backend, `seconds` is negative or not finite,
// `occupancy` is not in (0, 1], the device is out of range, or the stream is unknown or belongs
// to another device.
SALUS_API void launch_sim_kernel(DeviceBackend& backend, StreamHandle stream, int device,
                                 double seconds, double occupancy = 1.0);

// What a simulated device's compute did since the backend was made.
struct SimDeviceActivity {
  double busy_seconds = 0.0;         // wall time with at least one kernel running
  double utilization_seconds = 0.0;  // integral over time of device_utilization (contention.hpp)
  double work_seconds = 0.0;         // sum over completed kernels of seconds * occupancy
  std::uint64_t kernels = 0;         // completed kernels
  // Tasks handed to the device's stream threads: kernels, copies, host functions, and event
  // records and waits that could not complete at once (an event recorded on an idle stream
  // completes at once, as on a GPU). Each is a thread hand-over, a wake-up when the thread slept:
  // a steady iteration that computes on the host hands over none.
  std::uint64_t stream_tasks = 0;
};
// Under processor_sharing, utilization_seconds equals work_seconds once the kernels have
// completed (work is conserved). Throws InvalidArgument like launch_sim_kernel for a backend that
// is not the sim backend or a device out of range.
[[nodiscard]] SALUS_API SimDeviceActivity sim_device_activity(DeviceBackend& backend, int device);

}  // namespace salus
