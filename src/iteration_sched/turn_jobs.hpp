// The jobs of one device's turn queue: those present, by id, and the last that left, for their
// statistics, all in arrival order. A process that runs jobs for weeks must not grow without
// bound (the soak test saw it): it keeps kFinishedJobsKept of those that left.
//
// Lock rule: a value with no lock of its own. LocalTurns' mu_ guards it, and the turn state of
// the records it holds (local_turns.hpp); nothing here calls out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <unordered_map>
#include <vector>

#include "iteration_sched/job_record.hpp"

namespace salus {

class TurnJobs {
 public:
  using Record = std::shared_ptr<JobRecordState>;
  static constexpr std::size_t kFinishedJobsKept = 256;

  // A new job registered as `id`, present from now on; it arrives after every job before it.
  const Record& add(JobId id, JobSpec spec);
  // The job left (or was cancelled): no longer present; its record stays for its statistics.
  void remove(JobId id);
  // The job present as `id`; nullptr once it left or for other ids.
  [[nodiscard]] Record find(JobId id) const;
  // The job `id` if it was cancelled and its handle has not left yet (it still answers
  // JobCancelled); nullptr else.
  [[nodiscard]] const JobRecordState* cancelled(JobId id) const;
  // Every job present, and the last that left, in arrival order.
  [[nodiscard]] const std::vector<Record>& history() const { return history_; }
  // The jobs present.
  [[nodiscard]] const std::unordered_map<JobId, Record>& present() const { return present_; }
  // How many iterations other than `job`'s run or are about to that a thread other than `me` may
  // end: one that `me` began cannot end while it waits.
  [[nodiscard]] int others_running(const JobRecordState& job, std::thread::id me) const;

 private:
  // Drops the oldest finished jobs from history_ once twice the kept number have gathered
  // (amortized: one pass per kFinishedJobsKept jobs).
  void forget_old_jobs();

  std::unordered_map<JobId, Record> present_;
  std::vector<Record> history_;
  std::uint64_t arrivals_ = 0;
};

}  // namespace salus
