// The device layer on the CUDA driver API (virtual memory management, streams, events). It talks
// to the driver only through a DriverApi table, so tests run it against a fake driver.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>

#include "cuda/device_capabilities.hpp"
#include "cuda/driver_api.hpp"
#include "cuda/handle_registry.hpp"
#include "cuda/primary_contexts.hpp"
#include "salus/device.hpp"

namespace salus::cuda {

// Thread-safe. Every call that concerns a device makes that device's primary context current for
// the duration of the call and then restores whatever the thread had current before, so the
// application's own notion of "current device" (e.g. PyTorch's) is left alone. Calls on a stream
// or event handle other than a default stream are the exception: the handle names its context,
// so they run in whatever context the thread has (no cuCtxGetCurrent, no cuCtxSetCurrent: the
// hot path's events and queries cost one driver call each), and bind the device's context only
// when the driver answers CUDA_ERROR_INVALID_CONTEXT.
//
// Stream handle 0 is the legacy default stream. Calls that take only a stream use the stream's
// device; for handle 0 they use the device of the event involved if there is one, else device 0
// (with unified addressing, copies and host functions work from any device's context).
//
// It composes three parts, each with its own header and lock rule: the devices' primary contexts
// (PrimaryContexts), what the driver supports, read once (DeviceCapabilities), and which device
// each handle it made belongs to (HandleRegistry). The backend itself holds no lock.
class CudaBackend final : public DeviceBackend {
 public:
  // Initializes the driver and caches granularities and device attributes. A device's primary
  // context is retained on first use of that device only: each costs about half a gigabyte of
  // device memory, which a process that uses one GPU of eight should not pay eight times.
  // Throws NotSupported when the driver reports no device, DeviceError when a call fails.
  explicit CudaBackend(DriverApi api);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;
  CudaBackend(CudaBackend&&) = delete;
  CudaBackend& operator=(CudaBackend&&) = delete;

  [[nodiscard]] const DriverApi& driver() const noexcept { return api_; }

 private:
  // DeviceBackend (its public functions have checked the arguments; see salus/device.hpp).
  [[nodiscard]] std::string_view do_name() const noexcept override { return "cuda"; }
  [[nodiscard]] int do_device_count() const override { return caps_.count(); }
  [[nodiscard]] DeviceProperties do_properties(int device) const override {
    return caps_.properties(device);
  }
  [[nodiscard]] std::size_t do_free_memory(int device) const override;
  [[nodiscard]] std::size_t do_granularity(Location where) const override {
    return caps_.granularity(where);
  }
  [[nodiscard]] std::size_t do_address_granularity() const noexcept override {
    return caps_.address_granularity();
  }
  [[nodiscard]] PeerLink do_peer_link(int from, int to) const override {
    return caps_.peer_link(from, to);
  }

  ChunkHandle do_create_chunk(Location where, std::size_t bytes) override;
  void do_release_chunk(ChunkHandle chunk) override;
  SharedChunk do_export_chunk(ChunkHandle chunk) override;
  ChunkHandle do_import_chunk(Location where, const SharedChunk& shared) override;

  DevicePtr do_reserve_address(std::size_t bytes, std::size_t alignment) override;
  void do_free_address(DevicePtr base, std::size_t bytes) override;
  void do_map(DevicePtr va, std::size_t bytes, ChunkHandle chunk,
              std::size_t chunk_offset) override;
  void do_unmap(DevicePtr va, std::size_t bytes) override;
  void do_set_access(DevicePtr va, std::size_t bytes,
                     std::span<const AccessGrant> grants) override;

  [[nodiscard]] StreamPriorityRange do_stream_priority_range(int device) const override;
  StreamHandle do_create_stream(int device, int priority) override;
  void do_destroy_stream(StreamHandle stream) override;
  void do_synchronize_stream(StreamHandle stream) override;
  void do_validate_stream(StreamHandle stream, int device) override;
  [[nodiscard]] bool do_stream_capturing(StreamHandle stream) override;
  [[nodiscard]] bool do_query_stream(StreamHandle stream, int device) override;
  EventHandle do_create_event(int device) override;
  void do_destroy_event(EventHandle event) override;
  void do_record_event(EventHandle event, StreamHandle stream) override;
  [[nodiscard]] bool do_query_event(EventHandle event) override;
  void do_synchronize_event(EventHandle event) override;
  void do_stream_wait_event(StreamHandle stream, EventHandle event, int device) override;
  EventHandle do_create_shareable_event(int device) override;
  [[nodiscard]] SharedEvent do_export_event(EventHandle event) override;
  EventHandle do_import_event(int device, const SharedEvent& shared) override;
  void do_launch_host_func(StreamHandle stream, std::function<void()> fn) override;
  void do_fill_async(DevicePtr dst, std::uint8_t value, std::size_t bytes,
                     StreamHandle stream) override;
  void do_copy_async(DevicePtr dst, DevicePtr src, std::size_t bytes,
                     StreamHandle stream) override;
  EventHandle do_create_timing_event(int device) override;
  [[nodiscard]] double do_elapsed_seconds(EventHandle start, EventHandle end) override;

  // `call()` (a driver call on a stream or event handle that names its context) as it is; again
  // with `device`'s context bound if the driver wants a current context for it.
  template <class Call>
  CUresult on_handle(int device, Call&& call) const {
    const CUresult rc = call();
    if (rc != CUDA_ERROR_INVALID_CONTEXT) return rc;
    const auto scope = contexts_.bind(device);
    return call();
  }
  // As on_handle for a created stream; a default stream (0, legacy, per-thread) means the current
  // context's, so `device`'s is bound for it.
  template <class Call>
  CUresult on_stream(StreamHandle stream, int device, Call&& call) const;
  // Binds the context a chunk's driver calls run in: its device's, or for a host chunk one
  // already retained.
  [[nodiscard]] ScopedContext bind_for(Location where) const {
    return contexts_.bind(where.is_host() ? contexts_.any_retained() : where.index);
  }
  // cuEventCreate with `flags` on `device`, listed (as shareable or not).
  EventHandle make_event(int device, unsigned flags, bool shareable = false);
  // The listed chunk; InvalidArgument for an unknown handle.
  [[nodiscard]] HandleRegistry::Chunk chunk_info(ChunkHandle chunk) const;

  // Declaration order is construction order: each part uses those above it, and the contexts
  // release through api_ when they go.
  DriverApi api_;
  PrimaryContexts contexts_;
  DeviceCapabilities caps_;
  HandleRegistry handles_;
};

}  // namespace salus::cuda
