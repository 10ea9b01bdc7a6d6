// The scheduling state of one device, without threads or clocks: admission into lanes, the
// waiting jobs of each lane ordered by the policy's key, and what runs. The real scheduler drives
// it under its lock with wall-clock seconds; the discrete-event simulator drives it with a virtual
// clock. Every decision costs O(log n) in the number of jobs (n up to thousands).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "salus/scheduler.hpp"

namespace salus::sched {

// An iteration to start now, in `lane` (memory-aware plans: the lane of the job, whether it
// starts as the lane's turn or as an extra beside the lanes).
struct Start {
  JobId job;
  int lane = 0;
};

struct Decision {
  std::vector<Start> starts;  // already marked running in the core
  // Memory-aware plans: ask again after this many seconds even if nothing else happens (when a
  // waiting job is predicted to fit as an extra, or a newcomer's quota beside the extras). Unset
  // when only an event can change the answer.
  std::optional<double> recheck_after_seconds;
};

class DecisionCore {
 public:
  // `policy` must outlive the core. `budget_bytes`: what the device may hold for all jobs.
  DecisionCore(const Policy& policy, std::size_t budget_bytes);
  ~DecisionCore();
  DecisionCore(const DecisionCore&) = delete;
  DecisionCore& operator=(const DecisionCore&) = delete;

  // Registers a job; it is admitted into a lane once its memory fits (possibly at once).
  // Throws InvalidArgument for a duplicate id.
  void add(const JobView& job);
  // Replaces what is known of a job (profiled estimates, attained time, counters). A waiting job's
  // key is recomputed; a lane's quota follows its members' new estimates.
  void update(const JobView& job);
  // The job left or was cancelled: it stops waiting or running and its lane share is freed.
  void remove(JobId job);
  // The job asks for its next iteration. Throws InvalidArgument if unknown, already waiting or
  // running.
  void wait(JobId job);
  // The job no longer asks for an iteration (its caller gave up waiting): it leaves its lane's
  // queue, keeping its admission and lane. Throws InvalidArgument if unknown or not waiting (a
  // started job is running: finish() ends that).
  void withdraw(JobId job);
  // A running iteration ended `now` (seconds on the caller's clock).
  void finish(JobId job, double now);
  // A running iteration has done `work_seconds` of its work by `now`. Without this the core takes
  // the wall time since its start as its progress; a mechanism that knows better (the simulator,
  // whose iterations slow down under contention) says so before deciding, and memory-aware plans
  // then predict each running curve from where the iteration really is. Ignored for a job that
  // is not running; `work_seconds` is clamped to [0, now - start].
  void progressed(JobId job, double now, double work_seconds);
  // Starts every iteration that may start at `now` under the policy and marks them running.
  Decision decide(double now);
  // Bytes that plans leave free (the mechanism's measure of what the device loses to whole pages;
  // 0 by default, as in the simulator, whose memory is exact): admission places new jobs, and
  // memory-aware extras start, within the budget less this. Admitted jobs that no longer fit and
  // neither run nor own their lane go back to pending (and are placed again, in fewer lanes).
  void set_headroom(std::size_t bytes);
  // Live bytes on the device that no job of this core owns (blocks of jobs that left while their
  // holders keep them, allocations made outside any job): plans treat them as taken, as above.
  void set_unowned(std::size_t bytes);

  [[nodiscard]] bool admitted(JobId job) const;
  [[nodiscard]] bool waiting(JobId job) const;
  [[nodiscard]] bool running(JobId job) const;
  [[nodiscard]] std::optional<int> lane_of(JobId job) const;
  // Iterations running now (turns and extras).
  [[nodiscard]] std::size_t running_count() const;
  // The waiting job that takes `lane`'s next turn as things stand (what to prefetch).
  [[nodiscard]] std::optional<JobId> next_in_lane(int lane) const;
  [[nodiscard]] int lane_count() const;
  // Bytes the admitted jobs are accounted for: per lane, sum of persistent + largest ephemeral
  // peak (the memory-aware plan's lanes are the packed ones; its extras use what is left).
  [[nodiscard]] std::size_t committed_bytes() const;
  // Persistent bytes of the admitted jobs (resident on the device between iterations).
  [[nodiscard]] std::size_t persistent_bytes() const;
  // Persistent + ephemeral peak of the registered jobs not admitted yet (what they will ask for).
  [[nodiscard]] std::size_t pending_bytes() const;
  [[nodiscard]] const JobView* view(JobId job) const;
  [[nodiscard]] std::size_t job_count() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace salus::sched
