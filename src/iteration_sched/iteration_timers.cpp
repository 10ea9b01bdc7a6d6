#include "iteration_sched/iteration_timers.hpp"

#include <utility>

#include "log/log.hpp"

namespace salus {

namespace {

constexpr const char* kNotReady = "CUDA_ERROR_NOT_READY";

}  // namespace

IterationTimers::IterationTimers(std::shared_ptr<DeviceBackend> backend, int device)
    : backend_(std::move(backend)), device_(device) {}

IterationTimers::~IterationTimers() {
  // Records still pending on a stream complete anyway: both backends keep a destroyed event's
  // pending work going.
  for (const Pair& pair : all_) {
    for (const EventHandle event : {pair.start, pair.end}) {
      try {
        backend_->destroy_event(event);
      } catch (const Error& e) {
        log::error("destroying timing event {:#x} of device {} failed: {}", event.value, device_,
                   e.what());
      }
    }
  }
}

IterationTimers::Pair IterationTimers::start(StreamHandle stream) {
  std::optional<Pair> pooled;
  {
    std::lock_guard lock(mu_);
    if (!free_.empty()) {
      pooled = free_.back();
      free_.pop_back();
    }
  }
  if (!pooled) {
    // Made outside the lock: creating events is a driver call.
    Pair made{backend_->create_timing_event(device_), {}};
    try {
      made.end = backend_->create_timing_event(device_);
    } catch (...) {
      backend_->destroy_event(made.start);
      throw;
    }
    std::lock_guard lock(mu_);
    all_.push_back(made);
    pooled = made;
  }
  try {
    backend_->record_event(pooled->start, stream);
  } catch (...) {
    release(*pooled);
    throw;
  }
  return *pooled;
}

void IterationTimers::stop(const Pair& pair, StreamHandle stream) {
  backend_->record_event(pair.end, stream);
}

std::optional<double> IterationTimers::elapsed(const Pair& pair) {
  // Polled often: a pending end event answers without an exception.
  if (!backend_->query_event(pair.end)) return std::nullopt;
  try {
    return backend_->elapsed_seconds(pair.start, pair.end);
  } catch (const DeviceError& e) {
    if (e.status() == kNotReady) return std::nullopt;
    throw;
  }
}

void IterationTimers::release(const Pair& pair) {
  std::lock_guard lock(mu_);
  free_.push_back(pair);
}

}  // namespace salus
