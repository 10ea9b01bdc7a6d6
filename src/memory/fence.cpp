#include "memory/fence.hpp"

namespace salus::memory {

FencePtr Fence::after(EventPool& pool, std::span<const StreamHandle> streams) {
  std::vector<std::shared_ptr<const Event>> events;
  for (StreamHandle stream : streams) {
    if (auto event = pool.record(stream)) events.push_back(std::move(event));
  }
  if (events.empty()) return nullptr;
  return std::make_shared<const Fence>(std::move(events));
}

FencePtr Fence::join(const FencePtr& a, const FencePtr& b) {
  const bool a_pending = !settled(a);
  const bool b_pending = !settled(b);
  if (!a_pending) return b_pending ? b : nullptr;
  if (!b_pending || a == b) return a;
  // Only the events still pending carry over, so chains of joins stay short.
  std::vector<std::shared_ptr<const Event>> events;
  for (const FencePtr* fence : {&a, &b}) {
    for (const auto& event : (*fence)->events()) {
      if (!event->query()) events.push_back(event);
    }
  }
  return events.empty() ? nullptr : std::make_shared<const Fence>(std::move(events));
}

bool Fence::done() const {
  if (done_.load(std::memory_order_acquire)) return true;
  for (const auto& event : events_) {
    if (!event->query()) return false;
  }
  done_.store(true, std::memory_order_release);
  return true;
}

void Fence::order(DeviceBackend& backend, StreamHandle stream, int device) const {
  if (done_.load(std::memory_order_acquire)) return;
  for (const auto& event : events_) {
    if (!event->query()) backend.stream_wait_event(stream, event->handle(), device);
  }
}

void Fence::wait() const {
  if (done_.load(std::memory_order_acquire)) return;
  for (const auto& event : events_) event->synchronize();
  done_.store(true, std::memory_order_release);
}

}  // namespace salus::memory
