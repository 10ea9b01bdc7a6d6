// The memory side of a device's turns: the calls its turn queue (LocalTurns) makes to the memory
// manager as jobs arrive, wait, run and leave, and the trace's memory counters. A job's pages may
// move while it waits for its turn (a safe point), come home as it takes one, and its memory
// curve spans the iteration.
//
// Lock rule: it holds no job state and no lock of its own. The memory manager may take a heap's
// lock and the trace its own, so the queue calls it with its lock released; only prefetch, which
// queues a target for the harvester (a leaf), is called with the queue's lock held.
//
// A job cancelled from another thread has its memory released meanwhile: a call that finds it
// gone (the memory manager's UnknownJob) says so with false or nullopt, and the queue throws the
// error that says why (JobCancelled, or that it left), or UnknownJob itself.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>

#include "iteration_sched/trace.hpp"
#include "memory/curves.hpp"
#include "salus/memory.hpp"
#include "salus/runtime.hpp"

namespace salus {

struct JobRecordState;

class TurnMemory {
 public:
  TurnMemory(std::shared_ptr<MemoryManager> memory, std::shared_ptr<TraceRecorder> trace,
             int device);

  // What the device can ever give its jobs: its own memory, what peers lend, the host. With
  // harvesting, jobs are admitted against it; where their pages live is the memory manager's
  // business.
  [[nodiscard]] std::size_t reachable_bytes() const;
  // A new job's memory account. Throws OutOfMemory when its hints exceed what the device can ever
  // give one job: it could never be admitted, so it is refused now, not left waiting for good.
  [[nodiscard]] JobId register_job(const JobSpec& spec);
  // Live block bytes of `job` on this device (0 once it is gone).
  [[nodiscard]] std::size_t bytes_on_device(JobId job) const;
  // The job left: its blocks go to their holders (`orphan`, JobSpec::blocks_outlive_job), who
  // free them whenever they are done, or are freed.
  void release(JobId job, bool orphan);

  // The job waits for a turn and enqueues nothing: its pages may move (a safe point).
  [[nodiscard]] bool quiesce(JobId job);
  // The job may enqueue work again: its pages that went down a tier come home.
  [[nodiscard]] bool activate(JobId job);
  // The job's iteration begins on `stream`: its memory is ordered after the work it enqueues
  // there, its pages come home (activate) and its memory curve starts.
  [[nodiscard]] bool begin_iteration(JobId job, StreamHandle stream);
  // Its memory curve ends (no samples for a job that is gone).
  [[nodiscard]] memory::CurveSamples end_curve(JobId job);
  // The iteration's surviving ephemeral blocks (optimizer state made in the first step) become
  // persistent; then the job's statistics.
  [[nodiscard]] std::optional<JobMemoryStats> promote_ephemeral(JobId job);
  [[nodiscard]] DeviceMemoryStats device_stats() const;
  // Starts bringing home the pages of the job that takes a lane's next turn.
  void prefetch(JobId job);

  // The trace's memory counters as an iteration of `job_name` ends, `at_us` into the trace.
  void trace_counters(std::string_view job_name, const JobMemoryStats& job,
                      const DeviceMemoryStats& device, double at_us);

 private:
  // Throws OutOfMemory when the spec's hints exceed `budget`.
  void refuse_if_never_fits(const JobSpec& spec, std::size_t budget) const;

  const std::shared_ptr<MemoryManager> memory_;
  const std::shared_ptr<TraceRecorder> trace_;
  const int device_;
};

// A TurnMemory call found `job` gone: takes `lock` (the queue's, released as this is called) and
// throws as JobRecordState::check_usable(what) when the job was cancelled or left meanwhile, else
// the memory manager's UnknownJob.
[[noreturn]] void throw_job_gone(const JobRecordState& job, const char* what,
                                 std::unique_lock<std::mutex>& lock);

}  // namespace salus
