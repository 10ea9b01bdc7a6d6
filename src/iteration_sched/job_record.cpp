#include "iteration_sched/job_record.hpp"

#include <fmt/format.h>

#include "salus/error.hpp"

namespace salus {

namespace {

constexpr double kHostWeight = 0.5;  // weight of the newest iteration in host_seconds

}  // namespace

void JobRecordState::check_usable(const char* what) const {
  if (state == JobState::cancelled) throw JobCancelled(spec.name);
  if (state == JobState::left) {
    throw InvalidArgument(fmt::format("{}: job '{}' has left", what, spec.name));
  }
}

void JobRecordState::check_running(const char* what) const {
  check_usable(what);
  if (state != JobState::running) {
    throw InvalidArgument(fmt::format("{}: job '{}' is not inside an iteration (it is {})", what,
                                      spec.name, to_string(state)));
  }
}

void JobRecordState::count_wait(SteadyClock::duration waited) {
  const double seconds = std::chrono::duration<double>(waited).count();
  waiting_seconds += seconds;
  max_wait_seconds = std::max(max_wait_seconds, seconds);
}

void JobRecordState::start_running(SteadyClock::time_point now,
                                   std::optional<IterationTimers::Pair> iteration_timer,
                                   bool on_host) {
  timer = iteration_timer;
  host_timed = on_host;
  count_wait(now - wait_started);
  state = JobState::running;
  began_by = std::this_thread::get_id();
  iteration_started = now;
}

double JobRecordState::stop_running(SteadyClock::time_point now) {
  const double seconds = std::chrono::duration<double>(now - iteration_started).count();
  state = JobState::idle;
  ++iterations;
  host_seconds =
      host_seconds > 0.0 ? (1 - kHostWeight) * host_seconds + kHostWeight * seconds : seconds;
  return seconds;
}

void JobRecordState::wake(bool all) {
  signal.fetch_add(1, std::memory_order_release);
  // A spinning waiter is not in the wait, nor is a wait with no thread: no system call then.
  if (all) {
    wakeup.notify_all();
  } else {
    wakeup.notify_one();
  }
  if (on_wake) on_wake();
}

}  // namespace salus
