#include "memory/heap_arenas.hpp"

#include <algorithm>

#include "log/log.hpp"

namespace salus::memory {

HeapArenas::HeapArenas(DeviceBackend& backend, std::size_t page_bytes, int device,
                       std::size_t small_bytes, std::size_t large_bytes, std::uint64_t epoch)
    : backend_(backend),
      page_bytes_(page_bytes),
      device_(device),
      first_bytes_{small_bytes, large_bytes} {
  try {
    grow(kSmall, small_bytes, epoch);  // the first range of a class throws when refused
    grow(kLarge, large_bytes, epoch);
  } catch (...) {
    for_each([&](Arena& arena) {
      try {
        backend_.free_address(arena.base(), arena.bytes());
      } catch (const Error&) {  // the reservation just made: nothing else can hold it
      }
    });
    throw;
  }
}

HeapArenas::~HeapArenas() {
  for_each([&](Arena& arena) {
    try {
      backend_.free_address(arena.base(), arena.bytes());
    } catch (const Error& e) {
      log::error("freeing an address range at shutdown failed: {}", e.what());
    }
  });
}

Arena* HeapArenas::grow(SizeClass c, std::size_t bytes, std::uint64_t epoch) {
  if (ranges_.full()) return nullptr;
  const std::size_t page = page_bytes_;
  // At least the class's first range, and at least as much as the class has already: a class
  // that keeps running out doubles its address space each time.
  std::size_t size = std::max(first_bytes_[c], (bytes + page - 1) / page * page);
  for (const auto& arena : arenas_[c]) size = std::max(size, arena->bytes());
  DevicePtr base = 0;
  try {
    base = backend_.reserve_address(size, page);
  } catch (const Error& e) {
    if (arenas_[c].empty()) throw;  // the heap cannot exist without its first ranges
    log::warn("device {}: reserving another {} bytes of address space failed: {}", device_, size,
              e.what());
    return nullptr;
  }
  Arena* arena = arenas_[c].emplace_back(std::make_unique<Arena>(base, size, page)).get();
  arena->set_epoch(epoch);
  ranges_.add(base, size);
  return arena;
}

Block* HeapArenas::overflow(std::size_t bytes, Arena*& where) {
  // A small block whose page would be a fresh chunk. The classes peak at different times (a
  // recurrent model's small per-step tensors in the forward pass, its large gradients in the
  // backward pass): free space the large class has mapped, such as the partly used last page of
  // a large block, holds it at no cost, and the choice is the same in every iteration, so the
  // steady state maps nothing. (Large blocks stay in their class: a small range holds few, and
  // the large class's own pages would then go unused in every iteration.)
  for (const auto& arena : arenas_[kLarge]) {
    if (const Arena::Spot spot = arena->cheapest(bytes, true); spot.block != nullptr) {
      where = arena.get();
      return arena->carve_from(spot, bytes);
    }
  }
  return nullptr;
}

}  // namespace salus::memory
