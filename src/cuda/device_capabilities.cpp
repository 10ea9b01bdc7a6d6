// DeviceCapabilities: see device_capabilities.hpp.
#include "cuda/device_capabilities.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "log/log.hpp"

namespace salus::cuda {

namespace {

std::string describe(const CUmemLocation& location) {
  return location.type == CU_MEM_LOCATION_TYPE_HOST ? std::string("HOST")
                                                    : fmt::format("HOST_NUMA:{}", location.id);
}

}  // namespace

DeviceCapabilities::DeviceCapabilities(const DriverApi& api, const PrimaryContexts& contexts)
    : api_(api) {
  devices_.reserve(static_cast<std::size_t>(contexts.count()));
  for (int i = 0; i < contexts.count(); ++i) {
    devices_.push_back(read_device(contexts.device(i)));
  }
  read_device_granularities(contexts);
  choose_host_location(contexts);
  address_granularity_ =
      std::min_element(devices_.begin(), devices_.end(), [](const Device& a, const Device& b) {
        return a.granularity < b.granularity;
      })->granularity;
  if (host_granularity_) address_granularity_ = std::min(address_granularity_, *host_granularity_);
}

int DeviceCapabilities::attribute(CUdevice_attribute attribute, CUdevice device,
                                  int fallback) const {
  if (api_.cuDeviceGetAttribute == nullptr) return fallback;
  int value = 0;
  const CUresult rc = api_.cuDeviceGetAttribute(&value, attribute, device);
  // A driver older than the attribute answers CUDA_ERROR_INVALID_VALUE: it does not have it.
  return rc == CUDA_SUCCESS ? value : fallback;
}

DeviceCapabilities::Device DeviceCapabilities::read_device(CUdevice device) const {
  Device caps;
  caps.device = device;
  caps.gpu_direct_rdma =
      attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, device, 0) != 0;
  caps.posix_fd =
      attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device, 0) != 0;
  // -1: the system has no NUMA; node 0 is then the only one.
  caps.host_numa_id = std::max(attribute(CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, device, 0), 0);
  caps.ipc_events = attribute(CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED, device, 0) != 0;
  return caps;
}

CUresult DeviceCapabilities::query_granularity(const PrimaryContexts& contexts,
                                               const CUmemAllocationProp& prop, int device,
                                               std::size_t* out) const {
  // The query concerns the location in `prop`, not a context; should a driver want one anyway,
  // the device's is retained then (and only then).
  CUresult rc = api_.cuMemGetAllocationGranularity(out, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (rc == CUDA_ERROR_INVALID_CONTEXT) {
    const auto scope = contexts.bind(device);
    rc = api_.cuMemGetAllocationGranularity(out, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  }
  return rc;
}

void DeviceCapabilities::read_device_granularities(const PrimaryContexts& contexts) {
  for (int i = 0; i < count(); ++i) {
    std::size_t granularity = 0;
    check(api_, "cuMemGetAllocationGranularity",
          query_granularity(contexts, allocation_prop(Location::gpu(i)), i, &granularity));
    if (granularity == 0) {
      throw DeviceError("cuMemGetAllocationGranularity", "CUDA_SUCCESS", CUDA_SUCCESS,
                        fmt::format("device {} reported a granularity of 0", i));
    }
    devices_[static_cast<std::size_t>(i)].granularity = granularity;
  }
}

void DeviceCapabilities::choose_host_location(const PrimaryContexts& contexts) {
  // Host VMM chunks: plain HOST needs a CUDA 13.0 driver (12.x refuses it with
  // CUDA_ERROR_INVALID_VALUE), HOST_NUMA a 12.2+ one. Without either only device chunks are
  // offered rather than failing the whole backend.
  // HOST only where the driver says so (its attribute came with 13.0, and a 12.x driver may
  // answer a granularity for HOST that its cuMemCreate then refuses). HOST_NUMA's attribute is
  // younger than the location: unknown (-1 here), the granularity query decides.
  const CUdevice first = devices_.front().device;
  std::vector<CUmemLocation> candidates;
  if (attribute(CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, first, 0) == 1) {
    candidates.push_back({CU_MEM_LOCATION_TYPE_HOST, 0});
  }
  if (attribute(CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, first, -1) !=
      0) {
    candidates.push_back({CU_MEM_LOCATION_TYPE_HOST_NUMA, devices_.front().host_numa_id});
  }
  CUresult rc = CUDA_ERROR_NOT_SUPPORTED;
  for (const CUmemLocation& location : candidates) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location = location;
    std::size_t granularity = 0;
    rc = query_granularity(contexts, prop, 0, &granularity);
    if (rc == CUDA_SUCCESS && granularity != 0) {
      host_location_ = location;
      host_granularity_ = granularity;
      log::info("host memory chunks as {}", describe(location));
      return;
    }
  }
  log::info("the CUDA driver offers no host memory chunks ({})", error_name(api_, rc));
}

std::size_t DeviceCapabilities::granularity(Location where) const {
  if (where.is_host()) {
    if (!host_granularity_) {
      throw NotSupported("host memory chunks: the CUDA driver does not offer them here");
    }
    return *host_granularity_;
  }
  return devices_[static_cast<std::size_t>(where.index)].granularity;
}

DeviceProperties DeviceCapabilities::properties(int device) const {
  const Device& caps = devices_[static_cast<std::size_t>(device)];
  const CUdevice dev = caps.device;
  DeviceProperties props;
  std::array<char, 256> name{};
  SALUS_CU(api_, cuDeviceGetName, name.data(), static_cast<int>(name.size()), dev);
  name.back() = '\0';  // the driver truncates long names without promising a terminator
  props.name = name.data();
  SALUS_CU(api_, cuDeviceTotalMem, &props.total_memory, dev);
  CUuuid uuid{};
  SALUS_CU(api_, cuDeviceGetUuid, &uuid, dev);
  std::memcpy(props.uuid.data(), uuid.bytes, props.uuid.size());
  props.granularity = caps.granularity;
  props.host_chunks = host_location_.has_value();
  if (host_location_) props.host_chunk_location = describe(*host_location_);
  props.gpu_direct_rdma = caps.gpu_direct_rdma;
  props.shareable_handles = caps.posix_fd;
  return props;
}

PeerLink DeviceCapabilities::peer_link(int from, int to) const {
  if (from == to) return {LinkKind::self, true, 0, 0.0};

  const CUdevice src = devices_[static_cast<std::size_t>(from)].device;
  const CUdevice dst = devices_[static_cast<std::size_t>(to)].device;
  int access = 0;
  SALUS_CU(api_, cuDeviceGetP2PAttribute, &access, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, src,
           dst);
  if (access == 0) return {LinkKind::none, false, 0, 0.0};

  PeerLink link;
  link.can_access = true;
  SALUS_CU(api_, cuDeviceGetP2PAttribute, &link.performance_rank,
           CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK, src, dst);
  // The driver does not name the link type. Native atomics are the best public signal: they work
  // over NVLink (and C2C) but the driver does not offer them between peers across PCIe. A PCIe
  // platform that does report them would be classified nvlink; NVML could tell for sure, but it
  // is one more library to load for a hint that only orders harvesting candidates.
  int atomics = 0;
  SALUS_CU(api_, cuDeviceGetP2PAttribute, &atomics, CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
           src, dst);
  link.kind = atomics != 0 ? LinkKind::nvlink : LinkKind::pcie;
  link.bandwidth_gbps = 0.0;  // unknown: the driver does not report it
  return link;
}

void DeviceCapabilities::require_ipc_events(int device, std::string_view what) const {
  if (!devices_[static_cast<std::size_t>(device)].ipc_events) {
    throw NotSupported(fmt::format(
        "{}: device {} has no interprocess events (CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED is 0)",
        what, device));
  }
}

CUmemLocation DeviceCapabilities::cu_location(Location where) const {
  CUmemLocation location{};
  if (!where.is_host()) {
    location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    location.id = where.index;
  } else if (where.index == 0 && host_location_) {
    // Host node 0 means "the host" to the layers above: whichever form this driver accepts.
    location = *host_location_;
  } else {
    location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    location.id = where.index;
  }
  return location;
}

CUmemAllocationProp DeviceCapabilities::allocation_prop(Location where) const {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  prop.location = cu_location(where);
  if (!where.is_host() && where.index >= 0 && where.index < count()) {
    // Only what the device supports: the driver refuses a flag or handle type it cannot honour.
    // File descriptors are what cross-process sharing will export; the RDMA flag lets NICs
    // read the chunks directly.
    const Device& caps = devices_[static_cast<std::size_t>(where.index)];
    if (caps.posix_fd) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    if (caps.gpu_direct_rdma) prop.allocFlags.gpuDirectRDMACapable = 1;
  }
  return prop;
}

}  // namespace salus::cuda
