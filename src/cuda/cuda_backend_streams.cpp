// CudaBackend: streams, events, host functions and copies.
#include <fmt/format.h>

#include <cstring>

#include <bit>
#include <exception>
#include <memory>
#include <utility>

#include "cuda/cuda_backend.hpp"
#include "log/log.hpp"

namespace salus::cuda {

namespace {

// Handles are the driver's pointers as integers: stable, unique while live, and 0 is never a
// created stream (it is the legacy default stream).
CUstream to_cu(StreamHandle stream) {
  return std::bit_cast<CUstream>(stream.value);
}
CUevent to_cu(EventHandle event) {
  return std::bit_cast<CUevent>(event.value);
}

// Runs on a driver thread. It owns the closure from here on, and nothing may unwind into the
// driver, so every exception ends here (logged, as there is no caller to hand it to).
void host_func_trampoline(void* user_data) noexcept {
  const std::unique_ptr<std::function<void()>> fn(static_cast<std::function<void()>*>(user_data));
  try {
    (*fn)();
  } catch (const std::exception& e) {
    log::error("a host function on a CUDA stream threw: {}", e.what());
  } catch (...) {
    log::error("a host function on a CUDA stream threw a non-standard exception");
  }
}

// The driver's stand-ins for the default stream: valid on every device, never created.
bool is_default_stream(StreamHandle stream) {
  return stream.value == 0 || stream.value == std::bit_cast<std::uint64_t>(CU_STREAM_LEGACY) ||
         stream.value == std::bit_cast<std::uint64_t>(CU_STREAM_PER_THREAD);
}

}  // namespace

// A default stream is the current context's: its device's context is bound for the call.
template <class Call>
CUresult CudaBackend::on_stream(StreamHandle stream, int device, Call&& call) const {
  if (!is_default_stream(stream)) return on_handle(device, std::forward<Call>(call));
  const auto scope = bind(device);
  return call();
}

int CudaBackend::device_of(StreamHandle stream, int fallback) const {
  if (is_default_stream(stream)) return fallback;
  {
    const std::scoped_lock lock(mutex_);
    const auto it = streams_.find(stream.value);
    if (it != streams_.end()) return it->second;
  }
  // Not ours: a framework's stream. The driver knows its context; nothing is cached, since a
  // destroyed stream's handle may come back as another stream of another device.
  CUcontext context = nullptr;
  const CUresult rc = api_.cuStreamGetCtx(to_cu(stream), &context);
  // A handle the driver does not know is the caller's mistake; anything else is the driver's.
  if (rc != CUDA_SUCCESS && rc != CUDA_ERROR_INVALID_HANDLE && rc != CUDA_ERROR_INVALID_VALUE &&
      rc != CUDA_ERROR_CONTEXT_IS_DESTROYED) {
    throw driver_error(api_, "cuStreamGetCtx", rc);
  }
  if (rc != CUDA_SUCCESS) {
    throw InvalidArgument(fmt::format(
        "stream {:#x} is no stream the CUDA driver knows (never created, or destroyed): "
        "cuStreamGetCtx returned {}",
        stream.value, error_name(api_, rc)));
  }
  const int device = device_of(context);
  if (device < 0) {
    throw InvalidArgument(fmt::format(
        "stream {:#x} belongs to a CUDA context that is no device's primary context", stream.value));
  }
  return device;
}

int CudaBackend::device_of(CUcontext context) const {
  for (std::size_t d = 0; d < contexts_.size(); ++d) {
    if (contexts_[d].context() == context) return static_cast<int>(d);
  }
  // A device Salus has not used yet: contexts are retained lazily. A stream's context exists, so
  // retaining that device's primary context costs nothing new; the search stops at the match.
  for (std::size_t d = 0; d < contexts_.size(); ++d) {
    if (contexts_[d].context() != nullptr) continue;
    try {
      if (this->context(static_cast<int>(d)) == context) return static_cast<int>(d);
    } catch (const DeviceError&) {
      // A device the driver will not give a context is not the stream's.
    }
  }
  return -1;
}

void CudaBackend::do_validate_stream(StreamHandle stream, int device) {
  if (stream.value == std::bit_cast<std::uint64_t>(CU_STREAM_PER_THREAD)) {
    // It names a different stream on each thread: a fence recorded on it from another thread
    // (a free, a cancel) would land on that thread's stream and order nothing.
    throw InvalidArgument(
        "the per-thread default stream (CU_STREAM_PER_THREAD) names another stream on each "
        "thread, so Salus cannot order work on it from other threads: use a created stream "
        "(or the legacy default stream, 0)");
  }
  static_cast<void>(context(device));  // a framework's stream is told by its (retained) context
  const int owner = device_of(stream, device);
  if (owner != device) {
    throw InvalidArgument(fmt::format("stream {:#x} belongs to device {}, not device {}",
                                      stream.value, owner, device));
  }
}

int CudaBackend::device_of(EventHandle event) const {
  const std::scoped_lock lock(mutex_);
  const auto it = events_.find(event.value);
  if (it == events_.end()) {
    throw InvalidArgument(fmt::format("unknown event handle {:#x}", event.value));
  }
  return it->second;
}

StreamHandle CudaBackend::do_create_stream(int device, int priority) {
  const auto scope = bind(device);
  CUstream stream = nullptr;
  // Non-blocking: Salus streams must not serialize against the legacy default stream that
  // framework code may still use.
  SALUS_CU(api_, cuStreamCreateWithPriority, &stream, CU_STREAM_NON_BLOCKING, priority);
  const StreamHandle handle{std::bit_cast<std::uint64_t>(stream)};
  try {
    const std::scoped_lock lock(mutex_);
    streams_.emplace(handle.value, device);
  } catch (...) {
    api_.cuStreamDestroy(stream);
    throw;
  }
  return handle;
}

void CudaBackend::do_destroy_stream(StreamHandle stream) {
  const int device = device_of(stream);
  const auto scope = bind(device);
  SALUS_CU(api_, cuStreamDestroy, to_cu(stream));
  const std::scoped_lock lock(mutex_);
  streams_.erase(stream.value);
}

void CudaBackend::do_synchronize_stream(StreamHandle stream) {
  const int device = device_of(stream);
  check(api_, "cuStreamSynchronize", on_stream(stream, device, [&] {
          return api_.cuStreamSynchronize(to_cu(stream));
        }));
}

bool CudaBackend::do_stream_capturing(StreamHandle stream) {
  if (is_default_stream(stream)) return false;  // the legacy stream cannot capture
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  check(api_, "cuStreamIsCapturing", on_handle(device_of(stream), [&] {
          return api_.cuStreamIsCapturing(to_cu(stream), &status);
        }));
  return status != CU_STREAM_CAPTURE_STATUS_NONE;  // an invalidated capture is not over yet
}

bool CudaBackend::do_query_stream(StreamHandle stream, int device) {
  const CUresult rc = on_stream(stream, device_of(stream, device),
                                [&] { return api_.cuStreamQuery(to_cu(stream)); });
  if (rc == CUDA_SUCCESS) return true;
  if (rc == CUDA_ERROR_NOT_READY) return false;
  throw driver_error(api_, "cuStreamQuery", rc);
}

EventHandle CudaBackend::make_event(int device, unsigned flags) {
  const auto scope = bind(device);
  CUevent event = nullptr;
  SALUS_CU(api_, cuEventCreate, &event, flags);
  return adopt_event(device, event);
}

EventHandle CudaBackend::adopt_event(int device, CUevent event) {
  const EventHandle handle{std::bit_cast<std::uint64_t>(event)};
  try {
    const std::scoped_lock lock(mutex_);
    events_.emplace(handle.value, device);
  } catch (...) {
    api_.cuEventDestroy(event);
    throw;
  }
  return handle;
}

EventHandle CudaBackend::do_create_event(int device) {
  // Salus mostly orders work with events; timing would make every record heavier.
  return make_event(device, CU_EVENT_DISABLE_TIMING);
}

EventHandle CudaBackend::do_create_timing_event(int device) {
  return make_event(device, CU_EVENT_DEFAULT);
}

double CudaBackend::do_elapsed_seconds(EventHandle start, EventHandle end) {
  const int device = device_of(start);
  (void)device_of(end);  // refuses unknown events before any driver call
  float milliseconds = 0.0F;
  const CUresult rc = on_handle(
      device, [&] { return api_.cuEventElapsedTime(&milliseconds, to_cu(start), to_cu(end)); });
  if (rc == CUDA_ERROR_NOT_READY) {
    throw driver_error(api_, "cuEventElapsedTime", rc,
                       fmt::format("event {:#x} or {:#x} has not completed yet", start.value,
                                   end.value));
  }
  if (rc == CUDA_ERROR_INVALID_HANDLE) {
    // Both handles are live events (device_of said so), so the driver means one was never
    // recorded or was made without timing: the caller's mistake, not the driver's.
    throw InvalidArgument(fmt::format(
        "elapsed_seconds: event {:#x} or {:#x} was never recorded or is no timing event (use "
        "create_timing_event); cuEventElapsedTime returned {}",
        start.value, end.value, error_name(api_, rc)));
  }
  if (rc != CUDA_SUCCESS) throw driver_error(api_, "cuEventElapsedTime", rc);
  return static_cast<double>(milliseconds) / 1e3;
}

void CudaBackend::do_destroy_event(EventHandle event) {
  const auto scope = bind(device_of(event));
  SALUS_CU(api_, cuEventDestroy, to_cu(event));
  const std::scoped_lock lock(mutex_);
  events_.erase(event.value);
  shareable_events_.erase(event.value);
}

// --- interprocess events ---------------------------------------------------------------------

void CudaBackend::check_ipc_events(int device, std::string_view what) const {
  if (!devices_[static_cast<std::size_t>(device)].ipc_events) {
    throw NotSupported(fmt::format(
        "{}: device {} has no interprocess events (CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED is 0)",
        what, device));
  }
}

EventHandle CudaBackend::do_create_shareable_event(int device) {
  if (api_.cuIpcGetEventHandle == nullptr || api_.cuIpcOpenEventHandle == nullptr) {
    throw NotSupported("create_shareable_event: this CUDA driver has no interprocess events");
  }
  check_ipc_events(device, "create_shareable_event");
  // The driver demands no timing for an interprocess event.
  const EventHandle event = make_event(device, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING);
  const std::scoped_lock lock(mutex_);
  shareable_events_.insert(event.value);
  return event;
}

SharedEvent CudaBackend::do_export_event(EventHandle event) {
  const int device = device_of(event);
  {
    const std::scoped_lock lock(mutex_);
    if (!shareable_events_.contains(event.value)) {
      throw InvalidArgument(fmt::format(
          "export_event: event {:#x} is not shareable (make it with create_shareable_event)",
          event.value));
    }
  }
  const auto scope = bind(device);
  CUipcEventHandle handle{};
  SALUS_CU(api_, cuIpcGetEventHandle, &handle, to_cu(event));
  SharedEvent out;
  static_assert(sizeof(handle.reserved) == std::tuple_size_v<decltype(out.handle)>);
  std::memcpy(out.handle.data(), handle.reserved, sizeof(handle.reserved));
  return out;
}

EventHandle CudaBackend::do_import_event(int device, const SharedEvent& shared) {
  if (api_.cuIpcOpenEventHandle == nullptr) {
    throw NotSupported("import_event: this CUDA driver has no interprocess events");
  }
  check_ipc_events(device, "import_event");
  const auto scope = bind(device);
  CUipcEventHandle handle{};
  std::memcpy(handle.reserved, shared.handle.data(), sizeof(handle.reserved));
  CUevent event = nullptr;
  SALUS_CU(api_, cuIpcOpenEventHandle, &event, handle);
  return adopt_event(device, event);
}

void CudaBackend::do_record_event(EventHandle event, StreamHandle stream) {
  const int device = device_of(event);
  check(api_, "cuEventRecord", on_stream(stream, device_of(stream, device), [&] {
          return api_.cuEventRecord(to_cu(event), to_cu(stream));
        }));
}

bool CudaBackend::do_query_event(EventHandle event) {
  const CUresult rc =
      on_handle(device_of(event), [&] { return api_.cuEventQuery(to_cu(event)); });
  if (rc == CUDA_SUCCESS) return true;
  if (rc == CUDA_ERROR_NOT_READY) return false;
  throw driver_error(api_, "cuEventQuery", rc);
}

void CudaBackend::do_synchronize_event(EventHandle event) {
  check(api_, "cuEventSynchronize",
        on_handle(device_of(event), [&] { return api_.cuEventSynchronize(to_cu(event)); }));
}

void CudaBackend::do_stream_wait_event(StreamHandle stream, EventHandle event, int device) {
  (void)device_of(event);  // refuses unknown events before any driver call
  // The wait is enqueued on the stream, so the stream's context is the one that matters; the
  // event may belong to another device (cross-device dependencies are allowed).
  check(api_, "cuStreamWaitEvent", on_stream(stream, device_of(stream, device), [&] {
          return api_.cuStreamWaitEvent(to_cu(stream), to_cu(event), CU_EVENT_WAIT_DEFAULT);
        }));
}

void CudaBackend::do_launch_host_func(StreamHandle stream, std::function<void()> fn) {
  const auto scope = bind(device_of(stream));
  // The driver carries one void*; the closure travels in it and the trampoline adopts it.
  auto closure = std::make_unique<std::function<void()>>(std::move(fn));
  const CUresult rc = api_.cuLaunchHostFunc(to_cu(stream), &host_func_trampoline, closure.get());
  if (rc != CUDA_SUCCESS) throw driver_error(api_, "cuLaunchHostFunc", rc);  // closure still ours
  // Enqueued: from here the trampoline owns it (it may even have run already).
  static_cast<void>(closure.release());
}

void CudaBackend::do_copy_async(DevicePtr dst, DevicePtr src, std::size_t bytes,
                                StreamHandle stream) {
  const auto scope = bind(device_of(stream));
  SALUS_CU(api_, cuMemcpyAsync, static_cast<CUdeviceptr>(dst), static_cast<CUdeviceptr>(src), bytes,
           to_cu(stream));
}

void CudaBackend::do_fill_async(DevicePtr dst, std::uint8_t value, std::size_t bytes,
                                StreamHandle stream) {
  const auto scope = bind(device_of(stream));
  SALUS_CU(api_, cuMemsetD8Async, static_cast<CUdeviceptr>(dst), value, bytes, to_cu(stream));
}

}  // namespace salus::cuda
