// StreamHeap: the doors to its PageMigrator (remap, demote, recall, fetch, prefetch and the
// per-tier view of a job's blocks, all under this heap's lock), and borrowed pages going home
// after a free. The allocator itself is in stream_heap.cpp.
#include "log/log.hpp"
#include "memory/device_heap.hpp"
#include "memory/stream_heap.hpp"

namespace salus::memory {

HeapView StreamHeap::view() {
  const MigratorDevice device{.backend = device_.shared_backend(),
                              .counters = device_.counters(),
                              .tiers = device_.tiers(),
                              .jobs = device_.jobs(),
                              .mover = device_.mover(),
                              .grants = device_.access_grants(),
                              .device = device_.device(),
                              .page_bytes = device_.granularity(),
                              .limit_bytes = device_.limit()};
  return {device, stream(), retire_fence_, arenas_, live_, ledger_, table_.remote_pages()};
}

void StreamHeap::remap(DevicePtr ptr, Location where) {
  std::lock_guard lock(mu_);
  Block* block = live_block(ptr, "remap");
  std::vector<StreamHandle> streams;
  streams_using(*block, streams);
  streams.push_back(stream());
  PageMigrator(view()).remap(*block, where, streams);
}

std::size_t StreamHeap::move_pages(const MoveSpec& spec, std::vector<Page>& destinations,
                                   JobGate& gate, std::vector<JobId>* owners) {
  if (destinations.empty()) return 0;
  std::lock_guard lock(mu_);
  return PageMigrator(view()).move_pages(spec, destinations, gate, owners);
}

std::size_t StreamHeap::count_pages(const MoveSpec& spec, JobGate* gate) {
  std::lock_guard lock(mu_);
  return PageMigrator(view()).count_pages(spec, gate);
}

void StreamHeap::add_tier_usage(JobId job, std::size_t (&bytes)[kTierCount]) {
  std::lock_guard lock(mu_);
  PageMigrator(view()).add_tier_usage(job, bytes);
}

bool StreamHeap::has_job(JobId job) {
  std::lock_guard lock(mu_);
  return ledger_.has_job(job);
}

void StreamHeap::return_stray_remote_pages(OwnFence& own) {
  if (table_.remote_pages() == 0) return;
  std::vector<Page> pages;
  try {
    for_each_arena([&](Arena& arena) {
      arena.for_each_free_holding_pages([&](const Block& free_block) {
        auto [first, last] = arena.pages_inside(free_block);
        last = std::min(last, arena.mapped_high());
        for (std::size_t i = first; i < last; ++i) {
          const PageSlot& slot = arena.page(i);
          if (slot.owned() && tier_of(slot.where, device_.device()) != Tier::local) {
            pages.push_back(table_.hand_off(arena, i, own.get()));
          }
        }
        return true;
      });
    });
  } catch (const Error& e) {
    log::warn("device {}: returning borrowed pages failed: {}", device_.device(), e.what());
  }
  device_.tiers().give_back(device_.device(), pages);
}

void StreamHeap::return_remote_pages(Arena& arena, std::size_t first, std::size_t last,
                                     const Block& merged) {
  std::vector<Page> pages;
  OwnFence own(*this);
  try {
    for (std::size_t i = first; i < last; ++i) {
      const PageSlot& slot = arena.page(i);
      if (slot.owned() && tier_of(slot.where, device_.device()) != Tier::local &&
          !live_touches(arena, i, merged)) {
        pages.push_back(table_.hand_off(arena, i, own.get()));
      }
    }
  } catch (const Error& e) {
    // The free is done; handing borrowed pages back early is not part of it. A page whose fence
    // could not be recorded stays here as free space, and a later free, trim or recall returns it.
    log::warn("device {}: returning borrowed pages after a free failed: {}", device_.device(),
              e.what());
  }
  device_.tiers().give_back(device_.device(), pages);
}

bool StreamHeap::live_touches(Arena& arena, std::size_t index, const Block& from) const {
  // Blocks set aside by carve hold addresses, not data: only live blocks keep a page.
  const DevicePtr lo = arena.page_addr(index);
  const DevicePtr hi = lo + arena.page_bytes();
  for (const Block* b = &from; b != nullptr && b->end() > lo; b = b->prev) {
    if (b->addr < hi && live_.contains(b->addr)) return true;
  }
  for (const Block* b = from.next; b != nullptr && b->addr < hi; b = b->next) {
    if (b->end() > lo && live_.contains(b->addr)) return true;
  }
  return false;
}

}  // namespace salus::memory
