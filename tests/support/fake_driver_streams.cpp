// The fake driver's streams, events and host functions. Work "finishes" as soon as it is enqueued,
// except events held pending by the test (hold_events), which model a busy GPU.
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
    *stream = std::bit_cast<CUstream>(next_object_);
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::stream_destroy(CUstream stream) {
  return run("cuStreamDestroy", {as_int(stream)}, [&] {
    return streams_.erase(std::bit_cast<std::uintptr_t>(stream)) == 1 ? CUDA_SUCCESS
                                                                      : CUDA_ERROR_INVALID_HANDLE;
  });
}

CUresult FakeDriver::State::stream_synchronize(CUstream stream) {
  return run("cuStreamSynchronize", {as_int(stream)}, [&] {
    if (!valid_stream(stream)) return CUDA_ERROR_INVALID_HANDLE;
    // Waiting for the stream is waiting for whatever was recorded on it (on the legacy stream,
    // for everything).
    for (auto& [handle, event] : events_) {
      if (event.state == EventState::pending && (stream == nullptr || event.stream == stream)) {
        event.state = EventState::complete;
      }
    }
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::stream_wait_event(CUstream stream, CUevent event, unsigned flags) {
  return run("cuStreamWaitEvent", {as_int(stream), as_int(event), flags}, [&] {
    if (!valid_stream(stream) || !events_.contains(std::bit_cast<std::uintptr_t>(event))) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  });
}

CUresult FakeDriver::State::event_create(CUevent* event, unsigned flags) {
  return run("cuEventCreate", {flags}, [&] {
    if (event == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const int device = current_device();
    if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
    next_object_ += 0x10;
    events_.emplace(next_object_, Event{device, EventState::never_recorded, nullptr});
    *event = std::bit_cast<CUevent>(next_object_);
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::event_destroy(CUevent event) {
  return run("cuEventDestroy", {as_int(event)}, [&] {
    return events_.erase(std::bit_cast<std::uintptr_t>(event)) == 1 ? CUDA_SUCCESS
                                                                    : CUDA_ERROR_INVALID_HANDLE;
  });
}

CUresult FakeDriver::State::event_record(CUevent event, CUstream stream) {
  return run("cuEventRecord", {as_int(event), as_int(stream)}, [&] {
    const auto it = events_.find(std::bit_cast<std::uintptr_t>(event));
    if (it == events_.end() || !valid_stream(stream)) return CUDA_ERROR_INVALID_HANDLE;
    it->second.state = hold_events_ ? EventState::pending : EventState::complete;
    it->second.stream = stream;
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::event_query(CUevent event) {
  return run("cuEventQuery", {as_int(event)}, [&] {
    const auto it = events_.find(std::bit_cast<std::uintptr_t>(event));
    if (it == events_.end()) return CUDA_ERROR_INVALID_HANDLE;
    return it->second.state == EventState::pending ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::event_synchronize(CUevent event) {
  return run("cuEventSynchronize", {as_int(event)}, [&] {
    const auto it = events_.find(std::bit_cast<std::uintptr_t>(event));
    if (it == events_.end()) return CUDA_ERROR_INVALID_HANDLE;
    it->second.state = EventState::complete;  // the wait is over: the GPU got there
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::launch_host_func(CUstream stream, CUhostFn fn, void* user_data) {
  const CUresult rc = run("cuLaunchHostFunc", {as_int(stream)}, [&] {
    if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return valid_stream(stream) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
  });
  // Outside the lock: the function may call back into the backend (and so into this fake).
  if (rc == CUDA_SUCCESS) fn(user_data);
  return rc;
}

}  // namespace salus::test
