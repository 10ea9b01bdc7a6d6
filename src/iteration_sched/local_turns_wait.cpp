// LocalTurns: a job's wait for its turn (begin_iteration, with or without a deadline) and the
// withdrawal of a pending wait. The rest of the queue is in local_turns.cpp.
#include <fmt/format.h>

#include <algorithm>

#include "waits/blocking.hpp"
#include "waits/cpu_relax.hpp"
#include "iteration_sched/attribution.hpp"
#include "iteration_sched/local_turns.hpp"
#include "memory/curves.hpp"
#include "memory/safe_points.hpp"

namespace salus {

StreamHandle LocalTurns::begin(JobRecordState& job) {
  return *begin_turn(job, std::nullopt);
}

std::optional<StreamHandle> LocalTurns::begin_until(JobRecordState& job,
                                                         SteadyClock::time_point deadline) {
  return begin_turn(job, deadline);
}

std::optional<StreamHandle> LocalTurns::begin_turn(
    JobRecordState& job, std::optional<SteadyClock::time_point> deadline) {
  settle_timings();  // the decisions below see the GPU time of iterations done so far
  std::unique_lock lock(mu_);
  check_usable_locked(job, "begin_iteration");
  // A waiting job with no thread in its wait (a deadline passed) goes on waiting here.
  if (job.state == JobState::running || job.waiter) {
    throw InvalidArgument(fmt::format("begin_iteration: job '{}' is already {}", job.spec.name,
                                      to_string(job.state)));
  }
  job.waiter = true;
  try {
    if (job.state == JobState::idle) ask_for_turn(job, lock);
    if (!wait_for_start(job, lock, deadline)) {
      job.waiter = false;
      return std::nullopt;
    }
    check_usable_locked(job, "begin_iteration");
    take_turn(job, lock);
  } catch (...) {
    if (!lock.owns_lock()) lock.lock();
    job.waiter = false;
    Wakes to_wake;
    if (job.state == JobState::waiting) {
      if (job.started) {
        to_wake = hand_back_turn(job);  // a turn granted but not taken would hold its lane
      } else if (!core_.waiting(job.id)) {
        job.state = JobState::idle;  // it never joined the queue
      }
    }
    lock.unlock();
    wake(to_wake);
    throw;
  }
  job.waiter = false;
  return job.stream;
}

void LocalTurns::before_gate_wait(JobRecordState& job) {
  {
    std::lock_guard lock(mu_);
    check_usable_locked(job, "begin_iteration");
    if (job.state != JobState::idle) return;  // already waiting here, or running
  }
  if (parts_.clock.on_host()) return;  // see ask_for_turn
  try {
    memory::set_job_quiescent(*memory_, job.id);
  } catch (const UnknownJob&) {
    check_usable(job, "memory call");
    throw;
  }
}

void LocalTurns::count_gate_wait(JobRecordState& job, SteadyClock::duration waited) {
  const double seconds = std::chrono::duration<double>(waited).count();
  std::lock_guard lock(mu_);
  job.waiting_seconds += seconds;
  job.max_wait_seconds = std::max(job.max_wait_seconds, seconds);
}

void LocalTurns::ask_for_turn(JobRecordState& job, std::unique_lock<std::mutex>& lock) {
  job.state = JobState::waiting;
  job.started = false;
  job.wait_started = SteadyClock::now();
  // Waiting for its turn, the job enqueues nothing: a safe point to move its pages. (Outside mu_,
  // like every memory manager call that may take a heap lock: see allocate.) Not when jobs
  // compute on the host: their other threads (a data loader, a tensor's holder) may touch their
  // memory at any moment, so it never moves (new pages may still come from other tiers).
  if (!parts_.clock.on_host()) {
    lock.unlock();
    try {
      memory::set_job_quiescent(*memory_, job.id);
    } catch (const UnknownJob&) {
      // Cancelled meanwhile, its memory released: JobCancelled says so (issue 34's UnknownJob
      // after a cancel from another thread, 1 in about 100 such cancels).
      lock.lock();
      check_usable_locked(job, "begin_iteration");
      throw;
    }
    lock.lock();
  }
  // Cancelled or left meanwhile (a job that left used to begin anyway: found by fuzz_c_api).
  check_usable_locked(job, "begin_iteration");
  core_.wait(job.id);
  wake(run_decisions());
  if (!job.started) prefetch_next(core_.lane_of(job.id));
}

bool LocalTurns::wait_for_start(JobRecordState& job, std::unique_lock<std::mutex>& lock,
                                     std::optional<SteadyClock::time_point> deadline) {
  bool spun = false;  // one spin per wait: a turn that did not come in it is woken as usual
  while (!job.started && job.state == JobState::waiting) {
    // Wake at the deadline or at a recheck the core asked for, whichever comes first.
    std::optional<SteadyClock::time_point> until = recheck_at_;
    if (deadline) {
      if (SteadyClock::now() >= *deadline) return false;
      if (!until || *deadline < *until) until = deadline;
    }
    if (const std::optional<SteadyClock::time_point> due = spun ? std::nullopt : turn_due(job)) {
      const auto now = SteadyClock::now();
      const auto spin_from = *due - turn_spin_;
      if (now < spin_from && (!until || spin_from < *until)) {
        // Sleep until the turn is near (a start or a cancel still wakes it before).
        waits::before_blocking();
        job.wakeup.wait_until(lock, spin_from);
        continue;
      }
      if (now >= spin_from) {
        spun = true;
        const auto stop = std::max(*due, now) + turn_spin_;
        spin_for_turn(job, lock, until ? std::min(stop, *until) : stop);
        continue;
      }
    }
    waits::before_blocking();
    if (until) {
      job.wakeup.wait_until(lock, *until);
      if (recheck_at_ && SteadyClock::now() >= *recheck_at_) {
        recheck_at_.reset();
        wake(run_decisions());
      }
    } else {
      job.wakeup.wait(lock);
    }
  }
  return true;
}

std::optional<SteadyClock::time_point> LocalTurns::turn_due(const JobRecordState& job) const {
  if (turn_spin_.count() == 0 || !many_cpus_ || parts_.clock.on_host()) {
    return std::nullopt;
  }
  return expected_turn_locked(job);
}

std::optional<SteadyClock::time_point> LocalTurns::expected_turn(const JobRecordState& job) const {
  std::lock_guard lock(mu_);
  if (job.state != JobState::waiting || job.started) return std::nullopt;
  return expected_turn_locked(job);
}

std::optional<SteadyClock::time_point> LocalTurns::expected_turn_locked(
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

void LocalTurns::spin_for_turn(JobRecordState& job, std::unique_lock<std::mutex>& lock,
                                    SteadyClock::time_point until) {
  const std::uint32_t seen = job.signal.load(std::memory_order_acquire);
  lock.unlock();
  for (unsigned i = 1; job.signal.load(std::memory_order_acquire) == seen; ++i) {
    waits::cpu_relax();
    if (i % 64 == 0 && SteadyClock::now() >= until) break;
  }
  // The granting thread may still hold mu_ for a moment: spin for it as well.
  for (unsigned i = 0; !lock.try_lock(); ++i) {
    if (i == 4096) {
      lock.lock();
      break;
    }
    waits::cpu_relax();
  }
}

void LocalTurns::take_turn(JobRecordState& job, std::unique_lock<std::mutex>& lock) {
  // Its pages that went down a tier while it waited come home (prefetch may have done it).
  const StreamHandle stream = job.stream;
  // GPU time counts from here, where the stream reaches this iteration's work; compute on the
  // host is timed on the host instead (at end()).
  const bool host_timed = parts_.clock.on_host();
  lock.unlock();
  try {
    // Its memory (persistent blocks made on another stream included) is used on this stream
    // from now on: frees and page moves are ordered after the work it enqueues here (a job that
    // computes on the host may still queue work on its lane).
    memory_->add_job_stream(job.id, device_, stream);
    memory::activate_job(*memory_, job.id);
    memory::begin_curve(*memory_, job.id);
  } catch (const UnknownJob&) {
    check_usable(job, "memory call");  // cancelled meanwhile: its memory is gone
    throw;
  }
  const std::optional<IterationTimers::Pair> timer =
      host_timed ? std::nullopt : parts_.clock.start(job.spec.name, stream);
  lock.lock();
  if (job.state == JobState::cancelled || job.state == JobState::left) {
    if (timer) parts_.clock.release(*timer);
    check_usable_locked(job, "begin_iteration");
  }
  job.timer = timer;
  job.host_timed = host_timed;
  const auto now = SteadyClock::now();
  count_wait(job, now);
  job.state = JobState::running;
  job.began_by = std::this_thread::get_id();
  job.iteration_started = now;
  attribution::enter_iteration(job);
}

LocalTurns::Wakes LocalTurns::hand_back_turn(JobRecordState& job) {
  parts_.streams.stop(job.stream);
  parts_.lanes.release(job.lane);
  job.started = false;
  job.state = JobState::idle;
  core_.finish(job.id, seconds_since_start(SteadyClock::now()));
  parts_.waits.iteration_gone();
  return run_decisions();
}

void LocalTurns::count_wait(JobRecordState& job, SteadyClock::time_point now) {
  const double waited = std::chrono::duration<double>(now - job.wait_started).count();
  job.waiting_seconds += waited;
  job.max_wait_seconds = std::max(job.max_wait_seconds, waited);
}

void LocalTurns::withdraw(JobRecordState& job) {
  Wakes to_wake;
  {
    std::lock_guard lock(mu_);
    if (job.state == JobState::running) {
      throw InvalidArgument(fmt::format(
          "withdraw: job '{}' is inside an iteration (end_iteration ends it)", job.spec.name));
    }
    if (job.state != JobState::waiting) return;  // idle, left or cancelled: no wait to end
    if (job.waiter) {
      throw InvalidArgument(fmt::format(
          "withdraw: a thread waits in begin_iteration for job '{}' (cancel() wakes it)",
          job.spec.name));
    }
    count_wait(job, SteadyClock::now());
    if (job.started) {
      to_wake = hand_back_turn(job);  // granted since the wait ran out of time: the next one goes
    } else {
      const std::optional<int> lane = core_.lane_of(job.id);
      core_.withdraw(job.id);
      job.state = JobState::idle;
      to_wake = run_decisions();  // memory-aware plans may try another waiting job as an extra
      prefetch_next(lane);        // the lane's next job may be another one now
    }
  }
  wake(to_wake);
  // Idle again, the job may enqueue work as between iterations: its pages stay where they are.
  try {
    memory::activate_job(*memory_, job.id);
  } catch (const UnknownJob&) {
    std::lock_guard lock(mu_);
    if (job.state != JobState::cancelled && job.state != JobState::left) throw;
  }
}

}  // namespace salus
