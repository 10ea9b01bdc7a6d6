// SimStreams' events: records (markers on a stream that capture its busy clock and the time),
// queries, waits and the elapsed time between timing events.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <mutex>

#include "cuda/sim_status.hpp"
#include "cuda/sim_streams.hpp"
#include "salus/error.hpp"

namespace salus::sim {

EventCapture SimStreams::timing_capture(const std::shared_ptr<SimEvent>& ev, EventHandle handle,
                                        const char* role) {
  std::lock_guard lock(ev->mutex);
  if (!ev->timing) {
    throw InvalidArgument(fmt::format(
        "elapsed_seconds: {} event {} was created without timing (use create_timing_event)", role,
        handle.value));
  }
  if (ev->recorded == 0) {
    throw InvalidArgument(
        fmt::format("elapsed_seconds: {} event {} was never recorded", role, handle.value));
  }
  if (!ev->done()) {
    throw DeviceError("cuEventElapsedTime", "CUDA_ERROR_NOT_READY", kCudaErrorNotReady,
                      fmt::format("the {} event {} has not completed yet", role, handle.value));
  }
  return *ev->last;
}

std::shared_ptr<SimEvent> SimStreams::event_for(EventHandle event) const {
  check_process("this simulated GPU's event");
  std::lock_guard lock(mutex_);
  return event_locked(event);
}

std::shared_ptr<SimEvent> SimStreams::event_locked(EventHandle event) const {
  auto it = events_.find(event.value);
  if (it == events_.end()) {
    throw InvalidArgument(
        fmt::format("unknown event {} (never created or destroyed)", event.value));
  }
  return it->second;
}

std::pair<std::shared_ptr<SimEvent>, std::shared_ptr<SimStream>> SimStreams::event_and_stream(
    EventHandle event, StreamHandle stream) {
  check_process("this simulated GPU's event");
  std::lock_guard lock(mutex_);
  auto ev = event_locked(event);
  auto target = stream_locked(stream, ev->device);
  return {std::move(ev), std::move(target)};
}

EventHandle SimStreams::add_event(std::shared_ptr<SimEvent> event) {
  check_process("this simulated GPU");
  std::lock_guard lock(mutex_);
  const std::uint64_t id = next_event_++;
  events_.emplace(id, std::move(event));
  return EventHandle{id};
}

EventHandle SimStreams::create_event(int device, bool timing) {
  return add_event(std::make_shared<SimEvent>(device, timing));
}

EventHandle SimStreams::create_shareable_event(int device) {
  check_process("this simulated GPU");
  auto event = std::make_shared<SimEvent>(device, false);
  event->shared = SharedEventMemory::create();
  return add_event(std::move(event));
}

SharedEvent SimStreams::export_event(EventHandle event) {
  const auto ev = event_for(event);
  if (!ev->shared) {
    throw InvalidArgument(
        fmt::format("export_event: event {} is not shareable (make it with create_shareable_event)",
                    event.value));
  }
  return ev->shared->exported();
}

EventHandle SimStreams::import_event(int device, const SharedEvent& shared) {
  check_process("this simulated GPU");
  auto memory = SharedEventMemory::open(shared);
  auto event = std::make_shared<SimEvent>(device, false);
  event->shared = std::move(memory);
  event->imported = true;
  return add_event(std::move(event));
}

void SimStreams::destroy_event(EventHandle event) {
  // Pending records and waits hold their own reference, so they still complete.
  std::lock_guard lock(mutex_);
  if (events_.erase(event.value) == 0) {
    throw InvalidArgument(fmt::format("destroy_event: unknown event {}", event.value));
  }
}

bool SimStreams::record_event(EventHandle event, StreamHandle stream) {
  // Named, not bound: a lambda below captures the event (clang 14 refuses structured bindings).
  auto found = event_and_stream(event, stream);
  std::shared_ptr<SimEvent> ev = std::move(found.first);
  auto target = std::move(found.second);
  if (ev->imported) {
    throw InvalidArgument(
        fmt::format("record_event: event {} was imported: only the process that made it records it",
                    event.value));
  }
  // Holding the event lock across push keeps generations in record order and lets a refused
  // push leave the event untouched.
  std::lock_guard lock(ev->mutex);
  const std::uint64_t generation = ev->recorded + 1;
  // On an idle stream the record completes at once, as a GPU's does: no task, no thread woken.
  if (const std::optional<EventCapture> now = target->capture_if_idle()) {
    ev->recorded = generation;
    ev->captured = generation;
    ev->last = *now;
    if (ev->shared) {
      ev->shared->publish_recorded(generation);
      ev->shared->publish_completed(generation);
    }
    return false;  // a waiter waits for a generation it saw recorded: this one is new
  }
  // The marker runs on `on`'s worker, which outlives it (a raw pointer: a stream's queue must not
  // own the stream). It reads the busy clock there, where only that thread writes it.
  target->push([ev, generation, on = target.get()](std::stop_token) {
    const EventCapture capture{on->device, on->id, on->busy_seconds(),
                               std::chrono::steady_clock::now()};
    {
      std::lock_guard done(ev->mutex);
      std::erase(ev->pending, generation);
      // Records on different streams may complete out of order; the newest one counts.
      if (generation > ev->captured) {
        ev->captured = generation;
        ev->last = capture;
      }
    }
    if (ev->shared) ev->shared->publish_completed(generation);
    ev->cv.notify_all();
  });
  ev->recorded = generation;
  ev->pending.push_back(generation);
  if (ev->shared) ev->shared->publish_recorded(generation);
  return true;
}

bool SimStreams::query_event(EventHandle event) {
  auto ev = event_for(event);
  std::lock_guard lock(ev->mutex);
  return ev->done();
}

void SimStreams::synchronize_event(EventHandle event) {
  auto ev = event_for(event);
  if (ev->imported) {
    ev->shared->wait(ev->shared->recorded(), std::stop_token{});
    return;
  }
  std::unique_lock lock(ev->mutex);
  const std::uint64_t target = ev->recorded;
  ev->cv.wait(lock, [&] { return ev->reached(target); });
}

void SimStreams::stream_wait_event(StreamHandle stream, EventHandle event, int device) {
  auto ev = event_for(event);
  auto waiter = stream_for(stream, device);
  if (ev->imported) {
    // Another process records it: the wait is for the record it had made by now.
    const std::uint64_t target = ev->shared->recorded();
    if (ev->shared->reached(target)) return;
    waiter->push([shared = ev->shared, target](std::stop_token st) { shared->wait(target, st); });
    return;
  }
  std::lock_guard lock(ev->mutex);
  // The wait is for the record captured now; later records must not move it (as in CUDA).
  const std::uint64_t target = ev->recorded;
  if (ev->reached(target)) return;
  waiter->push([ev, target](std::stop_token st) {
    std::unique_lock wait_lock(ev->mutex);
    // Shutdown (a stop request) releases the wait even if the event never completes.
    ev->cv.wait(wait_lock, st, [&] { return ev->reached(target); });
  });
}

double SimStreams::elapsed_seconds(EventHandle start, EventHandle end) {
  const EventCapture from = timing_capture(event_for(start), start, "start");
  const EventCapture to = timing_capture(event_for(end), end, "end");
  if (from.device == to.device && from.stream == to.stream) {
    // One stream: the device time its kernels and copies took in between.
    return to.busy_seconds - from.busy_seconds;
  }
  return std::chrono::duration<double>(to.at - from.at).count();
}

}  // namespace salus::sim
