// Internal: the sim backend's memory (SimBackend forwards to it).
//
// Physical memory of each simulated device (and of the host) is one sparse memfd, a SimPool
// (sim_pool.hpp); chunks are page-granular extents of it. Virtual ranges are PROT_NONE
// reservations; mapping a chunk is mmap(MAP_SHARED | MAP_FIXED) of its file extent, so remapping
// a range onto another chunk keeps the pointer while real bytes live in the new chunk. Access is
// mprotect of the mapped pages.
//
// Sharing (export_chunk, import_chunk; sim_sharing.cpp): an exported chunk is a duplicate of its
// pool's memfd plus the extent's offset; an importer maps that file instead of its own pool. The
// exporter still owns the extent: releasing it frees it under any importer (CUDA would keep it
// until the last importer let go), so whoever hands chunks out takes them back before releasing.
//
// Lock rule: `mutex_` guards every table below (pools' usage and free extents, chunks, imported
// files, reservations, pages, the mapped byte count). Every public method takes it at most once
// and calls no other public method; holding it, it calls nothing but its own unlocked parts
// (SimPool, ImportedFiles) and the kernel (mmap, mprotect, fallocate, fcntl). What is fixed at
// construction (the pools' locations, files and granularities, the device count) is read without
// it. Arguments are checked by DeviceBackend's public functions before they get here, except where
// a method says what it refuses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda/os_handles.hpp"
#include "cuda/sim_imported_files.hpp"
#include "cuda/sim_pool.hpp"
#include "salus/device.hpp"
#include "salus/sim.hpp"

namespace salus::sim {

class SimMemory {
 public:
  explicit SimMemory(const SimConfig& config);  // one pool per device, then the host's
  SimMemory(const SimMemory&) = delete;
  SimMemory& operator=(const SimMemory&) = delete;

  [[nodiscard]] std::size_t free_memory(int device) const;
  [[nodiscard]] std::size_t granularity(Location where) const;
  [[nodiscard]] std::size_t address_granularity() const noexcept { return address_granularity_; }

  ChunkHandle create_chunk(Location where, std::size_t bytes);
  void release_chunk(ChunkHandle chunk);
  SharedChunk export_chunk(ChunkHandle chunk);
  ChunkHandle import_chunk(Location where, const SharedChunk& shared);

  DevicePtr reserve_address(std::size_t bytes, std::size_t alignment);
  void free_address(DevicePtr base, std::size_t bytes);
  void map(DevicePtr va, std::size_t bytes, ChunkHandle chunk, std::size_t chunk_offset);
  void unmap(DevicePtr va, std::size_t bytes);
  void set_access(DevicePtr va, std::size_t bytes, std::span<const AccessGrant> grants);

  // What an async copy or fill may touch, checked before it is enqueued: DeviceError
  // (CUDA_ERROR_INVALID_VALUE) naming the side that is not readable (src) or writable (dst).
  // With `locate`, the physical locations of the first bytes of dst and src (what times the copy).
  struct CopyEnds {
    std::optional<Location> dst;
    std::optional<Location> src;
  };
  CopyEnds check_copy(DevicePtr dst, DevicePtr src, std::size_t bytes, bool locate) const;
  void check_fill(DevicePtr dst, std::size_t bytes) const;

  // Introspection (SimBackend's, whose callers' device indices it checked).
  [[nodiscard]] Access access_of(DevicePtr va, int device) const;
  [[nodiscard]] std::optional<Location> location_of(DevicePtr va) const;
  [[nodiscard]] std::size_t chunk_bytes(Location where) const;
  [[nodiscard]] std::size_t mapped_bytes() const;
  [[nodiscard]] std::size_t reserved_bytes() const;

 private:
  struct Chunk {
    std::size_t pool = 0;    // index into pools_ (an imported chunk's: its location's, for its
                             // granularity; the pool's extents and usage are never touched)
    std::size_t offset = 0;  // in the pool's file, or in the imported file
    std::size_t bytes = 0;
    std::size_t mapped_pages = 0;
    bool released = false;  // the handle is dead; the memory goes when the last page is unmapped
    std::shared_ptr<ImportedFiles::File> imported;  // set: map from this file, and free nothing
  };
  struct Page {
    std::uint64_t chunk = 0;
    std::size_t bytes = 0;  // granularity of the chunk's location
    Location where;
    std::vector<Access> access;  // per device
  };
  using PageIt = std::map<DevicePtr, Page>::iterator;

  // Helpers; all but pool_index (fixed state) expect mutex_ held.
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
  [[nodiscard]] bool range_usable(DevicePtr lo, std::size_t bytes, bool write) const;
  [[nodiscard]] std::optional<Location> physical_location(DevicePtr va) const;

  const std::size_t device_count_;
  // Devices 0..n-1, then the host. The vector is fixed; each pool's usage is under mutex_.
  std::vector<SimPool> pools_;
  std::size_t address_granularity_ = 0;  // the smallest pool granularity

  mutable std::mutex mutex_;
  std::unordered_map<std::uint64_t, Chunk> chunks_;
  std::uint64_t next_chunk_ = 1;
  ImportedFiles imported_files_;  // what imported chunks map from; the chunks hold their file
  std::map<DevicePtr, AddressRange> reservations_;  // base -> range
  std::map<DevicePtr, Page> pages_;                 // page base -> mapped page
  std::size_t mapped_bytes_ = 0;
};

}  // namespace salus::sim
