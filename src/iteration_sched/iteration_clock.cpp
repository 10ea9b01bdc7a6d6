#include "iteration_sched/iteration_clock.hpp"

#include <algorithm>
#include <utility>

#include "iteration_sched/device_scheduler.hpp"
#include "log/log.hpp"

namespace salus {

IterationClock::IterationClock(std::shared_ptr<DeviceBackend> backend, int device,
                               std::shared_ptr<const SiteChoice> site)
    : site_(std::move(site)), timers_(std::move(backend), device) {}

std::optional<IterationClock::Timer> IterationClock::start(std::string_view job,
                                                           StreamHandle stream) {
  try {
    return timers_.start(stream);
  } catch (const Error& e) {
    // The iteration is admitted and its lane taken: failing it over a measurement would leave
    // the lane to a job that never ends. It runs unmeasured instead.
    log::warn("an iteration of job '{}' goes unmeasured: its start event failed: {}", job,
              e.what());
    return std::nullopt;
  }
}

bool IterationClock::stop(std::string_view job, const Timer& timer, StreamHandle stream) {
  try {
    timers_.stop(timer, stream);
    return true;
  } catch (const Error& e) {
    log::warn("an iteration of job '{}' goes unmeasured: its end event failed: {}", job,
              e.what());
    return false;
  }
}

void IterationClock::hand_off(std::shared_ptr<JobRecordState> job, const Timer& timer,
                              bool timed) {
  if (!timed) {
    timers_.release(timer);
    return;
  }
  std::lock_guard lock(mu_);
  pending_.push_back({std::move(job), timer});
}

void IterationClock::release(const Timer& timer) {
  timers_.release(timer);
}

std::vector<IterationClock::Settled> IterationClock::settle() {
  std::vector<Pending> pending;
  {
    std::lock_guard lock(mu_);
    if (pending_.empty()) return {};
    pending.swap(pending_);
  }
  // Polled without mu_: the backend may take its own locks (and the driver its time). No host
  // function marks the end: each would stall its stream behind a driver thread (host functions
  // are serialized), and after a sticky error the driver runs none, so a timer would wait forever.
  std::vector<Settled> settled;
  std::vector<Pending> running;
  for (Pending& p : pending) {
    std::optional<double> seconds;
    try {
      seconds = timers_.elapsed(p.timer);
    } catch (const Error& e) {
      log::warn("the GPU time of an iteration of job '{}' is lost: {}", p.job->spec.name,
                e.what());
      timers_.release(p.timer);
      continue;
    }
    if (!seconds) {
      running.push_back(std::move(p));  // its work is still running
      continue;
    }
    timers_.release(p.timer);
    settled.push_back({std::move(p.job), std::max(*seconds, 0.0)});
  }
  if (!running.empty()) {
    std::lock_guard lock(mu_);
    pending_.insert(pending_.end(), std::make_move_iterator(running.begin()),
                    std::make_move_iterator(running.end()));
  }
  return settled;
}

}  // namespace salus
