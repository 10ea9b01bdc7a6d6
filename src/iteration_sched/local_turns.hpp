// The turn queue of one device: its jobs' turns and the waits for them. Jobs block in begin on
// their own condition variable until the decisions start them; end decides at once and wakes
// exactly the jobs that start (no polling). Lanes are streams (LaneStreams); jobs in one lane
// share its stream, so the next job's work is ordered behind the previous one's on the GPU while
// its host thread is already enqueueing.
//
// It owns every JobRecordState's turn state (job_record.hpp) and the parts it is made of: the
// jobs present and their history (TurnJobs), the decisions (TurnDecisions: the policy's core, and
// what it is shown of each job), a job's wait for its turn and its taking (TurnWaits), and the
// memory side of a turn (TurnMemory: the memory manager's calls and the trace's counters). What
// it learns of its jobs is the device's JobProfiles (job_profiles.hpp), which it shares with the
// facade in front of it, DeviceScheduler; that one adds allocations, frees, stream bindings and
// statistics.
//
// Lock rule: every public method takes mu_ itself, and none calls another public one. mu_ guards
// the turn state of every job, and TurnJobs, TurnDecisions and TurnWaits (parts with no lock of
// their own, called with mu_ held). With mu_ held it calls only those and leaves, which take a
// lock of their own (or none) and call nothing back: TurnParts (among them JobProfiles;
// LaneStreams makes a lane's stream under it), the harvester's prefetch queue
// (TurnMemory::prefetch) and a job's on_wake. Everything else (the rest of TurnMemory, timing
// events, the trace) is called with mu_ released.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "iteration_sched/job_profiles.hpp"
#include "iteration_sched/job_record.hpp"
#include "iteration_sched/trace.hpp"
#include "iteration_sched/turn_decisions.hpp"
#include "iteration_sched/turn_jobs.hpp"
#include "iteration_sched/turn_memory.hpp"
#include "iteration_sched/turn_parts.hpp"
#include "iteration_sched/turn_source.hpp"
#include "iteration_sched/turn_waits.hpp"
#include "salus/memory.hpp"
#include "salus/runtime.hpp"

namespace salus {

// Where a job's next block goes and what it is, as the facade's allocate asks.
struct Placement {
  bool running = false;   // inside an iteration: its blocks are ephemeral by default
  StreamHandle stream{};  // its last lane stream (the device's default before its first)
};

class LocalTurns final : public TurnSource {
 public:
  // `policy` must outlive it. `memory_reported`: RuntimeParts::memory_profiles is reported.
  // `turn_spin`: RuntimeOptions::turn_spin (0: off).
  LocalTurns(std::shared_ptr<MemoryManager> memory, std::shared_ptr<TraceRecorder> trace,
             int device, const Policy& policy, TurnParts parts, std::chrono::microseconds turn_spin,
             bool memory_reported);
  LocalTurns(const LocalTurns&) = delete;
  LocalTurns& operator=(const LocalTurns&) = delete;

  // --- TurnSource (turn_source.hpp says what each does) ---
  std::shared_ptr<JobRecordState> add(JobSpec spec) override;
  StreamHandle begin(JobRecordState& job) override;
  std::optional<StreamHandle> begin_until(JobRecordState& job, Deadline deadline) override;
  void withdraw(JobRecordState& job) override;
  void end(JobRecordState& job, const std::function<void()>& between = {}) override;
  void finish(JobRecordState& job, bool cancelled) override;

  // --- the queue ---
  // Runs a decision the core asked to be made again later (a memory-aware plan's recheck) if
  // its time has come, for waits with no thread in them, which watch no clock. Returns when the
  // next one is due; nullopt when none is asked for.
  std::optional<SteadyClock::time_point> recheck();
  // Decides now (an allocation's hold on new starts ended) and wakes whom it starts.
  void decide();
  // When the waiting `job`'s turn is expected: it is next in its lane, behind an iteration whose
  // host time is known (as the lane's iterations have lately lasted). Nullopt otherwise, and
  // under memory-aware plans, whose extras are not the lane's order.
  [[nodiscard]] std::optional<SteadyClock::time_point> expected_turn(
      const JobRecordState& job) const;
  // The job is about to wait for the gate's turn: as while it waits for this queue's, a safe
  // point at which its pages may move (to make room for another process).
  void before_gate_wait(JobRecordState& job);
  // The job waited that long for the gate's turn: its waiting statistics count it.
  void count_gate_wait(JobRecordState& job, SteadyClock::duration waited);

  // --- its jobs, for the facade ---
  // A job present on this device, by id; nullptr once it left or for other ids.
  [[nodiscard]] std::shared_ptr<JobRecordState> job_by_id(JobId id) const;
  // Throws JobCancelled when `id` is a job of this device that was cancelled.
  void throw_if_cancelled(JobId id) const;
  // Every job present, and the last that left (TurnJobs::kFinishedJobsKept), in arrival order.
  [[nodiscard]] std::vector<std::shared_ptr<JobRecordState>> history() const;
  // Throws JobCancelled when the job was cancelled, InvalidArgument naming `what` when it left.
  void check_usable(const JobRecordState& job, const char* what) const;
  // check_usable("allocate"), then where the job's next block goes.
  [[nodiscard]] Placement placement(const JobRecordState& job) const;
  // True when the job ended and its blocks outlive it (JobSpec::blocks_outlive_job), so that
  // their holders free them; false while the job may free its own; throws as check_usable when
  // it ended otherwise. One decision under one lock: no end slips between.
  [[nodiscard]] bool holder_frees(const JobRecordState& job) const;
  // check_usable("bind_stream"), and `stream`'s allocations are the job's from now on (under the
  // lock that a finish takes to forget its bindings: no finish slips between).
  void bind_stream(StreamHandle stream, const std::shared_ptr<JobRecordState>& job);
  // check_usable("allocate"), then how many other iterations run or are about to that another
  // thread may end (one this thread began cannot end while it waits); `running`: whether the
  // job itself is inside an iteration.
  [[nodiscard]] int others_running(const JobRecordState& job, bool& running) const;
  [[nodiscard]] StreamHandle stream_of(const JobRecordState& job) const;
  // The turn-side fields of the job's statistics (the profile's are JobProfiles', the rest the
  // memory manager's).
  void fill_stats(const JobRecordState& job, JobStats& stats) const;

  // --- what it learns of its jobs, in the device's JobProfiles ---
  // Charges the GPU time of the iterations whose work the clock found finished (polled without
  // mu_, then charged under it).
  void settle_timings();
  // Under MemoryProfiles::reported, what the job's process measured.
  void report_memory(JobRecordState& job, const MeasuredMemory& measured);
  // The GPU time measured of the job's iterations whose work has finished (polled now) since the
  // previous call: what its process reports to salusd at an iteration's end. Nullopt when its
  // last iteration was timed on the host (RuntimeOptions::host_compute).
  [[nodiscard]] std::optional<GpuTime> take_gpu_time(JobRecordState& job);
  // The job's GPU time as its process measured it: charged instead of the host time between
  // its begin and end, from now on.
  void report_gpu_time(JobRecordState& job, GpuTime gpu);

 private:
  [[nodiscard]] double seconds_since_start(SteadyClock::time_point t) const;
  // settle_timings, for the public methods that begin with it.
  void settle();
  // begin and begin_until: no deadline waits until the turn comes (or the job is cancelled).
  std::optional<StreamHandle> begin_turn(JobRecordState& job,
                                         std::optional<SteadyClock::time_point> deadline);
  // With mu_ held, as the job's iteration ends: its timer waits in the clock to be read when
  // `timed` (its end event was recorded), else goes back to the pool.
  void hand_off_timer(JobRecordState& job, bool timed);
  // end()'s bookkeeping once the next job is in: promotion, the profile, the decisions a smaller
  // take allows, the trace. Called without the lock.
  void after_iteration(JobRecordState& job, double host_seconds,
                       const std::vector<std::pair<double, std::size_t>>& samples,
                       SteadyClock::time_point now, TraceRecorder::Span span,
                       const std::function<void()>& between);

  const std::shared_ptr<TraceRecorder> trace_;
  const int device_;
  const TurnParts parts_;
  const SteadyClock::time_point epoch_;
  const bool memory_reported_;
  TurnMemory memory_;

  mutable std::mutex mu_;  // guards everything below and every JobRecordState's turn state
  TurnJobs jobs_;
  TurnDecisions decisions_;
  TurnWaits waits_;
};

}  // namespace salus
