// The device layer: the one interface every layer above talks to. Two backends implement it:
// the CUDA driver API (loaded at run time, see salus/cuda.hpp) and simulated GPUs backed by host
// memory (see salus/sim.hpp).
//
// Conventions shared by every backend:
//  - Sizes handed to create_chunk, reserve_address, map, unmap and set_access are multiples of
//    granularity(); addresses handed to map/unmap/set_access are granularity-aligned. Violations
//    raise InvalidArgument (checked once, by DeviceBackend itself: see the list above the class);
//    driver failures raise DeviceError naming the call.
//  - A StreamHandle with value 0 names the default stream of the device the call is about.
//  - A StreamHandle's value is the backend's native handle: a CUstream on CUDA (so a framework's
//    own streams can be passed in as they are), an opaque id on the sim backend.
//  - Handles are plain values: the owner (usually an RAII wrapper below) releases them.
#pragma once

#include <array>
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

using DeviceUuid = std::array<std::uint8_t, 16>;

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
  // Which GPU this is, whatever number a process gives it (CUDA_VISIBLE_DEVICES renumbers):
  // the driver's UUID (cuDeviceGetUuid). A simulated device's is made from its index.
  DeviceUuid uuid{};
};

// As nvidia-smi writes it: "GPU-" and 32 hex digits in 8-4-4-4-12 groups.
[[nodiscard]] SALUS_API std::string to_string(const DeviceUuid& uuid);

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

// A physical chunk as another process can import it: a file descriptor plus where the chunk lies in
// it. CUDA: a POSIX file descriptor from cuMemExportToShareableHandle (offset 0). Simulated: the
// location's memfd and the chunk's offset in it.
struct SharedChunk {
  int fd = -1;  // owned by whoever holds the struct; close it when done
  std::uint64_t offset = 0;
  std::size_t bytes = 0;
};

class Event;

// An event as another process can wait for it. CUDA: the 64 bytes of cuIpcGetEventHandle (fd
// -1). Simulated: a descriptor of the shared memory that holds the event's state, and handle
// bytes that name the event (its process and a serial) without being needed to open it.
struct SharedEvent {
  int fd = -1;  // owned by whoever holds the struct; close it when done
  std::array<std::byte, 64> handle{};
};

// Stream priorities follow CUDA: numerically lower is more urgent. `greatest` <= `least`.
struct StreamPriorityRange {
  int least = 0;
  int greatest = 0;
};

// The interface has the non-virtual-interface shape: each public function checks its arguments
// once, here (src/cuda/device_backend.cpp), and then calls the private virtual do_<name> of the
// same signature that a backend implements. Argument errors are InvalidArgument (NotSupported
// where a backend has no host chunks) naming the bad value, so a backend may assume:
//  - Device indices lie in [0, device_count()): properties, peer_link (both), granularity and
//    create_chunk (a GPU location), stream_priority_range, create_stream, validate_stream,
//    query_stream, create_event, create_timing_event, stream_wait_event and every grant of
//    set_access. The message names the index and the device count.
//  - A Location has a known kind; a host location's NUMA node is >= 0 (which nodes exist is the
//    backend's to say).
//  - create_chunk: bytes is a positive multiple of granularity(where) (so the location is valid).
//  - reserve_address: bytes is a positive multiple of the address granularity (the smallest
//    granularity of any location, do_address_granularity); alignment is 0 or a power of two.
//  - free_address, map, unmap, set_access: the address (and map's chunk offset) is a multiple of
//    the address granularity, bytes a positive multiple of it, and [va, va + bytes) does not wrap
//    around. What needs the chunk (map: its own granularity and size, via check_map_in_chunk in
//    src/cuda/backend_checks.hpp) or the backend's bookkeeping (reservations, mapped pages) is the
//    backend's.
//  - set_access: every grant names a device in range and an Access enumerator.
//  - import_chunk: the location is a GPU's, in range; the descriptor is >= 0; bytes is a positive
//    multiple of granularity(where) and the offset a multiple of it, and offset + bytes does not
//    wrap. Whether the descriptor holds an exported chunk is the backend's (it may ask the driver).
//  - Handles: chunk and event handles are not 0 (export_chunk's too); destroy_stream refuses
//    handle 0 (the default stream is nobody's to destroy). Whether a non-zero handle is live is
//    the backend's to check.
//  - launch_host_func: fn is not empty. copy_async and fill_async of 0 bytes are no-ops that
//    reach no backend.
// Hot paths (map, unmap, set_access, record_event, query_event, stream_wait_event,
// launch_host_func) get O(1) checks only (set_access: one per grant).
class SALUS_API DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  [[nodiscard]] std::string_view name() const noexcept { return do_name(); }
  [[nodiscard]] int device_count() const { return do_device_count(); }
  [[nodiscard]] DeviceProperties properties(int device) const;
  // Bytes of `device` that could still be allocated now, by this process or any other: CUDA's
  // cuMemGetInfo (what other processes' contexts and allocations hold is gone from it); a
  // simulated device's size less the chunks made of it.
  [[nodiscard]] std::size_t free_memory(int device) const;
  // Physical page size for chunks at `where`.
  [[nodiscard]] std::size_t granularity(Location where) const;
  [[nodiscard]] PeerLink peer_link(int from, int to) const;

  // Physical memory.
  ChunkHandle create_chunk(Location where, std::size_t bytes);
  void release_chunk(ChunkHandle chunk);

  // Sharing physical chunks between processes (a coordinator hands them to clients over a Unix
  // socket, SCM_RIGHTS). export_chunk returns a NEW descriptor for a live device chunk of this
  // backend (created or imported here); the caller closes it. It throws InvalidArgument for an
  // unknown or released handle, NotSupported for a host chunk (CUDA cannot share those) or where
  // the device or driver cannot export (CUDA: no POSIX file descriptor handles).
  [[nodiscard]] SharedChunk export_chunk(ChunkHandle chunk);
  // Makes a chunk of this backend, in this process, for memory that another backend instance
  // (possibly in another process) exported; `where` is the GPU that holds it, as this process
  // numbers its devices. `shared.fd` stays the caller's: what the backend needs, it duplicates.
  // The chunk behaves like a created one (map, unmap, set_access; release_chunk drops this
  // process's reference, freed memory waiting for the last unmap as usual) but never counts
  // against this backend's own capacity, and releasing it never frees the exporter's memory.
  // CUDA: offset must be 0 (a descriptor shares one whole allocation), and a second import of an
  // allocation may return a handle already held, which then needs one release per import.
  ChunkHandle import_chunk(Location where, const SharedChunk& shared);

  // Work of another process that may still touch `chunk`, which create_chunk has just returned
  // (a page salusd handed over behind that work): an event to order this process's work after
  // before the chunk's first use, or null. Taken once per chunk. Backends whose chunks are
  // always new memory return null.
  [[nodiscard]] std::shared_ptr<const Event> take_arrival(ChunkHandle chunk);
  // Releases `chunks` once the work of `work` (events of this backend) has finished; the caller
  // does not use them again. A backend of this process's own waits for that work, then releases
  // each. A process connected to salusd hands the pages back at once instead, behind an
  // interprocess event recorded after that work (the next process's streams wait for it), and
  // keeps its own reference to each until the event has completed.
  void release_chunks_after(std::span<const ChunkHandle> chunks,
                            std::span<const std::shared_ptr<const Event>> work);
  // True when release_chunks_after returns without waiting for the work (a process connected to
  // salusd): whoever gives pages up then need not wait for their work first.
  [[nodiscard]] bool defers_release() const noexcept { return do_defers_release(); }

  // Virtual address space shared by all devices (unified addressing).
  DevicePtr reserve_address(std::size_t bytes, std::size_t alignment);
  void free_address(DevicePtr base, std::size_t bytes);
  void map(DevicePtr va, std::size_t bytes, ChunkHandle chunk, std::size_t chunk_offset);
  void unmap(DevicePtr va, std::size_t bytes);
  // Replaces the access of every listed device for [va, va + bytes); must follow every map.
  void set_access(DevicePtr va, std::size_t bytes, std::span<const AccessGrant> grants);

  // Streams and events.
  [[nodiscard]] StreamPriorityRange stream_priority_range(int device) const;
  StreamHandle create_stream(int device, int priority);
  void destroy_stream(StreamHandle stream);
  void synchronize_stream(StreamHandle stream);
  // Checks that `stream` is a live stream of `device`, including streams the backend did not
  // create (a framework's own): on CUDA the driver says which context it belongs to. Handle 0
  // (the device's default stream) is always valid. Throws InvalidArgument, naming the handle in
  // hex, when it is no stream of this backend (never created, or destroyed) or belongs to another
  // device. Not for hot paths: callers check a stream once, when they first meet it.
  void validate_stream(StreamHandle stream, int device);
  // True while `stream` captures a CUDA graph (cuStreamBeginCapture, torch.cuda.graph): nothing
  // may then query, synchronize or fence it. Backends without graphs never capture.
  [[nodiscard]] bool stream_capturing(StreamHandle stream) { return do_stream_capturing(stream); }
  // True when all work enqueued on `stream` so far has finished. `device` says whose default
  // stream a handle of 0 is (other streams know their device).
  [[nodiscard]] bool query_stream(StreamHandle stream, int device);
  // True only where the backend knows, with no driver call, that nothing is pending on `stream`
  // (the simulated GPU reads a counter); false means "not known", never "busy" (CUDA always says
  // false). Fences skip such streams: a free on an idle stream records nothing.
  [[nodiscard]] bool stream_known_idle(StreamHandle stream, int device);
  EventHandle create_event(int device);
  void destroy_event(EventHandle event);
  void record_event(EventHandle event, StreamHandle stream);
  // As record_event, for a fence: false when the record completed at once because nothing was
  // pending on `stream` (nothing need wait for the event then). A backend that cannot tell at no
  // cost (CUDA: that would be a cuStreamQuery more) records and says true.
  [[nodiscard]] bool record_pending(EventHandle event, StreamHandle stream);
  // True once all work captured by the last record has finished (or the event was never recorded).
  [[nodiscard]] bool query_event(EventHandle event);
  void synchronize_event(EventHandle event);
  // Work enqueued on `stream` after this call waits for the event's captured work. `device` says
  // whose default stream a handle of 0 is; the event may belong to any device.
  void stream_wait_event(StreamHandle stream, EventHandle event, int device);
  // Events another process can wait for. create_shareable_event makes one (CUDA:
  // CU_EVENT_INTERPROCESS, no timing), recorded like any event. export_event describes it for
  // another process (the simulated backend returns a NEW descriptor; the caller closes it). There,
  // import_event gives an event of that process's backend that stands for the same event:
  // query_event, synchronize_event and stream_wait_event see the record the exporter made before
  // exporting. Record a shared event once, before exporting it. CUDA refuses an import in the
  // exporting process itself; the simulated backend allows it. An imported event whose exporter
  // has exited counts as complete on the simulated backend (its work is gone with it); destroy it
  // with destroy_event. NotSupported where the driver has no interprocess events.
  EventHandle create_shareable_event(int device);
  [[nodiscard]] SharedEvent export_event(EventHandle event);
  EventHandle import_event(int device, const SharedEvent& shared);
  // Runs `fn` on a host thread once prior work on `stream` has finished; later work waits for it.
  // `fn` must not call the backend (CUDA forbids driver calls inside a host function).
  void launch_host_func(StreamHandle stream, std::function<void()> fn);

  // Timing events: like create_event, but elapsed_seconds can measure between two of them. They
  // cost more to record than plain events, so Salus uses them only where it measures GPU time.
  EventHandle create_timing_event(int device);
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
  [[nodiscard]] double elapsed_seconds(EventHandle start, EventHandle end);
  // Copies between any two mapped ranges (device, peer or host), ordered on `stream`.
  void copy_async(DevicePtr dst, DevicePtr src, std::size_t bytes, StreamHandle stream);
  // Sets every byte of a mapped, writable range to `value`, ordered on `stream`
  // (cuMemsetD8Async). salusd zeroes a page so before another user gets it.
  void fill_async(DevicePtr dst, std::uint8_t value, std::size_t bytes, StreamHandle stream);

  // The backend that does the work: this one, or the one a wrapper (a process connected to
  // salusd) forwards to. What needs one backend's own features (simulated kernels) asks it.
  [[nodiscard]] DeviceBackend& underlying() noexcept { return do_underlying(); }

 private:
  // Argument checks shared by the public functions (throw InvalidArgument naming the value).
  void check_device(int device, std::string_view what) const;
  void check_location(Location where, std::string_view what) const;
  // Returns the address granularity it checked against.
  std::size_t check_range(std::string_view what, DevicePtr va, std::size_t bytes) const;
  static void check_event(EventHandle event, std::string_view what);

  // What a backend implements: the public function of the same name without do_, whose
  // arguments have passed the checks listed above the class.
  [[nodiscard]] virtual std::string_view do_name() const noexcept = 0;
  [[nodiscard]] virtual int do_device_count() const = 0;
  [[nodiscard]] virtual DeviceProperties do_properties(int device) const = 0;
  [[nodiscard]] virtual std::size_t do_free_memory(int device) const = 0;
  [[nodiscard]] virtual std::size_t do_granularity(Location where) const = 0;
  // The smallest granularity of any location: every address and size that reserve_address,
  // free_address, map, unmap and set_access can accept is a multiple of it. Called on hot paths.
  [[nodiscard]] virtual std::size_t do_address_granularity() const noexcept = 0;
  [[nodiscard]] virtual PeerLink do_peer_link(int from, int to) const = 0;
  virtual ChunkHandle do_create_chunk(Location where, std::size_t bytes) = 0;
  virtual void do_release_chunk(ChunkHandle chunk) = 0;
  [[nodiscard]] virtual SharedChunk do_export_chunk(ChunkHandle chunk) = 0;
  virtual ChunkHandle do_import_chunk(Location where, const SharedChunk& shared) = 0;
  // Defaults: nothing arrives with work behind it; release waits for the work, then releases.
  [[nodiscard]] virtual std::shared_ptr<const Event> do_take_arrival(ChunkHandle /*chunk*/) {
    return nullptr;
  }
  virtual void do_release_chunks_after(std::span<const ChunkHandle> chunks,
                                       std::span<const std::shared_ptr<const Event>> work);
  [[nodiscard]] virtual bool do_defers_release() const noexcept { return false; }
  virtual DevicePtr do_reserve_address(std::size_t bytes, std::size_t alignment) = 0;
  virtual void do_free_address(DevicePtr base, std::size_t bytes) = 0;
  virtual void do_map(DevicePtr va, std::size_t bytes, ChunkHandle chunk,
                      std::size_t chunk_offset) = 0;
  virtual void do_unmap(DevicePtr va, std::size_t bytes) = 0;
  virtual void do_set_access(DevicePtr va, std::size_t bytes,
                             std::span<const AccessGrant> grants) = 0;
  [[nodiscard]] virtual StreamPriorityRange do_stream_priority_range(int device) const = 0;
  virtual StreamHandle do_create_stream(int device, int priority) = 0;
  virtual void do_destroy_stream(StreamHandle stream) = 0;
  virtual void do_synchronize_stream(StreamHandle stream) = 0;
  virtual void do_validate_stream(StreamHandle stream, int device) = 0;
  // Backends without graphs never capture.
  [[nodiscard]] virtual bool do_stream_capturing(StreamHandle /*stream*/) { return false; }
  [[nodiscard]] virtual bool do_query_stream(StreamHandle stream, int device) = 0;
  [[nodiscard]] virtual bool do_stream_known_idle(StreamHandle /*stream*/, int /*device*/) {
    return false;
  }
  virtual EventHandle do_create_event(int device) = 0;
  virtual void do_destroy_event(EventHandle event) = 0;
  virtual void do_record_event(EventHandle event, StreamHandle stream) = 0;
  [[nodiscard]] virtual bool do_record_pending(EventHandle event, StreamHandle stream) {
    do_record_event(event, stream);
    return true;
  }
  [[nodiscard]] virtual bool do_query_event(EventHandle event) = 0;
  virtual void do_synchronize_event(EventHandle event) = 0;
  virtual void do_stream_wait_event(StreamHandle stream, EventHandle event, int device) = 0;
  virtual EventHandle do_create_shareable_event(int device) = 0;
  [[nodiscard]] virtual SharedEvent do_export_event(EventHandle event) = 0;
  virtual EventHandle do_import_event(int device, const SharedEvent& shared) = 0;
  virtual void do_launch_host_func(StreamHandle stream, std::function<void()> fn) = 0;
  virtual EventHandle do_create_timing_event(int device) = 0;
  [[nodiscard]] virtual double do_elapsed_seconds(EventHandle start, EventHandle end) = 0;
  virtual void do_copy_async(DevicePtr dst, DevicePtr src, std::size_t bytes,
                             StreamHandle stream) = 0;
  virtual void do_fill_async(DevicePtr dst, std::uint8_t value, std::size_t bytes,
                             StreamHandle stream) = 0;
  [[nodiscard]] virtual DeviceBackend& do_underlying() noexcept { return *this; }
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
  // Owns `adopted`, an event `backend` made (create_shareable_event, import_event).
  Event(std::shared_ptr<DeviceBackend> backend, EventHandle adopted) noexcept;
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
