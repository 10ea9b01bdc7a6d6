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

}  // namespace

// A default stream is the current context's: its device's context is bound for the call.
template <class Call>
CUresult CudaBackend::on_stream(StreamHandle stream, int device, Call&& call) const {
  if (!is_default_stream(stream)) return on_handle(device, std::forward<Call>(call));
  const auto scope = contexts_.bind(device);
  return call();
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
  // A framework's stream is told by its (retained) context.
  static_cast<void>(contexts_.context(device));
  const int owner = handles_.device_of(stream, device);
  if (owner != device) {
    throw InvalidArgument(fmt::format("stream {:#x} belongs to device {}, not device {}",
                                      stream.value, owner, device));
  }
}

StreamHandle CudaBackend::do_create_stream(int device, int priority) {
  const auto scope = contexts_.bind(device);
  CUstream stream = nullptr;
  // Non-blocking: Salus streams must not serialize against the legacy default stream that
  // framework code may still use.
  SALUS_CU(api_, cuStreamCreateWithPriority, &stream, CU_STREAM_NON_BLOCKING, priority);
  return handles_.adopt_stream(device, stream);
}

void CudaBackend::do_destroy_stream(StreamHandle stream) {
  const int device = handles_.device_of(stream);
  const auto scope = contexts_.bind(device);
  SALUS_CU(api_, cuStreamDestroy, to_cu(stream));
  handles_.forget_stream(stream);
}

void CudaBackend::do_synchronize_stream(StreamHandle stream) {
  const int device = handles_.device_of(stream);
  check(api_, "cuStreamSynchronize", on_stream(stream, device, [&] {
          return api_.cuStreamSynchronize(to_cu(stream));
        }));
}

bool CudaBackend::do_stream_capturing(StreamHandle stream) {
  if (is_default_stream(stream)) return false;  // the legacy stream cannot capture
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  check(api_, "cuStreamIsCapturing", on_handle(handles_.device_of(stream), [&] {
          return api_.cuStreamIsCapturing(to_cu(stream), &status);
        }));
  return status != CU_STREAM_CAPTURE_STATUS_NONE;  // an invalidated capture is not over yet
}

bool CudaBackend::do_query_stream(StreamHandle stream, int device) {
  const CUresult rc = on_stream(stream, handles_.device_of(stream, device),
                                [&] { return api_.cuStreamQuery(to_cu(stream)); });
  if (rc == CUDA_SUCCESS) return true;
  if (rc == CUDA_ERROR_NOT_READY) return false;
  throw driver_error(api_, "cuStreamQuery", rc);
}

EventHandle CudaBackend::make_event(int device, unsigned flags, bool shareable) {
  const auto scope = contexts_.bind(device);
  CUevent event = nullptr;
  SALUS_CU(api_, cuEventCreate, &event, flags);
  return handles_.adopt_event(device, event, shareable);
}

EventHandle CudaBackend::do_create_event(int device) {
  // Salus mostly orders work with events; timing would make every record heavier.
  return make_event(device, CU_EVENT_DISABLE_TIMING);
}

EventHandle CudaBackend::do_create_timing_event(int device) {
  return make_event(device, CU_EVENT_DEFAULT);
}

double CudaBackend::do_elapsed_seconds(EventHandle start, EventHandle end) {
  const int device = handles_.device_of(start);
  (void)handles_.device_of(end);  // refuses unknown events before any driver call
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
  const auto scope = contexts_.bind(handles_.device_of(event));
  SALUS_CU(api_, cuEventDestroy, to_cu(event));
  handles_.forget_event(event);
}

// --- interprocess events ---------------------------------------------------------------------

EventHandle CudaBackend::do_create_shareable_event(int device) {
  if (api_.cuIpcGetEventHandle == nullptr || api_.cuIpcOpenEventHandle == nullptr) {
    throw NotSupported("create_shareable_event: this CUDA driver has no interprocess events");
  }
  caps_.require_ipc_events(device, "create_shareable_event");
  // The driver demands no timing for an interprocess event.
  return make_event(device, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING, /*shareable=*/true);
}

SharedEvent CudaBackend::do_export_event(EventHandle event) {
  const int device = handles_.device_of(event);
  if (!handles_.shareable(event)) {
    throw InvalidArgument(fmt::format(
        "export_event: event {:#x} is not shareable (make it with create_shareable_event)",
        event.value));
  }
  const auto scope = contexts_.bind(device);
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
  caps_.require_ipc_events(device, "import_event");
  const auto scope = contexts_.bind(device);
  CUipcEventHandle handle{};
  std::memcpy(handle.reserved, shared.handle.data(), sizeof(handle.reserved));
  CUevent event = nullptr;
  SALUS_CU(api_, cuIpcOpenEventHandle, &event, handle);
  return handles_.adopt_event(device, event);
}

void CudaBackend::do_record_event(EventHandle event, StreamHandle stream) {
  const int device = handles_.device_of(event);
  check(api_, "cuEventRecord", on_stream(stream, handles_.device_of(stream, device), [&] {
          return api_.cuEventRecord(to_cu(event), to_cu(stream));
        }));
}

bool CudaBackend::do_query_event(EventHandle event) {
  const CUresult rc =
      on_handle(handles_.device_of(event), [&] { return api_.cuEventQuery(to_cu(event)); });
  if (rc == CUDA_SUCCESS) return true;
  if (rc == CUDA_ERROR_NOT_READY) return false;
  throw driver_error(api_, "cuEventQuery", rc);
}

void CudaBackend::do_synchronize_event(EventHandle event) {
  check(api_, "cuEventSynchronize", on_handle(handles_.device_of(event), [&] {
          return api_.cuEventSynchronize(to_cu(event));
        }));
}

void CudaBackend::do_stream_wait_event(StreamHandle stream, EventHandle event, int device) {
  (void)handles_.device_of(event);  // refuses unknown events before any driver call
  // The wait is enqueued on the stream, so the stream's context is the one that matters; the
  // event may belong to another device (cross-device dependencies are allowed).
  check(api_, "cuStreamWaitEvent", on_stream(stream, handles_.device_of(stream, device), [&] {
          return api_.cuStreamWaitEvent(to_cu(stream), to_cu(event), CU_EVENT_WAIT_DEFAULT);
        }));
}

void CudaBackend::do_launch_host_func(StreamHandle stream, std::function<void()> fn) {
  const auto scope = contexts_.bind(handles_.device_of(stream));
  // The driver carries one void*; the closure travels in it and the trampoline adopts it.
  auto closure = std::make_unique<std::function<void()>>(std::move(fn));
  const CUresult rc = api_.cuLaunchHostFunc(to_cu(stream), &host_func_trampoline, closure.get());
  if (rc != CUDA_SUCCESS) throw driver_error(api_, "cuLaunchHostFunc", rc);  // closure still ours
  // Enqueued: from here the trampoline owns it (it may even have run already).
  static_cast<void>(closure.release());
}

void CudaBackend::do_copy_async(DevicePtr dst, DevicePtr src, std::size_t bytes,
                                StreamHandle stream) {
  const auto scope = contexts_.bind(handles_.device_of(stream));
  SALUS_CU(api_, cuMemcpyAsync, static_cast<CUdeviceptr>(dst), static_cast<CUdeviceptr>(src), bytes,
           to_cu(stream));
}

void CudaBackend::do_fill_async(DevicePtr dst, std::uint8_t value, std::size_t bytes,
                                StreamHandle stream) {
  const auto scope = contexts_.bind(handles_.device_of(stream));
  SALUS_CU(api_, cuMemsetD8Async, static_cast<CUdeviceptr>(dst), value, bytes, to_cu(stream));
}

}  // namespace salus::cuda
