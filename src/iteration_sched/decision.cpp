// DecisionCore: admission into lanes, per-lane waiting queues ordered by the policy's key, and
// the bookkeeping of what runs. Every per-boundary operation is a hash lookup plus O(log n) tree
// updates; only admission retries (a job left, or estimates changed) walk the not-yet-admitted
// jobs. A memory-aware decide() also sums what the lanes and extras hold (O(lanes + extras)) and
// runs the offset search for at most kExtraCandidates waiting jobs.
#include "iteration_sched/decision.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <utility>

#include "iteration_sched/decision_state.hpp"

namespace salus::sched {

using decision::JobSeat;
using decision::Lane;

DecisionCore::DecisionCore(const Policy& policy, std::size_t budget_bytes)
    : state_(std::make_unique<State>(policy, budget_bytes)) {}

DecisionCore::~DecisionCore() = default;

void DecisionCore::add(const JobView& job) {
  State& s = *state_;
  const auto [it, inserted] = s.jobs.try_emplace(job.id);
  if (!inserted)
    throw InvalidArgument(fmt::format("scheduler: job {} is already registered", job.id));
  JobSeat& rec = it->second;
  rec.view = job;
  if (job.curve != nullptr) rec.curve = *job.curve;
  rec.view.curve = job.curve != nullptr ? &rec.curve : nullptr;
  rec.persistent = job.persistent_bytes;
  rec.peak = ephemeral_peak(rec.view);
  s.pending.emplace(job.arrival, job.id);
  s.pending_total += rec.persistent + rec.peak;
  s.pending_resident += State::resident_of(rec);
  s.admit_pending();
}

void DecisionCore::update(const JobView& job) {
  State& s = *state_;
  JobSeat& rec = s.find(job.id, "update");
  const std::uint64_t arrival = rec.view.arrival;  // registration order never changes
  const bool requeue = rec.waiting && rec.lane.has_value();
  if (requeue) s.dequeue(rec);
  if (rec.running && s.concurrent()) s.solo_running -= rec.solo() ? 1 : 0;
  if (!rec.lane) s.pending_resident -= State::resident_of(rec);  // added back below

  rec.view = job;
  rec.view.arrival = arrival;
  if (job.curve != nullptr && job.curve != &rec.curve) rec.curve = *job.curve;
  if (job.curve == nullptr) rec.curve = MemoryCurve{};
  rec.view.curve = job.curve != nullptr ? &rec.curve : nullptr;
  if (rec.waiting) rec.key = s.policy.key(rec.view);
  if (requeue) s.enqueue(rec);
  if (rec.running && s.concurrent()) s.solo_running += rec.solo() ? 1 : 0;

  const std::size_t persistent = job.persistent_bytes;
  const std::size_t peak = ephemeral_peak(rec.view);
  if (persistent == rec.persistent && peak == rec.peak) {
    if (rec.lane) {
      s.refresh(*rec.lane);
    } else {
      s.pending_resident += State::resident_of(rec);
    }
    return;
  }
  if (rec.lane) {
    s.reaccount(rec, persistent, peak);
    // Estimates grew past the budget: a job that neither runs nor holds its lane goes back to
    // waiting for admission rather than overcommit the device.
    const Lane& lane = s.lanes.at(*rec.lane);
    if (s.committed > s.usable() && !rec.running && lane.owner != job.id) {
      s.unadmit(rec);
      s.pending.emplace(arrival, job.id);
      s.pending_total += rec.persistent + rec.peak;
      s.pending_resident += State::resident_of(rec);
    }
  } else {
    s.pending_total = s.pending_total - (rec.persistent + rec.peak) + (persistent + peak);
    rec.persistent = persistent;
    rec.peak = peak;
    s.pending_resident += State::resident_of(rec);
  }
  s.admit_pending();
}

void DecisionCore::remove(JobId job) {
  State& s = *state_;
  JobSeat& rec = s.find(job, "remove");
  if (rec.running) s.stop(rec);
  if (rec.lane) {
    s.unadmit(rec);
  } else {
    s.pending.erase({rec.view.arrival, job});
    s.pending_total -= rec.persistent + rec.peak;
    s.pending_resident -= State::resident_of(rec);
  }
  s.jobs.erase(job);
  s.admit_pending();
}

void DecisionCore::wait(JobId job) {
  State& s = *state_;
  JobSeat& rec = s.find(job, "wait");
  if (rec.waiting) throw InvalidArgument(fmt::format("scheduler: job {} is already waiting", job));
  if (rec.running) {
    throw InvalidArgument(
        fmt::format("scheduler: job {} asked for an iteration while one is running", job));
  }
  rec.waiting = true;
  rec.key = s.policy.key(rec.view);
  if (rec.lane) {
    s.enqueue(rec);
    s.refresh(*rec.lane);
  }
}

void DecisionCore::withdraw(JobId job) {
  State& s = *state_;
  JobSeat& rec = s.find(job, "withdraw");
  if (!rec.waiting) throw InvalidArgument(fmt::format("scheduler: job {} is not waiting", job));
  if (rec.lane) s.dequeue(rec);  // by its key, which is valid while it waits
  rec.waiting = false;
  if (rec.lane) s.refresh(*rec.lane);  // an exclusive lane's owner no longer makes it ready
}

void DecisionCore::finish(JobId job, double now) {
  State& s = *state_;
  JobSeat& rec = s.find(job, "finish");
  if (!rec.running) {
    throw InvalidArgument(fmt::format("scheduler: finish() for job {}, which is {}", job,
                                      rec.waiting ? "waiting, not running" : "not running"));
  }
  if (now < rec.started_at) {
    throw InvalidArgument(fmt::format(
        "scheduler: job {} finished at {} s, before it started at {} s", job, now, rec.started_at));
  }
  s.stop(rec);
  s.refresh(*rec.lane);
  if (s.plan == LanePlan::memory_aware && !s.pending.empty()) s.admission_dirty = true;
}

void DecisionCore::progressed(JobId job, double now, double work_seconds) {
  JobSeat& rec = state_->find(job, "progressed");
  if (!rec.running) return;
  // The plans read progress as now - started_at: move the start so that it reads work_seconds.
  // Later only, so finish() still sees an iteration that ended after it started.
  const double elapsed = now - rec.started_at;
  rec.started_at = now - std::clamp(work_seconds, 0.0, std::max(elapsed, 0.0));
}

Decision DecisionCore::decide(double now) {
  State& s = *state_;
  Decision decision;
  if (s.plan == LanePlan::memory_aware) {
    s.decide_memory_aware(now, decision);
  } else {
    s.decide_lanes(now, decision);
  }
  return decision;
}

bool DecisionCore::admitted(JobId job) const {
  const auto it = state_->jobs.find(job);
  return it != state_->jobs.end() && it->second.lane.has_value();
}

bool DecisionCore::waiting(JobId job) const {
  const auto it = state_->jobs.find(job);
  return it != state_->jobs.end() && it->second.waiting;
}

bool DecisionCore::running(JobId job) const {
  const auto it = state_->jobs.find(job);
  return it != state_->jobs.end() && it->second.running;
}

std::optional<int> DecisionCore::lane_of(JobId job) const {
  const auto it = state_->jobs.find(job);
  return it == state_->jobs.end() ? std::nullopt : it->second.lane;
}

void DecisionCore::set_headroom(std::size_t bytes) {
  if (state_->headroom == bytes) return;
  state_->headroom = bytes;
  state_->admit_pending();  // admitted jobs may no longer fit, or pending ones may now
}

void DecisionCore::set_unowned(std::size_t bytes) {
  if (state_->unowned == bytes) return;
  state_->unowned = bytes;
  state_->admit_pending();
}

std::size_t DecisionCore::running_count() const {
  return state_->running.size();
}

std::optional<JobId> DecisionCore::next_in_lane(int lane) const {
  const auto it = state_->lanes.find(lane);
  if (it == state_->lanes.end() || it->second.waiting.empty()) return std::nullopt;
  // A lane held to completion runs only its owner until the owner leaves.
  if (state_->exclusive && it->second.owner) {
    const JobId owner = *it->second.owner;
    return state_->jobs.at(owner).waiting ? std::optional(owner) : std::nullopt;
  }
  return it->second.waiting.begin()->job;
}

int DecisionCore::lane_count() const {
  int count = 0;
  for (const auto& entry : state_->lanes) count += entry.second.members > 0 ? 1 : 0;
  return count;
}

std::size_t DecisionCore::committed_bytes() const {
  return state_->committed;
}

std::size_t DecisionCore::persistent_bytes() const {
  return state_->persistent_total;
}

std::size_t DecisionCore::pending_bytes() const {
  return state_->pending_total;
}

const JobView* DecisionCore::view(JobId job) const {
  const auto it = state_->jobs.find(job);
  return it == state_->jobs.end() ? nullptr : &it->second.view;
}

std::size_t DecisionCore::job_count() const {
  return state_->jobs.size();
}

}  // namespace salus::sched
