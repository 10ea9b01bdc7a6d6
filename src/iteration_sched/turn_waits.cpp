#include "iteration_sched/turn_waits.hpp"

#include <fmt/format.h>

#include "iteration_sched/attribution.hpp"
#include "waits/blocking.hpp"

namespace salus {

TurnWaits::TurnWaits(TurnParts parts, TurnDecisions& decisions, TurnMemory& memory,
                     std::chrono::microseconds turn_spin)
    : parts_(parts), decisions_(decisions), memory_(memory), spin_(turn_spin) {}

std::optional<StreamHandle> TurnWaits::begin(JobRecordState& job,
                                             std::unique_lock<std::mutex>& lock,
                                             std::optional<SteadyClock::time_point> deadline) {
  job.check_usable("begin_iteration");
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
    job.check_usable("begin_iteration");
    take_turn(job, lock);
  } catch (...) {
    if (!lock.owns_lock()) lock.lock();
    job.waiter = false;
    Wakes to_wake;
    if (job.state == JobState::waiting) {
      if (job.started) {
        to_wake = hand_back_turn(job);  // a turn granted but not taken would hold its lane
      } else if (!decisions_.asking(job.id)) {
        job.state = JobState::idle;  // it never joined the queue
      }
    }
    lock.unlock();
    wake_all(to_wake);
    throw;
  }
  job.waiter = false;
  return job.stream;
}

void TurnWaits::before_gate_wait(JobRecordState& job, std::unique_lock<std::mutex>& lock) {
  job.check_usable("begin_iteration");
  if (job.state != JobState::idle) return;  // already waiting here, or running
  lock.unlock();
  if (!parts_.clock.site().pages_rest_while_waiting()) return;
  if (!memory_.quiesce(job.id)) throw_job_gone(job, "memory call", lock);
}

void TurnWaits::ask_for_turn(JobRecordState& job, std::unique_lock<std::mutex>& lock) {
  job.state = JobState::waiting;
  job.started = false;
  job.wait_started = SteadyClock::now();
  // Waiting for its turn, the job enqueues nothing: a safe point to move its pages, where its
  // site lets them rest (ComputeSite::pages_rest_while_waiting). Outside mu_, like every memory
  // manager call that may take a heap lock: see allocate.
  bool present = true;  // its memory: a cancel releases it
  if (parts_.clock.site().pages_rest_while_waiting()) {
    lock.unlock();
    present = memory_.quiesce(job.id);
    lock.lock();
  }
  // Cancelled or left meanwhile (a job that left used to begin anyway: found by fuzz_c_api). Its
  // memory gone, JobCancelled says why (issue 34's UnknownJob after a cancel from another thread,
  // 1 in about 100 such cancels).
  job.check_usable("begin_iteration");
  if (!present) throw UnknownJob(job.id);
  decisions_.ask(job.id);
  wake_all(decisions_.decide());
  if (!job.started) decisions_.prefetch_for(job.id);
}

bool TurnWaits::wait_for_start(JobRecordState& job, std::unique_lock<std::mutex>& lock,
                               std::optional<SteadyClock::time_point> deadline) {
  bool spun = false;  // one spin per wait: a turn that did not come in it is woken as usual
  while (!job.started && job.state == JobState::waiting) {
    // Wake at the deadline or at a recheck the core asked for, whichever comes first.
    std::optional<SteadyClock::time_point> until = decisions_.recheck_at();
    if (deadline) {
      if (SteadyClock::now() >= *deadline) return false;
      if (!until || *deadline < *until) until = deadline;
    }
    // Near its expected turn it spins for it (a start or a cancel still wakes a sleep before).
    if (const std::optional<SteadyClock::time_point> due = spun ? std::nullopt : turn_due(job)) {
      const auto step = spin_.wait(job.signal, job.wakeup, lock, *due, until);
      spun = step == waits::SpinNearDue::Step::spun;
      if (step != waits::SpinNearDue::Step::none) continue;
    }
    waits::before_blocking();
    if (until) {
      job.wakeup.wait_until(lock, *until);
      wake_all(decisions_.recheck_if_due());
    } else {
      job.wakeup.wait(lock);
    }
  }
  return true;
}

std::optional<SteadyClock::time_point> TurnWaits::turn_due(const JobRecordState& job) const {
  if (!spin_.on() || !parts_.clock.site().may_spin()) return std::nullopt;
  return decisions_.expected_turn(job);
}

void TurnWaits::take_turn(JobRecordState& job, std::unique_lock<std::mutex>& lock) {
  // Its pages that went down a tier while it waited come home (prefetch may have done it).
  const StreamHandle stream = job.stream;
  // GPU time counts from here, where the stream reaches this iteration's work; a site that
  // computes on the host is timed on the host instead (at end()).
  const bool host_timed = parts_.clock.site().timed_on_host();
  lock.unlock();
  // Its memory is ordered after the work it enqueues on the stream (a job that computes on the
  // host may still queue work on its lane), its pages come home, its curve starts.
  if (!memory_.begin_iteration(job.id, stream)) throw_job_gone(job, "memory call", lock);
  const std::optional<IterationTimers::Pair> timer =
      host_timed ? std::nullopt : parts_.clock.start(job.spec.name, stream);
  lock.lock();
  if (job.ended()) {
    if (timer) parts_.clock.release(*timer);
    job.check_usable("begin_iteration");
  }
  job.start_running(SteadyClock::now(), timer, host_timed);
  attribution::enter_iteration(job);
}

Wakes TurnWaits::hand_back_turn(JobRecordState& job) {
  parts_.streams.stop(job.stream);
  parts_.lanes.release(job.lane);
  job.started = false;
  job.state = JobState::idle;
  decisions_.finished(job.id, SteadyClock::now());
  parts_.waits.iteration_gone();
  return decisions_.decide();
}

void TurnWaits::withdraw(JobRecordState& job, std::unique_lock<std::mutex>& lock) {
  if (job.state == JobState::running) {
    throw InvalidArgument(fmt::format(
        "withdraw: job '{}' is inside an iteration (end_iteration ends it)", job.spec.name));
  }
  if (job.state != JobState::waiting) return;  // idle, left or cancelled: no wait to end
  if (job.waiter) {
    throw InvalidArgument(
        fmt::format("withdraw: a thread waits in begin_iteration for job '{}' (cancel() wakes it)",
                    job.spec.name));
  }
  job.count_wait(SteadyClock::now() - job.wait_started);
  Wakes to_wake;
  if (job.started) {
    to_wake = hand_back_turn(job);  // granted since the wait ran out of time: the next one goes
  } else {
    const std::optional<int> lane = decisions_.withdraw(job.id);
    job.state = JobState::idle;
    to_wake = decisions_.decide();   // memory-aware plans may try another waiting job as an extra
    decisions_.prefetch_next(lane);  // the lane's next job may be another one now
  }
  lock.unlock();
  wake_all(to_wake);
  // Idle again, the job may enqueue work as between iterations: its pages stay where they are.
  if (!memory_.activate(job.id)) {
    lock.lock();
    if (!job.ended()) throw UnknownJob(job.id);
  }
}

}  // namespace salus
