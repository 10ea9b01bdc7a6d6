// A job as its device keeps it: what it asked for (its spec), where it stands in its turns, and
// what its device has learned of it (its profile, kept for the device's JobProfiles). One record
// per job and device, made by the device's turn queue (LocalTurns::add) and shared with the parts
// that name jobs by stream or timer (StreamBindings, IterationClock) and with the Job handle.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <optional>
#include <thread>

#include "iteration_sched/decision.hpp"
#include "iteration_sched/iteration_timers.hpp"
#include "iteration_sched/job_profiles.hpp"
#include "iteration_sched/turn_gate.hpp"
#include "salus/runtime.hpp"

namespace salus {

using SteadyClock = std::chrono::steady_clock;

// One job as its device keeps it. Everything mutable but `learned` is its turn state, guarded by
// the mutex of its device's turn queue (LocalTurns, local_turns.hpp), which owns it; the other
// parts see it only through a shared_ptr they hand back to the queue, or read its const fields.
// The rules of its turn state are here: its methods read or change it, so they are called with
// that mutex held, but wake, which touches only the signal, the condition variable and on_wake
// (the queue wakes most jobs once it has unlocked). None calls out but wake, to on_wake.
struct JobRecordState {
  JobRecordState(JobId id, JobSpec spec, std::uint64_t arrival);

  // Left or cancelled: it takes no more turns, and is no longer its decision core's.
  [[nodiscard]] bool ended() const {
    return state == JobState::left || state == JobState::cancelled;
  }
  // Throws JobCancelled when it was cancelled, InvalidArgument naming `what` when it left.
  void check_usable(const char* what) const;
  // check_usable, and it must be inside an iteration.
  void check_running(const char* what) const;
  // It holds its lane's stream: inside an iteration, or granted a turn it has not taken (not yet,
  // or its wait ran out of time).
  [[nodiscard]] bool holds_lane() const {
    return state == JobState::running || (state == JobState::waiting && started);
  }
  // It waited that long (for its turn, or the gate's): its statistics count it.
  void count_wait(SteadyClock::duration waited);
  // Its turn came: its iteration begins `now` on the calling thread, timed by `iteration_timer`
  // (or on the host: `on_host`). The wait that ends counts.
  void start_running(SteadyClock::time_point now,
                     std::optional<IterationTimers::Pair> iteration_timer, bool on_host);
  // Its iteration ends `now`: it is idle, one more iteration counts, and its host time joins the
  // average. Returns the iteration's host time in seconds.
  double stop_running(SteadyClock::time_point now);
  // Its wake-up: its signal moves, its condition variable and its on_wake are told.
  void wake(bool all = false);

  const JobId id;
  const JobSpec spec;
  const std::uint64_t arrival;
  std::condition_variable wakeup;  // its own: a start wakes exactly the job that starts
  // Moves at every wake-up of this job (wake): a waiter that spins for
  // its turn (RuntimeOptions::turn_spin) watches it instead of sleeping on `wakeup`.
  std::atomic<std::uint32_t> signal{0};
  // A wait with no thread in it (salusd's turn loop: RuntimeAccess::on_wake): called at every
  // wake-up of this job, on the thread that decided and possibly with the scheduler's lock held,
  // so it only takes note (the loop then asks with a begin that does not wait). Set once, before
  // the job's first begin; never changed after.
  std::function<void()> on_wake;

  JobState state = JobState::idle;
  // Cancelled, and its handle then left: its id is retired (UnknownJob from now on, as for any
  // job that left), no longer "cancelled".
  bool retired = false;
  bool started = false;  // the core started the iteration this job waits for
  // A thread waits in begin for this job's turn. A wait may also be pending with no thread in it
  // (a timed begin ran out of time): the job keeps its place until it begins or withdraws.
  bool waiter = false;
  int lane = -1;
  StreamHandle stream{};
  // The turns' counts that JobStats shows (salus/stats_fields.h).
#define SALUS_STATS_MEMBER(type, name, what) type name = 0;
  SALUS_JOB_TURN_STATS_FIELDS(SALUS_STATS_MEMBER)
#undef SALUS_STATS_MEMBER
  SteadyClock::time_point wait_started{};
  SteadyClock::time_point iteration_started{};  // host time: the memory curve's and trace's clock
  // Its iterations' host time, begin to end (moving average; 0 until one ended): when the job
  // behind it in its lane may expect its turn.
  double host_seconds = 0.0;
  // The thread that began the running iteration: a thread blocked in an allocation cannot end
  // the iterations it began itself, so it does not wait for them (allocate_or_wait.cpp).
  std::thread::id began_by{};
  // The running iteration's timing events (its start is recorded on its stream); none when the
  // backend could not record them, or when the iteration is timed on the host.
  std::optional<IterationTimers::Pair> timer;
  bool host_timed = false;  // the running iteration computes on the host: its host time counts

  // What its device has learned of it (its profile, its GPU time): guarded by the device's
  // JobProfiles (job_profiles.hpp), not by the turn queue's mutex, and reached only through it.
  LearnedOfJob learned;
};

inline JobRecordState::JobRecordState(JobId job, JobSpec job_spec, std::uint64_t order)
    : id(job), spec(std::move(job_spec)), arrival(order), learned(spec.hints) {}

}  // namespace salus
