// The mechanism around a policy on one device: jobs block in begin_iteration on their own
// condition variable until the decision core starts them; end_iteration decides at once and wakes
// exactly the jobs that start (no polling). Lanes are streams owned here; jobs in one lane share
// its stream, so the next job's work is ordered behind the previous one's on the GPU while its
// host thread is already enqueueing.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <thread>
#include <vector>

#include "cuda/process_fork.hpp"
#include "iteration_sched/decision.hpp"
#include "iteration_sched/iteration_clock.hpp"
#include "iteration_sched/lane_streams.hpp"
#include "iteration_sched/memory_waits.hpp"
#include "iteration_sched/runtime_parts.hpp"
#include "iteration_sched/stream_bindings.hpp"
#include "iteration_sched/trace.hpp"
#include "iteration_sched/turn_source.hpp"
#include "salus/runtime.hpp"

namespace salus {

using SteadyClock = std::chrono::steady_clock;

// What the profiler has learned of a job; starts from the spec's hints.
struct JobProfile {
  // What JobStats shows of it (salus/stats_fields.h).
#define SALUS_STATS_MEMBER(type, name, what) type name = 0;
  SALUS_JOB_PROFILE_FIELDS(SALUS_STATS_MEMBER)
  MemoryCurve curve;
  bool measured = false;  // at least one iteration was timed on the GPU
  bool memory_known = false;  // hinted, or an iteration has ended (JobView::memory_known)
  // The ephemeral peaks of the last iterations (ephemeral_peak_bytes is the largest).
  std::array<std::size_t, 4> recent_peaks{};
  std::uint64_t iterations_profiled = 0;

  // Records one iteration's ephemeral peak. Peaks vary between iterations (the first makes the
  // optimizer's state; batches differ): plans count the largest of the last few, so that lanes
  // placed side by side by one lucky iteration do not outgrow the device in the next.
  void note_peak(std::size_t peak) {
    recent_peaks[iterations_profiled++ % recent_peaks.size()] = peak;
    ephemeral_peak_bytes = *std::max_element(recent_peaks.begin(), recent_peaks.end());
  }
};

// One job as its device's scheduler keeps it. Everything mutable is guarded by the scheduler's
// mutex.
struct JobRecordState {
  JobRecordState(JobId id, JobSpec spec, std::uint64_t arrival);

  const JobId id;
  const JobSpec spec;
  const std::uint64_t arrival;
  std::condition_variable wakeup;  // its own: a start wakes exactly the job that starts
  // Moves at every wake-up of this job (DeviceScheduler::wake, finish): a waiter that spins for
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
  // GPU time measured with events (settle_timings) and not yet handed to the gate's keeper
  // (take_gpu_time).
  GpuTime unreported_gpu;
  // Its process measures its GPU time and reports it (report_gpu_time): its host time no longer
  // counts, whatever the runtime's host_compute says.
  bool gpu_time_reported = false;
  JobProfile profile;
};

// Lock rule: every public method takes mu_ itself, and none calls another public one. With mu_
// held it calls only leaves, which take a lock of their own (or none) and call nothing back: its
// parts (IterationClock, StreamBindings, MemoryWaits, LaneStreams, which makes a lane's stream
// under it), the decision core, the harvester's prefetch queue and a job's on_wake. Everything else below it
// (allocations, frees, statistics, timing events, the gate, a memory wait) is called with mu_
// released.
class DeviceScheduler {
 public:
  // `host_compute`: the runtime's RuntimeOptions::host_compute, which may change while it runs;
  // `allocation_wait_limit`: RuntimeOptions::allocation_wait_limit.
  DeviceScheduler(std::shared_ptr<DeviceBackend> backend, std::shared_ptr<MemoryManager> memory,
                  std::shared_ptr<TraceRecorder> trace, int device, std::unique_ptr<Policy> policy,
                  std::shared_ptr<const std::atomic<bool>> host_compute,
                  std::chrono::milliseconds allocation_wait_limit,
                  std::chrono::microseconds turn_spin = {}, const RuntimeParts& parts = {});
  ~DeviceScheduler();
  DeviceScheduler(const DeviceScheduler&) = delete;
  DeviceScheduler& operator=(const DeviceScheduler&) = delete;

  std::shared_ptr<JobRecordState> add(JobSpec spec);
  StreamHandle begin(JobRecordState& job);
  // As begin, but waits until `deadline` at most: nullopt when it passed first. The job then
  // keeps waiting in its place in the queue, with no thread in the wait: a later begin or
  // begin_until goes on with it, withdraw ends it.
  std::optional<StreamHandle> begin_until(JobRecordState& job, SteadyClock::time_point deadline);
  // Ends a pending wait that no thread is in: the job is idle again and queued nowhere; a turn
  // the core granted meanwhile is handed back unused. Nothing happens when the job is idle, left
  // or cancelled; InvalidArgument while a thread waits in begin or the job is inside an iteration.
  void withdraw(JobRecordState& job);
  // `between`: called once the next job is in (woken, or noted by its on_wake) and this
  // iteration's profile is whole, before the rest of its bookkeeping (statistics, the trace),
  // with no lock held: where a turn goes on elsewhere, off that bookkeeping's path (a connected
  // job's release to salusd; the turn salusd's loop sends the next process). What it throws is
  // thrown once the bookkeeping is done.
  void end(JobRecordState& job, const std::function<void()>& between = {});
  // Runs a decision the core asked to be made again later (a memory-aware plan's recheck) if
  // its time has come, for waits with no thread in them, which watch no clock. Returns when the
  // next one is due; nullopt when none is asked for.
  std::optional<SteadyClock::time_point> recheck();
  // Leaves (or cancels) the job: it stops, its waiter wakes, everything it holds is freed (or,
  // with JobSpec::blocks_outlive_job, handed to nobody until its holders free it).
  void finish(JobRecordState& job, bool cancelled);

  // On `stream` when given (a framework's own stream), else on the job's last lane stream (or the
  // device's default stream before its first iteration).
  DevicePtr allocate(JobRecordState& job, std::size_t bytes, std::optional<Lifetime> lifetime,
                     std::optional<StreamHandle> stream = std::nullopt);
  // Frees the job's block at `ptr`; `check` says what else the caller knows of it (its size and
  // device), checked where the block is freed.
  void deallocate(JobRecordState& job, DevicePtr ptr, MemoryManager::FreeCheck check = {});
  // The job whose iteration runs on `stream` now (one of this device's lane streams), else the
  // job `stream` is bound to, if any.
  [[nodiscard]] std::shared_ptr<JobRecordState> job_on(StreamHandle stream);
  // A framework's stream: its allocations are the job's until unbound or the job finishes.
  void bind_stream(StreamHandle stream, const std::shared_ptr<JobRecordState>& job);
  void unbind_stream(StreamHandle stream);
  // The stream is going: a binding of it ends (none is fine).
  void forget_stream(StreamHandle stream);
  // A job present on this device, by id; nullptr once it left or for other ids.
  [[nodiscard]] std::shared_ptr<JobRecordState> job_by_id(JobId id);
  // When the waiting `job`'s turn is expected: it is next in its lane, behind an iteration whose
  // host time is known (as the lane's iterations have lately lasted). Nullopt otherwise, and
  // under memory-aware plans, whose extras are not the lane's order.
  [[nodiscard]] std::optional<SteadyClock::time_point> expected_turn(const JobRecordState& job) const;
  // Throws JobCancelled when `id` is a job of this device that was cancelled.
  void throw_if_cancelled(JobId id) const;

  // Both first charge the GPU time of iterations whose work has finished since.
  [[nodiscard]] JobStats stats(const JobRecordState& job);
  [[nodiscard]] StreamHandle stream_of(const JobRecordState& job) const;
  [[nodiscard]] std::vector<JobStats> all_stats();
  [[nodiscard]] std::string_view policy_name() const { return policy_->name(); }
  [[nodiscard]] int device() const { return device_; }
  // Where it was made: in a forked child it is inherited and must not be used (process_fork.hpp).
  [[nodiscard]] const process::Birth& birth() const { return birth_; }
  // Where its jobs' turns come from (turn_source.hpp): its own, or salusd's gate in front of them
  // (RuntimeParts::gate).
  [[nodiscard]] TurnSource& turns() const { return *turns_; }
  // The job is about to wait for the gate's turn: as while it waits for this scheduler's, a safe
  // point at which its pages may move (to make room for another process).
  void before_gate_wait(JobRecordState& job);
  // The job waited that long for the gate's turn: its waiting statistics count it.
  void count_gate_wait(JobRecordState& job, SteadyClock::duration waited);
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
  [[nodiscard]] double seconds_since_start(SteadyClock::time_point t) const;
  // stats without settling first: takes mu_, then asks the memory manager without it.
  [[nodiscard]] JobStats read_stats(const JobRecordState& job);
  [[nodiscard]] JobView view_of(const JobRecordState& job) const;
  // Throws OutOfMemory when the spec's hints exceed what the device can ever give one job.
  void refuse_if_never_fits(const JobSpec& spec) const;
  void check_usable(const JobRecordState& job, const char* what) const;  // with mu_ held
  // With mu_ held: check_usable, and the job must be inside an iteration.
  void check_running(const JobRecordState& job, const char* what) const;
  void rethrow_if_finished(const JobRecordState& job) const;             // takes mu_
  // Live block bytes of `job` on this device (0 once it is gone). Takes no scheduler lock.
  [[nodiscard]] std::size_t bytes_on_device(JobId job) const;
  // Takes mu_: true when the job ended and its blocks outlive it (JobSpec::blocks_outlive_job),
  // so that their holders free them; false while the job may free its own; throws as
  // check_usable when it ended otherwise. One decision under one lock: no end slips between.
  [[nodiscard]] bool holder_frees(const JobRecordState& job) const;
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
  std::vector<std::shared_ptr<JobRecordState>> hand_back_turn(JobRecordState& job);
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
  std::vector<std::shared_ptr<JobRecordState>> run_decisions();
  static void wake(const std::vector<std::shared_ptr<JobRecordState>>& jobs);
  // One job's wake-up: its signal moves, its condition variable and its on_wake are told.
  static void wake_one(JobRecordState& job, bool all = false);
  // With mu_ held: starts bringing home the pages of the job that takes `lane`'s next turn.
  void prefetch_next(std::optional<int> lane);
  // What it learns of jobs (profile.cpp). Charges the GPU time of the iterations whose work
  // the clock found finished (polled without mu_, then charged under it).
  void settle_timings();
  // With mu_ held: adds `iterations` iterations' GPU time to the job's attained time and
  // profile.
  void charge_gpu_time(JobRecordState& job, double seconds, std::uint32_t iterations = 1);
  // With mu_ held, as the job's iteration ends: its timer waits in the clock to be read when
  // `timed` (its end event was recorded), else goes back to the pool.
  void hand_off_timer(JobRecordState& job, bool timed);
  // An allocation the device refuses while other iterations run waits for them (allocate_or_wait.cpp;
  // when waiting helps: memory_waits.hpp).
  DevicePtr allocate_or_wait(JobRecordState& job, const AllocationRequest& request);
  // With mu_ held (by `lock`, released meanwhile): false when waiting cannot help; else waits a
  // while (an iteration ending, or a short time for frees in the middle of others' iterations).
  bool wait_for_memory(JobRecordState& job, std::unique_lock<std::mutex>& lock,
                       SteadyClock::time_point began);
  class StartHold;
  // end()'s bookkeeping once the next job is in: promotion, the profile, the decisions a smaller
  // take allows, the trace. Called without the lock.
  void after_iteration(JobRecordState& job, double host_seconds,
                       const std::vector<std::pair<double, std::size_t>>& samples,
                       SteadyClock::time_point now, TraceRecorder::Span span,
                       const std::function<void()>& between);
  // The memory counters of the trace, as an iteration of `job` ends at `now`.
  void trace_memory(const JobRecordState& job, const JobMemoryStats& mem,
                    const DeviceMemoryStats& device, SteadyClock::time_point now);
  void finish_profile(JobRecordState& job, double host_seconds,
                      const std::vector<std::pair<double, std::size_t>>& samples,
                      std::size_t persistent_bytes);

  std::shared_ptr<DeviceBackend> backend_;
  std::shared_ptr<MemoryManager> memory_;
  std::shared_ptr<TraceRecorder> trace_;
  const int device_;
  const std::unique_ptr<Policy> policy_;
  const SteadyClock::time_point epoch_;
  const std::chrono::milliseconds allocation_wait_limit_;
  const std::chrono::microseconds turn_spin_;  // 0: off
  const bool many_cpus_;                       // the process may run on more than one CPU
  const process::Birth birth_ = process::birth_now();
  const std::unique_ptr<TurnSource> turns_;
  const bool memory_reported_;  // RuntimeParts::memory_profiles is reported
  IterationClock clock_;     // its own lock (a leaf): timers, pending timings, host compute
  StreamBindings streams_;   // its own lock (a leaf): whose stream an allocation is on
  MemoryWaits waits_;        // its own lock (a leaf): allocations waiting for memory, holds
  LaneStreams lanes_;        // its own lock (a leaf): the lanes' streams and slots

  mutable std::mutex mu_;  // guards everything below and every JobRecordState's mutable part
  sched::DecisionCore core_;
  std::unordered_map<JobId, std::shared_ptr<JobRecordState>> jobs_;  // present ones
  // Every job present, and the last kFinishedJobsKept that left, for statistics: a process that
  // runs jobs for weeks must not grow without bound (the soak test saw it).
  std::vector<std::shared_ptr<JobRecordState>> history_;
  static constexpr std::size_t kFinishedJobsKept = 256;
  // With mu_ held: drops the oldest finished jobs from history_ once twice the kept number have
  // gathered (amortized: one pass per kFinishedJobsKept jobs).
  void forget_old_jobs();
  std::optional<SteadyClock::time_point> recheck_at_;
  std::uint64_t arrivals_ = 0;
};

}  // namespace salus
