// One simulated device: its DecisionCore, the iterations running on it with their progress under
// the contention model, and what the results report about it (busy and utilization integrals,
// memory peaks and time over budget, the timeline).
//
// Time only matters between events: the engine calls account_until(now) before it changes
// anything on the device at `now` (so the integrals cover the state that held until then), then
// start()/stop(), then rerate() once the running set of that instant is final.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "iteration_sched/decision.hpp"
#include "salus/contention.hpp"
#include "salus/simulation.hpp"

namespace salus::sched::detail {

// An iteration in flight. Its progress (work-seconds done) grows at `rate` from the anchor:
// progress(t) = anchor_progress + rate * (t - anchor_time); the anchor moves only when the rate
// changes, so an iteration that is never slowed ends at exactly start + work.
struct RunningIter {
  std::uint32_t job = 0;
  double occupancy = 1.0;
  double work = 0.0;  // seconds alone
  double start = 0.0;
  const MemoryCurve* curve = nullptr;  // stretched to `work`; null or empty: no ephemeral bytes
  std::size_t record = 0;              // index into SimResult::iterations, when recorded

  double rate = 0.0;  // 0 until the first rerate()
  double anchor_time = 0.0;
  double anchor_progress = 0.0;
  double end = 0.0;  // at the current rate
  // It ran below full speed at some point. An iteration never slowed ran exactly its work (its
  // wall time end - start would only round to it).
  bool slowed = false;
  // The curve sample in use and when progress reaches the next one (+inf at the last).
  std::size_t step = 0;
  double next_step_time = std::numeric_limits<double>::infinity();

  [[nodiscard]] std::size_t bytes() const;
  // Wall time from start to `end_time`: its work when it was never slowed.
  [[nodiscard]] double wall_seconds(double end_time) const {
    return slowed ? end_time - start : work;
  }
  [[nodiscard]] double progress_at(double t) const {
    return anchor_progress + rate * (t - anchor_time);
  }
  // Sets next_step_time from the anchor (the boundary after `step`).
  void aim_next_step();
};

class SimDevice {
 public:
  SimDevice(int index, const Policy& policy, std::size_t budget, double timeline_step);

  DecisionCore core;
  std::vector<std::uint32_t> placed;  // jobs placed here, in arrival order
  std::uint64_t unfinished = 0;       // placed jobs that have not left
  std::uint32_t waiting = 0;          // placed jobs that asked and have not started
  double next_recheck = -1.0;         // a recheck event is pending at this time, if > now
  SimDeviceResult result;
  SimTimeline timeline;  // filled only with a timeline step

  [[nodiscard]] const std::vector<RunningIter>& running() const { return running_; }

  // Integrates [last accounted time, now) under the state as it stands: busy and utilization
  // time, the combined-memory peak and time over budget (walking the running curves' steps as
  // their progress crosses them), and the timeline samples that fall in it.
  void account_until(double now);
  // A new iteration at the accounted time; its rate and end are set by the next rerate().
  void start(const RunningIter& iteration);
  // Takes `job`'s iteration off the device; throws InvalidArgument if none runs.
  RunningIter stop(std::uint32_t job);

  // The running set changed at `now` (= the accounted time): asks the model for the rates of
  // all running iterations; re-anchors those whose rate changed and calls
  // `moved(iteration)` for each iteration whose end changed (new ones included).
  template <class Moved>
  void rerate(double now, const ContentionModel& model, Moved&& moved) {
    compute_rates(model);
    for (std::size_t i = 0; i < running_.size(); ++i) {
      if (reanchor(running_[i], rates_[i], now)) moved(running_[i]);
    }
  }

  // Accounts up to `makespan` and samples the timeline's grid points up to it (the state after
  // the last event).
  void finalize(double makespan);

 private:
  void compute_rates(const ContentionModel& model);
  // Applies `rate` from `now`; true when the end moved (always for a new iteration).
  static bool reanchor(RunningIter& it, double rate, double now);
  // The combined bytes `bytes` held over [a, b).
  void record_piece(double a, double b, std::size_t bytes);
  void sample(double t, std::size_t bytes);

  int index_;
  std::size_t budget_;
  double timeline_step_;
  std::vector<RunningIter> running_;  // in start order (the order the model sees)
  std::size_t ephemeral_ = 0;         // sum of running_[i].bytes()
  double accounted_ = 0.0;
  double utilization_ = 0.0;  // of the current rates
  std::uint64_t next_sample_ = 0;
  std::vector<double> occupancies_;  // scratch for the model
  std::vector<double> rates_;
};

}  // namespace salus::sched::detail
