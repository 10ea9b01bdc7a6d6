// The devices' primary contexts, retained lazily, and binding one to the calling thread for the
// duration of a driver call. Part of the CUDA backend (cuda_backend.hpp); talks to the driver
// only through a DriverApi table.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <mutex>
#include <vector>

#include "cuda/driver_api.hpp"

namespace salus::cuda {

// Makes a context current on this thread until destroyed, then restores the previous one, so
// that the application's own notion of "current device" (e.g. PyTorch's) is left alone.
class [[nodiscard]] ScopedContext {
 public:
  ScopedContext(const DriverApi& api, CUcontext context);
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
  ~ScopedContext();

 private:
  const DriverApi& api_;
  CUcontext previous_ = nullptr;
  bool restore_ = false;
};

// Owns one primary context per device, each retained on first use of that device only: each
// costs about half a gigabyte of device memory, which a process that uses one GPU of eight
// should not pay eight times. Destruction releases every context it retained, exactly once.
//
// Thread-safe. Lock rule: mu_ only serializes retaining (a slot is written under it, once); a
// retained context is published through an atomic, so the hot path (context() of a device in
// use) takes no lock. Nothing but cuDevicePrimaryCtxRetain is called while mu_ is held, and no
// public method holds it while calling another.
//
// The DriverApi must outlive this object (it releases through it).
class PrimaryContexts {
 public:
  // `devices[i]` is the driver's device of index i. Retains nothing.
  PrimaryContexts(const DriverApi& api, std::vector<CUdevice> devices);
  ~PrimaryContexts();
  PrimaryContexts(const PrimaryContexts&) = delete;
  PrimaryContexts& operator=(const PrimaryContexts&) = delete;
  PrimaryContexts(PrimaryContexts&&) = delete;
  PrimaryContexts& operator=(PrimaryContexts&&) = delete;

  [[nodiscard]] int count() const noexcept { return static_cast<int>(devices_.size()); }
  // The driver's device of index `device`.
  [[nodiscard]] CUdevice device(int device) const { return devices_[index(device)]; }

  // The primary context of `device`, retained on first use. DeviceError when the retain fails;
  // the next call then tries again.
  [[nodiscard]] CUcontext context(int device) const;
  // `device`'s primary context made current on this thread until the result is destroyed.
  [[nodiscard]] ScopedContext bind(int device) const { return {api_, context(device)}; }
  // For calls about no device in particular (address space, host chunks): a device whose context
  // is already retained, so that such calls never retain one more; device 0 when none is.
  [[nodiscard]] int any_retained() const noexcept;
  // The device whose primary context is `context`, or -1 (a context the application made).
  // Retains the contexts of devices not used yet while looking, until one matches (a context
  // that exists already costs nothing more to retain); a device the driver refuses one is
  // skipped.
  [[nodiscard]] int device_of(CUcontext context) const;

 private:
  static std::size_t index(int device) { return static_cast<std::size_t>(device); }
  // The context of slot `device`, or nullptr while not retained.
  [[nodiscard]] CUcontext retained(std::size_t device) const noexcept {
    return contexts_[device].load(std::memory_order_acquire);
  }
  // Retains slot `device` under mu_ unless another thread did first; its context either way.
  [[nodiscard]] CUcontext retain(std::size_t device) const;

  const DriverApi& api_;
  const std::vector<CUdevice> devices_;
  mutable std::mutex mu_;  // serializes retaining
  // One per device: nullptr until retained, then the context (written once, under mu_).
  mutable std::vector<std::atomic<CUcontext>> contexts_;
};

}  // namespace salus::cuda
