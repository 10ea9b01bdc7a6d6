// HandleRegistry: see handle_registry.hpp.
#include "cuda/handle_registry.hpp"

#include <fmt/format.h>

namespace salus::cuda {

// --- chunks ------------------------------------------------------------------------------------

std::optional<HandleRegistry::Chunk> HandleRegistry::find_chunk(ChunkHandle chunk) const {
  const std::scoped_lock lock(mu_);
  const auto it = chunks_.find(chunk.value);
  if (it == chunks_.end()) return std::nullopt;
  return it->second;
}

ChunkHandle HandleRegistry::adopt_chunk(CUmemGenericAllocationHandle handle, Location where,
                                        std::size_t bytes) {
  try {
    const std::scoped_lock lock(mu_);
    const auto [it, fresh] = chunks_.emplace(handle, Chunk{where, bytes});
    if (!fresh) ++it->second.references;
  } catch (...) {
    api_.cuMemRelease(handle);  // only bad_alloc can land here; do not leak device memory
    throw;
  }
  return ChunkHandle{handle};
}

void HandleRegistry::drop_chunk_reference(ChunkHandle chunk) {
  const std::scoped_lock lock(mu_);
  if (const auto it = chunks_.find(chunk.value);
      it != chunks_.end() && --it->second.references == 0) {
    chunks_.erase(it);
  }
}

// --- streams -----------------------------------------------------------------------------------

StreamHandle HandleRegistry::adopt_stream(int device, CUstream stream) {
  const StreamHandle handle{std::bit_cast<std::uint64_t>(stream)};
  try {
    const std::scoped_lock lock(mu_);
    streams_.emplace(handle.value, device);
  } catch (...) {
    api_.cuStreamDestroy(stream);
    throw;
  }
  return handle;
}

int HandleRegistry::device_of(StreamHandle stream, int fallback) const {
  if (is_default_stream(stream)) return fallback;
  {
    const std::scoped_lock lock(mu_);
    const auto it = streams_.find(stream.value);
    if (it != streams_.end()) return it->second;
  }
  return device_of_foreign(stream);
}

int HandleRegistry::device_of_foreign(StreamHandle stream) const {
  // A framework's stream. The driver knows its context; nothing is cached, since a destroyed
  // stream's handle may come back as another stream of another device.
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
  const int device = contexts_.device_of(context);
  if (device < 0) {
    throw InvalidArgument(
        fmt::format("stream {:#x} belongs to a CUDA context that is no device's primary context",
                    stream.value));
  }
  return device;
}

void HandleRegistry::forget_stream(StreamHandle stream) {
  const std::scoped_lock lock(mu_);
  streams_.erase(stream.value);
}

// --- events ------------------------------------------------------------------------------------

EventHandle HandleRegistry::adopt_event(int device, CUevent event, bool shareable) {
  const EventHandle handle{std::bit_cast<std::uint64_t>(event)};
  try {
    const std::scoped_lock lock(mu_);
    const auto [it, fresh] = events_.emplace(handle.value, device);
    try {
      if (shareable) shareable_events_.insert(handle.value);
    } catch (...) {
      if (fresh) events_.erase(it);  // listed both ways or not at all
      throw;
    }
  } catch (...) {
    api_.cuEventDestroy(event);
    throw;
  }
  return handle;
}

int HandleRegistry::device_of(EventHandle event) const {
  const std::scoped_lock lock(mu_);
  const auto it = events_.find(event.value);
  if (it == events_.end()) {
    throw InvalidArgument(fmt::format("unknown event handle {:#x}", event.value));
  }
  return it->second;
}

bool HandleRegistry::shareable(EventHandle event) const {
  const std::scoped_lock lock(mu_);
  return shareable_events_.contains(event.value);
}

void HandleRegistry::forget_event(EventHandle event) {
  const std::scoped_lock lock(mu_);
  events_.erase(event.value);
  shareable_events_.erase(event.value);
}

}  // namespace salus::cuda
