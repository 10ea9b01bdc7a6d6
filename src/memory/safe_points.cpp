// The memory manager's safe points (memory/safe_points.hpp): its Impl implements them.
#include "memory/safe_points.hpp"

#include "memory/memory_manager_impl.hpp"

namespace salus {

memory::SafePoints& safe_points(MemoryManager& memory) noexcept {
  return *memory.impl_;
}

void MemoryManager::Impl::set_job_quiescent(JobId job) {
  if (job == kUnattributedJob) {
    throw InvalidArgument("set_job_quiescent: the unattributed job is never quiescent");
  }
  harvester_->set_quiescent(jobs_.live(job));
}

std::size_t MemoryManager::Impl::activate_job(JobId job) {
  return harvester_->activate(jobs_.live(job));
}

void MemoryManager::Impl::prefetch(JobId job) {
  (void)jobs_.live(job);
  harvester_->prefetch(job);
}

std::size_t MemoryManager::Impl::demote(JobId job, int device) {
  (void)jobs_.live(job);
  if (!tiers_.spills()) {
    throw NotSupported("demote: the spill policy is none, so there is no tier below the device");
  }
  return harvester_->demote(job, heap(device));
}

std::size_t MemoryManager::Impl::demote_quiescent(int device, std::size_t pages) {
  if (!tiers_.spills()) return 0;
  return harvester_->demote_others(heap(device), pages, kUnattributedJob);
}

}  // namespace salus
