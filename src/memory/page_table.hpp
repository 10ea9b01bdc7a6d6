// The page side of a stream heap's address ranges (the arenas' PageSlots): maps pages under a
// block, hands free ones to a new user and unmaps them, and keeps the addresses still retiring.
// Lock story: no lock of its own; guarded by the owning StreamHeap's mutex, which the caller
// holds for every call.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "memory/arena.hpp"
#include "memory/device_counters.hpp"
#include "memory/page_mover.hpp"
#include "memory/page_source.hpp"
#include "salus/device.hpp"

namespace salus::memory {

// What a page table uses of its device: each part is the DeviceHeap's and outlives the table.
struct PageTableDevice {
  DeviceBackend& backend;
  DeviceCounters& counters;
  const AccessGrants& grants;  // who must reach a page mapped here, by where it lives
  int device;
};

class PageTable {
 public:
  explicit PageTable(const PageTableDevice& device) : device_(device) {}
  PageTable(const PageTable&) = delete;
  PageTable& operator=(const PageTable&) = delete;

  // Whether some page handed off is still mapped at its old address (settle_retiring's work).
  [[nodiscard]] bool retiring() const { return !retiring_.empty(); }
  // Mapped pages that live on another tier.
  [[nodiscard]] std::size_t& remote_pages() { return remote_pages_; }

  [[nodiscard]] static bool awaits_retiring(Arena& arena, const Block& block);
  // Makes the pages [first, last) of a block just carved ready for mapping: waits out old
  // addresses still retiring there. Returns how many pages need mapping. Page fences stay: an
  // allocation that fails after this gives the block back with its pages' fences intact.
  std::size_t prepare_pages(Arena& arena, std::size_t first, std::size_t last);
  // Once the block is the caller's: orders `stream` after the work that other streams may
  // still do on its pages kept mapped (their fences), and drops those fences.
  void adopt_page_fences(Arena& arena, std::size_t first, std::size_t last, StreamHandle stream);
  // Maps `pages` (taken from the back) under the unmapped pages of [first, last); `stream` (the
  // heap's) orders its work after theirs. On failure the pages go back to `pages`; with fewer
  // pages than unmapped pages there, it maps none and throws InvalidArgument.
  void map_pages(Arena& arena, std::size_t first, std::size_t last, std::vector<Page>& pages,
                 StreamHandle stream);
  // Hands page `index` over to a new user: unmapped at once when no work may still touch it,
  // else fenced (`own`: the heap's stream's work so far, or null) and left mapped at its old
  // address (retiring) until that work has finished. Only pages wholly inside free space are
  // handed off.
  Page hand_off(Arena& arena, std::size_t index, const FencePtr& own);
  // Unmaps one owned page and returns it; work that may still touch it must have finished.
  Page unmap_page(Arena& arena, std::size_t index);
  // The page is no longer this arena's: counters follow.
  void forget_page(Arena& arena, std::size_t index);
  // Unmaps the old addresses of pages handed off whose work has finished; with `wait`, waits
  // for that work first.
  void settle_retiring(bool wait);
  void unmap_retired(Arena& arena, std::size_t index);

 private:
  // map_pages failed: unmaps the pages it mapped (`mapped_now`, by index) and puts them back.
  void roll_back(Arena& arena, std::vector<std::pair<std::size_t, Page>>& mapped_now,
                 std::vector<Page>& pages);

  PageTableDevice device_;
  std::size_t remote_pages_ = 0;  // mapped pages that live on another tier
  // Pages handed off but still mapped here (PageSlot::retiring), oldest first.
  std::vector<std::pair<Arena*, std::size_t>> retiring_;
};

}  // namespace salus::memory
