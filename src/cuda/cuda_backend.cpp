// CudaBackend: construction, contexts, properties and topology. Memory and stream operations live
// in cuda_backend_memory.cpp and cuda_backend_streams.cpp.
#include "cuda/cuda_backend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <string>
#include <utility>

#include "log/log.hpp"

namespace salus::cuda {

CUmemLocation to_cu_location(Location where) {
  CUmemLocation location{};
  if (!where.is_host()) {
    location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    location.id = where.index;
  } else if (where.index == 0) {
    // Plain HOST rather than HOST_NUMA node 0: it also works on machines without NUMA support.
    location.type = CU_MEM_LOCATION_TYPE_HOST;
    location.id = 0;
  } else {
    location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    location.id = where.index;
  }
  return location;
}

CUmemAllocationProp pinned_allocation(Location where) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  prop.location = to_cu_location(where);
  return prop;
}

// --- PrimaryContext ---------------------------------------------------------------------------

CudaBackend::PrimaryContext::PrimaryContext(const DriverApi& api, int ordinal) : api_(&api) {
  SALUS_CU(api, cuDeviceGet, &device_, ordinal);
  SALUS_CU(api, cuDevicePrimaryCtxRetain, &context_, device_);
}

CudaBackend::PrimaryContext::PrimaryContext(PrimaryContext&& other) noexcept
    : api_(other.api_), device_(other.device_), context_(std::exchange(other.context_, nullptr)) {}

CudaBackend::PrimaryContext::~PrimaryContext() {
  if (context_ == nullptr) return;
  const CUresult rc = api_->cuDevicePrimaryCtxRelease(device_);
  if (rc != CUDA_SUCCESS) {
    // Destruction cannot fail; a context the driver refuses to release is leaked, not fatal.
    log::warn("cuDevicePrimaryCtxRelease(device {}) failed: {}", device_, error_name(*api_, rc));
  }
}

// --- ScopedContext ----------------------------------------------------------------------------

CudaBackend::ScopedContext::ScopedContext(const DriverApi& api, CUcontext context) : api_(api) {
  SALUS_CU(api, cuCtxGetCurrent, &previous_);
  if (previous_ == context) return;  // the common case in a thread that only uses Salus
  SALUS_CU(api, cuCtxSetCurrent, context);
  restore_ = true;
}

CudaBackend::ScopedContext::~ScopedContext() {
  if (!restore_) return;
  const CUresult rc = api_.cuCtxSetCurrent(previous_);
  if (rc != CUDA_SUCCESS) {
    log::warn("restoring the caller's CUDA context failed: {}", error_name(api_, rc));
  }
}

CudaBackend::ScopedContext CudaBackend::bind(int device) const {
  return ScopedContext(api_, contexts_[static_cast<std::size_t>(device)].context());
}

// --- construction -----------------------------------------------------------------------------

CudaBackend::CudaBackend(DriverApi api) : api_(std::move(api)) {
  const CUresult init = api_.cuInit(0);
  if (init == CUDA_ERROR_NO_DEVICE) throw NotSupported("the CUDA driver reports no device");
  check(api_, "cuInit", init);

  int count = 0;
  SALUS_CU(api_, cuDeviceGetCount, &count);
  if (count <= 0) throw NotSupported("the CUDA driver reports no device");

  contexts_.reserve(static_cast<std::size_t>(count));
  device_granularity_.reserve(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) {
    contexts_.emplace_back(api_, i);
    const auto scope = bind(i);
    const CUmemAllocationProp prop = pinned_allocation(Location::gpu(i));
    std::size_t granularity = 0;
    SALUS_CU(api_, cuMemGetAllocationGranularity, &granularity, &prop,
             CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (granularity == 0) {
      throw DeviceError("cuMemGetAllocationGranularity", "CUDA_SUCCESS", CUDA_SUCCESS,
                        fmt::format("device {} reported a granularity of 0", i));
    }
    device_granularity_.push_back(granularity);
  }

  {
    // Host VMM chunks need a CUDA 12.2+ driver and a capable platform; without them only device
    // chunks are offered rather than failing the whole backend.
    const auto scope = bind(0);
    const CUmemAllocationProp prop = pinned_allocation(Location::host());
    std::size_t granularity = 0;
    const CUresult rc =
        api_.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (rc == CUDA_SUCCESS && granularity != 0) {
      host_granularity_ = granularity;
    } else {
      log::info("the CUDA driver offers no host memory chunks ({})", error_name(api_, rc));
    }
  }

  address_granularity_ = *std::min_element(device_granularity_.begin(), device_granularity_.end());
  if (host_granularity_) address_granularity_ = std::min(address_granularity_, *host_granularity_);
}

CudaBackend::~CudaBackend() = default;

// --- queries ----------------------------------------------------------------------------------

void CudaBackend::check_device(int device, std::string_view what) const {
  if (device < 0 || device >= device_count()) {
    throw InvalidArgument(
        fmt::format("{}: device {} out of range (0..{})", what, device, device_count() - 1));
  }
}

DeviceProperties CudaBackend::properties(int device) const {
  check_device(device, "properties");
  const CUdevice dev = contexts_[static_cast<std::size_t>(device)].device();
  DeviceProperties props;
  std::array<char, 256> name{};
  SALUS_CU(api_, cuDeviceGetName, name.data(), static_cast<int>(name.size()), dev);
  name.back() = '\0';  // the driver truncates long names without promising a terminator
  props.name = name.data();
  SALUS_CU(api_, cuDeviceTotalMem, &props.total_memory, dev);
  props.granularity = device_granularity_[static_cast<std::size_t>(device)];
  return props;
}

std::size_t CudaBackend::granularity(Location where) const {
  if (where.is_host()) {
    if (!host_granularity_) {
      throw NotSupported("host memory chunks: the CUDA driver does not offer them here");
    }
    return *host_granularity_;
  }
  check_device(where.index, "granularity");
  return device_granularity_[static_cast<std::size_t>(where.index)];
}

PeerLink CudaBackend::peer_link(int from, int to) const {
  check_device(from, "peer_link");
  check_device(to, "peer_link");
  if (from == to) return {LinkKind::self, true, 0, 0.0};

  const CUdevice src = contexts_[static_cast<std::size_t>(from)].device();
  const CUdevice dst = contexts_[static_cast<std::size_t>(to)].device();
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

StreamPriorityRange CudaBackend::stream_priority_range(int device) const {
  check_device(device, "stream_priority_range");
  const auto scope = bind(device);
  StreamPriorityRange range;
  SALUS_CU(api_, cuCtxGetStreamPriorityRange, &range.least, &range.greatest);
  return range;
}

}  // namespace salus::cuda
