// Events for fences, reused. A free of a block that other streams used records an event on each
// of them; creating and destroying one every time would be two driver calls more per free (on
// CUDA; a backend lock and a table entry on the simulated GPU). A fence's events come from here
// and go back when the last fence holding them lets go (while any fence holds one it is never
// recorded again, as Fence promises). Like PyTorch's event pool, it keeps what it was given
// back, up to kKept events; more are destroyed.
//
// Lock rule: mu_ guards free_; no backend call is made under it.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "salus/device.hpp"

namespace salus::memory {

class EventPool : public std::enable_shared_from_this<EventPool> {
 public:
  // Events of `device`, without timing.
  static std::shared_ptr<EventPool> make(std::shared_ptr<DeviceBackend> backend, int device);
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // An event recorded now on `stream`: after the work enqueued there so far; null when nothing
  // was pending there (DeviceBackend::record_pending: the event went back at once). It returns
  // to the pool when the last copy goes (or is destroyed, once the pool is gone). Throws what the
  // backend throws (nothing is lost: an event whose record failed goes back unrecorded).
  [[nodiscard]] std::shared_ptr<const Event> record(StreamHandle stream);
  // Events cached now (for tests).
  [[nodiscard]] std::size_t cached() const;

  static constexpr std::size_t kKept = 1024;

 private:
  EventPool(std::shared_ptr<DeviceBackend> backend, int device);
  void give_back(Event* event) noexcept;

  const std::shared_ptr<DeviceBackend> backend_;
  const int device_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Event>> free_;
};

}  // namespace salus::memory
