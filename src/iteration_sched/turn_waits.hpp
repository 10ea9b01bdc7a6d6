// A job's wait for its turn on one device, and the turn's taking: LocalTurns' begin (with or
// without a deadline), the withdrawal of a wait that no thread is in, and a connected job's safe
// point before it waits for the gate. A waiting job blocks on its own condition variable until
// the decisions start it (TurnDecisions); near its expected turn it spins for it instead
// (SpinNearDue, RuntimeOptions::turn_spin). As it waits, its pages may move (a safe point); as it
// takes its turn, they come home and its iteration is timed.
//
// Lock rule: no lock and no state of its own. Each call is made with LocalTurns' mu_ held by the
// `lock` it is handed (the caller's, dropped once the call returns or throws), which guards the
// records it changes and the decisions it asks. It releases the lock to call the memory manager
// (TurnMemory) and the clock's timers, to sleep or spin, and to wake others; under it, it calls
// only leaves (TurnParts) and the decisions, guarded by the same lock.
#pragma once

#include <chrono>
#include <mutex>
#include <optional>

#include "iteration_sched/job_record.hpp"
#include "iteration_sched/turn_decisions.hpp"
#include "iteration_sched/turn_memory.hpp"
#include "iteration_sched/turn_parts.hpp"
#include "waits/spin_near_due.hpp"

namespace salus {

class TurnWaits {
 public:
  // `turn_spin`: RuntimeOptions::turn_spin (0: off).
  TurnWaits(TurnParts parts, TurnDecisions& decisions, TurnMemory& memory,
            std::chrono::microseconds turn_spin);

  // The job asks for its turn (unless it already waits, with no thread in its wait), waits until
  // the decisions start it, and takes it: returns its lane's stream. Past `deadline` it returns
  // nullopt and keeps its place, with no thread in its wait. On failure (a cancel meanwhile, a
  // memory call) a turn granted and not taken goes back.
  std::optional<StreamHandle> begin(JobRecordState& job, std::unique_lock<std::mutex>& lock,
                                    std::optional<SteadyClock::time_point> deadline);
  // Ends a wait that no thread is in (TurnSource::withdraw).
  void withdraw(JobRecordState& job, std::unique_lock<std::mutex>& lock);
  // An idle job's pages may move while it waits for the gate's turn (LocalTurns::before_gate_wait).
  void before_gate_wait(JobRecordState& job, std::unique_lock<std::mutex>& lock);

 private:
  // An idle job asks the decisions for its next turn.
  void ask_for_turn(JobRecordState& job, std::unique_lock<std::mutex>& lock);
  // Waits until the decisions start the job, it is cancelled, or `deadline` passes (then returns
  // false); a waiter also watches the clock for a decision that asked to be made again later.
  bool wait_for_start(JobRecordState& job, std::unique_lock<std::mutex>& lock,
                      std::optional<SteadyClock::time_point> deadline);
  // When the waiting job's turn is expected, if it spins for it.
  [[nodiscard]] std::optional<SteadyClock::time_point> turn_due(const JobRecordState& job) const;
  // The decisions started the job; its memory is made ready on the lane's stream and it runs.
  // Throws (the caller hands the turn back) on failure.
  void take_turn(JobRecordState& job, std::unique_lock<std::mutex>& lock);
  // The turn granted to the waiting job goes back unused (no iteration counted); the job is
  // idle. Returns the jobs to wake.
  Wakes hand_back_turn(JobRecordState& job);

  const TurnParts parts_;
  TurnDecisions& decisions_;
  TurnMemory& memory_;
  const waits::SpinNearDue spin_;
};

}  // namespace salus
