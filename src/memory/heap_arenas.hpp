// The address space of one stream heap: its arenas by size class, each one reserved address
// range kept until the heap goes (the destructor frees them), published in AddressRanges for
// lookups that take no lock; and where in them a new block goes (place).
//
// Lock story: no lock of its own; its heap's mutex guards every call but contains() and count(),
// which any thread may make without a lock (see AddressRanges). It makes no driver call but
// reserving and freeing address ranges: pages are the PageTable's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "memory/address_ranges.hpp"
#include "memory/arena.hpp"
#include "memory/page_pool.hpp"
#include "salus/device.hpp"

namespace salus::memory {

class HeapArenas {
 public:
  // Requests up to this size share pages in arenas of their own, so that small long-lived blocks
  // do not pin pages among large ones; except that one that would need a fresh chunk goes on
  // pages the large class has mapped and left free, if any (see place).
  static constexpr std::size_t kSmallRequest = 1 << 20;
  enum SizeClass : std::size_t { kSmall = 0, kLarge = 1 };
  static SizeClass class_of(std::size_t bytes) { return bytes <= kSmallRequest ? kSmall : kLarge; }

  // Reserves the first range of each class (`small_bytes`, `large_bytes`), whose frees belong to
  // `epoch`; throws what the backend throws when refused (nothing stays reserved). `backend`
  // outlives this; `page_bytes`: the device's page size, the ranges' alignment.
  HeapArenas(DeviceBackend& backend, std::size_t page_bytes, int device, std::size_t small_bytes,
             std::size_t large_bytes, std::uint64_t epoch);
  ~HeapArenas();  // frees every range; their pages must be unmapped by then
  HeapArenas(const HeapArenas&) = delete;
  HeapArenas& operator=(const HeapArenas&) = delete;

  // Lock-free: whether `p` lies in one of the ranges.
  [[nodiscard]] bool contains(DevicePtr p) const { return ranges_.contains(p); }
  // Lock-free: ranges reserved so far (both classes).
  [[nodiscard]] std::size_t count() const { return ranges_.count(); }
  [[nodiscard]] const ArenaSet& set() const { return arenas_; }
  // The arena that holds `block`; throws InvalidArgument when none does.
  Arena& arena_of(const Block& block) { return memory::arena_of(arenas_, block); }
  // Every arena, large ones first (the order reclaiming takes pages in).
  template <class F>
  void for_each(F&& visit) {
    for (SizeClass c : {kLarge, kSmall}) {
      for (const auto& arena : arenas_[c]) visit(*arena);
    }
  }
  // Frees from now on belong to `epoch` (QuietEpochs::current), in every arena.
  void set_epoch(std::uint64_t epoch) {
    for_each([&](Arena& arena) { arena.set_epoch(epoch); });
  }

  // Where a new block of `bytes` goes (`where` says which arena). The steady state: a spot on
  // mapped pages in the class's first range, found with one lookup. Else, for a small block whose
  // pages would come from fresh chunks (more than `pool` keeps), free space the large class has
  // mapped that holds it (overflow). Else `cutter.carve_in(arena, bytes)` in each arena of its
  // class, oldest first (the heap's PageSupply, which may set blocks aside), and last a new range
  // (grow), whose frees belong to `cutter.epoch()`. nullptr when no range can be had at all.
  template <class Cutter>
  Block* place(std::size_t bytes, Arena*& where, const PagePool& pool, Cutter& cutter);

 private:
  // A spot for a small block on the large class's mapped free pages; nullptr when none.
  Block* overflow(std::size_t bytes, Arena*& where);
  // A new range for `c`, large enough for `bytes`; nullptr when the backend refuses one (but for
  // a class's first, which throws) or there are AddressRanges::kMax already. A class that has no
  // room left for a request gets another range this way, so address space never decides whether
  // an allocation fits: only physical pages do (DESIGN.md, invariant 6).
  Arena* grow(SizeClass c, std::size_t bytes, std::uint64_t epoch);

  DeviceBackend& backend_;
  std::size_t page_bytes_;
  int device_;
  std::size_t first_bytes_[2];
  ArenaSet arenas_;  // each class oldest first
  AddressRanges ranges_;
};

template <class Cutter>
Block* HeapArenas::place(std::size_t bytes, Arena*& where, const PagePool& pool, Cutter& cutter) {
  const SizeClass c = class_of(bytes);
  Arena& first = *arenas_[c].front();
  const Arena::Spot spot = first.cheapest(bytes);
  if (spot.block != nullptr && spot.cost == 0) {
    where = &first;
    return first.carve_from(spot, bytes);
  }
  if (c == kSmall && spot.block != nullptr &&
      first.unmapped_pages(spot.addr, bytes) > pool.kept_pages()) {
    if (Block* block = overflow(bytes, where)) return block;
  }
  for (const auto& arena : arenas_[c]) {
    if (Block* block = cutter.carve_in(*arena, bytes)) {
      where = arena.get();
      return block;
    }
  }
  Arena* fresh = grow(c, bytes, cutter.epoch());
  if (fresh == nullptr) return nullptr;
  where = fresh;
  return fresh->carve(bytes);
}

}  // namespace salus::memory
