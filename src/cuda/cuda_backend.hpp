// The device layer on the CUDA driver API (virtual memory management, streams, events). It talks
// to the driver only through a DriverApi table, so tests run it against a fake driver.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cuda/driver_api.hpp"
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
  [[nodiscard]] int do_device_count() const override {
    return static_cast<int>(devices_.size());
  }
  [[nodiscard]] DeviceProperties do_properties(int device) const override;
  [[nodiscard]] std::size_t do_free_memory(int device) const override;
  [[nodiscard]] std::size_t do_granularity(Location where) const override;
  // The smallest granularity of any location: every address and size the driver can accept for
  // map, unmap or set_access is a multiple of it.
  [[nodiscard]] std::size_t do_address_granularity() const noexcept override {
    return address_granularity_;
  }
  [[nodiscard]] PeerLink do_peer_link(int from, int to) const override;

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

  // One retained primary context; released on destruction.
  class PrimaryContext {
   public:
    PrimaryContext(const DriverApi& api, CUdevice device);
    PrimaryContext(PrimaryContext&& other) noexcept;
    PrimaryContext& operator=(PrimaryContext&&) = delete;
    PrimaryContext(const PrimaryContext&) = delete;
    PrimaryContext& operator=(const PrimaryContext&) = delete;
    ~PrimaryContext();

    [[nodiscard]] CUdevice device() const noexcept { return device_; }
    [[nodiscard]] CUcontext context() const noexcept { return context_; }

   private:
    const DriverApi* api_;
    CUdevice device_ = 0;
    CUcontext context_ = nullptr;
  };

  // Makes a device's primary context current on this thread until destroyed, then restores the
  // previous one.
  class [[nodiscard]] ScopedContext {
   public:
    ScopedContext(const DriverApi& api, CUcontext context);
    ScopedContext(const ScopedContext&) = delete;
    ScopedContext& operator=(const ScopedContext&) = delete;
    ~ScopedContext();

   private:
    const DriverApi& api_;
    CUcontext previous_ = nullptr;
    bool restore_ = false;
  };

  struct ChunkInfo {
    Location where;
    std::size_t bytes = 0;
    // The driver's references behind this handle value, one cuMemRelease each: 1, plus one per
    // import that returned a handle already held (the driver does not promise a new one).
    int references = 1;
  };

  // A device's primary context, or nullptr until something retains it (context()).
  class LazyContext {
   public:
    [[nodiscard]] CUcontext context() const noexcept {
      return context_.load(std::memory_order_acquire);
    }

   private:
    friend class CudaBackend;
    std::atomic<CUcontext> context_{nullptr};
    std::unique_ptr<PrimaryContext> owner_;  // guarded by context_mu_
  };
  // What the driver supports for a device, read once at construction (no context needed).
  struct DeviceCaps {
    CUdevice device = 0;
    bool gpu_direct_rdma = false;  // VMM chunks may carry the GPUDirect RDMA flag
    bool posix_fd = false;         // VMM chunks may be exported as POSIX file descriptors
    int host_numa_id = 0;          // the host NUMA node nearest the device (0 without NUMA)
    bool ipc_events = false;       // interprocess events (not on every platform: e.g. WSL)
  };

  // NotSupported, naming `what`, where the device has no interprocess events.
  void check_ipc_events(int device, std::string_view what) const;
  // The primary context of `device`, retained on first use (thread-safe).
  [[nodiscard]] CUcontext context(int device) const;
  [[nodiscard]] ScopedContext bind(int device) const;
  // `call()` (a driver call on a stream or event handle that names its context) as it is; again
  // with `device`'s context bound if the driver wants a current context for it.
  template <class Call>
  CUresult on_handle(int device, Call&& call) const {
    const CUresult rc = call();
    if (rc != CUDA_ERROR_INVALID_CONTEXT) return rc;
    const auto scope = bind(device);
    return call();
  }
  // As on_handle for a created stream; a default stream (0, legacy, per-thread) means the current
  // context's, so `device`'s is bound for it.
  template <class Call>
  CUresult on_stream(StreamHandle stream, int device, Call&& call) const;
  // For calls about no device in particular (address space, host chunks): a device whose context
  // is already retained, so that such calls never retain one more; device 0 when none is.
  [[nodiscard]] int any_device() const noexcept;
  [[nodiscard]] int attribute(CUdevice_attribute attribute, int device, int fallback) const;
  [[nodiscard]] DeviceCaps read_caps(int device) const;
  // Picks how host chunks are asked for (HOST on 13.0+, else HOST_NUMA on the node nearest
  // device 0) and caches their granularity; leaves host_location_ empty when neither works.
  void choose_host_location();
  // cuMemGetAllocationGranularity (MINIMUM) without a context when the driver allows it, else
  // with `device`'s.
  CUresult query_granularity(const CUmemAllocationProp& prop, int device, std::size_t* out);
  [[nodiscard]] CUmemLocation cu_location(Location where) const;
  [[nodiscard]] CUmemAllocationProp allocation_prop(Location where) const;
  // The device a stream (or, for handle 0 and the legacy and per-thread default streams,
  // `fallback`) belongs to. Streams this backend did not create (a framework's) are looked up
  // through the driver (cuStreamGetCtx). InvalidArgument if the driver does not know it.
  [[nodiscard]] int device_of(StreamHandle stream, int fallback = 0) const;
  // The device whose primary context is `context`, or -1 (a context the application made).
  // Retains the contexts of devices not used yet while looking, until one matches.
  [[nodiscard]] int device_of(CUcontext context) const;
  [[nodiscard]] int device_of(EventHandle event) const;
  // cuEventCreate with `flags` on `device`, registered for device_of.
  EventHandle make_event(int device, unsigned flags);
  // Lists an event the driver made on `device` (destroying it if the listing fails).
  EventHandle adopt_event(int device, CUevent event);
  [[nodiscard]] ChunkInfo chunk_info(ChunkHandle chunk) const;
  // Remembers a handle cuMemCreate or cuMemImportFromShareableHandle just gave (one more
  // reference when it is held already); releases it again if even that fails (bad_alloc).
  void adopt_chunk(CUmemGenericAllocationHandle handle, ChunkInfo info);

  DriverApi api_;  // first: the contexts below release through it
  std::vector<DeviceCaps> devices_;
  mutable std::mutex context_mu_;  // serializes retaining
  mutable std::vector<LazyContext> contexts_;
  std::vector<std::size_t> device_granularity_;
  std::optional<std::size_t> host_granularity_;  // empty when the driver has no host VMM chunks
  std::optional<CUmemLocation> host_location_;   // how host(0) chunks are asked for
  std::size_t address_granularity_ = 0;

  mutable std::mutex mutex_;  // guards the maps below
  std::unordered_map<std::uint64_t, ChunkInfo> chunks_;
  std::unordered_map<std::uint64_t, int> streams_;
  std::unordered_map<std::uint64_t, int> events_;
  std::unordered_set<std::uint64_t> shareable_events_;  // made by create_shareable_event
};


}  // namespace salus::cuda
