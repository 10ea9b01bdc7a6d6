// DeviceScheduler: the GPU time of iterations, measured with timing events (see
// iteration_timers.hpp) and charged to jobs once their work has finished.

#include <algorithm>
#include <iterator>
#include <utility>

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
    pending_timings_.push_back({self->second, *job.timer});
  } else {
    timers_.release(*job.timer);
  }
  job.timer.reset();
}

void DeviceScheduler::settle_timings() {
  std::vector<PendingTiming> pending;
  {
    std::lock_guard lock(mu_);
    if (pending_timings_.empty()) return;
    pending.swap(pending_timings_);
  }
  // Polled without mu_: the backend may take its own locks (and the driver its time). No host
  // function marks the end: each would stall its stream behind a driver thread (host functions
  // are serialized), and after a sticky error the driver runs none, so a timer would wait forever.
  std::vector<std::optional<double>> seconds(pending.size());
  std::vector<bool> failed(pending.size(), false);
  for (std::size_t i = 0; i < pending.size(); ++i) {
    try {
      seconds[i] = timers_.elapsed(pending[i].timer);
    } catch (const Error& e) {
      failed[i] = true;
      log::warn("the GPU time of an iteration of job '{}' is lost: {}", pending[i].job->spec.name,
                e.what());
    }
  }
  std::lock_guard lock(mu_);
  for (std::size_t i = 0; i < pending.size(); ++i) {
    if (seconds[i]) {
      charge_gpu_time(*pending[i].job, *seconds[i]);
      GpuTime& unreported = pending[i].job->unreported_gpu;
      unreported.seconds += std::max(*seconds[i], 0.0);
      ++unreported.iterations;
    }
    if (seconds[i] || failed[i]) {
      timers_.release(pending[i].timer);
    } else {
      pending_timings_.push_back(std::move(pending[i]));  // its work is still running
    }
  }
}

std::optional<GpuTime> DeviceScheduler::take_gpu_time(JobRecordState& job) {
  settle_timings();
  std::lock_guard lock(mu_);
  if (job.host_timed) return std::nullopt;
  return std::exchange(job.unreported_gpu, GpuTime{});
}

void DeviceScheduler::report_gpu_time(JobRecordState& job, GpuTime gpu) {
  std::lock_guard lock(mu_);
  job.gpu_time_reported = true;
  if (gpu.iterations > 0) charge_gpu_time(job, gpu.seconds, gpu.iterations);
}

void DeviceScheduler::charge_gpu_time(JobRecordState& job, double seconds,
                                      std::uint32_t iterations) {
  seconds = std::max(seconds, 0.0);
  job.attained_seconds += seconds;
  // The profile estimates one iteration: a report of several adds their mean.
  const double each = seconds / std::max<std::uint32_t>(iterations, 1);
  JobProfile& p = job.profile;
  p.iteration_seconds =
      p.measured ? (1 - kEstimateWeight) * p.iteration_seconds + kEstimateWeight * each : each;
  p.measured = true;
  // A job that left keeps its statistics but is no longer the decision core's.
  if (job.state == JobState::idle || job.state == JobState::waiting ||
      job.state == JobState::running) {
    core_.update(view_of(job));
  }
}

}  // namespace salus
