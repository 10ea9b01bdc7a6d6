// DecisionCore's plans: which iterations start at a decision. The lane rule (an idle lane starts
// its first waiting member), solo runs for jobs whose memory is not known yet, and the
// memory-aware plan's extras beside the lanes, with the picture of the device it reads.
#include <cmath>
#include <limits>
#include <optional>

#include "iteration_sched/decision_state.hpp"

namespace salus::sched {

std::size_t DecisionCore::State::picture(double now) {
  scratch.clear();
  held.clear();
  std::size_t fixed = persistent_total + pending_resident;
  for (const auto& [id, lane] : lanes) {
    if (!lane.turn) {
      fixed += lane.max_peak();
      continue;
    }
    const JobSeat& rec = jobs.at(*lane.turn);
    const double elapsed = now - rec.started_at;
    const double left = predicted_seconds(rec.view) - elapsed;
    if (left > 0.0 && left < std::numeric_limits<double>::infinity()) {
      scratch.push_back({&rec.view, elapsed});
      held.push_back({left, lane.max_peak()});
    } else {
      fixed += lane.max_peak();  // covers the turn itself: it is a member of the lane
    }
  }
  for (const JobId id : extras) {
    const JobSeat& rec = jobs.at(id);
    scratch.push_back({&rec.view, now - rec.started_at});
  }
  return fixed;
}

DeviceView DecisionCore::State::device_view(std::size_t fixed) const {
  return DeviceView{usable(), fixed, scratch, held};
}

std::optional<double> DecisionCore::State::fit_delay(std::size_t fixed,
                                                     const JobView& candidate) const {
  return least_start_offset(device_view(fixed), candidate);
}

std::optional<double> DecisionCore::State::admission_delay(const JobSeat& rec, int lane_id,
                                                           double now) {
  const std::size_t fixed = picture(now) - resident_of(rec);  // its own bytes come below
  const double turn = predicted_seconds(rec.view);
  if (rec.waiting && !lanes.contains(lane_id) && turn < std::numeric_limits<double>::infinity()) {
    held.push_back({turn, rec.peak});
    return least_start_offset(DeviceView{usable(), fixed + rec.persistent, scratch, held},
                              rec.view);
  }
  JobView quota;
  quota.id = rec.view.id;
  quota.ephemeral_peak_bytes = growth(rec, lane_id);
  return fit_delay(fixed, quota);
}

void DecisionCore::State::admit_pending_beside_extras(double now, Decision& decision) {
  admission_dirty = false;
  for (auto it = pending.begin(); it != pending.end();) {
    JobSeat& rec = jobs.at(it->second);
    const std::optional<int> lane = placement(rec);
    if (!lane) {
      ++it;
      continue;
    }
    const std::optional<double> delay = admission_delay(rec, *lane, now);
    if (!delay || *delay > kOffsetTolerance) {
      admission_dirty = true;  // the extras end or fall: try again then
      if (delay) note_recheck(decision, *delay);
      return;
    }
    admit(rec, *lane);
    it = pending.erase(it);
  }
}

void DecisionCore::State::note_recheck(Decision& decision, double delay) {
  if (!decision.recheck_after_seconds || delay < *decision.recheck_after_seconds) {
    decision.recheck_after_seconds = delay;
  }
}

void DecisionCore::State::start(JobSeat& rec, double now, bool extra, Decision& decision) {
  Lane& lane = lanes.at(*rec.lane);
  dequeue(rec);
  rec.waiting = false;
  rec.running = true;
  rec.started_at = now;
  rec.served = ++starts;
  rec.extra = extra;
  if (rec.solo() && concurrent()) ++solo_running;
  if (extra) {
    extras.insert(rec.view.id);
  } else {
    ++lane.running;
    lane.turn = rec.view.id;
  }
  if (exclusive && !lane.owner) lane.owner = rec.view.id;
  running.insert(rec.view.id);
  decision.starts.push_back({rec.view.id, *rec.lane});
  refresh(*rec.lane);
}

void DecisionCore::State::stop(JobSeat& rec) {
  rec.running = false;
  running.erase(rec.view.id);
  if (rec.solo() && concurrent()) --solo_running;
  if (rec.extra) {
    extras.erase(rec.view.id);
    rec.extra = false;
    return;
  }
  Lane& lane = lanes.at(*rec.lane);
  --lane.running;
  lane.turn.reset();
}

bool DecisionCore::State::decide_solo(double now, Decision& decision) {
  if (solo_running > 0) return true;
  if (solo_waiting.empty()) return false;
  if (running.empty()) start(jobs.at(solo_waiting.begin()->job), now, /*extra=*/false, decision);
  return true;
}

void DecisionCore::State::decide_lanes(double now, Decision& decision) {
  if (concurrent() && decide_solo(now, decision)) return;
  while (!ready.empty()) {
    const int lane_id = *ready.begin();
    const Lane& lane = lanes.at(lane_id);
    const JobId next = exclusive && lane.owner ? *lane.owner : lane.waiting.begin()->job;
    start(jobs.at(next), now, /*extra=*/false, decision);
  }
}

// The memory-aware plan is the lane rule plus extras. Why it does not lose to the lane rule:
// - The lanes (admission, quotas, turns, the order within a lane) are exactly the lane rule's,
//   and no extra is ever given memory a lane may need for a turn (a lane's quota is lent only
//   while its running turn's curve is predicted to stay below it), so a turn never waits.
// - An extra is a further iteration of an admitted job that waits for its lane's turn. It runs
//   beside the lanes, never instead of a turn, and its work is work the lane no longer has to
//   do: a lane's jobs finish no later than the lane rule would have finished them.
// - What is left: extras may also use memory no lane holds yet, so a newcomer whose quota does
//   not fit beside them waits, at most until they end (admission_delay keeps that rare); and
//   jobs that leave earlier meet the lane rule's greedy admission in a different state.
// So "never slower" is checked on random trials (tests/test_scheduler_simulation.cpp), not a
// theorem: no loss over seeds 1..1000, 5 losses of at most 0.6% over seeds 1..5000. Lending
// extras only the lanes' unused quota removes the admission wait but loses more (worst 0.955)
// and gains far less (mean 1.04 instead of 1.28).
//
// When an extra may start is the policy's answer (Policy::start_delay over the picture: the
// same question as the offset search, which is what the built-in "memory_aware" answers with),
// so a custom memory-aware policy can start extras earlier, later or never. Admission stays the
// lane rule's own (admission_delay), whatever the policy.
void DecisionCore::State::decide_memory_aware(double now, Decision& decision) {
  if (admission_dirty) admit_pending_beside_extras(now, decision);
  decide_lanes(now, decision);
  if (solo_running > 0 || !solo_waiting.empty()) return;  // a solo job holds the device
  const std::size_t fixed = picture(now);
  const std::size_t extras_budget = usable();
  auto next = waiting_admitted.begin();
  for (int examined = 0; examined < kExtraCandidates && next != waiting_admitted.end();
       ++examined) {
    JobSeat& rec = jobs.at(next->job);
    ++next;  // before start() erases it
    const std::optional<double> delay =
        policy.start_delay(DeviceView{extras_budget, fixed, scratch, held}, rec.view);
    if (delay && *delay <= kOffsetTolerance) {
      start(rec, now, /*extra=*/true, decision);
      scratch.push_back({&rec.view, 0.0});
    } else if (delay && std::isfinite(*delay)) {  // a custom policy's +inf or NaN: not now
      note_recheck(decision, *delay);
    }
  }
}

double DecisionCore::State::predicted_seconds(const JobView& job) {
  if (job.curve != nullptr && job.curve->known()) return job.curve->duration_seconds;
  return job.iteration_seconds > 0.0 ? job.iteration_seconds
                                     : std::numeric_limits<double>::infinity();
}

}  // namespace salus::sched
