// Where a device's jobs get their turns. A Job asks its scheduler's turn source and never which
// kind it is:
//  - LocalTurns (local_turns.hpp): the device's own queue, lanes and decision core (an
//    in-process runtime);
//  - GatedTurns: salusd's turn first (the gate, turn_gate.hpp), then the scheduler's, given back
//    in the other order, so that no thread waits for the daemon while it holds a local turn.
//
// Lock rule: GatedTurns holds no mutable state and takes no lock. Each call goes to the local
// queue (which takes its own) and to the gate one after the other, never inside the other.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>

#include "iteration_sched/turn_gate.hpp"
#include "salus/runtime.hpp"

namespace salus {

class JobProfiles;
class LocalTurns;
struct JobRecordState;

class TurnSource {
 public:
  using Deadline = std::chrono::steady_clock::time_point;

  virtual ~TurnSource() = default;
  // A new job of the device; one the gate refuses is no job here either. Throws InvalidArgument
  // for a job with no name, OutOfMemory when its hints exceed what the device can ever give one.
  virtual std::shared_ptr<JobRecordState> add(JobSpec spec) = 0;
  // Waits for the job's turn and begins its iteration on the returned stream.
  virtual StreamHandle begin(JobRecordState& job) = 0;
  // As begin, until `deadline`: nullopt when it passed first, and the job keeps its place, with
  // no thread in its wait (a later begin goes on with it, withdraw ends the wait).
  virtual std::optional<StreamHandle> begin_until(JobRecordState& job, Deadline deadline) = 0;
  // Ends a pending wait that no thread is in: the job is idle again and queued nowhere; a turn
  // granted meanwhile is handed back unused. Nothing happens when the job is idle, left or
  // cancelled; InvalidArgument while a thread waits in begin or the job is inside an iteration.
  virtual void withdraw(JobRecordState& job) = 0;
  // Ends the iteration. `between`: called once the next job is in (woken, or noted by its
  // on_wake) and this iteration's profile is whole, before the rest of its bookkeeping
  // (statistics, the trace), with no lock held; what it throws is thrown once the bookkeeping is
  // done. It is for salusd's own loop, whose turns are local (the turn it sends the next
  // process): a gated source refuses it.
  virtual void end(JobRecordState& job, const std::function<void()>& between = {}) = 0;
  // Leaves (or cancels) the job everywhere its turns come from, even where one of them throws:
  // it stops, its waiter wakes, everything it holds is freed (or, with
  // JobSpec::blocks_outlive_job, handed to nobody until its holders free it).
  virtual void finish(JobRecordState& job, bool cancelled) = 0;
};

class GatedTurns final : public TurnSource {
 public:
  // `profiles`: the device's, which `local` charges (what a release sends the daemon).
  GatedTurns(std::shared_ptr<TurnGate> remote, LocalTurns& local, const JobProfiles& profiles)
      : remote_(std::move(remote)), local_(local), profiles_(profiles) {}
  std::shared_ptr<JobRecordState> add(JobSpec spec) override;
  StreamHandle begin(JobRecordState& job) override;
  std::optional<StreamHandle> begin_until(JobRecordState& job, Deadline deadline) override;
  void withdraw(JobRecordState& job) override;
  void end(JobRecordState& job, const std::function<void()>& between) override;
  void finish(JobRecordState& job, bool cancelled) override;

 private:
  // The daemon's turn; false when `deadline` passed first. Its wait counts in the job's
  // statistics, and is a safe point at which the job's pages may move.
  bool take_remote(JobRecordState& job, std::optional<Deadline> deadline);
  // The local turn of a job `begin` is returning with: its stream must follow the previous
  // holder's work (TurnGate::order_after). On failure the iteration ends here and the daemon's
  // turn goes back, and the failure is thrown.
  void order_or_give_back(JobRecordState& job, StreamHandle stream);

  const std::shared_ptr<TurnGate> remote_;
  LocalTurns& local_;
  const JobProfiles& profiles_;
};

}  // namespace salus
