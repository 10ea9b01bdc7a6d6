// DeviceScheduler: the GPU time of iterations, measured with timing events (see
// iteration_timers.hpp) and charged to jobs once their work has finished.

#include <algorithm>
#include <iterator>

#include "iteration_sched/device_scheduler.hpp"
#include "log/log.hpp"

namespace salus {

namespace {

constexpr double kEstimateWeight = 0.5;  // weight of the newest measurement

}  // namespace

std::optional<IterationTimers::Pair> DeviceScheduler::start_timer(const JobRecordState& job,
                                                                  StreamHandle stream) {
  try {
    return timers_.start(stream);
  } catch (const Error& e) {
    // The iteration is admitted and its lane taken: failing it over a measurement would leave
    // the lane to a job that never ends. It runs unmeasured instead.
    log::warn("an iteration of job '{}' goes unmeasured: its start event failed: {}", job.spec.name,
              e.what());
    return std::nullopt;
  }
}

bool DeviceScheduler::stop_timer(const JobRecordState& job, const IterationTimers::Pair& timer,
                                 StreamHandle stream) {
  try {
    timers_.stop(timer, stream);
    return true;
  } catch (const Error& e) {
    log::warn("an iteration of job '{}' goes unmeasured: its end event failed: {}", job.spec.name,
              e.what());
    return false;
  }
}

void DeviceScheduler::hand_off_timer(JobRecordState& job, bool timed) {
  if (!job.timer) return;
  const auto self = jobs_.find(job.id);
  if (timed && self != jobs_.end()) {
    pending_timings_.push_back({self->second, *job.timer, false});
  } else {
    timers_.release(*job.timer);
  }
  job.timer.reset();
}

void DeviceScheduler::launch_marker(StreamHandle stream, EventHandle end) {
  try {
    backend_->launch_host_func(stream, [sink = marker_sink_, end] {
      std::lock_guard sink_lock(sink->mu);
      if (sink->scheduler) sink->scheduler->timing_reached(end);
    });
  } catch (...) {
    // Without its marker the timer is read whenever its events say it is done.
    timing_reached(end);
    throw;
  }
}

void DeviceScheduler::timing_reached(EventHandle end) {
  std::lock_guard lock(mu_);
  for (PendingTiming& pending : pending_timings_) {
    if (pending.timer.end == end) pending.reached = true;
  }
}

void DeviceScheduler::settle_timings() {
  std::vector<PendingTiming> ready;
  {
    std::lock_guard lock(mu_);
    const auto split = std::stable_partition(pending_timings_.begin(), pending_timings_.end(),
                                             [](const PendingTiming& p) { return !p.reached; });
    ready.assign(std::make_move_iterator(split), std::make_move_iterator(pending_timings_.end()));
    pending_timings_.erase(split, pending_timings_.end());
  }
  if (ready.empty()) return;
  // Read without mu_: the backend may take its own locks (and the driver its time).
  std::vector<std::optional<double>> seconds(ready.size());
  std::vector<bool> failed(ready.size(), false);
  for (std::size_t i = 0; i < ready.size(); ++i) {
    try {
      seconds[i] = timers_.elapsed(ready[i].timer);
    } catch (const Error& e) {
      failed[i] = true;
      log::warn("the GPU time of an iteration of job '{}' is lost: {}", ready[i].job->spec.name,
                e.what());
    }
  }
  std::lock_guard lock(mu_);
  for (std::size_t i = 0; i < ready.size(); ++i) {
    if (seconds[i]) charge_gpu_time(*ready[i].job, *seconds[i]);
    if (seconds[i] || failed[i]) {
      timers_.release(ready[i].timer);
    } else {
      // Its marker ran but the events are not done yet (a driver whose host functions run
      // ahead of the stream's work, like the tests' fake): read it again next time.
      pending_timings_.push_back(std::move(ready[i]));
    }
  }
}

void DeviceScheduler::charge_gpu_time(JobRecordState& job, double seconds) {
  seconds = std::max(seconds, 0.0);
  job.attained_seconds += seconds;
  JobProfile& p = job.profile;
  p.iteration_seconds =
      p.measured ? (1 - kEstimateWeight) * p.iteration_seconds + kEstimateWeight * seconds
                 : seconds;
  p.measured = true;
  // A job that left keeps its statistics but is no longer the decision core's.
  if (job.state == JobState::idle || job.state == JobState::waiting ||
      job.state == JobState::running) {
    core_.update(view_of(job));
  }
}

}  // namespace salus
