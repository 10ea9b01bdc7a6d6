// Internal: one simulated location's physical memory (a device's or the host's), for SimMemory.
//
// A sparse memfd of the location's capacity, carved into extents first-fit; freed extents are
// coalesced with their neighbours and their pages punched out of the file (back to the OS, as
// freeing device memory would). Not locked: SimMemory's lock guards every call but the const
// accessors, which read what is fixed at construction.
#pragma once

#include <cstddef>
#include <map>

#include "cuda/os_handles.hpp"
#include "salus/device.hpp"

namespace salus::sim {

class SimPool {
 public:
  SimPool(Location where, std::size_t capacity, std::size_t granularity);

  // The file offset of a fresh extent of `bytes`; DeviceError out_of_memory (cuMemCreate) naming
  // the location and its usage when no free extent is that large.
  [[nodiscard]] std::size_t allocate(std::size_t bytes);
  // Gives [offset, offset + bytes) back. The bookkeeping is done even when returning the pages
  // to the OS fails, which then throws (fallocate, cuMemRelease).
  void release(std::size_t offset, std::size_t bytes);

  [[nodiscard]] Location where() const noexcept { return where_; }
  [[nodiscard]] int fd() const noexcept { return fd_.get(); }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::size_t granularity() const noexcept { return granularity_; }
  [[nodiscard]] std::size_t used() const noexcept { return used_; }

 private:
  Location where_;
  UniqueFd fd_;
  std::size_t capacity_ = 0;
  std::size_t granularity_ = 0;
  std::size_t used_ = 0;
  std::map<std::size_t, std::size_t> free_extents_;  // file offset -> length, coalesced
};

}  // namespace salus::sim
