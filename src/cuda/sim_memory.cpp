// SimMemory: physical memory (memfd extents), virtual reservations, map/unmap and access.
// Sharing chunks between processes lives in sim_sharing.cpp.
#include "cuda/sim_memory.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <string>

#include "cuda/backend_checks.hpp"
#include "cuda/sim_status.hpp"
#include "salus/error.hpp"

namespace salus::sim {
namespace {

void* as_ptr(DevicePtr va) {
  return reinterpret_cast<void*>(va);
}

int prot_for(Access access) {
  switch (access) {
    case Access::read_write:
      return PROT_READ | PROT_WRITE;
    case Access::read:
      return PROT_READ;
    case Access::none:
      break;
  }
  return PROT_NONE;
}

Access strongest(const std::vector<Access>& access) {
  return access.empty() ? Access::none : *std::max_element(access.begin(), access.end());
}

// Puts a fresh inaccessible anonymous mapping over [va, va + bytes): the range stays reserved
// (no other mmap can land there) but no longer refers to any chunk.
int unback(DevicePtr va, std::size_t bytes) {
  void* p = ::mmap(as_ptr(va), bytes, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  return p == MAP_FAILED ? errno : 0;
}

}  // namespace

SimMemory::SimMemory(const SimConfig& config) : device_count_(config.devices.size()) {
  for (std::size_t i = 0; i < device_count_; ++i) {
    pools_.emplace_back(Location::gpu(static_cast<int>(i)), config.devices[i].memory_bytes,
                        config.devices[i].granularity);
  }
  pools_.emplace_back(Location::host(), config.host_memory_bytes, config.host_granularity);
  address_granularity_ = pools_.front().granularity();
  for (const SimPool& pool : pools_) {
    address_granularity_ = std::min(address_granularity_, pool.granularity());
  }
}

// A GPU location's device is in range (DeviceBackend checked it, or chunk_bytes' caller did).
std::size_t SimMemory::pool_index(Location where) const {
  if (where.is_host()) {
    // The simulator has one host memory pool; other NUMA nodes do not exist.
    if (where.index != 0) {
      throw InvalidArgument(
          fmt::format("{}: the sim backend only has host NUMA node 0", to_string(where)));
    }
    return pools_.size() - 1;
  }
  return static_cast<std::size_t>(where.index);
}

std::size_t SimMemory::free_memory(int device) const {
  std::lock_guard lock(mutex_);
  const SimPool& pool = pools_[pool_index(Location::gpu(device))];
  return pool.capacity() - pool.used();
}

// Granularities are fixed at construction: no lock.
std::size_t SimMemory::granularity(Location where) const {
  return pools_[pool_index(where)].granularity();
}

ChunkHandle SimMemory::create_chunk(Location where, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  const std::size_t index = pool_index(where);
  const std::size_t offset = pools_[index].allocate(bytes);
  const std::uint64_t id = next_chunk_++;
  chunks_.emplace(id, Chunk{index, offset, bytes, 0, false, nullptr});
  return ChunkHandle{id};
}

void SimMemory::release_chunk(ChunkHandle chunk) {
  std::lock_guard lock(mutex_);
  auto it = chunks_.find(chunk.value);
  if (it == chunks_.end() || it->second.released) {
    throw InvalidArgument(fmt::format(
        "release_chunk: unknown chunk {} (never created or already released)", chunk.value));
  }
  // CUDA keeps released memory alive while mapped; the last unmap frees it (see drop_pages).
  if (it->second.mapped_pages > 0) {
    it->second.released = true;
    return;
  }
  free_chunk(chunk.value);
}

void SimMemory::free_chunk(std::uint64_t id) {
  auto it = chunks_.find(id);
  Chunk chunk = std::move(it->second);
  chunks_.erase(it);
  // The exporter's memory: neither this pool's extent nor ours to punch.
  if (chunk.imported) {
    imported_files_.drop(std::move(chunk.imported));
    return;
  }
  pools_[chunk.pool].release(chunk.offset, chunk.bytes);
}

DevicePtr SimMemory::reserve_address(std::size_t bytes, std::size_t alignment) {
  std::size_t max_granularity = 0;
  for (const SimPool& pool : pools_)
    max_granularity = std::max(max_granularity, pool.granularity());
  // Aligning to the largest granularity lets a chunk from any location map at the base.
  const std::size_t align = std::max(alignment, max_granularity);
  if (bytes > SIZE_MAX - align) {
    throw InvalidArgument(fmt::format("reserve_address: {} bytes is too large", bytes));
  }
  const std::size_t total = bytes + align;
  void* p = ::mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw_errno("mmap", errno, "cuMemAddressReserve");
  const auto raw = reinterpret_cast<DevicePtr>(p);
  const DevicePtr base = (raw + align - 1) & ~(DevicePtr{align} - 1);
  // Over-reserved to find an aligned base; give back the slack on both sides.
  if (base > raw) ::munmap(p, base - raw);
  if (raw + total > base + bytes) ::munmap(as_ptr(base + bytes), raw + total - (base + bytes));
  AddressRange range(base, bytes);
  std::lock_guard lock(mutex_);
  reservations_.emplace(base, std::move(range));
  return base;
}

void SimMemory::free_address(DevicePtr base, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  auto it = reservations_.find(base);
  if (it == reservations_.end() || it->second.bytes() != bytes) {
    throw InvalidArgument(
        fmt::format("free_address: [{:#x}, +{}) is not a reservation", base, bytes));
  }
  // Dropping the reservation munmaps the whole range, chunk mappings included.
  AddressRange range = std::move(it->second);
  reservations_.erase(it);
  drop_pages(pages_.lower_bound(base), pages_.lower_bound(base + bytes));
}

const AddressRange* SimMemory::reservation_at(DevicePtr va) const {
  auto it = reservations_.upper_bound(va);
  if (it == reservations_.begin()) return nullptr;
  --it;
  return va < it->second.end() ? &it->second : nullptr;
}

std::map<DevicePtr, SimMemory::Page>::const_iterator SimMemory::find_page(DevicePtr va) const {
  auto it = pages_.upper_bound(va);
  if (it == pages_.begin()) return pages_.end();
  --it;
  return va < it->first + it->second.bytes ? it : pages_.end();
}

const SimMemory::Page* SimMemory::page_at(DevicePtr va) const {
  auto it = find_page(va);
  return it == pages_.end() ? nullptr : &it->second;
}

void SimMemory::map(DevicePtr va, std::size_t bytes, ChunkHandle chunk, std::size_t chunk_offset) {
  std::lock_guard lock(mutex_);
  auto cit = chunks_.find(chunk.value);
  if (cit == chunks_.end() || cit->second.released) {
    throw InvalidArgument(fmt::format("map: unknown chunk {}", chunk.value));
  }
  Chunk& c = cit->second;
  const SimPool& pool = pools_[c.pool];
  const std::size_t g = pool.granularity();
  detail::check_map_in_chunk(va, bytes, chunk, chunk_offset, c.bytes, g);
  const AddressRange* range = reservation_at(va);
  if (range == nullptr || bytes > range->end() - va) {
    throw InvalidArgument(
        fmt::format("map: [{:#x}, +{}) is not inside one reservation", va, bytes));
  }
  if (auto first = pages_.lower_bound(va);
      find_page(va) != pages_.end() || (first != pages_.end() && first->first < va + bytes)) {
    throw InvalidArgument(fmt::format("map: [{:#x}, +{}) overlaps mapped pages", va, bytes));
  }
  // Like cuMemMap, the new mapping is inaccessible until set_access.
  const int fd = c.imported ? c.imported->fd.get() : pool.fd();
  void* p = ::mmap(as_ptr(va), bytes, PROT_NONE, MAP_SHARED | MAP_FIXED, fd,
                   static_cast<off_t>(c.offset + chunk_offset));
  if (p == MAP_FAILED) {
    const int err = errno;
    unback(va, bytes);  // a failed MAP_FIXED may have torn a hole in the reservation
    throw_errno("mmap", err, "cuMemMap");
  }
  auto hint = pages_.lower_bound(va);
  for (DevicePtr page = va; page < va + bytes; page += g) {
    hint = pages_.emplace_hint(
        hint, page,
        Page{chunk.value, g, pool.where(), std::vector<Access>(device_count_, Access::none)});
    ++hint;
  }
  c.mapped_pages += bytes / g;
  mapped_bytes_ += bytes;
}

std::pair<SimMemory::PageIt, SimMemory::PageIt> SimMemory::covering_pages(DevicePtr va,
                                                                          std::size_t bytes,
                                                                          const char* what) {
  const auto first = pages_.find(va);
  if (first == pages_.end()) {
    throw InvalidArgument(fmt::format("{}: {:#x} is not the start of a mapped page", what, va));
  }
  auto it = first;
  DevicePtr cursor = va;
  const DevicePtr end = va + bytes;
  while (cursor < end) {
    if (it == pages_.end() || it->first != cursor) {
      throw InvalidArgument(fmt::format("{}: [{:#x}, +{}) is not fully mapped (hole at {:#x})",
                                        what, va, bytes, cursor));
    }
    cursor += it->second.bytes;
    ++it;
  }
  if (cursor != end) {
    throw InvalidArgument(
        fmt::format("{}: [{:#x}, +{}) does not end on a page boundary", what, va, bytes));
  }
  return {first, it};
}

void SimMemory::unmap(DevicePtr va, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  const auto [first, last] = covering_pages(va, bytes, "unmap");
  if (const int err = unback(va, bytes); err != 0) throw_errno("mmap", err, "cuMemUnmap");
  drop_pages(first, last);
}

void SimMemory::drop_pages(PageIt first, PageIt last) {
  std::vector<std::uint64_t> freed;
  for (auto it = first; it != last; ++it) {
    mapped_bytes_ -= it->second.bytes;
    Chunk& chunk = chunks_.at(it->second.chunk);
    if (--chunk.mapped_pages == 0 && chunk.released) freed.push_back(it->second.chunk);
  }
  // Erasing the pages also forgets their access, as CUDA does on unmap.
  pages_.erase(first, last);
  for (std::uint64_t id : freed) free_chunk(id);
}

void SimMemory::set_access(DevicePtr va, std::size_t bytes, std::span<const AccessGrant> grants) {
  std::lock_guard lock(mutex_);
  const auto [first, last] = covering_pages(va, bytes, "set_access");
  std::vector<std::vector<Access>> updated;
  for (auto it = first; it != last; ++it) {
    updated.push_back(it->second.access);
    for (const AccessGrant& grant : grants) {
      updated.back()[static_cast<std::size_t>(grant.device)] = grant.access;
    }
  }
  // Host threads stand in for every device, so the MMU can only enforce the strongest grant.
  // Protect runs of equal protection with one mprotect each, before committing any state.
  std::size_t i = 0;
  for (auto it = first; it != last;) {
    const DevicePtr start = it->first;
    const int prot = prot_for(strongest(updated[i]));
    std::size_t run = 0;
    while (it != last && prot_for(strongest(updated[i])) == prot) {
      run += it->second.bytes;
      ++it;
      ++i;
    }
    if (::mprotect(as_ptr(start), run, prot) != 0) throw_errno("mprotect", errno, "cuMemSetAccess");
  }
  i = 0;
  for (auto it = first; it != last; ++it) it->second.access = std::move(updated[i++]);
}

bool SimMemory::range_usable(DevicePtr lo, std::size_t bytes, bool write) const {
  if (bytes == 0) return true;
  if (lo == 0 || bytes > UINTPTR_MAX - lo) return false;
  const DevicePtr hi = lo + bytes;
  const Access needed = write ? Access::read_write : Access::read;
  auto it = reservations_.upper_bound(lo);
  if (it != reservations_.begin() && std::prev(it)->second.end() > lo) --it;
  // Memory outside every reservation is ordinary host memory, which the caller vouches for; a
  // range that is partly reserved must be wholly reserved and mapped.
  if (it == reservations_.end() || it->first >= hi) return true;
  DevicePtr cursor = lo;
  for (; it != reservations_.end() && it->first < hi; ++it) {
    if (it->first > cursor) return false;
    const DevicePtr end = std::min(hi, it->second.end());
    while (cursor < end) {
      auto page = find_page(cursor);
      if (page == pages_.end() || strongest(page->second.access) < needed) return false;
      cursor = page->first + page->second.bytes;
    }
    cursor = std::max(cursor, end);
  }
  return cursor >= hi;
}

std::optional<Location> SimMemory::physical_location(DevicePtr va) const {
  const Page* page = page_at(va);
  if (page == nullptr) return std::nullopt;
  return page->where;
}

SimMemory::CopyEnds SimMemory::check_copy(DevicePtr dst, DevicePtr src, std::size_t bytes,
                                          bool locate) const {
  std::lock_guard lock(mutex_);
  const bool src_ok = range_usable(src, bytes, false);
  if (!src_ok || !range_usable(dst, bytes, true)) {
    throw DeviceError(
        "cuMemcpyAsync", "CUDA_ERROR_INVALID_VALUE", kCudaErrorInvalidValue,
        fmt::format("{} [{:#x}, +{}) is not {} memory", src_ok ? "destination" : "source",
                    src_ok ? dst : src, bytes, src_ok ? "writable" : "readable"));
  }
  if (!locate) return {};
  return {physical_location(dst), physical_location(src)};
}

void SimMemory::check_fill(DevicePtr dst, std::size_t bytes) const {
  std::lock_guard lock(mutex_);
  if (!range_usable(dst, bytes, true)) {
    throw DeviceError("cuMemsetD8Async", "CUDA_ERROR_INVALID_VALUE", kCudaErrorInvalidValue,
                      fmt::format("[{:#x}, +{}) is not writable memory", dst, bytes));
  }
}

Access SimMemory::access_of(DevicePtr va, int device) const {
  std::lock_guard lock(mutex_);
  const Page* page = page_at(va);
  return page ? page->access[static_cast<std::size_t>(device)] : Access::none;
}

std::optional<Location> SimMemory::location_of(DevicePtr va) const {
  std::lock_guard lock(mutex_);
  return physical_location(va);
}

std::size_t SimMemory::chunk_bytes(Location where) const {
  std::lock_guard lock(mutex_);
  return pools_[pool_index(where)].used();
}

std::size_t SimMemory::mapped_bytes() const {
  std::lock_guard lock(mutex_);
  return mapped_bytes_;
}

std::size_t SimMemory::reserved_bytes() const {
  std::lock_guard lock(mutex_);
  std::size_t total = 0;
  for (const auto& [base, range] : reservations_) total += range.bytes();
  return total;
}

}  // namespace salus::sim
