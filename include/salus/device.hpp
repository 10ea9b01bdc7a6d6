// The device layer: the one interface every layer above talks to. Two backends implement it:
// the CUDA driver API (loaded at run time, see salus/cuda.hpp) and simulated GPUs backed by host
// memory (see salus/sim.hpp).
//
// Conventions shared by every backend:
//  - Sizes handed to create_chunk, reserve_address, map, unmap and set_access are multiples of
//    granularity(); addresses handed to map/unmap/set_access are granularity-aligned. Violations
//    raise InvalidArgument; driver failures raise DeviceError naming the call.
//  - A StreamHandle with value 0 names the default stream of the device the call is about.
//  - A StreamHandle's value is the backend's native handle: a CUstream on CUDA (so a framework's
//    own streams can be passed in as they are), an opaque id on the sim backend.
//  - Handles are plain values: the owner (usually an RAII wrapper below) releases them.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "salus/error.hpp"
#include "salus/export.hpp"

namespace salus {

using DevicePtr = std::uintptr_t;

enum class LocationKind : std::uint8_t { device, host };

// Where physical memory lives: GPU `index`, or host memory (index is the NUMA node).
struct Location {
  LocationKind kind = LocationKind::device;
  int index = 0;

  static constexpr Location gpu(int device) { return {LocationKind::device, device}; }
  static constexpr Location host(int numa_node = 0) { return {LocationKind::host, numa_node}; }
  [[nodiscard]] constexpr bool is_host() const { return kind == LocationKind::host; }
  friend constexpr bool operator==(const Location&, const Location&) = default;
};

[[nodiscard]] SALUS_API std::string to_string(Location where);

// Strongly typed opaque handle: the backend gives the value its meaning.
template <class Tag>
struct Handle {
  std::uint64_t value = 0;
  friend constexpr auto operator<=>(const Handle&, const Handle&) = default;
};
using ChunkHandle = Handle<struct ChunkTag>;    // a physical memory chunk
using StreamHandle = Handle<struct StreamTag>;  // an in-order work queue on one device
using EventHandle = Handle<struct EventTag>;    // a marker recorded into a stream

struct DeviceProperties {
  std::string name;
  std::size_t total_memory = 0;  // bytes
  std::size_t granularity = 0;   // physical page size for create_chunk/map (bytes)
  // Whether host memory chunks (the host tier) are available, and how the driver is asked for
  // them: "HOST", "HOST_NUMA:<node>" (CUDA 12.x drivers refuse plain HOST), "sim", or empty.
  bool host_chunks = false;
  std::string host_chunk_location;
  // The device's chunks carry the GPUDirect RDMA flag / can be exported as file descriptors.
  bool gpu_direct_rdma = false;
  bool shareable_handles = false;
};

enum class LinkKind : std::uint8_t { self, nvlink, pcie, none };
[[nodiscard]] SALUS_API const char* to_string(LinkKind kind) noexcept;

// How `from` reaches memory that lives on `to`.
struct PeerLink {
  LinkKind kind = LinkKind::none;
  bool can_access = false;      // `from` may map and read/write memory of `to`
  int performance_rank = 0;     // the driver's relative rank: lower is faster
  double bandwidth_gbps = 0.0;  // one direction, GB/s; 0 when unknown
};

enum class Access : std::uint8_t { none, read, read_write };

// Access of one device to a mapped range.
struct AccessGrant {
  int device = 0;
  Access access = Access::read_write;
};

// Stream priorities follow CUDA: numerically lower is more urgent. `greatest` <= `least`.
struct StreamPriorityRange {
  int least = 0;
  int greatest = 0;
};

class SALUS_API DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  [[nodiscard]] virtual int device_count() const = 0;
  [[nodiscard]] virtual DeviceProperties properties(int device) const = 0;
  // Physical page size for chunks at `where`.
  [[nodiscard]] virtual std::size_t granularity(Location where) const = 0;
  [[nodiscard]] virtual PeerLink peer_link(int from, int to) const = 0;

  // Physical memory.
  virtual ChunkHandle create_chunk(Location where, std::size_t bytes) = 0;
  virtual void release_chunk(ChunkHandle chunk) = 0;

  // Virtual address space shared by all devices (unified addressing).
  virtual DevicePtr reserve_address(std::size_t bytes, std::size_t alignment) = 0;
  virtual void free_address(DevicePtr base, std::size_t bytes) = 0;
  virtual void map(DevicePtr va, std::size_t bytes, ChunkHandle chunk, std::size_t chunk_offset) = 0;
  virtual void unmap(DevicePtr va, std::size_t bytes) = 0;
  // Replaces the access of every listed device for [va, va + bytes); must follow every map.
  virtual void set_access(DevicePtr va, std::size_t bytes, std::span<const AccessGrant> grants) = 0;

  // Streams and events.
  [[nodiscard]] virtual StreamPriorityRange stream_priority_range(int device) const = 0;
  virtual StreamHandle create_stream(int device, int priority) = 0;
  virtual void destroy_stream(StreamHandle stream) = 0;
  virtual void synchronize_stream(StreamHandle stream) = 0;
  // Checks that `stream` is a live stream of `device`, including streams the backend did not
  // create (a framework's own): on CUDA the driver says which context it belongs to. Handle 0
  // (the device's default stream) is always valid. Throws InvalidArgument, naming the handle in
  // hex, when it is no stream of this backend (never created, or destroyed) or belongs to another
  // device. Not for hot paths: callers check a stream once, when they first meet it.
  virtual void validate_stream(StreamHandle stream, int device) = 0;
  // True while `stream` captures a CUDA graph (cuStreamBeginCapture, torch.cuda.graph): nothing
  // may then query, synchronize or fence it. Backends without graphs never capture.
  [[nodiscard]] virtual bool stream_capturing(StreamHandle /*stream*/) { return false; }
  // True when all work enqueued on `stream` so far has finished. `device` says whose default
  // stream a handle of 0 is (other streams know their device).
  [[nodiscard]] virtual bool query_stream(StreamHandle stream, int device) = 0;
  virtual EventHandle create_event(int device) = 0;
  virtual void destroy_event(EventHandle event) = 0;
  virtual void record_event(EventHandle event, StreamHandle stream) = 0;
  // True once all work captured by the last record has finished (or the event was never recorded).
  [[nodiscard]] virtual bool query_event(EventHandle event) = 0;
  virtual void synchronize_event(EventHandle event) = 0;
  // Work enqueued on `stream` after this call waits for the event's captured work. `device` says
  // whose default stream a handle of 0 is; the event may belong to any device.
  virtual void stream_wait_event(StreamHandle stream, EventHandle event, int device) = 0;
  // Runs `fn` on a host thread once prior work on `stream` has finished; later work waits for it.
  // `fn` must not call the backend (CUDA forbids driver calls inside a host function).
  virtual void launch_host_func(StreamHandle stream, std::function<void()> fn) = 0;

  // Timing events: like create_event, but elapsed_seconds can measure between two of them. They
  // cost more to record than plain events, so Salus uses them only where it measures GPU time.
  virtual EventHandle create_timing_event(int device) = 0;
  // Seconds of device time between the completion of `start`'s last record and `end`'s (negative
  // when `end` completed first). Both must be timing events whose last record has completed.
  //  - CUDA: cuEventElapsedTime, the GPU's timeline between the two points: everything the
  //    stream did in between counts, kernels as well as host functions and waits for other
  //    streams.
  //  - sim: when both were last recorded on one stream, the seconds that stream spent running
  //    kernels (launch_sim_kernel) and copies in between, so host functions (the stand-in for
  //    the host's own work) and waits for other streams' events do not count; otherwise the wall
  //    time between the two completions.
  // Throws InvalidArgument for an unknown event, one that was never recorded or was created
  // without timing, and DeviceError with status CUDA_ERROR_NOT_READY (call cuEventElapsedTime)
  // while a record has not completed (query_event says false).
  [[nodiscard]] virtual double elapsed_seconds(EventHandle start, EventHandle end) = 0;
  // Copies between any two mapped ranges (device, peer or host), ordered on `stream`.
  virtual void copy_async(DevicePtr dst, DevicePtr src, std::size_t bytes, StreamHandle stream) = 0;
};

// RAII owner of a stream.
class SALUS_API Stream {
 public:
  Stream() = default;
  Stream(std::shared_ptr<DeviceBackend> backend, int device, int priority = 0);
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  [[nodiscard]] StreamHandle handle() const noexcept { return handle_; }
  [[nodiscard]] int device() const noexcept { return device_; }
  void synchronize() const;

 private:
  void reset() noexcept;
  std::shared_ptr<DeviceBackend> backend_;
  StreamHandle handle_{};
  int device_ = 0;
};

enum class EventTiming : std::uint8_t { disabled, enabled };

// RAII owner of an event; EventTiming::enabled makes a timing event (create_timing_event).
class SALUS_API Event {
 public:
  Event() = default;
  Event(std::shared_ptr<DeviceBackend> backend, int device,
        EventTiming timing = EventTiming::disabled);
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  [[nodiscard]] EventHandle handle() const noexcept { return handle_; }
  void record(StreamHandle stream) const;
  [[nodiscard]] bool query() const;
  void synchronize() const;
  // DeviceBackend::elapsed_seconds from `start` to this event (both timing events of one backend).
  [[nodiscard]] double seconds_since(const Event& start) const;

 private:
  void reset() noexcept;
  std::shared_ptr<DeviceBackend> backend_;
  EventHandle handle_{};
};

}  // namespace salus
