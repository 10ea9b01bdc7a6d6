// StreamHeap: the doors to its PageMigrator (remap, demote, recall, fetch, prefetch and the
// per-tier view of a job's blocks) and to its PageSupply (free pages going to another user, old
// addresses settling), all under this heap's lock. The allocator itself is in stream_heap.cpp.
#include "memory/device_heap.hpp"
#include "memory/stream_heap.hpp"

namespace salus::memory {

HeapView StreamHeap::view() {
  return {device_.migrator_device(), stream(), stream_.retire_fence(), arenas_.set(),
          live_, ledger_, table_.remote_pages()};
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

std::size_t StreamHeap::reclaim_pages(std::size_t wanted, Take take) {
  std::lock_guard lock(mu_);
  if (table_.retiring()) pages_.settle_retiring(false);
  OwnFence own(stream_);
  // Work enqueued on this stream before its blocks were freed may still touch their pages.
  if (take == Take::idle && own.get() != nullptr) return 0;
  if (take == Take::any) pages_.return_stray_remote_pages(own);
  std::vector<Page> pages;
  std::size_t taken = 0;
  try {
    taken = pages_.reclaim(wanted, pages, own, take);
  } catch (...) {
    device_.pool().put(pages);  // those taken before the failure
    throw;
  }
  device_.pool().put(pages);
  return taken;
}

void StreamHeap::settle(bool wait) {
  std::lock_guard lock(mu_);
  pages_.settle_retiring(wait);
}

}  // namespace salus::memory
