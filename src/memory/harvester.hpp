// Harvesting policy across devices: what gives way when a device runs out of its own pages, and
// bringing a job's pages home before (prefetch) or when (fetch) it runs again.
//
// Order when an allocation on device D comes up short, after D's own cached pages (the steps are
// listed, in the order they run, in kSteps of memory/placement.cpp):
//   1. recall: D's pages lent to quiescent borrowers come back (the borrowers' pages move to their
//      own memory if it has room, else to the host);
//   2. demote: pages of D's quiescent jobs go down a tier (peers, then host, by the spill policy);
//   3. borrow: the allocation itself gets pages from the best lender with room, then the host
//      (Tiers::borrow);
//   4. wait: when D has pages lent to running jobs, wait for a safe point (bounded), and retry
//      (Tiers::wait_safe_point).
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stop_token>
#include <thread>
#include <vector>

#include "memory/device_heap.hpp"
#include "memory/job_table.hpp"
#include "memory/tiers.hpp"

namespace salus::memory {

class Harvester {
 public:
  Harvester(const std::vector<std::unique_ptr<DeviceHeap>>& devices, Tiers& tiers, JobTable& jobs);
  ~Harvester();
  Harvester(const Harvester&) = delete;
  Harvester& operator=(const Harvester&) = delete;

  // Harvesting steps 1 and 2, which placement.cpp runs for an allocation that came up short.
  // Recall: pages of `lender` mapped by quiescent borrowers come home; returns how many.
  std::size_t recall(DeviceHeap& lender, std::size_t pages);
  // Demote: pages of `device`'s quiescent jobs other than `requester` go a tier down; returns how
  // many.
  std::size_t demote_others(DeviceHeap& device, std::size_t pages, JobId requester);

  void set_quiescent(JobRecord& job);
  std::size_t activate(JobRecord& job);
  void prefetch(JobId job);
  std::size_t demote(JobId job, DeviceHeap& device);
  // Blocks were freed: a prefetch waiting for room may go on.
  void on_free() {
    if (waiting_for_room_.load(std::memory_order_relaxed)) signal_room();
  }
  // Waits for a prefetch round in flight and keeps the next one from starting while the lock is
  // held: a round holds the pages it took for its targets (in no pool, mapped nowhere) until it
  // has moved them, so what counts or takes every page (trim) holds this first.
  [[nodiscard]] std::unique_lock<std::mutex> hold_prefetches() {
    return std::unique_lock(round_mu_);
  }

 private:
  // Up to `pages` of `device`'s own pages: its pool's, then its streams' cached free ones.
  std::size_t take_local(DeviceHeap& device, std::size_t pages, std::vector<Page>& out);
  // Pages of quiescent jobs (as `gate` says) in `device`'s ranges go a tier down.
  std::size_t evict(DeviceHeap& device, std::size_t pages, JobGate& gate);
  // Brings the job's pages on other tiers home as room allows; returns bytes moved. `own` lets
  // the job's pages move; `others`, when given, says whose pages may go down to make room.
  std::size_t fetch_home(JobId job, MoveReason reason, JobGate& own, JobGate* others);
  void signal_room();
  // These jobs' pages went down a tier while they were quiescent.
  void mark_away(const std::vector<JobId>& jobs);
  void run_prefetches(std::stop_token stop);

  const std::vector<std::unique_ptr<DeviceHeap>>& devices_;
  Tiers& tiers_;
  JobTable& jobs_;

  std::mutex prefetch_mu_;
  std::condition_variable_any prefetch_cv_;
  std::vector<JobId> targets_;  // guarded by prefetch_mu_
  bool fresh_ = false;          // a target was added
  bool room_ = false;           // blocks were freed or jobs turned quiescent since the last try
  std::atomic<bool> waiting_for_room_{false};
  // Held by a prefetch round while it works, and by whoever must not run beside one (activate,
  // trim). Taken before any heap, pool or job lock, never while holding prefetch_mu_.
  std::mutex round_mu_;
  std::jthread worker_;  // last: stops and joins before the state above goes
};

}  // namespace salus::memory
