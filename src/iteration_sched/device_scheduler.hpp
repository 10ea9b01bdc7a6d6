// The mechanism around a policy on one device, as the runtime sees it: a facade over the device's
// turn queue (LocalTurns, local_turns.hpp: its jobs and their turns), what it learns of them
// (JobProfiles) and the memory side of its jobs (allocations that may wait for other iterations'
// memory, frees, the streams a framework binds to a job, statistics). Where its jobs' turns come
// from is turns(): the queue itself, or salusd's gate in front of it.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "cuda/process_fork.hpp"
#include "iteration_sched/iteration_clock.hpp"
#include "iteration_sched/job_profiles.hpp"
#include "iteration_sched/job_record.hpp"
#include "iteration_sched/lane_streams.hpp"
#include "iteration_sched/local_turns.hpp"
#include "iteration_sched/memory_waits.hpp"
#include "iteration_sched/runtime_parts.hpp"
#include "iteration_sched/stream_bindings.hpp"
#include "iteration_sched/trace.hpp"
#include "iteration_sched/turn_source.hpp"
#include "salus/runtime.hpp"

namespace salus {

// Lock rule: it holds no lock of its own. Each part it is made of takes its own (local_turns.hpp
// states the queue's), and it calls them one after the other, never one inside another.
class DeviceScheduler {
 public:
  // `site`: where the runtime's iterations compute (RuntimeOptions::host_compute), which may
  // change while it runs;
  // `allocation_wait_limit`: RuntimeOptions::allocation_wait_limit.
  DeviceScheduler(std::shared_ptr<DeviceBackend> backend, std::shared_ptr<MemoryManager> memory,
                  std::shared_ptr<TraceRecorder> trace, int device, std::unique_ptr<Policy> policy,
                  std::shared_ptr<const SiteChoice> site,
                  std::chrono::milliseconds allocation_wait_limit,
                  std::chrono::microseconds turn_spin = {}, const RuntimeParts& parts = {});
  ~DeviceScheduler();
  DeviceScheduler(const DeviceScheduler&) = delete;
  DeviceScheduler& operator=(const DeviceScheduler&) = delete;

  // Where its jobs' turns come from (turn_source.hpp): its own queue, or salusd's gate in front
  // of it (RuntimeParts::gate). Jobs are added, begin, end and leave there.
  [[nodiscard]] TurnSource& turns() {
    return gated_ ? static_cast<TurnSource&>(*gated_) : local_;
  }
  // The device's own queue: rechecks, expected turns, reported profiles (RuntimeAccess).
  [[nodiscard]] LocalTurns& queue() { return local_; }

  // On `stream` when given (a framework's own stream), else on the job's last lane stream (or the
  // device's default stream before its first iteration).
  DevicePtr allocate(JobRecordState& job, std::size_t bytes, std::optional<Lifetime> lifetime,
                     std::optional<StreamHandle> stream = std::nullopt);
  // Frees the job's block at `ptr`; `check` says what else the caller knows of it (its size and
  // device), checked where the block is freed.
  void deallocate(JobRecordState& job, DevicePtr ptr, MemoryManager::FreeCheck check = {});
  // The job whose iteration runs on `stream` now (one of this device's lane streams), else the
  // job `stream` is bound to, if any. Takes only the bindings' lock.
  [[nodiscard]] std::shared_ptr<JobRecordState> job_on(StreamHandle stream) {
    return streams_.job_on(stream);
  }
  // A framework's stream: its allocations are the job's until unbound or the job finishes.
  void bind_stream(StreamHandle stream, const std::shared_ptr<JobRecordState>& job);
  void unbind_stream(StreamHandle stream);
  // The stream is going: a binding of it ends (none is fine).
  void forget_stream(StreamHandle stream) { (void)streams_.unbind(stream); }

  // Both first charge the GPU time of iterations whose work has finished since.
  [[nodiscard]] JobStats stats(const JobRecordState& job);
  [[nodiscard]] std::vector<JobStats> all_stats();
  [[nodiscard]] std::string_view policy_name() const { return policy_->name(); }
  [[nodiscard]] int device() const { return device_; }
  // Where it was made: in a forked child it is inherited and must not be used (process_fork.hpp).
  [[nodiscard]] const process::Birth& birth() const { return birth_; }

 private:
  // stats without settling first.
  [[nodiscard]] JobStats read_stats(const JobRecordState& job);
  // An allocation the device refuses while other iterations run waits for them
  // (allocate_or_wait.cpp; when waiting helps: memory_waits.hpp).
  DevicePtr allocate_or_wait(JobRecordState& job, const AllocationRequest& request);
  // False when waiting cannot help; else waits a while (an iteration ending, or a short time for
  // frees in the middle of others' iterations).
  bool wait_for_memory(JobRecordState& job, SteadyClock::time_point began);
  class StartHold;

  const std::shared_ptr<DeviceBackend> backend_;
  const std::shared_ptr<MemoryManager> memory_;
  const int device_;
  const std::unique_ptr<Policy> policy_;
  const std::chrono::milliseconds allocation_wait_limit_;
  const process::Birth birth_ = process::birth_now();
  // Its parts, each with a lock of its own (a leaf), shared with the queue (TurnParts).
  IterationClock clock_;     // timers, pending timings, host compute
  StreamBindings streams_;   // whose stream an allocation is on
  MemoryWaits waits_;        // allocations waiting for memory, holds
  LaneStreams lanes_;        // the lanes' streams and slots
  JobProfiles profiles_;     // what the device learns of its jobs
  LocalTurns local_;                         // its jobs and their turns (its own lock)
  const std::unique_ptr<GatedTurns> gated_;  // salusd's turn in front of local_; null in-process
};

}  // namespace salus
