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
      // One reservation holds the small arena, the large arena and a scratch page.
      va_base_(reserve_range(device.backend(), small_bytes + large_bytes + device.granularity(),
                             device.granularity())),
      va_bytes_(small_bytes + large_bytes + device.granularity()),
      small_(va_base_, small_bytes, device.granularity()),
      large_(va_base_ + small_bytes, large_bytes, device.granularity()),
      scratch_page_(va_base_ + small_bytes + large_bytes) {}

StreamHeap::~StreamHeap() {
  // Live blocks at this point belong to a caller that never freed them; their pages go anyway.
  if (!live_.empty()) {
    spdlog::warn("salus: device {} stream {:#x}: {} blocks still live at shutdown", device_.device(),
                 stream_.value, live_.size());
  }
  std::vector<Page> local;
  for (Arena* arena : {&small_, &large_}) {
    for (std::size_t i = 0; i < arena->page_count(); ++i) {
      if (arena->page(i).mapped) {
        try {
          unmap_page(*arena, i, local);
        } catch (const Error& e) {
          spdlog::error("salus: unmapping at shutdown failed: {}", e.what());
        }
      }
    }
  }
  device_.pool().put(local);
  try {
    device_.backend().free_address(va_base_, va_bytes_);
  } catch (const Error& e) {
    spdlog::error("salus: freeing an address range at shutdown failed: {}", e.what());
  }
}

CarveResult StreamHeap::allocate(std::size_t bytes, std::size_t requested, JobId job,
                                 Lifetime lifetime) {
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
      if (got < missing) {
        device_.pool().put(pages);
        arena.release(block);
        return {.pages_short = missing - got};
      }
      map_pages(arena, first, last, pages);
    } catch (...) {
      // A driver failure: whatever pages were gathered go back, the block returns to the free set.
      device_.pool().put(pages);
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
        backend.map(arena.page_addr(i), page, chunk, 0);
        pages.pop_back();
        arena.page(i) = {chunk, device_.pool().where(), true};
        mapped_now.push_back(i);
        device_.counters().page_maps.fetch_add(1, std::memory_order_relaxed);
        device_.counters().mapped.fetch_add(page, std::memory_order_relaxed);
      }
      backend.set_access(arena.page_addr(run_start), (i - run_start) * page, device_.grants());
    }
  } catch (...) {
    for (std::size_t index : mapped_now) {
      try {
        unmap_page(arena, index, pages);
      } catch (const Error& e) {
        spdlog::error("salus: rolling back a page map failed: {}", e.what());
      }
    }
    throw;
  }
}

void StreamHeap::unmap_page(Arena& arena, std::size_t index, std::vector<Page>& local_pages) {
  PageSlot& slot = arena.page(index);
  device_.backend().unmap(arena.page_addr(index), arena.page_bytes());
  if (slot.where == device_.pool().where()) {
    local_pages.push_back({slot.chunk, nullptr});
  } else {
    device_.backend().release_chunk(slot.chunk);
  }
  slot = PageSlot{};
  device_.counters().page_unmaps.fetch_add(1, std::memory_order_relaxed);
  device_.counters().mapped.fetch_sub(arena.page_bytes(), std::memory_order_relaxed);
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
    arena_of(*block).release(block);
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
    arena_of(*p.block).release(p.block);
    return true;
  });
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
        if (!arena->page(i).mapped) continue;
        const std::size_t before = out.size();
        unmap_page(*arena, i, out);
        taken += out.size() - before;
      }
    });
    if (taken >= wanted) break;
  }
  return taken;
}

void StreamHeap::drain_stream() {
  if (!drained_) drained_.emplace(device_.shared_backend(), device_.device());
  drained_->record(stream_);
  drained_->synchronize();
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

void StreamHeap::remap(DevicePtr ptr, Location where) {
  std::lock_guard lock(mu_);
  Block* block = live_block(ptr, "remap");
  DeviceBackend& backend = device_.backend();
  const std::size_t page = device_.granularity();
  if (backend.granularity(where) != page) {
    throw NotSupported(fmt::format("remap to {}: its page size {} differs from device {}'s {}",
                                   to_string(where), backend.granularity(where), device_.device(),
                                   page));
  }
  // Every use of the pages so far must have finished before their bytes are copied.
  drain_stream();
  for (StreamHandle other : block->other_streams) {
    Event event(device_.shared_backend(), device_.device());
    event.record(other);
    event.synchronize();
  }
  Arena& arena = arena_of(*block);
  auto [first, last] = arena.pages_touched(*block);
  const bool local = where == device_.pool().where();
  for (std::size_t i = first; i < last; ++i) {
    ChunkHandle fresh;
    if (local) {
      std::vector<Page> got;
      if (device_.pool().acquire(1, got) == 0) {
        throw OutOfMemory({.job = block->job.value,
                           .job_name = {},
                           .device = device_.device(),
                           .requested_bytes = page,
                           .job_in_use_bytes = 0,
                           .job_limit_bytes = 0,
                           .device_in_use_bytes = 0,
                           .device_limit_bytes = device_.limit(),
                           .reason = "remap found no free page on the device"});
      }
      if (got.front().fence) got.front().fence->synchronize();
      fresh = got.front().chunk;
    } else {
      fresh = backend.create_chunk(where, page);
    }
    const DevicePtr va = arena.page_addr(i);
    const AccessGrant self{device_.device(), Access::read_write};
    try {
      backend.map(scratch_page_, page, fresh, 0);
      backend.set_access(scratch_page_, page, std::span(&self, 1));
      backend.copy_async(scratch_page_, va, page, stream_);
      backend.synchronize_stream(stream_);
      backend.unmap(scratch_page_, page);
    } catch (...) {
      local ? device_.pool().put({fresh, nullptr}) : backend.release_chunk(fresh);
      throw;
    }
    PageSlot& slot = arena.page(i);
    const PageSlot old = slot;
    backend.unmap(va, page);
    backend.map(va, page, fresh, 0);
    backend.set_access(va, page, device_.grants());
    slot = {fresh, where, true};
    if (old.where == device_.pool().where()) {
      device_.pool().put({old.chunk, nullptr});
    } else {
      backend.release_chunk(old.chunk);
    }
  }
}

}  // namespace salus::memory
