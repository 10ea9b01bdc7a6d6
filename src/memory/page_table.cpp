// The page side of a stream heap's address ranges: mapping physical pages under a block, handing
// free ones to a new user (behind a fence, the old address kept mapped until the work enqueued
// before has finished: retiring) and unmapping them, with the device's counters kept true. Lock
// story: no lock of its own; guarded by the owning StreamHeap's mutex, which the caller holds.
#include "memory/page_table.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "log/log.hpp"
#include "memory/tiers.hpp"

namespace salus::memory {

bool PageTable::awaits_retiring(Arena& arena, const Block& block) {
  auto [first, last] = arena.pages_touched(block);
  for (std::size_t i = first; i < last; ++i) {
    const PageSlot& slot = arena.page(i);
    if (slot.retiring && !slot.fence->done()) return true;
  }
  return false;
}

std::size_t PageTable::prepare_pages(Arena& arena, std::size_t first, std::size_t last) {
  std::size_t missing = 0;
  bool waited = false;
  for (std::size_t i = first; i < last; ++i) {
    PageSlot& slot = arena.page(i);
    if (slot.retiring) {
      // The old address still maps a page that went to another user, behind work enqueued here
      // that has not finished. A new page can be mapped here only once it has: the one place
      // where an allocation waits on the host (see DeviceMemoryStats::allocation_waits).
      if (!slot.fence->done()) {
        if (!std::exchange(waited, true)) {
          device_.counters.allocation_waits.fetch_add(1, std::memory_order_relaxed);
        }
        slot.fence->wait();
      }
      std::erase(retiring_, std::pair<Arena*, std::size_t>{&arena, i});
      unmap_retired(arena, i);
    }
    if (!slot.mapped) ++missing;
  }
  return missing;
}

void PageTable::adopt_page_fences(Arena& arena, std::size_t first, std::size_t last,
                                  StreamHandle stream) {
  DeviceBackend& backend = device_.backend;
  const Fence* ordered = nullptr;
  for (std::size_t i = first; i < last; ++i) {
    PageSlot& slot = arena.page(i);
    if (!slot.fence) continue;
    // Work of other streams on a block freed here: this stream waits for it on the GPU, and the
    // page's fence is this stream's from now on (its epochs cover it).
    if (slot.fence.get() != ordered) slot.fence->order(backend, stream, device_.device);
    ordered = slot.fence.get();
    slot.fence.reset();
  }
}

void PageTable::map_pages(Arena& arena, std::size_t first, std::size_t last,
                          std::vector<Page>& pages, StreamHandle stream) {
  DeviceBackend& backend = device_.backend;
  const std::size_t page = arena.page_bytes();
  std::vector<std::pair<std::size_t, Page>> mapped_now;
  const Fence* ordered = nullptr;
  try {
    std::size_t i = first;
    while (i < last) {
      if (arena.page(i).mapped) {
        ++i;
        continue;
      }
      if (pages.empty()) {  // a caller's bug (it counts the pages first): nothing is lost
        throw InvalidArgument(fmt::format("map_pages: too few pages for [{:#x}, {:#x})",
                                          arena.page_addr(first), arena.page_addr(last)));
      }
      // Map a run of unmapped pages from one location, then grant access to the whole run at
      // once (who may access a page depends on where it lives).
      const std::size_t run_start = i;
      const Location run_where = pages.back().where;
      for (; i < last && !arena.page(i).mapped && !pages.empty() && pages.back().where == run_where;
           ++i) {
        // A page from another user: our later work waits for its old work, on the GPU.
        if (const Page& next = pages.back(); next.fence && next.fence.get() != ordered) {
          next.fence->order(backend, stream, device_.device);
          ordered = next.fence.get();
        }
        backend.map(arena.page_addr(i), page, pages.back().chunk, 0);
        mapped_now.emplace_back(i, std::move(pages.back()));
        pages.pop_back();
        const Page& taken = mapped_now.back().second;
        arena.page(i) = PageSlot{taken.chunk, taken.where, true, false, nullptr};
        arena.note_mapped(i);
        device_.counters.page_maps.fetch_add(1, std::memory_order_relaxed);
        device_.counters.mapped.fetch_add(page, std::memory_order_relaxed);
        if (const Tier tier = tier_of(taken.where, device_.device); tier != Tier::local) {
          device_.counters.borrowed[static_cast<std::size_t>(tier)].fetch_add(
              page, std::memory_order_relaxed);
          ++remote_pages_;
        }
      }
      backend.set_access(arena.page_addr(run_start), (i - run_start) * page,
                         device_.grants.of(run_where));
    }
  } catch (...) {
    roll_back(arena, mapped_now, pages);
    throw;
  }
}

void PageTable::roll_back(Arena& arena, std::vector<std::pair<std::size_t, Page>>& mapped_now,
                          std::vector<Page>& pages) {
  // Nothing has used the new mappings; the pages go back as they came, fences included.
  for (auto& [index, taken] : mapped_now) {
    try {
      forget_page(arena, index);
      device_.backend.unmap(arena.page_addr(index), arena.page_bytes());
      device_.counters.page_unmaps.fetch_add(1, std::memory_order_relaxed);
    } catch (const Error& e) {
      log::error("rolling back a page map failed: {}", e.what());
    }
    pages.push_back(std::move(taken));
  }
}

void PageTable::forget_page(Arena& arena, std::size_t index) {
  PageSlot& slot = arena.page(index);
  if (const Tier tier = tier_of(slot.where, device_.device); tier != Tier::local) {
    device_.counters.borrowed[static_cast<std::size_t>(tier)].fetch_sub(
        arena.page_bytes(), std::memory_order_relaxed);
    --remote_pages_;
  }
  device_.counters.mapped.fetch_sub(arena.page_bytes(), std::memory_order_relaxed);
  slot = PageSlot{};
}

Page PageTable::unmap_page(Arena& arena, std::size_t index) {
  PageSlot& slot = arena.page(index);
  device_.backend.unmap(arena.page_addr(index), arena.page_bytes());
  Page page{slot.chunk, nullptr, slot.where};
  forget_page(arena, index);
  device_.counters.page_unmaps.fetch_add(1, std::memory_order_relaxed);
  return page;
}

Page PageTable::hand_off(Arena& arena, std::size_t index, const FencePtr& own) {
  PageSlot& slot = arena.page(index);
  FencePtr fence = Fence::join(own, slot.fence);
  if (fence == nullptr) return unmap_page(arena, index);
  // Work enqueued before may still touch the page at this address. The new user maps the same
  // page at its own address at once and waits for the fence on the GPU; this address keeps the
  // page until the fence is seen complete (settle_retiring), so that work never faults.
  Page page{slot.chunk, fence, slot.where};
  const PageSlot kept{slot.chunk, slot.where, true, true, std::move(fence)};
  forget_page(arena, index);
  slot = kept;
  retiring_.emplace_back(&arena, index);
  device_.counters.deferred_unmaps.fetch_add(1, std::memory_order_relaxed);
  device_.counters.retiring.fetch_add(arena.page_bytes(), std::memory_order_relaxed);
  return page;
}

void PageTable::settle_retiring(bool wait) {
  std::erase_if(retiring_, [&](const std::pair<Arena*, std::size_t>& entry) {
    auto [arena, index] = entry;
    PageSlot& slot = arena->page(index);
    try {
      if (wait) {
        slot.fence->wait();
      } else if (!slot.fence->done()) {
        return false;
      }
      unmap_retired(*arena, index);
    } catch (const Error& e) {
      log::error("unmapping a retired page at {:#x} failed: {}", arena->page_addr(index), e.what());
      return false;
    }
    return true;
  });
}

void PageTable::unmap_retired(Arena& arena, std::size_t index) {
  device_.backend.unmap(arena.page_addr(index), arena.page_bytes());
  device_.counters.page_unmaps.fetch_add(1, std::memory_order_relaxed);
  device_.counters.retiring.fetch_sub(arena.page_bytes(), std::memory_order_relaxed);
  arena.page(index) = PageSlot{};
}

}  // namespace salus::memory
