#include "iteration_sched/turn_decisions.hpp"

#include <algorithm>

namespace salus {

TurnDecisions::TurnDecisions(const Policy& policy, std::size_t budget_bytes, TurnParts parts,
                             const TurnJobs& jobs, TurnMemory& memory,
                             SteadyClock::time_point epoch)
    : policy_(policy),
      parts_(parts),
      jobs_(jobs),
      memory_(memory),
      epoch_(epoch),
      core_(policy_, budget_bytes) {}

double TurnDecisions::seconds_since_start(SteadyClock::time_point t) const {
  return std::chrono::duration<double>(t - epoch_).count();
}

JobView TurnDecisions::view_of(const JobRecordState& job) const {
  JobView v;
  v.id = job.id;
  v.kind = job.spec.kind;
  v.priority = job.spec.priority;
  v.arrival = job.arrival;
  v.iterations_done = job.iterations;
  v.expected_iterations = job.spec.expected_iterations;
  v.iteration_seconds = seen_.iteration_seconds;
  v.attained_seconds = job.attained_seconds;
  v.persistent_bytes = seen_.persistent_bytes;
  v.ephemeral_peak_bytes = seen_.ephemeral_peak_bytes;
  v.curve = parts_.clock.site().plan_curve(seen_.curve);  // or none: plans count the flat peak
  v.memory_known = seen_.memory_known;
  v.memory_resident = true;  // a job builds its weights before its first turn
  return v;
}

void TurnDecisions::add(const JobRecordState& job) {
  parts_.profiles.snapshot(job, seen_);
  core_.add(view_of(job));
}

void TurnDecisions::show(const JobRecordState& job) {
  parts_.profiles.snapshot(job, seen_);
  core_.update(view_of(job));
}

void TurnDecisions::charge_measured(JobRecordState& job, double seconds) {
  parts_.profiles.charge_measured(job, seconds, seen_);
  charge(job, seconds);
}

void TurnDecisions::charge_host_time(JobRecordState& job, double seconds) {
  if (parts_.profiles.charge_host_time(job, seconds, seen_)) charge(job, seconds);
}

void TurnDecisions::charge_reported(JobRecordState& job, GpuTime gpu) {
  parts_.profiles.charge_reported(job, gpu, seen_);
  if (gpu.iterations > 0) charge(job, gpu.seconds);
}

void TurnDecisions::charge(JobRecordState& job, double seconds) {
  job.attained_seconds += std::max(seconds, 0.0);
  // A job that left keeps its statistics but is no longer the decision core's.
  if (!job.ended()) core_.update(view_of(job));
}

void TurnDecisions::note_iteration(JobRecordState& job, double host_seconds,
                                   const std::vector<std::pair<double, std::size_t>>& samples,
                                   std::size_t persistent_bytes) {
  parts_.profiles.note_iteration(job, host_seconds, samples, persistent_bytes, seen_);
  if (job.state == JobState::idle) core_.update(view_of(job));
}

void TurnDecisions::note_reported(JobRecordState& job, const MeasuredMemory& measured) {
  parts_.profiles.note_reported(job, measured, seen_);
  if (job.state == JobState::idle) core_.update(view_of(job));
}

void TurnDecisions::ask(JobId job) {
  core_.wait(job);
}

bool TurnDecisions::asking(JobId job) const {
  return core_.waiting(job);
}

std::optional<int> TurnDecisions::withdraw(JobId job) {
  const std::optional<int> lane = core_.lane_of(job);
  core_.withdraw(job);
  return lane;
}

void TurnDecisions::finished(JobId job, SteadyClock::time_point now) {
  core_.finish(job, seconds_since_start(now));
}

void TurnDecisions::remove(JobId job) {
  core_.remove(job);
}

void TurnDecisions::set_headroom(std::size_t bytes) {
  core_.set_headroom(bytes);
}

void TurnDecisions::set_unowned(std::size_t bytes) {
  core_.set_unowned(bytes);
}

Wakes TurnDecisions::decide() {
  Wakes to_wake;
  if (parts_.waits.holding()) return to_wake;  // an allocation waits for running iterations to end
  const sched::Decision decision = core_.decide(seconds_since_start(SteadyClock::now()));
  for (const sched::Start& start : decision.starts) {
    auto it = jobs_.present().find(start.job);
    if (it == jobs_.present().end()) continue;
    JobRecordState& job = *it->second;
    job.lane = start.lane;
    job.stream = parts_.lanes.take(job.lane, job.spec.kind);
    parts_.streams.run(job.stream, it->second);
    job.started = true;
    to_wake.push_back(it->second);
  }
  for (const sched::Start& start : decision.starts) prefetch_next(start.lane);
  if (decision.recheck_after_seconds) {
    const auto at =
        SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                 std::chrono::duration<double>(*decision.recheck_after_seconds));
    if (!recheck_at_ || at < *recheck_at_) recheck_at_ = at;
    // Some waiter must watch the clock: wake the waiting jobs so one of them waits until then.
    for (const auto& [id, job] : jobs_.present()) {
      if (job->state == JobState::waiting && !job->started) to_wake.push_back(job);
    }
  }
  return to_wake;
}

Wakes TurnDecisions::recheck_if_due() {
  if (!recheck_at_ || SteadyClock::now() < *recheck_at_) return {};
  recheck_at_.reset();
  return decide();
}

void TurnDecisions::prefetch_next(std::optional<int> lane) {
  if (!lane) return;
  if (const auto next = core_.next_in_lane(*lane)) memory_.prefetch(*next);
}

void TurnDecisions::prefetch_for(JobId job) {
  prefetch_next(core_.lane_of(job));
}

std::optional<SteadyClock::time_point> TurnDecisions::expected_turn(
    const JobRecordState& job) const {
  // Memory-aware plans start extras beside the lanes: who is next is not the lane's to say.
  if (policy_.lanes() == LanePlan::memory_aware) return std::nullopt;
  const std::optional<int> lane = core_.lane_of(job.id);
  if (!lane || core_.next_in_lane(*lane) != job.id) return std::nullopt;
  const std::optional<StreamHandle> stream = parts_.lanes.stream_of(*lane);
  if (!stream) return std::nullopt;
  const std::shared_ptr<JobRecordState> ahead = parts_.streams.running_on(*stream);
  if (!ahead || ahead->host_seconds <= 0.0) return std::nullopt;
  return ahead->iteration_started + std::chrono::duration_cast<SteadyClock::duration>(
                                        std::chrono::duration<double>(ahead->host_seconds));
}

}  // namespace salus
