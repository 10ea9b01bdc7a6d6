// Where a device's jobs get their turns. A Job asks its scheduler's turn source and never which
// kind it is:
//  - LocalTurns: the scheduler's own queue, lanes and decision core (an in-process runtime);
//  - GatedTurns: salusd's turn first (the gate, turn_gate.hpp), then the scheduler's, given back
//    in the other order, so that no thread waits for the daemon while it holds a local turn.
//
// Lock rule: a turn source holds no mutable state and takes no lock. Each call goes to the
// scheduler (which takes its own) and to the gate one after the other, never inside the other.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>

#include "iteration_sched/turn_gate.hpp"
#include "salus/runtime.hpp"

namespace salus {

class DeviceScheduler;
struct JobRecordState;

class TurnSource {
 public:
  using Deadline = std::chrono::steady_clock::time_point;

  virtual ~TurnSource() = default;
  // A new job of the device; one the gate refuses is no job here either.
  virtual std::shared_ptr<JobRecordState> add(JobSpec spec) = 0;
  // Waits for the job's turn and begins its iteration on the returned stream.
  virtual StreamHandle begin(JobRecordState& job) = 0;
  // As begin, until `deadline`: nullopt when it passed first, and the job keeps its place (a
  // later begin goes on with it, withdraw ends the wait).
  virtual std::optional<StreamHandle> begin_until(JobRecordState& job, Deadline deadline) = 0;
  virtual void withdraw(JobRecordState& job) = 0;
  // Ends the iteration. `between` (DeviceScheduler::end) is for salusd's own loop, whose turns
  // are local: a gated source refuses it.
  virtual void end(JobRecordState& job, const std::function<void()>& between = {}) = 0;
  // Leaves (or cancels) the job everywhere its turns come from, even where one of them throws.
  virtual void finish(JobRecordState& job, bool cancelled) = 0;
};

class LocalTurns final : public TurnSource {
 public:
  explicit LocalTurns(DeviceScheduler& local) : local_(local) {}
  std::shared_ptr<JobRecordState> add(JobSpec spec) override;
  StreamHandle begin(JobRecordState& job) override;
  std::optional<StreamHandle> begin_until(JobRecordState& job, Deadline deadline) override;
  void withdraw(JobRecordState& job) override;
  void end(JobRecordState& job, const std::function<void()>& between) override;
  void finish(JobRecordState& job, bool cancelled) override;

 private:
  DeviceScheduler& local_;
};

class GatedTurns final : public TurnSource {
 public:
  GatedTurns(std::shared_ptr<TurnGate> remote, DeviceScheduler& local)
      : remote_(std::move(remote)), local_(local) {}
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
  DeviceScheduler& local_;
};

}  // namespace salus
