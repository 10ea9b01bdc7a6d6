// The turn queue of one device: its jobs, the decision core that says whose iteration runs next,
// and the waits for those turns. Jobs block in begin on their own condition variable until the
// core starts them; end decides at once and wakes exactly the jobs that start (no polling).
// Lanes are streams (LaneStreams); jobs in one lane share its stream, so the next job's work is
// ordered behind the previous one's on the GPU while its host thread is already enqueueing.
//
// It owns every JobRecordState's mutable part (job_record.hpp) and what it learns of its jobs
// (their profiles: local_turns_profile.cpp). The facade in front of it, DeviceScheduler, adds the
// memory side: allocations, frees, stream bindings and statistics.
//
// Lock rule: every public method takes mu_ itself, and none calls another public one. With mu_
// held it calls only leaves, which take a lock of their own (or none) and call nothing back: the
// parts it shares with the facade (TurnParts; LaneStreams makes a lane's stream under it), the
// decision core, the harvester's prefetch queue and a job's on_wake. Everything else (the memory
// manager, timing events, the trace) is called with mu_ released.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "iteration_sched/decision.hpp"
#include "iteration_sched/iteration_clock.hpp"
#include "iteration_sched/job_record.hpp"
#include "iteration_sched/lane_streams.hpp"
#include "iteration_sched/memory_waits.hpp"
#include "iteration_sched/stream_bindings.hpp"
#include "iteration_sched/trace.hpp"
#include "iteration_sched/turn_source.hpp"
#include "salus/memory.hpp"
#include "salus/runtime.hpp"

namespace salus {

// The parts a device's turn queue shares with its facade, each with a lock of its own (a leaf).
struct TurnParts {
  IterationClock& clock;     // timers, pending timings, host compute
  StreamBindings& streams;   // whose stream an allocation is on
  MemoryWaits& waits;        // allocations waiting for memory; holds on new starts
  LaneStreams& lanes;        // the lanes' streams and slots
};

// Where a job's next block goes and what it is, as the facade's allocate asks.
struct Placement {
  bool running = false;  // inside an iteration: its blocks are ephemeral by default
  StreamHandle stream{};  // its last lane stream (the device's default before its first)
};

class LocalTurns final : public TurnSource {
 public:
  // `policy` must outlive it. `memory_reported`: RuntimeParts::memory_profiles is reported.
  // `turn_spin`: RuntimeOptions::turn_spin (0: off).
  LocalTurns(std::shared_ptr<MemoryManager> memory, std::shared_ptr<TraceRecorder> trace,
             int device, const Policy& policy, TurnParts parts,
             std::chrono::microseconds turn_spin, bool memory_reported);
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
  [[nodiscard]] std::optional<SteadyClock::time_point> expected_turn(const JobRecordState& job) const;
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
  // Every job present, and the last that left (kFinishedJobsKept), in arrival order.
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
  // The turn-side fields of the job's statistics (the rest is the memory manager's).
  void fill_stats(const JobRecordState& job, JobStats& stats) const;

  // --- what it learns of its jobs (local_turns_profile.cpp) ---
  // Charges the GPU time of the iterations whose work the clock found finished (polled without
  // mu_, then charged under it).
  void settle_timings();
  // Under MemoryProfiles::reported, what the job's process measured.
  void report_memory(JobRecordState& job, const MeasuredMemory& measured);
  // What the job's profile says of its memory; nullopt while nothing is known (no iteration
  // ended and no hint).
  [[nodiscard]] std::optional<MeasuredMemory> measured_memory(const JobRecordState& job) const;
  // The GPU time measured of the job's iterations whose work has finished (polled now) since the
  // previous call: what its process reports to salusd at an iteration's end. Nullopt when its
  // last iteration was timed on the host (RuntimeOptions::host_compute).
  [[nodiscard]] std::optional<GpuTime> take_gpu_time(JobRecordState& job);
  // The job's GPU time as its process measured it: charged instead of the host time between
  // its begin and end, from now on.
  void report_gpu_time(JobRecordState& job, GpuTime gpu);

 private:
  using Wakes = std::vector<std::shared_ptr<JobRecordState>>;
  [[nodiscard]] double seconds_since_start(SteadyClock::time_point t) const;
  [[nodiscard]] JobView view_of(const JobRecordState& job) const;  // with mu_ held
  // Throws OutOfMemory when the spec's hints exceed what the device can ever give one job.
  void refuse_if_never_fits(const JobSpec& spec) const;
  // With mu_ held: see check_usable.
  void check_usable_locked(const JobRecordState& job, const char* what) const;
  // With mu_ held: check_usable, and the job must be inside an iteration.
  void check_running(const JobRecordState& job, const char* what) const;
  // Live block bytes of `job` on this device (0 once it is gone). Takes no lock of its own.
  [[nodiscard]] std::size_t bytes_on_device(JobId job) const;
  // With mu_ held: drops the oldest finished jobs from history_ once twice the kept number have
  // gathered (amortized: one pass per kFinishedJobsKept jobs).
  void forget_old_jobs();
  // begin and begin_until: no deadline waits until the turn comes (or the job is cancelled).
  std::optional<StreamHandle> begin_turn(JobRecordState& job,
                                         std::optional<SteadyClock::time_point> deadline);
  // With mu_ held (by `lock`, released meanwhile): an idle job asks the core for its next turn.
  void ask_for_turn(JobRecordState& job, std::unique_lock<std::mutex>& lock);
  // With mu_ held (by `lock`, released meanwhile): the core started the job; its memory is made
  // ready on the lane's stream and it runs. Throws (the caller hands the turn back) on failure.
  void take_turn(JobRecordState& job, std::unique_lock<std::mutex>& lock);
  // With mu_ held: the turn the core granted the waiting `job` goes back unused (no iteration
  // counted); the job is idle. Returns the jobs to wake.
  Wakes hand_back_turn(JobRecordState& job);
  // With mu_ held: a wait of `job` ends now; its statistics count it.
  static void count_wait(JobRecordState& job, SteadyClock::time_point now);
  // With mu_ held (by `lock`): waits until the core starts the job, it is cancelled, or
  // `deadline` passes (then returns false); a waiter also watches the clock for a decision that
  // asked to be made again later.
  bool wait_for_start(JobRecordState& job, std::unique_lock<std::mutex>& lock,
                      std::optional<SteadyClock::time_point> deadline);
  // With mu_ held: expected_turn_locked, when spinning is on (RuntimeOptions::turn_spin).
  [[nodiscard]] std::optional<SteadyClock::time_point> turn_due(const JobRecordState& job) const;
  // With mu_ held: see expected_turn.
  [[nodiscard]] std::optional<SteadyClock::time_point> expected_turn_locked(
      const JobRecordState& job) const;
  // With mu_ held (by `lock`, released meanwhile): watches the job's signal until it moves or
  // `until` passes, then takes mu_ back spinning too (the thread that granted the turn may
  // still hold it: sleeping on it would cost the wake-up the spin saves).
  void spin_for_turn(JobRecordState& job, std::unique_lock<std::mutex>& lock,
                     SteadyClock::time_point until);
  // With mu_ held: starts what the core decides; returns the jobs to wake (after unlocking, so
  // they do not wake only to block on mu_).
  Wakes run_decisions();
  static void wake(const Wakes& jobs);
  // One job's wake-up: its signal moves, its condition variable and its on_wake are told.
  static void wake_one(JobRecordState& job, bool all = false);
  // With mu_ held: starts bringing home the pages of the job that takes `lane`'s next turn.
  void prefetch_next(std::optional<int> lane);
  // With mu_ held: adds `iterations` iterations' GPU time to the job's attained time and
  // profile.
  void charge_gpu_time(JobRecordState& job, double seconds, std::uint32_t iterations = 1);
  // With mu_ held, as the job's iteration ends: its timer waits in the clock to be read when
  // `timed` (its end event was recorded), else goes back to the pool.
  void hand_off_timer(JobRecordState& job, bool timed);
  // end()'s bookkeeping once the next job is in: promotion, the profile, the decisions a smaller
  // take allows, the trace. Called without the lock.
  void after_iteration(JobRecordState& job, double host_seconds,
                       const std::vector<std::pair<double, std::size_t>>& samples,
                       SteadyClock::time_point now, TraceRecorder::Span span,
                       const std::function<void()>& between);
  // The memory counters of the trace, as an iteration of `job` ends at `now`.
  void trace_memory(const JobRecordState& job, const JobMemoryStats& mem,
                    const DeviceMemoryStats& device, SteadyClock::time_point now);

  const std::shared_ptr<MemoryManager> memory_;
  const std::shared_ptr<TraceRecorder> trace_;
  const int device_;
  const Policy& policy_;
  const TurnParts parts_;
  const SteadyClock::time_point epoch_;
  const std::chrono::microseconds turn_spin_;  // 0: off
  const bool many_cpus_;                       // the process may run on more than one CPU
  const bool memory_reported_;

  mutable std::mutex mu_;  // guards everything below and every JobRecordState's mutable part
  sched::DecisionCore core_;
  std::unordered_map<JobId, std::shared_ptr<JobRecordState>> jobs_;  // present ones
  // Every job present, and the last kFinishedJobsKept that left, for statistics: a process that
  // runs jobs for weeks must not grow without bound (the soak test saw it).
  std::vector<std::shared_ptr<JobRecordState>> history_;
  static constexpr std::size_t kFinishedJobsKept = 256;
  std::optional<SteadyClock::time_point> recheck_at_;
  std::uint64_t arrivals_ = 0;
};

}  // namespace salus
