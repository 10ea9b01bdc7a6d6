// The interprocess events a process connected to salusd gives its pages back behind (its
// "fences"), and the opening of the fences that come with the pages it is granted.
//
// CUDA makes two rules that decide this class's shape:
//  - A process cannot open an event it exported itself (cuIpcOpenEventHandle answers
//    CUDA_ERROR_INVALID_CONTEXT). Yet salusd's free list is last-in-first-out, so a process that
//    gives pages back behind its own work is often granted the same pages again, with its own
//    fence: `open` answers such a fence with the event itself.
//  - An opened handle whose event the exporter destroyed is undefined, and the driver reuses
//    handles. salusd keeps a page's fence, and hands it on with later grants, for as long as the
//    page is free. So an exported event is never destroyed while the pool lives: once its fence
//    has completed it is recorded again for a later one (`recycle`). A holder of the old handle
//    then waits for the newer record, which is safe: the old record had completed before the
//    event was recorded again, so waiting for the newer one waits at least as long.
//
// Thread-safety: every public method takes mu_, and none calls another; the backend is called
// with mu_ released.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "salus/device.hpp"

namespace salus::remote {

// Polls `fence` (another process's event) until it has completed or `until` has passed; true
// when it completed. A fence whose process has gone (it can no longer be asked) has passed.
bool wait_for_fence(const Event& fence, std::chrono::steady_clock::time_point until);

class FencePool {
 public:
  // An exported event: recorded by its holder, sent as `shared`, and handed back to `recycle`
  // once its record has completed.
  struct Fence {
    int device = 0;
    std::shared_ptr<const Event> event;
    SharedEvent shared;  // its descriptor (simulated events) is the pool's, closed at the end
  };

  explicit FencePool(std::shared_ptr<DeviceBackend> backend) : backend_(std::move(backend)) {}
  ~FencePool();
  FencePool(const FencePool&) = delete;
  FencePool& operator=(const FencePool&) = delete;

  // A fence of `device` to record: one that completed before, or a new exported event. Throws
  // NotSupported where the backend has no interprocess events. The reference stays valid for
  // the pool's life.
  Fence& acquire(int device);
  // `fence`'s last record has completed: it may be recorded again.
  void recycle(Fence& fence);
  // A fence that came with granted pages, as an event of this process: this process's own event
  // where it is one of ours, else the backend's import. Throws what import_event throws.
  std::shared_ptr<const Event> open(int device, const SharedEvent& shared);

  // Events exported so far (none is destroyed before the pool).
  [[nodiscard]] std::size_t exported() const;
  // Fences answered with this process's own event.
  [[nodiscard]] std::uint64_t own_opened() const;

 private:
  using Key = std::array<std::byte, 64>;

  const std::shared_ptr<DeviceBackend> backend_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Fence>> fences_;
  std::map<int, std::vector<Fence*>> idle_;  // by device: completed, ready to record again
  std::map<Key, Fence*> by_handle_;
  std::uint64_t own_opened_ = 0;
};

}  // namespace salus::remote
