// The decisions of one device's turn queue: the policy's decision core (decision.hpp), told what
// the queue's jobs do and shown what is known of them (a JobView each: their turn counts, and
// their profiles, which it charges and reads through the device's JobProfiles), and what its
// decisions start: each started job takes its lane's stream, and is to be woken. Memory-aware
// plans may ask for a decision to be made again later (a recheck), which someone must watch the
// clock for.
//
// Lock rule: a value with no lock of its own. LocalTurns' mu_ guards it and the turn state of
// the records it changes (local_turns.hpp). It calls only leaves: the parts the queue shares with
// its facade (TurnParts: JobProfiles; LaneStreams makes a lane's stream under it) and the
// harvester's prefetch queue (TurnMemory::prefetch).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "iteration_sched/decision.hpp"
#include "iteration_sched/job_profiles.hpp"
#include "iteration_sched/job_record.hpp"
#include "iteration_sched/turn_jobs.hpp"
#include "iteration_sched/turn_memory.hpp"
#include "iteration_sched/turn_parts.hpp"

namespace salus {

// Jobs a decision started (or woke to watch the clock), to wake once the caller has unlocked, so
// that they do not wake only to block on its lock.
using Wakes = std::vector<std::shared_ptr<JobRecordState>>;
inline void wake_all(const Wakes& jobs) {
  for (const auto& job : jobs) job->wake();
}

class TurnDecisions {
 public:
  // `policy` must outlive it. Its clock counts seconds from `epoch` (the trace's).
  TurnDecisions(const Policy& policy, std::size_t budget_bytes, TurnParts parts,
                const TurnJobs& jobs, TurnMemory& memory, SteadyClock::time_point epoch);

  // --- what the core is shown of a job: its turn counts and its profile ---
  // A new job (admitted once its memory fits).
  void add(const JobRecordState& job);
  // What is known of the job now.
  void show(const JobRecordState& job);
  // GPU time the job received counts in its profile (JobProfiles::charge_measured, and so on) and
  // its attained time, and the core sees both while the job is its (not ended).
  void charge_measured(JobRecordState& job, double seconds);
  void charge_host_time(JobRecordState& job, double seconds);
  void charge_reported(JobRecordState& job, GpuTime gpu);
  // What an iteration measured, or the job's process (JobProfiles::note_iteration, note_reported);
  // the core sees it if the job is idle.
  void note_iteration(JobRecordState& job, double host_seconds,
                      const std::vector<std::pair<double, std::size_t>>& samples,
                      std::size_t persistent_bytes);
  void note_reported(JobRecordState& job, const MeasuredMemory& measured);

  // --- what the core is told of a job ---
  // The job asks for its next turn; whether it is asking (waiting, not started).
  void ask(JobId job);
  [[nodiscard]] bool asking(JobId job) const;
  // The job no longer asks (its caller gave up waiting); returns the lane it was queued in.
  std::optional<int> withdraw(JobId job);
  // Its iteration ended (or a granted turn went back unused) `now`.
  void finished(JobId job, SteadyClock::time_point now);
  // The job left or was cancelled: its lane share is free.
  void remove(JobId job);
  // See DecisionCore::set_headroom and set_unowned.
  void set_headroom(std::size_t bytes);
  void set_unowned(std::size_t bytes);

  // --- deciding ---
  // Starts what the core decides: each started job takes its lane's stream. Returns the jobs to
  // wake. While an allocation holds new starts (MemoryWaits), nothing starts.
  Wakes decide();
  // A decision asked to be made again later, when its time has come; else nothing.
  Wakes recheck_if_due();
  // When the next recheck is due; nullopt when none is asked for.
  [[nodiscard]] std::optional<SteadyClock::time_point> recheck_at() const { return recheck_at_; }
  // Starts bringing home the pages of the job that takes `lane`'s next turn.
  void prefetch_next(std::optional<int> lane);
  // The same for the lane of `job`.
  void prefetch_for(JobId job);
  // When the waiting `job`'s turn is expected (LocalTurns::expected_turn), not asking whether it
  // waits.
  [[nodiscard]] std::optional<SteadyClock::time_point> expected_turn(
      const JobRecordState& job) const;

 private:
  [[nodiscard]] double seconds_since_start(SteadyClock::time_point t) const;
  // The job as the core sees it, its profile as seen_ holds it.
  [[nodiscard]] JobView view_of(const JobRecordState& job) const;
  // See charge_measured: the profile counts the time already, and seen_ shows it.
  void charge(JobRecordState& job, double seconds);

  const Policy& policy_;
  const TurnParts parts_;
  const TurnJobs& jobs_;
  TurnMemory& memory_;
  const SteadyClock::time_point epoch_;
  sched::DecisionCore core_;
  std::optional<SteadyClock::time_point> recheck_at_;
  // What the core last saw of a job's profile (JobView::curve points into it), reused so that a
  // view allocates nothing; it means nothing between two calls.
  JobProfiles::Snapshot seen_;
};

}  // namespace salus
