#include "iteration_sched/sim_device.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "salus/error.hpp"

namespace salus::sched::detail {
namespace {

// Pieces of constant memory shorter than this are rounding slivers (one iteration ends at the
// instant another steps down, computed along two paths), not states the device was in: they do
// not count for the peak nor the time over budget.
constexpr double kSliverSeconds = 1e-7;

}  // namespace

std::size_t RunningIter::bytes() const {
  if (curve == nullptr || curve->bytes.empty()) return 0;
  return curve->bytes[std::min(step, curve->bytes.size() - 1)];
}

void RunningIter::aim_next_step() {
  const std::size_t samples = curve == nullptr ? 0 : curve->bytes.size();
  if (step + 1 >= samples) {
    next_step_time = std::numeric_limits<double>::infinity();
    return;
  }
  // The curve is stretched over the work: sample k covers progress [k, k+1) * work / samples.
  const double width = work / static_cast<double>(samples);
  next_step_time = anchor_time + (width * static_cast<double>(step + 1) - anchor_progress) / rate;
}

SimDevice::SimDevice(int index, const Policy& policy, std::size_t budget, double timeline_step)
    : core(policy, budget), index_(index), budget_(budget), timeline_step_(timeline_step) {
  timeline.device = index;
}

void SimDevice::account_until(double now) {
  const double from = accounted_;
  if (!(now > from)) return;
  accounted_ = now;
  if (!running_.empty()) {
    result.busy_seconds += now - from;
    result.utilization_seconds += utilization_ * (now - from);
  }
  // Between events the rates hold, so each curve steps at known times: walk the steps in time
  // order (the device runs few iterations at once, so a linear scan finds the next one).
  const std::size_t persistent = core.persistent_bytes();
  double a = from;
  while (true) {
    double next = std::numeric_limits<double>::infinity();
    for (const RunningIter& it : running_) next = std::min(next, it.next_step_time);
    if (next > now) {
      record_piece(a, now, persistent + ephemeral_);
      return;
    }
    if (next > a) {
      record_piece(a, next, persistent + ephemeral_);
      a = next;
    }
    for (RunningIter& it : running_) {
      if (it.next_step_time > next) continue;
      const std::size_t before = it.bytes();
      ++it.step;
      ephemeral_ = ephemeral_ - before + it.bytes();
      it.aim_next_step();
    }
  }
}

void SimDevice::record_piece(double a, double b, std::size_t bytes) {
  if (b - a >= kSliverSeconds) {
    result.peak_combined_bytes = std::max(result.peak_combined_bytes, bytes);
    if (bytes > budget_) result.over_budget_seconds += b - a;
  }
  if (timeline_step_ > 0.0) {
    // Grid points are k * step (not a running sum), so every device samples the same instants.
    while (static_cast<double>(next_sample_) * timeline_step_ < b) {
      sample(static_cast<double>(next_sample_) * timeline_step_, bytes);
    }
  }
}

void SimDevice::sample(double t, std::size_t bytes) {
  timeline.time.push_back(t);
  timeline.utilization.push_back(running_.empty() ? 0.0 : utilization_);
  timeline.running.push_back(static_cast<std::uint32_t>(running_.size()));
  timeline.memory_bytes.push_back(bytes);
  timeline.waiting.push_back(waiting);
  ++next_sample_;
}

void SimDevice::start(const RunningIter& iteration) {
  running_.push_back(iteration);
  RunningIter& it = running_.back();
  it.rate = 0.0;
  it.slowed = false;
  it.step = 0;
  ephemeral_ += it.bytes();
}

RunningIter SimDevice::stop(std::uint32_t job) {
  const auto it = std::find_if(running_.begin(), running_.end(),
                               [job](const RunningIter& r) { return r.job == job; });
  if (it == running_.end()) {
    throw InvalidArgument(
        fmt::format("simulation: job {} has no iteration running on device {}", job, index_));
  }
  const RunningIter stopped = *it;
  ephemeral_ -= stopped.bytes();
  running_.erase(it);  // keeps the start order: the model may weigh position
  return stopped;
}

void SimDevice::compute_rates(const ContentionModel& model) {
  occupancies_.clear();
  for (const RunningIter& it : running_) occupancies_.push_back(it.occupancy);
  rates_.assign(running_.size(), 1.0);
  if (running_.empty()) {
    utilization_ = 0.0;
    return;
  }
  model.rates(occupancies_, rates_);
  for (const double rate : rates_) {
    // A rate of 0 (or NaN) would leave an iteration running for ever.
    if (!(rate > 0.0 && rate <= 1.0)) {
      throw InvalidArgument(fmt::format(
          "simulation: contention model '{}' gave a rate of {} on device {} (must be in (0, 1])",
          model.name(), rate, index_));
    }
  }
  utilization_ = device_utilization(occupancies_, rates_);
}

bool SimDevice::reanchor(RunningIter& it, double rate, double now) {
  it.slowed = it.slowed || rate < 1.0;
  if (it.rate == 0.0) {  // new: starts now at this rate
    it.rate = rate;
    it.anchor_time = it.start;
    it.anchor_progress = 0.0;
    it.end = it.start + it.work / rate;
    it.aim_next_step();
    return true;
  }
  if (rate == it.rate) return false;
  it.anchor_progress = std::min(it.work, it.progress_at(now));
  it.anchor_time = now;
  it.rate = rate;
  it.end = now + (it.work - it.anchor_progress) / rate;
  it.aim_next_step();
  return true;
}

void SimDevice::finalize(double makespan) {
  account_until(makespan);
  if (timeline_step_ <= 0.0) return;
  const std::size_t bytes = core.persistent_bytes() + ephemeral_;
  while (static_cast<double>(next_sample_) * timeline_step_ <= makespan) {
    sample(static_cast<double>(next_sample_) * timeline_step_, bytes);
  }
}

}  // namespace salus::sched::detail
