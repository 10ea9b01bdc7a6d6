// CudaBackend: construction and per-device queries. Memory and stream operations live in
// cuda_backend_memory.cpp and cuda_backend_streams.cpp; contexts, capabilities and handles in
// their own classes (primary_contexts.hpp, device_capabilities.hpp, handle_registry.hpp).
#include "cuda/cuda_backend.hpp"

#include <utility>
#include <vector>

#include "log/log.hpp"

namespace salus::cuda {

namespace {

// Initializes the driver and names its devices (index i is the driver's device i).
std::vector<CUdevice> open_devices(const DriverApi& api) {
  const CUresult init = api.cuInit(0);
  if (init == CUDA_ERROR_NO_DEVICE) throw NotSupported("the CUDA driver reports no device");
  check(api, "cuInit", init);

  int count = 0;
  SALUS_CU(api, cuDeviceGetCount, &count);
  if (count <= 0) throw NotSupported("the CUDA driver reports no device");

  std::vector<CUdevice> devices(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) {
    SALUS_CU(api, cuDeviceGet, &devices[static_cast<std::size_t>(i)], i);
  }
  return devices;
}

}  // namespace

// --- construction -----------------------------------------------------------------------------

CudaBackend::CudaBackend(DriverApi api)
    : api_(std::move(api)),
      contexts_(api_, open_devices(api_)),
      caps_(api_, contexts_),
      handles_(api_, contexts_) {
  // For the log only (what a first run on a machine reports): a failure here is no reason to stop.
  int version = 0;
  if (api_.cuDriverGetVersion(&version) == CUDA_SUCCESS) {
    log::info("CUDA driver API {}.{}, {} device(s)", version / 1000, version % 1000 / 10,
              caps_.count());
  }
}

CudaBackend::~CudaBackend() = default;

// --- queries ----------------------------------------------------------------------------------

std::size_t CudaBackend::do_free_memory(int device) const {
  // cuMemGetInfo answers for the current context's device.
  const ScopedContext scope = contexts_.bind(device);
  std::size_t free = 0;
  std::size_t total = 0;
  SALUS_CU(api_, cuMemGetInfo, &free, &total);
  return free;
}

StreamPriorityRange CudaBackend::do_stream_priority_range(int device) const {
  const auto scope = contexts_.bind(device);
  StreamPriorityRange range;
  SALUS_CU(api_, cuCtxGetStreamPriorityRange, &range.least, &range.greatest);
  return range;
}

}  // namespace salus::cuda
