#include "salus/device.hpp"

#include <fmt/format.h>

#include <utility>

namespace salus {

std::string to_string(Location where) {
  return where.is_host() ? fmt::format("host:{}", where.index) : fmt::format("gpu:{}", where.index);
}

std::string to_string(const DeviceUuid& uuid) {
  std::string out = "GPU-";
  for (std::size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += fmt::format("{:02x}", uuid[i]);
  }
  return out;
}

const char* to_string(LinkKind kind) noexcept {
  switch (kind) {
    case LinkKind::self: return "self";
    case LinkKind::nvlink: return "nvlink";
    case LinkKind::pcie: return "pcie";
    case LinkKind::none: return "none";
  }
  return "unknown";
}

Stream::Stream(std::shared_ptr<DeviceBackend> backend, int device, int priority)
    : backend_(std::move(backend)), device_(device) {
  handle_ = backend_->create_stream(device, priority);
}

Stream::Stream(Stream&& other) noexcept
    : backend_(std::move(other.backend_)),
      handle_(std::exchange(other.handle_, {})),
      device_(other.device_) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    reset();
    backend_ = std::move(other.backend_);
    handle_ = std::exchange(other.handle_, {});
    device_ = other.device_;
  }
  return *this;
}

Stream::~Stream() { reset(); }

void Stream::reset() noexcept {
  if (backend_ && handle_.value != 0) {
    try {
      backend_->destroy_stream(handle_);
    } catch (...) {
      // Destruction must not throw; a driver that refuses to destroy a stream leaks it.
    }
  }
  handle_ = {};
  backend_.reset();
}

void Stream::synchronize() const { backend_->synchronize_stream(handle_); }

Event::Event(std::shared_ptr<DeviceBackend> backend, int device, EventTiming timing)
    : backend_(std::move(backend)) {
  handle_ = timing == EventTiming::enabled ? backend_->create_timing_event(device)
                                           : backend_->create_event(device);
}

Event::Event(std::shared_ptr<DeviceBackend> backend, EventHandle adopted) noexcept
    : backend_(std::move(backend)), handle_(adopted) {}

Event::Event(Event&& other) noexcept
    : backend_(std::move(other.backend_)), handle_(std::exchange(other.handle_, {})) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    reset();
    backend_ = std::move(other.backend_);
    handle_ = std::exchange(other.handle_, {});
  }
  return *this;
}

Event::~Event() { reset(); }

void Event::reset() noexcept {
  if (backend_ && handle_.value != 0) {
    try {
      backend_->destroy_event(handle_);
    } catch (...) {
      // See Stream::reset.
    }
  }
  handle_ = {};
  backend_.reset();
}

void Event::record(StreamHandle stream) const { backend_->record_event(handle_, stream); }
bool Event::query() const { return backend_->query_event(handle_); }
void Event::synchronize() const { backend_->synchronize_event(handle_); }
double Event::seconds_since(const Event& start) const {
  if (!backend_ || !start.backend_) throw InvalidArgument("Event::seconds_since: an empty event");
  if (backend_ != start.backend_) {
    throw InvalidArgument("Event::seconds_since: the two events belong to different backends");
  }
  return backend_->elapsed_seconds(start.handle_, handle_);
}

}  // namespace salus
