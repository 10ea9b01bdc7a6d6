// The jobs of one stream heap: each job's live blocks there, as intrusive lists per class, and
// their usage. Lock story: no lock of its own; guarded by the owning StreamHeap's mutex, which
// the caller holds for every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <utility>

#include "memory/arena.hpp"
#include "salus/memory.hpp"

namespace salus::memory {

class JobTable;
struct JobRecord;
class StreamHeap;

// Live bytes and blocks of one job in one stream heap, by class.
struct JobUsage {
  std::size_t bytes[kLifetimeCount] = {};
  std::size_t blocks[kLifetimeCount] = {};
};

// One job's live blocks in one stream heap: an intrusive list per class, and their usage. Each
// block points at its owner's entry (Block::owner), so a free needs no lookup by job.
struct JobBlocks {
  Block* head[kLifetimeCount] = {};
  JobUsage usage;
  JobRecord* record = nullptr;  // the job's record in the JobTable, looked up once

  [[nodiscard]] bool empty() const {
    for (const Block* h : head) {
      if (h != nullptr) return false;
    }
    return true;
  }
};

class JobLedger {
 public:
  // `heap`: the stream heap this ledger belongs to, named to each job's record as the job's
  // entry is made (JobRecord::note_heap).
  JobLedger(JobTable& jobs, StreamHeap& heap) : table_(jobs), heap_(heap) {}
  JobLedger(const JobLedger&) = delete;
  JobLedger& operator=(const JobLedger&) = delete;

  // The lists of `job` here, made on first use. The last one found is remembered: a stream's
  // allocations mostly come from one job. Whatever erases from jobs_ calls forget_jobs.
  // Inline, as link and unlink: they are on every allocation's and free's path.
  JobBlocks& owner_for(JobId job) {
    if (last_owner_ != nullptr && last_owner_job_ == job.value) return *last_owner_;
    return owner_slow(job);
  }
  // The lists of `job`, or null when it has none here (nothing is made).
  [[nodiscard]] JobBlocks* find(JobId job) {
    auto it = jobs_.find(job.value);
    return it == jobs_.end() ? nullptr : &it->second;
  }
  void forget_jobs(std::optional<JobId> job = std::nullopt);  // one job's entry, or all

  // Puts a live block on its job's list of its class (block->job, block->lifetime).
  void link(Block* block) {
    JobBlocks& owner = owner_for(block->job);
    block->owner = &owner;
    const auto c = static_cast<std::size_t>(block->lifetime);
    block->job_prev = nullptr;
    block->job_next = owner.head[c];
    if (owner.head[c]) owner.head[c]->job_prev = block;
    owner.head[c] = block;
    owner.usage.bytes[c] += block->size;
    ++owner.usage.blocks[c];
  }
  void unlink(Block* block) {
    JobBlocks& owner = *block->owner;  // set by link: no lookup by job on the free path
    const auto c = static_cast<std::size_t>(block->lifetime);
    if (block->job_prev) {
      block->job_prev->job_next = block->job_next;
    } else {
      owner.head[c] = block->job_next;
    }
    if (block->job_next) block->job_next->job_prev = block->job_prev;
    block->job_prev = block->job_next = nullptr;
    block->owner = nullptr;
    owner.usage.bytes[c] -= block->size;
    --owner.usage.blocks[c];
  }

  // Hands each live block of `job` to `visit`, which may unlink it, then forgets the job.
  template <class F>
  void drain_job(JobId job, F&& visit);
  // Visits each live block of `job` (of every job, without one): visit(block). `visit` must not
  // link or unlink.
  template <class F>
  void for_each_block(std::optional<JobId> job, F&& visit) const;
  // Moves the ephemeral list of `owner` in front of its persistent one (every block turns
  // persistent); returns {bytes, blocks} moved.
  static std::pair<std::size_t, std::size_t> promote(JobBlocks& owner);

  [[nodiscard]] bool has_job(JobId job) const;
  // Live bytes and blocks of `job` here, by class.
  [[nodiscard]] JobUsage job_usage(JobId job) const;

 private:
  JobBlocks& owner_slow(JobId job);

  JobTable& table_;
  StreamHeap& heap_;
  // Blocks point at their entry here (Block::owner): a node-based map, whose elements never
  // move, and an entry is erased only once no block points at it.
  std::unordered_map<std::uint32_t, JobBlocks> jobs_;
  JobBlocks* last_owner_ = nullptr;  // owner_for's last answer (an entry of jobs_), or null
  std::uint32_t last_owner_job_ = 0;
};

template <class F>
void JobLedger::drain_job(JobId job, F&& visit) {
  auto it = jobs_.find(job.value);
  if (it == jobs_.end()) return;
  for (Block* head : it->second.head) {
    for (Block* b = head; b != nullptr;) {
      Block* next = b->job_next;
      visit(b);
      b = next;
    }
  }
  forget_jobs(job);
}

template <class F>
void JobLedger::for_each_block(std::optional<JobId> job, F&& visit) const {
  auto walk = [&](const JobBlocks& blocks) {
    for (Block* head : blocks.head) {
      for (Block* b = head; b != nullptr; b = b->job_next) visit(*b);
    }
  };
  if (job) {
    if (auto it = jobs_.find(job->value); it != jobs_.end()) walk(it->second);
  } else {
    for (const auto& [id, blocks] : jobs_) walk(blocks);
  }
}

}  // namespace salus::memory
