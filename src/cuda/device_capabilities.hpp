// What the CUDA driver says about each device: its attributes, VMM granularities and how host
// chunks are asked for (read once when the backend is made), and its properties and peer links
// (asked each time). Part of the CUDA backend (cuda_backend.hpp).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

#include "cuda/driver_api.hpp"
#include "cuda/primary_contexts.hpp"
#include "salus/device.hpp"

namespace salus::cuda {

// Immutable once built: the constructor reads everything it keeps, so it needs no lock and any
// thread may read it. properties() and peer_link() ask the driver each time (calls that need no
// context); nothing here binds a context after construction.
//
// The DriverApi must outlive this object.
class DeviceCapabilities {
 public:
  // What the driver supports for one device.
  struct Device {
    CUdevice device = 0;
    bool gpu_direct_rdma = false;  // VMM chunks may carry the GPUDirect RDMA flag
    bool posix_fd = false;         // VMM chunks may be exported as POSIX file descriptors
    int host_numa_id = 0;          // the host NUMA node nearest the device (0 without NUMA)
    bool ipc_events = false;       // interprocess events (not on every platform: e.g. WSL)
    std::size_t granularity = 0;   // MINIMUM granularity of its chunks
  };

  // Reads every device of `contexts` (attributes first, then granularities, then host chunks).
  // Retains a device's context only should the driver want one for a granularity query.
  // Throws DeviceError when a granularity query fails or answers 0.
  DeviceCapabilities(const DriverApi& api, const PrimaryContexts& contexts);

  [[nodiscard]] int count() const noexcept { return static_cast<int>(devices_.size()); }
  [[nodiscard]] const Device& device(int device) const {
    return devices_[static_cast<std::size_t>(device)];
  }
  // A device's or the host's chunk granularity; NotSupported for the host when the driver has no
  // host VMM chunks.
  [[nodiscard]] std::size_t granularity(Location where) const;
  // The smallest granularity of any location: every address and size the driver can accept for
  // map, unmap or set_access is a multiple of it.
  [[nodiscard]] std::size_t address_granularity() const noexcept { return address_granularity_; }
  // Name, memory and UUID as the driver reports them, the rest as read at construction.
  [[nodiscard]] DeviceProperties properties(int device) const;
  // The link between two devices as the driver's P2P attributes tell it.
  [[nodiscard]] PeerLink peer_link(int from, int to) const;
  // NotSupported, naming `what`, where `device` has no interprocess events.
  void require_ipc_events(int device, std::string_view what) const;

  // Where `where` is, as the driver names it.
  [[nodiscard]] CUmemLocation cu_location(Location where) const;
  // What cuMemCreate is asked for a chunk at `where`: only flags and handle types the device
  // supports.
  [[nodiscard]] CUmemAllocationProp allocation_prop(Location where) const;

 private:
  // `attribute` of `device`, or `fallback` where the driver does not know it.
  [[nodiscard]] int attribute(CUdevice_attribute attribute, CUdevice device, int fallback) const;
  [[nodiscard]] Device read_device(CUdevice device) const;
  // cuMemGetAllocationGranularity (MINIMUM) without a context when the driver allows it, else
  // with `device`'s.
  CUresult query_granularity(const PrimaryContexts& contexts, const CUmemAllocationProp& prop,
                             int device, std::size_t* out) const;
  void read_device_granularities(const PrimaryContexts& contexts);
  // Picks how host chunks are asked for (HOST on 13.0+, else HOST_NUMA on the node nearest
  // device 0) and their granularity; leaves host_location_ empty when neither works.
  void choose_host_location(const PrimaryContexts& contexts);

  const DriverApi& api_;
  std::vector<Device> devices_;
  std::optional<std::size_t> host_granularity_;  // empty when the driver has no host VMM chunks
  std::optional<CUmemLocation> host_location_;   // how host(0) chunks are asked for
  std::size_t address_granularity_ = 0;
};

}  // namespace salus::cuda
