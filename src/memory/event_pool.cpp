#include "memory/event_pool.hpp"

#include <utility>

namespace salus::memory {

std::shared_ptr<EventPool> EventPool::make(std::shared_ptr<DeviceBackend> backend, int device) {
  return std::shared_ptr<EventPool>(new EventPool(std::move(backend), device));
}

EventPool::EventPool(std::shared_ptr<DeviceBackend> backend, int device)
    : backend_(std::move(backend)), device_(device) {}

std::shared_ptr<const Event> EventPool::record(StreamHandle stream) {
  if (backend_->stream_known_idle(stream, device_)) return nullptr;  // nothing to wait for
  std::unique_ptr<Event> event;
  {
    std::lock_guard lock(mu_);
    if (!free_.empty()) {
      event = std::move(free_.back());
      free_.pop_back();
    }
  }
  if (!event) event = std::make_unique<Event>(backend_, device_);  // a driver call: no lock held
  bool pending = false;
  try {
    pending = backend_->record_pending(event->handle(), stream);
  } catch (...) {
    give_back(event.release());  // unrecorded: as good as new
    throw;
  }
  if (!pending) {
    give_back(event.release());  // recorded and done: nothing will wait for it
    return nullptr;
  }
  // The deleter holds the pool weakly: a fence may outlive its device's heap (a page moved to
  // another tier keeps its fence), and then its events are simply destroyed.
  return std::shared_ptr<const Event>(event.release(), [pool = weak_from_this()](const Event* e) {
    if (const std::shared_ptr<EventPool> home = pool.lock()) {
      home->give_back(const_cast<Event*>(e));
    } else {
      delete e;
    }
  });
}

std::size_t EventPool::cached() const {
  std::lock_guard lock(mu_);
  return free_.size();
}

void EventPool::give_back(Event* event) noexcept {
  std::unique_ptr<Event> owned(event);
  {
    std::lock_guard lock(mu_);
    if (free_.size() < kKept) {
      try {
        free_.push_back(std::move(owned));
      } catch (...) {
        // No room to keep it: it is destroyed below, outside the lock.
      }
    }
  }
  // `owned`, if not kept, destroys the event here (a driver call), outside the lock.
}

}  // namespace salus::memory
