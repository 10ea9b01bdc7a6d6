// StreamHeap: retiring the heap of a stream that is about to be destroyed, and re-binding a
// retired heap to a new stream. A retired heap never records on its stream again: its own work is
// what the retire fence caught (OwnFence and marks_now take that fence instead).
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "memory/device_heap.hpp"
#include "memory/stream_heap.hpp"

namespace salus::memory {

FencePtr StreamHeap::retire() {
  std::lock_guard lock(mu_);
  if (stream_.retired()) return nullptr;
  // The stream is still alive here: one fence after its work so far, taken before the heap
  // stops recording on it.
  FencePtr fence;
  {
    OwnFence own(stream_);
    fence = own.get();
  }
  // Lookups stop finding the heap: the handle may name a new stream once this one is destroyed.
  stream_.retire(fence);
  drain_retired();
  return fence;
}

void StreamHeap::drain_retired() {
  // Pages go to the pool fenced: the taker waits for the retired stream's work on the GPU, and
  // the old addresses stay mapped here until that work has finished (PageTable::hand_off).
  std::vector<Page> pages;
  OwnFence own(stream_);
  pages_.return_stray_remote_pages(own);
  pages_.reclaim(std::numeric_limits<std::size_t>::max(), pages, own, Take::any);
  device_.pool().put(pages);
}

bool StreamHeap::rebind(StreamHandle stream) {
  std::lock_guard lock(mu_);
  if (!stream_.retired()) return false;
  pages_.settle_retiring(false);
  if (!live_.empty() || table_.retiring() || pages_.has_detours()) return false;
  // Free space may still hold pages when an earlier drain failed: they go now.
  drain_retired();
  if (table_.retiring()) return false;
  ledger_.forget_jobs();
  stream_.bind(stream);
  return true;
}

void StreamHeap::forget_stream(StreamHandle stream, const std::function<const FencePtr&()>& fence,
                               std::span<const JobId> jobs) {
  std::lock_guard lock(mu_);
  for (auto& [addr, block] : live_) {
    const bool named = std::erase(block->other_streams, stream) > 0;
    const bool job_used = std::find(jobs.begin(), jobs.end(), block->job) != jobs.end();
    if (named || job_used) block->fence = Fence::join(block->fence, fence());
  }
}

FencePtr StreamHeap::retire_fence() {
  std::lock_guard lock(mu_);
  return stream_.retired() && !settled(stream_.retire_fence()) ? stream_.retire_fence() : nullptr;
}

}  // namespace salus::memory
