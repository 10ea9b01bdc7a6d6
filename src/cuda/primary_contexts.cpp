// PrimaryContexts and ScopedContext: see primary_contexts.hpp.
#include "cuda/primary_contexts.hpp"

#include <utility>

#include "log/log.hpp"

namespace salus::cuda {

ScopedContext::ScopedContext(const DriverApi& api, CUcontext context) : api_(api) {
  SALUS_CU(api, cuCtxGetCurrent, &previous_);
  if (previous_ == context) return;  // the common case in a thread that only uses Salus
  SALUS_CU(api, cuCtxSetCurrent, context);
  restore_ = true;
}

ScopedContext::~ScopedContext() {
  if (!restore_) return;
  const CUresult rc = api_.cuCtxSetCurrent(previous_);
  if (rc != CUDA_SUCCESS) {
    log::warn("restoring the caller's CUDA context failed: {}", error_name(api_, rc));
  }
}

PrimaryContexts::PrimaryContexts(const DriverApi& api, std::vector<CUdevice> devices)
    : api_(api), devices_(std::move(devices)), contexts_(devices_.size()) {}

PrimaryContexts::~PrimaryContexts() {
  for (std::size_t d = 0; d < contexts_.size(); ++d) {
    if (retained(d) == nullptr) continue;
    const CUresult rc = api_.cuDevicePrimaryCtxRelease(devices_[d]);
    if (rc != CUDA_SUCCESS) {
      // Destruction cannot fail; a context the driver refuses to release is leaked, not fatal.
      log::warn("cuDevicePrimaryCtxRelease(device {}) failed: {}", devices_[d],
                error_name(api_, rc));
    }
  }
}

CUcontext PrimaryContexts::context(int device) const {
  const std::size_t d = index(device);
  if (CUcontext ready = contexts_.at(d).load(std::memory_order_acquire)) return ready;
  return retain(d);
}

CUcontext PrimaryContexts::retain(std::size_t d) const {
  const std::scoped_lock lock(mu_);
  if (CUcontext ready = retained(d)) return ready;  // another thread retained it meanwhile
  // A failed retain leaves the slot empty, so that the next use tries again.
  CUcontext context = nullptr;
  SALUS_CU(api_, cuDevicePrimaryCtxRetain, &context, devices_[d]);
  contexts_[d].store(context, std::memory_order_release);
  return context;
}

int PrimaryContexts::any_retained() const noexcept {
  for (std::size_t d = 0; d < contexts_.size(); ++d) {
    if (retained(d) != nullptr) return static_cast<int>(d);
  }
  return 0;
}

int PrimaryContexts::device_of(CUcontext context) const {
  for (std::size_t d = 0; d < contexts_.size(); ++d) {
    if (retained(d) == context) return static_cast<int>(d);
  }
  // A device Salus has not used yet: contexts are retained lazily. A stream's context exists, so
  // retaining that device's primary context costs nothing new; the search stops at the match.
  for (std::size_t d = 0; d < contexts_.size(); ++d) {
    if (retained(d) != nullptr) continue;
    try {
      if (retain(d) == context) return static_cast<int>(d);
    } catch (const DeviceError&) {
      // A device the driver will not give a context is not the stream's.
    }
  }
  return -1;
}

}  // namespace salus::cuda
