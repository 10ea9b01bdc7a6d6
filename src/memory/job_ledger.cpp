#include "memory/job_ledger.hpp"

#include "memory/job_table.hpp"

namespace salus::memory {

JobBlocks& JobLedger::owner_slow(JobId job) {
  JobBlocks& owner = jobs_[job.value];
  if (owner.record == nullptr) {
    owner.record = table_.find(job);
    if (owner.record != nullptr) owner.record->note_heap(&heap_);
  }
  last_owner_ = &owner;
  last_owner_job_ = job.value;
  return owner;
}

void JobLedger::forget_jobs(std::optional<JobId> job) {
  if (job) {
    jobs_.erase(job->value);
  } else {
    jobs_.clear();
  }
  last_owner_ = nullptr;
}

std::pair<std::size_t, std::size_t> JobLedger::promote(JobBlocks& owner) {
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
  return {bytes, blocks};
}

bool JobLedger::has_job(JobId job) const {
  auto it = jobs_.find(job.value);
  return it != jobs_.end() && !it->second.empty();
}

JobUsage JobLedger::job_usage(JobId job) const {
  auto it = jobs_.find(job.value);
  return it == jobs_.end() ? JobUsage{} : it->second.usage;
}

}  // namespace salus::memory
