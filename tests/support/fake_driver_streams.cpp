// The fake driver's streams, events and host functions, on the queue model of
// fake_driver_work.cpp: records and waits are items of their stream's queue, and a host wait
// completes what it waits for.
#include <fmt/format.h>

#include <cstring>

#include <bit>

#include "support/fake_driver_state.hpp"

namespace salus::test {

namespace {

std::uint64_t as_int(const void* p) {
  return std::bit_cast<std::uintptr_t>(p);
}

}  // namespace

CUresult FakeDriver::State::stream_create_with_priority(CUstream* stream, unsigned flags,
                                                        int priority) {
  return run("cuStreamCreateWithPriority", {flags, static_cast<std::uint64_t>(priority)}, [&] {
    if (stream == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const int device = current_device();
    if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
    next_object_ += 0x10;
    streams_.emplace(next_object_, device);
    if ((flags & CU_STREAM_NON_BLOCKING) == 0) blocking_streams_.insert(next_object_);
    *stream = std::bit_cast<CUstream>(next_object_);
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::stream_destroy(CUstream stream) {
  return run("cuStreamDestroy", {as_int(stream)}, [&] {
    const auto key = std::bit_cast<std::uintptr_t>(stream);
    if (!valid_stream(stream) || streams_.erase(key) == 0) return CUDA_ERROR_INVALID_HANDLE;
    destroyed_streams_.insert(key);
    capturing_.erase(key);
    // As with the driver, work already queued still runs (and may still be finished or waited
    // for through events); nothing new can join the queue.
    blocking_streams_.erase(key);
    tails_.erase(key);
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::stream_synchronize(CUstream stream) {
  std::vector<std::uint64_t> waited;
  const CUresult rc = run("cuStreamSynchronize", {as_int(stream)}, [&] {
    if (lacks_context()) return CUDA_ERROR_INVALID_CONTEXT;
    if (!valid_stream(stream)) return CUDA_ERROR_INVALID_HANDLE;
    if (breaks_capture(stream)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    waited = stream_tails(stream);
    complete_stream(stream);  // the host waited: the GPU got through the stream's work so far
    return CUDA_SUCCESS;
  });
  wait_finished(waited);  // and through the host functions in it
  return rc;
}

CUresult FakeDriver::State::stream_query(CUstream stream) {
  return run("cuStreamQuery", {as_int(stream)}, [&] {
    if (lacks_context()) return CUDA_ERROR_INVALID_CONTEXT;
    if (!valid_stream(stream)) return CUDA_ERROR_INVALID_HANDLE;
    if (breaks_capture(stream)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    const auto tail = tails_.find(std::bit_cast<std::uintptr_t>(stream));
    return tail == tails_.end() || finished(tail->second) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  });
}

CUresult FakeDriver::State::stream_get_ctx(CUstream stream, CUcontext* context) {
  return run("cuStreamGetCtx", {as_int(stream)}, [&] {
    if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // The default streams belong to whatever context is current, as with the driver.
    if (stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) {
      const int device = current_device();
      if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
      *context = context_of(device);
      return CUDA_SUCCESS;
    }
    if (!valid_stream(stream)) return CUDA_ERROR_INVALID_HANDLE;
    *context = context_of(streams_.at(std::bit_cast<std::uintptr_t>(stream)));
    return CUDA_SUCCESS;
  });
}

std::uintptr_t FakeDriver::State::new_event_handle() {
  if (free_event_handles_.empty()) {
    next_object_ += 0x10;
    return next_object_;
  }
  const std::uintptr_t id = free_event_handles_.back();
  free_event_handles_.pop_back();
  return id;
}

std::map<std::uintptr_t, FakeDriver::State::Event>::iterator FakeDriver::State::event_of(
    CUevent event) {
  const auto it = events_.find(std::bit_cast<std::uintptr_t>(event));
  if (it == events_.end() || it->second.source == 0) return it;
  const auto source = events_.find(it->second.source);
  if (source != events_.end() && source->second.serial == it->second.source_serial) return source;
  // CUDA: using an opened event after the exporter destroyed it is undefined.
  violations_.push_back(fmt::format(
      "opened interprocess event {:#x} used after its source event was destroyed", it->first));
  return it;  // the opened event alone
}

CUresult FakeDriver::State::stream_wait_event(CUstream stream, CUevent event, unsigned flags) {
  return run("cuStreamWaitEvent", {as_int(stream), as_int(event), flags}, [&] {
    if (lacks_context()) return CUDA_ERROR_INVALID_CONTEXT;
    const auto it = event_of(event);
    if (!valid_stream(stream) || it == events_.end()) return CUDA_ERROR_INVALID_HANDLE;
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    // A captured stream may wait only for work of its own capture; the fake has no event
    // recorded in a capture to wait for, so any wait isolates the capture from outside work.
    if (capturing_.contains(std::bit_cast<std::uintptr_t>(stream))) {
      capturing_[std::bit_cast<std::uintptr_t>(stream)] = false;
      violations_.push_back(fmt::format(
          "cuStreamWaitEvent made capturing stream {:#x} wait for work outside its capture",
          as_int(stream)));
      return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    }
    // Later work on the stream waits for the work the event captured when this call was made.
    enqueue(ItemKind::wait, stream, {}, it->second.captured);
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::event_create(CUevent* event, unsigned flags) {
  return run("cuEventCreate", {flags}, [&] {
    if (event == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const int device = current_device();
    if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
    const bool interprocess = (flags & CU_EVENT_INTERPROCESS) != 0;
    // As the driver: an interprocess event cannot time.
    if (interprocess && (flags & CU_EVENT_DISABLE_TIMING) == 0) return CUDA_ERROR_INVALID_VALUE;
    const std::uintptr_t id = new_event_handle();
    events_.emplace(id, Event{device, 0, (flags & CU_EVENT_DISABLE_TIMING) == 0, false,
                              interprocess, 0, next_event_serial_++, 0});
    *event = std::bit_cast<CUevent>(id);
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::event_destroy(CUevent event) {
  return run("cuEventDestroy", {as_int(event)}, [&] {
    const auto it = events_.find(std::bit_cast<std::uintptr_t>(event));
    if (it == events_.end()) return CUDA_ERROR_INVALID_HANDLE;
    record_times_.erase(it->second.captured);
    free_event_handles_.push_back(it->first);
    events_.erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::event_record(CUevent event, CUstream stream) {
  return run("cuEventRecord", {as_int(event), as_int(stream)}, [&] {
    if (lacks_context()) return CUDA_ERROR_INVALID_CONTEXT;
    const auto it = event_of(event);
    if (it == events_.end() || !valid_stream(stream)) return CUDA_ERROR_INVALID_HANDLE;
    // The record is an item of its own: it completes after the stream's work so far (at once on
    // an idle stream), or when released, while events are held.
    record_times_.erase(it->second.captured);  // nothing reads the previous record any more
    it->second.captured = enqueue(ItemKind::record, stream, {}, 0, hold_events_);
    it->second.recorded = true;
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::event_query(CUevent event) {
  return run("cuEventQuery", {as_int(event)}, [&] {
    if (lacks_context()) return CUDA_ERROR_INVALID_CONTEXT;
    const auto it = event_of(event);
    if (it == events_.end()) return CUDA_ERROR_INVALID_HANDLE;
    return finished(it->second.captured) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  });
}

CUresult FakeDriver::State::event_synchronize(CUevent event) {
  std::vector<std::uint64_t> waited;
  const CUresult rc = run("cuEventSynchronize", {as_int(event)}, [&] {
    if (lacks_context()) return CUDA_ERROR_INVALID_CONTEXT;
    const auto it = event_of(event);
    if (it == events_.end()) return CUDA_ERROR_INVALID_HANDLE;
    waited = {it->second.captured};
    complete(it->second.captured);  // the wait is over: the GPU got there
    return CUDA_SUCCESS;
  });
  wait_finished(waited);
  return rc;
}

// An interprocess event's handle holds a tag and the event's key; opening it gives an event of its
// own that stands for the source (waits, queries and records reach the source's last record).
// Unlike the driver, the fake opens handles in the process that made them: its tests play both
// processes in one.
namespace {
constexpr std::uint64_t kIpcEventTag = 0x4641'4B45'4950'4345;  // "FAKEIPCE"
}  // namespace

CUresult FakeDriver::State::ipc_get_event_handle(CUipcEventHandle* handle, CUevent event) {
  return run("cuIpcGetEventHandle", {as_int(event)}, [&] {
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto it = events_.find(std::bit_cast<std::uintptr_t>(event));
    if (it == events_.end()) return CUDA_ERROR_INVALID_HANDLE;
    if (!it->second.interprocess) return CUDA_ERROR_INVALID_VALUE;
    *handle = CUipcEventHandle{};
    const std::uint64_t words[3] = {kIpcEventTag, static_cast<std::uint64_t>(it->first),
                                    it->second.serial};
    std::memcpy(handle->reserved, words, sizeof(words));
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::ipc_open_event_handle(CUevent* event, CUipcEventHandle handle) {
  return run("cuIpcOpenEventHandle", {}, [&] {
    if (event == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::uint64_t words[3] = {};
    std::memcpy(words, handle.reserved, sizeof(words));
    if (words[0] != kIpcEventTag) return CUDA_ERROR_INVALID_VALUE;
    // Every event of this fake is this process's own (see ipc_open_own_events).
    if (!config_.ipc_open_own_events) return CUDA_ERROR_INVALID_CONTEXT;
    const auto source = events_.find(static_cast<std::uintptr_t>(words[1]));
    if (source == events_.end() || !source->second.interprocess) return CUDA_ERROR_INVALID_VALUE;
    if (source->second.serial != words[2]) {
      // The handle's event was destroyed and its handle went to another: undefined with CUDA.
      violations_.push_back(fmt::format(
          "cuIpcOpenEventHandle of a handle whose event was destroyed (handle {:#x} now names "
          "another event)", source->first));
      return CUDA_ERROR_INVALID_VALUE;
    }
    const int device = current_device();
    if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
    const std::uintptr_t id = new_event_handle();
    events_.emplace(id, Event{device, 0, false, false, true, source->first, next_event_serial_++,
                              source->second.serial});
    *event = std::bit_cast<CUevent>(id);
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::event_elapsed_time(float* milliseconds, CUevent start, CUevent end) {
  return run("cuEventElapsedTime", {as_int(start), as_int(end)}, [&] {
    if (milliseconds == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto from = events_.find(std::bit_cast<std::uintptr_t>(start));
    const auto to = events_.find(std::bit_cast<std::uintptr_t>(end));
    if (from == events_.end() || to == events_.end()) return CUDA_ERROR_INVALID_HANDLE;
    for (const auto* e : {&from->second, &to->second}) {
      if (!e->timing || !e->recorded) return CUDA_ERROR_INVALID_HANDLE;
    }
    if (!finished(from->second.captured) || !finished(to->second.captured)) {
      return CUDA_ERROR_NOT_READY;
    }
    *milliseconds = static_cast<float>(record_times_.at(to->second.captured) -
                                       record_times_.at(from->second.captured));
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::launch_host_func(CUstream stream, CUhostFn fn, void* user_data) {
  return run("cuLaunchHostFunc", {as_int(stream)}, [&] {
    if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_stream(stream)) return CUDA_ERROR_INVALID_HANDLE;
    // An item of its stream: it runs once what precedes it has finished, on the host-function
    // thread (the lock is held here, so that thread cannot take the item before it is filled).
    Item& item = items_.at(enqueue(ItemKind::host, stream, {}));
    item.fn = fn;
    item.user_data = user_data;
    return CUDA_SUCCESS;
  });
}

}  // namespace salus::test
