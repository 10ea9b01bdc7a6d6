#include "iteration_sched/turn_jobs.hpp"

#include <algorithm>

namespace salus {

const TurnJobs::Record& TurnJobs::add(JobId id, JobSpec spec) {
  auto job = std::make_shared<JobRecordState>(id, std::move(spec), arrivals_++);
  present_.emplace(id, job);
  history_.push_back(std::move(job));
  forget_old_jobs();  // never the new job: it is present
  return present_.at(id);
}

void TurnJobs::remove(JobId id) {
  present_.erase(id);
}

TurnJobs::Record TurnJobs::find(JobId id) const {
  auto it = present_.find(id);
  return it == present_.end() ? nullptr : it->second;
}

const JobRecordState* TurnJobs::cancelled(JobId id) const {
  for (const auto& job : history_) {
    if (job->id == id && job->state == JobState::cancelled && !job->retired) return job.get();
  }
  return nullptr;
}

void TurnJobs::forget_old_jobs() {
  const std::size_t finished = history_.size() - present_.size();
  if (finished <= 2 * kFinishedJobsKept) return;
  std::size_t excess = finished - kFinishedJobsKept;
  // Oldest first: history_ is in arrival order.
  std::erase_if(history_, [&](const Record& job) {
    // A cancelled job whose handle has not left yet still answers JobCancelled (cancelled()).
    const bool cancelled_held = job->state == JobState::cancelled && !job->retired;
    if (excess == 0 || present_.contains(job->id) || cancelled_held) return false;
    --excess;
    return true;
  });
}

int TurnJobs::others_running(const JobRecordState& job, std::thread::id me) const {
  int others = 0;
  for (const auto& [id, other] : present_) {
    if (other.get() == &job) continue;
    const bool runs = other->state == JobState::running && other->began_by != me;
    const bool starting = other->state == JobState::waiting && other->started;  // its own thread
    if (runs || starting) ++others;
  }
  return others;
}

}  // namespace salus
