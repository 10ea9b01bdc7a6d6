// GPU work that may still touch memory: events recorded on the streams that used it, after the
// work in question. A fence is built once and then shared read-only; whoever takes the memory
// over orders its own work after the fence on the GPU (order), or waits on the host (wait).
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <vector>

#include "memory/event_pool.hpp"
#include "salus/device.hpp"

namespace salus::memory {

class Fence;
using FencePtr = std::shared_ptr<const Fence>;

class Fence {
 public:
  explicit Fence(std::vector<std::shared_ptr<const Event>> events) : events_(std::move(events)) {}

  // A fence after the work enqueued so far on each of `streams` (of the pool's device), its
  // events from `events`; null when none of them had work pending.
  static FencePtr after(EventPool& events, std::span<const StreamHandle> streams);
  // What both fences wait for (either may be null); null when neither has pending work.
  static FencePtr join(const FencePtr& a, const FencePtr& b);

  // True once every event has completed. Sticky: events in a fence are never recorded again.
  [[nodiscard]] bool done() const;
  // Work enqueued on `stream` (of `device`) after this call waits for the fence's work, on the
  // GPU. The fence's events may belong to other devices.
  void order(DeviceBackend& backend, StreamHandle stream, int device) const;
  // Blocks the calling thread until the fence's work has finished.
  void wait() const;
  [[nodiscard]] std::span<const std::shared_ptr<const Event>> events() const { return events_; }

 private:
  std::vector<std::shared_ptr<const Event>> events_;
  mutable std::atomic<bool> done_{false};
};

// True when `fence` is null or done.
inline bool settled(const FencePtr& fence) {
  return fence == nullptr || fence->done();
}

}  // namespace salus::memory
