// Internal: the simulated-GPU backend behind salus::make_sim_backend (see salus/sim.hpp).
//
// Physical memory of each simulated device (and of the host) is one sparse memfd; chunks are
// page-granular extents of it. Virtual ranges are PROT_NONE reservations; mapping a chunk is
// mmap(MAP_SHARED | MAP_FIXED) of its file extent, so remapping a range onto another chunk keeps
// the pointer while real bytes live in the new chunk. Streams are worker threads.
//
// Sharing (export_chunk, import_chunk; sim_sharing.cpp): an exported chunk is a duplicate of its
// pool's memfd plus the extent's offset; an importer maps that file instead of its own pool. The
// exporter still owns the extent: releasing it frees it under any importer (CUDA would keep it
// until the last importer let go), so whoever hands chunks out takes them back before releasing.
//
// Tests and the layers above may downcast the DeviceBackend to SimBackend for introspection.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stop_token>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda/os_handles.hpp"
#include "cuda/process_fork.hpp"
#include "salus/device.hpp"
#include "salus/sim.hpp"

namespace salus::sim {

// CUDA driver status codes mirrored by the simulator so both backends raise the same errors.
inline constexpr int kCudaErrorInvalidValue = 1;
inline constexpr int kCudaErrorOutOfMemory = DeviceError::kOutOfMemoryCode;
inline constexpr int kCudaErrorNotReady = 600;

// Throws InvalidArgument naming the first inconsistency in `config`.
void validate_config(const SimConfig& config);

class ComputeEngine;

class SimBackend final : public DeviceBackend {
 public:
  explicit SimBackend(SimConfig config);  // expects a validated config
  SimBackend(const SimBackend&) = delete;
  SimBackend& operator=(const SimBackend&) = delete;
  ~SimBackend() override;

  // Simulated compute (salus::launch_sim_kernel, salus::sim_device_activity check the arguments).
  void launch_kernel(StreamHandle stream, int device, double seconds, double occupancy);
  [[nodiscard]] SimDeviceActivity activity(int device);

  // Introspection (tests, layers above). Out-of-range devices raise InvalidArgument.
  // Access that `device` was granted to the mapped page holding `va`; none when unmapped.
  [[nodiscard]] Access access_of(DevicePtr va, int device) const;
  // Physical location of the mapped page holding `va`; nullopt when unmapped.
  [[nodiscard]] std::optional<Location> location_of(DevicePtr va) const;
  // Physical bytes held by chunks at `where`, including released chunks still mapped somewhere;
  // imported chunks are the exporter's and not counted.
  [[nodiscard]] std::size_t chunk_bytes(Location where) const;
  [[nodiscard]] std::size_t mapped_bytes() const;
  [[nodiscard]] std::size_t reserved_bytes() const;
  [[nodiscard]] const SimConfig& config() const noexcept { return config_; }

 private:
  // DeviceBackend (its public functions have checked the arguments; see salus/device.hpp).
  [[nodiscard]] std::string_view do_name() const noexcept override { return "sim"; }
  [[nodiscard]] int do_device_count() const override;
  [[nodiscard]] DeviceProperties do_properties(int device) const override;
  [[nodiscard]] std::size_t do_free_memory(int device) const override;
  [[nodiscard]] std::size_t do_granularity(Location where) const override;
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
  [[nodiscard]] bool do_query_stream(StreamHandle stream, int device) override;
  [[nodiscard]] bool do_stream_known_idle(StreamHandle stream, int device) override;
  EventHandle do_create_event(int device) override;
  void do_destroy_event(EventHandle event) override;
  void do_record_event(EventHandle event, StreamHandle stream) override;
  bool do_record_pending(EventHandle event, StreamHandle stream) override;
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

  // One memfd: a device's (or the host's) physical memory, carved into extents.
  struct Pool {
    Location where;
    UniqueFd fd;
    std::size_t capacity = 0;
    std::size_t granularity = 0;
    std::size_t used = 0;
    std::map<std::size_t, std::size_t> free_extents;  // file offset -> length, coalesced
  };
  // A file whose chunks were imported (another backend's pool), held open once for all of them:
  // importing hundreds of pages of one pool costs one descriptor, not hundreds. Closed when the
  // last chunk of it is gone.
  struct ImportedFile {
    UniqueFd fd;
    std::uint64_t device = 0;  // st_dev and st_ino: what tells two descriptors of one file apart
    std::uint64_t inode = 0;
  };
  struct Chunk {
    std::size_t pool = 0;    // index into pools_ (an imported chunk's: its location's, for its
                             // granularity; the pool's extents and usage are never touched)
    std::size_t offset = 0;  // in the pool's file, or in the imported file
    std::size_t bytes = 0;
    std::size_t mapped_pages = 0;
    bool released = false;  // the handle is dead; the memory goes when the last page is unmapped
    std::shared_ptr<ImportedFile> imported;  // set: map from this file, and free nothing
  };
  struct Page {
    std::uint64_t chunk = 0;
    std::size_t bytes = 0;  // granularity of the chunk's location
    Location where;
    std::vector<Access> access;  // per device
  };
  struct Stream;
  struct Event;
  struct EventCapture;
  struct SharedEventMemory;
  using Task = std::function<void(std::stop_token)>;

  using PageIt = std::map<DevicePtr, Page>::iterator;

  // Memory helpers; all expect mem_mutex_ held.
  [[nodiscard]] std::size_t pool_index(Location where) const;
  [[nodiscard]] std::map<DevicePtr, Page>::const_iterator find_page(DevicePtr va) const;
  [[nodiscard]] const Page* page_at(DevicePtr va) const;
  [[nodiscard]] const AddressRange* reservation_at(DevicePtr va) const;
  // The pages covering exactly [va, va + bytes), or InvalidArgument naming `what`.
  std::pair<PageIt, PageIt> covering_pages(DevicePtr va, std::size_t bytes, const char* what);
  // Forgets the pages (their mapping is already gone) and frees chunks released meanwhile.
  void drop_pages(PageIt first, PageIt last);
  // Erases a chunk: returns a created chunk's extent to its pool, lets go of an imported one.
  void free_chunk(std::uint64_t chunk);
  // The ImportedFile for the file `fd` refers to (fstat's st_dev, st_ino), opened on first use.
  std::shared_ptr<ImportedFile> imported_file(int fd, std::uint64_t device, std::uint64_t inode);
  // Drops an imported chunk's hold on its file, and the table entry once nothing holds it.
  void drop_import(std::shared_ptr<ImportedFile> file);
  [[nodiscard]] bool range_usable(DevicePtr lo, std::size_t bytes, bool write) const;
  [[nodiscard]] std::optional<Location> physical_location(DevicePtr va) const;
  [[nodiscard]] double copy_bandwidth_gbps(std::optional<Location> dst,
                                           std::optional<Location> src) const;

  // For the introspection and compute calls below DeviceBackend (whose own calls it checked).
  void check_device(int device, const char* what) const;
  // `device` (whose default stream handle 0 is) is in range.
  std::shared_ptr<Stream> stream_for(StreamHandle stream, int device);
  std::shared_ptr<Stream> stream_locked(StreamHandle stream, int device);  // stream_mutex_ held
  std::shared_ptr<Event> event_for(EventHandle event) const;
  std::shared_ptr<Event> event_locked(EventHandle event) const;  // stream_mutex_ held
  // Both at once, under one lock (a record's hot path): `stream` of the event's device.
  std::pair<std::shared_ptr<Event>, std::shared_ptr<Stream>> event_and_stream(EventHandle event,
                                                                               StreamHandle stream);
  EventHandle make_event(int device, bool timing);  // `device` is in range
  EventHandle add_event(std::shared_ptr<Event> event);
  // The newest completed record of a timing event, or the error elapsed_seconds raises; `role`
  // ("start" or "end") names the event in messages.
  static EventCapture timing_capture(const std::shared_ptr<Event>& ev, EventHandle handle,
                                     const char* role);
  void enqueue(StreamHandle stream, int device, Task task);
  void shutdown_streams() noexcept;
  // Throws NotSupported in a forked child: the stream threads are the parent's (nothing would
  // run what is enqueued), and the memory is shared with it.
  void check_process(const char* what) const;

  const SimConfig config_;
  const process::Birth birth_ = process::birth_now();
  std::vector<std::vector<std::optional<SimLinkConfig>>> links_;  // [from][to]

  mutable std::mutex mem_mutex_;
  std::vector<Pool> pools_;  // devices 0..n-1, then the host
  std::size_t address_granularity_ = 0;  // the smallest pool granularity
  std::unordered_map<std::uint64_t, Chunk> chunks_;
  std::uint64_t next_chunk_ = 1;
  // (st_dev, st_ino) -> the file imported chunks map from; the chunks hold it (imported_file).
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::weak_ptr<ImportedFile>> imported_files_;
  std::map<DevicePtr, AddressRange> reservations_;  // base -> range
  std::map<DevicePtr, Page> pages_;                 // page base -> mapped page
  std::size_t mapped_bytes_ = 0;

  // One compute engine per device (sim_compute.hpp), each with its own lock; the vector itself
  // is fixed at construction.
  std::vector<std::unique_ptr<ComputeEngine>> engines_;
  // Per device: tasks handed to its stream threads (SimDeviceActivity::stream_tasks). Fixed size.
  std::unique_ptr<std::atomic<std::uint64_t>[]> stream_tasks_;
  [[nodiscard]] std::atomic<std::uint64_t>& tasks_of(int device) const {
    return stream_tasks_[static_cast<std::size_t>(device)];
  }

  mutable std::mutex stream_mutex_;
  std::unordered_map<std::uint64_t, std::shared_ptr<Stream>> streams_;
  std::vector<std::shared_ptr<Stream>> default_streams_;  // per device, started on first use
  std::unordered_map<std::uint64_t, std::shared_ptr<Event>> events_;
  std::uint64_t next_stream_ = 1;
  std::uint64_t next_event_ = 1;
};

}  // namespace salus::sim
