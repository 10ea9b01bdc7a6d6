#include "memory/stream_heap.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "memory/device_heap.hpp"

namespace salus::memory {

namespace {

DevicePtr reserve_range(DeviceBackend& backend, std::size_t bytes, std::size_t page) {
  return backend.reserve_address(bytes, page);
}

}  // namespace

StreamHeap::StreamHeap(DeviceHeap& device, StreamHandle stream, std::size_t small_bytes,
                       std::size_t large_bytes)
    : device_(device),
      stream_(stream),
      // One reservation holds the small arena and the large arena.
      va_base_(reserve_range(device.backend(), small_bytes + large_bytes, device.granularity())),
      va_bytes_(small_bytes + large_bytes),
      small_(va_base_, small_bytes, device.granularity()),
      large_(va_base_ + small_bytes, large_bytes, device.granularity()) {}

StreamHeap::~StreamHeap() {
  // Live blocks at this point belong to a caller that never freed them; their pages go anyway.
  if (!live_.empty()) {
    spdlog::warn("salus: device {} stream {:#x}: {} blocks still live at shutdown",
                 device_.device(), stream_.value, live_.size());
  }
  std::vector<Page> pages;
  for (Arena* arena : {&small_, &large_}) {
    for (std::size_t i = 0; i < arena->page_count(); ++i) {
      if (arena->page(i).mapped) {
        try {
          pages.push_back(unmap_page(*arena, i));
        } catch (const Error& e) {
          spdlog::error("salus: unmapping at shutdown failed: {}", e.what());
        }
      }
    }
  }
  device_.tiers().give_back(device_.device(), pages);
  try {
    device_.backend().free_address(va_base_, va_bytes_);
  } catch (const Error& e) {
    spdlog::error("salus: freeing an address range at shutdown failed: {}", e.what());
  }
}

CarveResult StreamHeap::allocate(std::size_t bytes, std::size_t requested, JobId job,
                                 Lifetime lifetime, std::vector<Page>& stash) {
  std::lock_guard lock(mu_);
  if (!pending_.empty()) retire_pending();
  Arena& arena = arena_for(bytes);
  Block* block = arena.carve(bytes);
  if (block == nullptr) return {.out_of_address_space = true};

  auto [first, last] = arena.pages_touched(*block);
  std::size_t missing = 0;
  for (std::size_t i = first; i < last; ++i) missing += arena.page(i).mapped ? 0 : 1;
  if (missing > 0) {
    std::vector<Page> pages;
    pages.reserve(missing);
    try {
      std::size_t got = device_.pool().acquire(missing, pages);
      // The block is live now, so reclaiming cannot take pages from under it.
      if (got < missing) got += reclaim_locked(missing - got, pages);
      if (got < missing && stash.size() >= missing - got) {
        // Borrowed pages go in front: map_pages takes pages from the back, so the local ones
        // fill the block's first pages and the borrowed ones its last.
        const auto take = stash.end() - static_cast<std::ptrdiff_t>(missing - got);
        pages.insert(pages.begin(), std::make_move_iterator(take),
                     std::make_move_iterator(stash.end()));
        stash.erase(take, stash.end());
        got = missing;
      }
      if (got < missing) {
        device_.tiers().give_back(device_.device(), pages);
        arena.release(block);
        return {.pages_short = missing - got};
      }
      map_pages(arena, first, last, pages);
    } catch (...) {
      // A driver failure: whatever pages were gathered go back, the block returns to the free set.
      device_.tiers().give_back(device_.device(), pages);
      arena.release(block);
      throw;
    }
  }

  block->requested = requested;
  block->job = job;
  block->lifetime = lifetime;
  link(block);
  live_.emplace(block->addr, block);
  ++tally_.allocations;
  ++tally_.blocks[static_cast<std::size_t>(lifetime)];
  device_.counters().on_allocate(lifetime, block->size);
  return {.ptr = block->addr};
}

void StreamHeap::map_pages(Arena& arena, std::size_t first, std::size_t last,
                           std::vector<Page>& pages) {
  DeviceBackend& backend = device_.backend();
  const std::size_t page = arena.page_bytes();
  std::vector<std::size_t> mapped_now;
  const Event* waited_on = nullptr;
  try {
    std::size_t i = first;
    while (i < last) {
      if (arena.page(i).mapped) {
        ++i;
        continue;
      }
      // Map a run of unmapped pages, then grant access to the whole run at once.
      const std::size_t run_start = i;
      for (; i < last && !arena.page(i).mapped; ++i) {
        const Page& next = pages.back();
        // A page from another stream: our later work waits for that stream's, on the GPU.
        if (next.fence && next.fence.get() != waited_on && !next.fence->query()) {
          backend.stream_wait_event(stream_, next.fence->handle());
          waited_on = next.fence.get();
        }
        const ChunkHandle chunk = next.chunk;
        const Location where = next.where;
        backend.map(arena.page_addr(i), page, chunk, 0);
        pages.pop_back();
        arena.page(i) = {chunk, where, true};
        mapped_now.push_back(i);
        device_.counters().page_maps.fetch_add(1, std::memory_order_relaxed);
        device_.counters().mapped.fetch_add(page, std::memory_order_relaxed);
        if (const Tier tier = tier_of(where, device_.device()); tier != Tier::local) {
          device_.counters().borrowed[static_cast<std::size_t>(tier)].fetch_add(
              page, std::memory_order_relaxed);
          ++remote_pages_;
        }
      }
      backend.set_access(arena.page_addr(run_start), (i - run_start) * page, device_.grants());
    }
  } catch (...) {
    for (std::size_t index : mapped_now) {
      try {
        pages.push_back(unmap_page(arena, index));
      } catch (const Error& e) {
        spdlog::error("salus: rolling back a page map failed: {}", e.what());
      }
    }
    throw;
  }
}

Page StreamHeap::unmap_page(Arena& arena, std::size_t index) {
  PageSlot& slot = arena.page(index);
  device_.backend().unmap(arena.page_addr(index), arena.page_bytes());
  const Page page{slot.chunk, nullptr, slot.where};
  if (const Tier tier = tier_of(slot.where, device_.device()); tier != Tier::local) {
    device_.counters().borrowed[static_cast<std::size_t>(tier)].fetch_sub(
        arena.page_bytes(), std::memory_order_relaxed);
    --remote_pages_;
  }
  slot = PageSlot{};
  device_.counters().page_unmaps.fetch_add(1, std::memory_order_relaxed);
  device_.counters().mapped.fetch_sub(arena.page_bytes(), std::memory_order_relaxed);
  return page;
}

Block* StreamHeap::live_block(DevicePtr ptr, const char* what) {
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    throw InvalidArgument(fmt::format(
        "{}: {:#x} is not a live Salus block on device {} (never allocated, already freed, or "
        "not the start of a block)",
        what, ptr, device_.device()));
  }
  return it->second;
}

void StreamHeap::link(Block* block) {
  JobBlocks& owner = jobs_[block->job.value];
  const auto c = static_cast<std::size_t>(block->lifetime);
  block->job_prev = nullptr;
  block->job_next = owner.head[c];
  if (owner.head[c]) owner.head[c]->job_prev = block;
  owner.head[c] = block;
  owner.usage.bytes[c] += block->size;
  ++owner.usage.blocks[c];
}

void StreamHeap::unlink(Block* block) {
  JobBlocks& owner = jobs_[block->job.value];
  const auto c = static_cast<std::size_t>(block->lifetime);
  if (block->job_prev) {
    block->job_prev->job_next = block->job_next;
  } else {
    owner.head[c] = block->job_next;
  }
  if (block->job_next) block->job_next->job_prev = block->job_prev;
  block->job_prev = block->job_next = nullptr;
  owner.usage.bytes[c] -= block->size;
  --owner.usage.blocks[c];
}

FreedBlock StreamHeap::free_block(Block* block) {
  const FreedBlock freed{block->job, block->lifetime, block->size};
  unlink(block);
  live_.erase(block->addr);
  ++tally_.frees;
  --tally_.blocks[static_cast<std::size_t>(block->lifetime)];
  device_.counters().on_free(block->lifetime, block->size);
  if (block->other_streams.empty()) {
    release_block(block);
    return freed;
  }
  // Other streams may still read or write it: reuse waits until their work so far has finished.
  Pending pending{block, {}};
  for (StreamHandle other : block->other_streams) {
    Event& event = pending.events.emplace_back(device_.shared_backend(), device_.device());
    event.record(other);
  }
  pending_.push_back(std::move(pending));
  return freed;
}

FreedBlock StreamHeap::deallocate(DevicePtr ptr, std::optional<std::size_t> caller_bytes) {
  std::lock_guard lock(mu_);
  Block* block = live_block(ptr, "free");
  if (caller_bytes && *caller_bytes != block->requested && *caller_bytes != block->size) {
    throw InvalidArgument(fmt::format(
        "free: size {} does not match the block at {:#x}, which was allocated with {} bytes",
        *caller_bytes, ptr, block->requested));
  }
  return free_block(block);
}

void StreamHeap::record_stream_use(DevicePtr ptr, StreamHandle other) {
  std::lock_guard lock(mu_);
  Block* block = live_block(ptr, "record_stream_use");
  if (other == stream_) return;
  for (StreamHandle s : block->other_streams) {
    if (s == other) return;
  }
  block->other_streams.push_back(other);
}

void StreamHeap::retire_pending() {
  std::erase_if(pending_, [this](Pending& p) {
    for (Event& e : p.events) {
      if (!e.query()) return false;
    }
    release_block(p.block);
    return true;
  });
}

void StreamHeap::release_block(Block* block) {
  Arena& arena = arena_of(*block);
  if (remote_pages_ == 0) {
    arena.release(block);
    return;
  }
  auto [first, last] = arena.pages_touched(*block);
  const Block* merged = arena.release(block);
  return_remote_pages(arena, first, last, *merged);
}

void StreamHeap::return_remote_pages(Arena& arena, std::size_t first, std::size_t last,
                                     const Block& merged) {
  auto [inside_first, inside_last] = arena.pages_inside(merged);
  std::vector<Page> pages;
  for (std::size_t i = std::max(first, inside_first); i < std::min(last, inside_last); ++i) {
    const PageSlot& slot = arena.page(i);
    if (slot.mapped && tier_of(slot.where, device_.device()) != Tier::local) {
      pages.push_back(unmap_page(arena, i));
    }
  }
  if (pages.empty()) return;
  // Work enqueued before the free may still touch these pages: their next user waits for it.
  auto fence = std::make_shared<Event>(device_.shared_backend(), device_.device());
  fence->record(stream_);
  for (Page& page : pages) page.fence = fence;
  device_.tiers().give_back(device_.device(), pages);
}

std::pair<std::size_t, std::size_t> StreamHeap::promote(JobId job) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job.value);
  if (it == jobs_.end()) return {0, 0};
  JobBlocks& owner = it->second;
  constexpr auto eph = static_cast<std::size_t>(Lifetime::ephemeral);
  constexpr auto per = static_cast<std::size_t>(Lifetime::persistent);
  std::size_t blocks = 0;
  Block* tail = nullptr;
  for (Block* b = owner.head[eph]; b != nullptr; b = b->job_next) {
    b->lifetime = Lifetime::persistent;
    tail = b;
    ++blocks;
  }
  if (tail == nullptr) return {0, 0};
  // Splice the whole ephemeral list in front of the persistent one.
  tail->job_next = owner.head[per];
  if (owner.head[per]) owner.head[per]->job_prev = tail;
  owner.head[per] = owner.head[eph];
  owner.head[eph] = nullptr;
  const std::size_t bytes = owner.usage.bytes[eph];
  owner.usage.bytes[per] += bytes;
  owner.usage.bytes[eph] = 0;
  owner.usage.blocks[per] += blocks;
  owner.usage.blocks[eph] = 0;
  tally_.blocks[per] += blocks;
  tally_.blocks[eph] -= blocks;
  device_.counters().on_promote(bytes);
  return {bytes, blocks};
}

std::optional<BlockInfo> StreamHeap::find(DevicePtr ptr) {
  std::lock_guard lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return std::nullopt;
  const Block& b = *it->second;
  return BlockInfo{b.addr, b.size, b.requested, device_.device(), stream_, b.job, b.lifetime};
}

StreamHeap::Tally& StreamHeap::Tally::operator+=(const Tally& other) {
  allocations += other.allocations;
  frees += other.frees;
  for (std::size_t c = 0; c < kLifetimeCount; ++c) blocks[c] += other.blocks[c];
  return *this;
}

StreamHeap::Tally StreamHeap::tally() {
  std::lock_guard lock(mu_);
  return tally_;
}

StreamHeap::JobUsage StreamHeap::job_usage(JobId job) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job.value);
  return it == jobs_.end() ? JobUsage{} : it->second.usage;
}

std::size_t StreamHeap::reclaim_locked(std::size_t wanted, std::vector<Page>& out) {
  std::size_t taken = 0;
  for (Arena* arena : {&large_, &small_}) {
    arena->for_each_free_largest_first([&](const Block& free_block) {
      if (taken >= wanted) return;
      auto [first, last] = arena->pages_inside(free_block);
      for (std::size_t i = first; i < last && taken < wanted; ++i) {
        // Pages of other tiers in free space went home when they were freed.
        if (!arena->page(i).mapped || arena->page(i).where != device_.pool().where()) continue;
        out.push_back(unmap_page(*arena, i));
        ++taken;
      }
    });
    if (taken >= wanted) break;
  }
  return taken;
}

std::size_t StreamHeap::reclaim_pages(std::size_t wanted) {
  std::lock_guard lock(mu_);
  std::vector<Page> pages;
  const std::size_t taken = reclaim_locked(wanted, pages);
  if (taken == 0) return 0;
  // Work enqueued on this stream before its blocks were freed may still touch their pages.
  auto fence = std::make_shared<Event>(device_.shared_backend(), device_.device());
  fence->record(stream_);
  for (Page& page : pages) page.fence = fence;
  device_.pool().put(pages);
  return taken;
}

}  // namespace salus::memory
