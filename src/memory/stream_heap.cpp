#include "memory/stream_heap.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "log/log.hpp"
#include "memory/device_heap.hpp"

namespace salus::memory {

int StreamHeap::device() const {
  return device_.device();
}

StreamHeap::StreamHeap(DeviceHeap& device, StreamHandle stream, std::size_t small_bytes,
                       std::size_t large_bytes)
    : device_(device),
      stream_(device.backend(), device.events(), device.device(), stream),
      arenas_(device.backend(), device.granularity(), device.device(), small_bytes, large_bytes,
              QuietEpochs::kFirst),
      table_({device.backend(), device.counters(), device.access_grants(), device.device()}),
      ledger_(device.jobs(), *this),
      pages_({arenas_, table_, live_, stream_, device.pool(), device.tiers(), device.device()}) {}

StreamHeap::~StreamHeap() {
  // Live blocks at this point belong to a caller that never freed them; their pages go anyway.
  if (!live_.empty()) {
    log::warn("device {} stream {:#x}: {} blocks still live at shutdown", device_.device(),
              stream().value, live_.size());
  }
  // Nothing may still touch a page when its address goes: wait for this stream's work so far.
  try {
    OwnFence own(stream_);
    if (const FencePtr& fence = own.get()) fence->wait();
  } catch (const Error& e) {
    // Its owner destroyed the stream first (a destroyed stream drains on its own, or the owner
    // synchronized it): nothing is left to wait for through its handle.
    log::debug("device {} stream {:#x}: not waiting for its work at shutdown: {}", device_.device(),
               stream().value, e.what());
  }
  pages_.unmap_all();
  // arenas_ frees the address ranges as it goes.
}

CarveResult StreamHeap::allocate(std::size_t bytes, std::size_t requested, JobId job,
                                 Lifetime lifetime, std::vector<Page>& stash, bool fresh_chunks) {
  std::lock_guard lock(mu_);
  if (stream_.retired()) {
    throw InvalidArgument(
        fmt::format("allocate: the stream was retired on device {}", device_.device()));
  }
  if (table_.retiring()) pages_.settle_retiring(false);
  Arena* where = nullptr;
  Block* block = arenas_.place(bytes, where, device_.pool(), pages_);
  if (block == nullptr) return {.out_of_address_space = true};
  Arena& arena = *where;
  auto [first, last] = arena.pages_touched(*block);
  std::vector<Page> pages;
  try {
    if (const std::size_t missing = table_.prepare_pages(arena, first, last); missing > 0) {
      const std::size_t short_by =
          map_missing(arena, block, first, last, missing, pages, stash, fresh_chunks);
      if (short_by > 0) return {.pages_short = short_by};
    }
  } catch (...) {
    // A driver failure: whatever pages were gathered go back, the block returns to the free set.
    device_.tiers().give_back(device_.device(), pages);
    arena.release(block, false);
    throw;
  }

  // Checked under this heap's lock, after owner_for listed this heap in the job's record
  // (JobRecord::heaps). release_job and orphan_job mark the job gone, then walk the listed heaps
  // under their locks: they find this block linked, or this load sees the job gone (the list's
  // lock orders the two), so no block is linked after their walk with nobody to free it.
  if (JobBlocks& owner = ledger_.owner_for(job);
      !owner.record->alive.load(std::memory_order_acquire)) {
    return drop_for_gone_job(owner, job, block);
  }
  try {
    table_.adopt_page_fences(arena, first, last, stream());
  } catch (...) {
    pages_.release_block(block);  // fences not yet adopted stay on their pages
    throw;
  }
  block->requested = requested;
  block->job = job;
  block->lifetime = lifetime;
  ledger_.link(block);
  live_.insert(block->addr, block);
  ++tally_.allocations;
  ++tally_.blocks[static_cast<std::size_t>(lifetime)];
  device_.counters().on_allocate(lifetime, block->size);
  return {.ptr = block->addr};
}

std::size_t StreamHeap::map_missing(Arena& arena, Block* block, std::size_t first, std::size_t last,
                                    std::size_t missing, std::vector<Page>& pages,
                                    std::vector<Page>& stash, bool fresh_chunks) {
  if (const std::size_t short_by =
          pages_.gather(arena, first, last, missing, pages, stash, fresh_chunks)) {
    // Pages taken keep their fences: whoever takes them next waits for the same work.
    device_.tiers().give_back(device_.device(), pages);
    arena.release(block, false);
    return short_by;
  }
  table_.map_pages(arena, first, last, pages, stream());
  return 0;
}

CarveResult StreamHeap::drop_for_gone_job(JobBlocks& owner, JobId job, Block* block) {
  // Blocks linked before are the walk's to come (it waits for this lock); an empty entry goes.
  if (owner.empty()) ledger_.forget_jobs(job);
  pages_.release_block(block);
  return {.job_gone = true};
}

Block* StreamHeap::live_block(DevicePtr ptr, const char* what) {
  Block* block = live_.find(ptr);
  if (block == nullptr) {
    throw InvalidArgument(fmt::format(
        "{}: {:#x} is not a live Salus block on device {} (never allocated, already freed, or "
        "not the start of a block)",
        what, ptr, device_.device()));
  }
  return block;
}

Lifetime StreamHeap::disown(Block* block) {
  const Lifetime was = block->lifetime;
  // Its job's other streams (lanes, bound framework streams) may still have work queued on it;
  // once it is nobody's, only the block itself can name them.
  const std::size_t named = block->other_streams.size();
  JobTable::streams_of(*block->owner->record, device_.device(), block->other_streams);
  std::erase(block->other_streams, stream());
  if (block->other_streams.size() > named) {
    std::sort(block->other_streams.begin(), block->other_streams.end());
    block->other_streams.erase(
        std::unique(block->other_streams.begin(), block->other_streams.end()),
        block->other_streams.end());
  }
  ledger_.unlink(block);
  if (was == Lifetime::ephemeral) {
    --tally_.blocks[static_cast<std::size_t>(Lifetime::ephemeral)];
    ++tally_.blocks[static_cast<std::size_t>(Lifetime::persistent)];
    device_.counters().on_promote(block->size);
  }
  block->job = kUnattributedJob;
  block->lifetime = Lifetime::persistent;
  ledger_.link(block);
  return was;
}

FreedBlock StreamHeap::free_block(Block* block) {
  // Other streams may still read or write it: whoever reuses, moves or takes its pages waits
  // for their work so far (this stream's own work is ordered by the stream itself). Streams
  // retired meanwhile left their fence on the block. The fence comes first: recording its events
  // may fail, and then the free fails with the block still live and nothing changed.
  std::vector<StreamHandle> others;
  streams_using(*block, others);
  FencePtr fence = block->fence;
  if (!others.empty()) {
    fence = Fence::join(fence, Fence::after(device_.events(), others));
  }
  const FreedBlock freed{block->job, block->lifetime, block->size, block->owner->record};
  ledger_.unlink(block);
  live_.erase(block->addr);
  ++tally_.frees;
  --tally_.blocks[static_cast<std::size_t>(block->lifetime)];
  device_.counters().on_free(block->lifetime, block->size);
  block->fence.reset();
  if (fence != nullptr) {
    Arena& arena = arenas_.arena_of(*block);
    auto [first, last] = arena.pages_touched(*block);
    for (std::size_t i = first; i < last; ++i) {
      arena.page(i).fence = Fence::join(arena.page(i).fence, fence);
    }
  }
  pages_.release_block(block);
  if (stream_.retired()) {
    try {
      drain_retired();
    } catch (const Error& e) {
      // As above: the free is done; the retired stream's pages go on a later free or rebind.
      log::warn("device {}: draining a retired stream after a free failed: {}", device_.device(),
                e.what());
    }
  }
  return freed;
}

void StreamHeap::streams_using(const Block& block, std::vector<StreamHandle>& out) const {
  // The common case, a block used on its own stream only by a job that named no other, costs a
  // check of two empty lists.
  out = block.other_streams;
  if (block.owner != nullptr) {  // live: its job's record is at hand
    JobTable::streams_of(*block.owner->record, device_.device(), out);
  } else {
    device_.jobs().streams_of(block.job, device_.device(), out);
  }
  if (out.empty()) return;
  std::erase(out, stream());
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
}

FreedBlock StreamHeap::deallocate(DevicePtr ptr, std::optional<std::size_t> caller_bytes,
                                  std::optional<JobId> job) {
  std::lock_guard lock(mu_);
  Block* block = live_block(ptr, "free");
  if (job && block->job != *job) {
    throw InvalidArgument(fmt::format("free: {:#x} belongs to job {}, not job {}", ptr,
                                      block->job.value, job->value));
  }
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
  if (other == stream()) return;
  for (StreamHandle s : block->other_streams) {
    if (s == other) return;
  }
  block->other_streams.push_back(other);
}

std::pair<std::size_t, std::size_t> StreamHeap::promote(JobId job) {
  std::lock_guard lock(mu_);
  JobBlocks* owner = ledger_.find(job);
  if (owner == nullptr) return {0, 0};
  pages_.end_iteration();
  const auto [bytes, blocks] = JobLedger::promote(*owner);
  if (blocks == 0) return {0, 0};
  tally_.blocks[static_cast<std::size_t>(Lifetime::persistent)] += blocks;
  tally_.blocks[static_cast<std::size_t>(Lifetime::ephemeral)] -= blocks;
  device_.counters().on_promote(bytes);
  return {bytes, blocks};
}

std::optional<BlockInfo> StreamHeap::find(DevicePtr ptr) {
  std::lock_guard lock(mu_);
  const Block* found = live_.find(ptr);
  if (found == nullptr) return std::nullopt;
  const Block& b = *found;
  return BlockInfo{b.addr, b.size, b.requested, device_.device(), stream(), b.job, b.lifetime};
}

StreamHeap::Tally StreamHeap::tally() {
  std::lock_guard lock(mu_);
  return tally_;
}

StreamHeap::JobUsage StreamHeap::job_usage(JobId job) {
  std::lock_guard lock(mu_);
  return ledger_.job_usage(job);
}

}  // namespace salus::memory
