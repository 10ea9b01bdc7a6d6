#include "iteration_sched/local_turns.hpp"

#include <algorithm>
#include <exception>
#include <thread>

#include "iteration_sched/attribution.hpp"

namespace salus {

LocalTurns::LocalTurns(std::shared_ptr<MemoryManager> memory, std::shared_ptr<TraceRecorder> trace,
                       int device, const Policy& policy, TurnParts parts,
                       std::chrono::microseconds turn_spin, bool memory_reported)
    : trace_(trace),
      device_(device),
      parts_(parts),
      epoch_(trace->epoch()),
      memory_reported_(memory_reported),
      memory_(std::move(memory), std::move(trace), device),
      decisions_(policy, memory_.reachable_bytes(), parts, jobs_, memory_, epoch_),
      waits_(parts, decisions_, memory_, turn_spin) {}

double LocalTurns::seconds_since_start(SteadyClock::time_point t) const {
  return std::chrono::duration<double>(t - epoch_).count();
}

std::shared_ptr<JobRecordState> LocalTurns::add(JobSpec spec) {
  if (spec.name.empty()) throw InvalidArgument("add_job: a job needs a name");
  const JobId id = memory_.register_job(spec);
  const std::size_t unowned = memory_.bytes_on_device(kUnattributedJob);
  std::lock_guard lock(mu_);
  const std::shared_ptr<JobRecordState>& job = jobs_.add(id, std::move(spec));
  decisions_.set_unowned(unowned);  // its admission sees what is free now
  decisions_.add(*job);
  return job;
}

StreamHandle LocalTurns::begin(JobRecordState& job) {
  return *begin_turn(job, std::nullopt);
}

std::optional<StreamHandle> LocalTurns::begin_until(JobRecordState& job,
                                                    SteadyClock::time_point deadline) {
  return begin_turn(job, deadline);
}

std::optional<StreamHandle> LocalTurns::begin_turn(
    JobRecordState& job, std::optional<SteadyClock::time_point> deadline) {
  settle();  // the decisions below see the GPU time of iterations done so far
  std::unique_lock lock(mu_);
  return waits_.begin(job, lock, deadline);
}

void LocalTurns::withdraw(JobRecordState& job) {
  std::unique_lock lock(mu_);
  waits_.withdraw(job, lock);
}

void LocalTurns::before_gate_wait(JobRecordState& job) {
  std::unique_lock lock(mu_);
  waits_.before_gate_wait(job, lock);
}

void LocalTurns::count_gate_wait(JobRecordState& job, SteadyClock::duration waited) {
  std::lock_guard lock(mu_);
  job.count_wait(waited);
}

std::optional<SteadyClock::time_point> LocalTurns::expected_turn(const JobRecordState& job) const {
  std::lock_guard lock(mu_);
  if (job.state != JobState::waiting || job.started) return std::nullopt;
  return decisions_.expected_turn(job);
}

std::optional<SteadyClock::time_point> LocalTurns::recheck() {
  Wakes to_wake;
  std::optional<SteadyClock::time_point> next;
  {
    std::lock_guard lock(mu_);
    to_wake = decisions_.recheck_if_due();
    next = decisions_.recheck_at();
  }
  wake_all(to_wake);
  return next;
}

void LocalTurns::decide() {
  Wakes to_wake;
  {
    std::lock_guard lock(mu_);
    // Asks the memory waits again: a hold taken since starts nothing.
    to_wake = decisions_.decide();
  }
  wake_all(to_wake);
}

void LocalTurns::end(JobRecordState& job, const std::function<void()>& between) {
  settle();
  std::unique_lock lock(mu_);
  job.check_running("end_iteration");
  const StreamHandle stream = job.stream;
  const std::optional<IterationTimers::Pair> timer = job.timer;
  lock.unlock();
  // The end event goes on the stream before the decision below lets the next job of this lane
  // enqueue behind it: only this iteration's work lies between the two events.
  const bool timed = timer && parts_.clock.stop(job.spec.name, *timer, stream);
  // Its memory curve ends here: what it frees from now on is not this iteration's.
  memory::CurveSamples samples = memory_.end_curve(job.id);
  lock.lock();
  job.check_running("end_iteration");  // a cancel meanwhile released the timer
  // The switch first: decide and let the next job in; this iteration's bookkeeping comes after.
  const auto now = SteadyClock::now();
  const double host_seconds = job.stop_running(now);
  parts_.streams.stop(job.stream);
  parts_.lanes.release(job.lane);
  attribution::leave_iteration(job);
  decisions_.finished(job.id, now);
  // A reported profile is whole before the switch (its process measured the iteration): the
  // decision below plans with it. Measured here, it is finished only after (after_iteration).
  if (memory_reported_) decisions_.show(job);
  parts_.waits.iteration_gone();
  const auto to_wake = decisions_.decide();
  hand_off_timer(job, timed);
  if (job.host_timed) decisions_.charge_host_time(job, host_seconds);
  TraceRecorder::Span span{
      job.spec.name,
      device_,
      std::max(job.lane, 0),
      seconds_since_start(job.iteration_started) * 1e6,
      seconds_since_start(now) * 1e6,
      job.iterations,
      seconds_since_start(std::min(job.wait_started, job.iteration_started)) * 1e6};
  // Whether a woken job has a thread in its wait (a wait with no thread is told by on_wake).
  const bool thread_woken =
      std::any_of(to_wake.begin(), to_wake.end(), [](const auto& j) { return j->waiter; });
  lock.unlock();
  wake_all(to_wake);
  // The woken job is the latency-critical path; on a busy or single core let it run before this
  // thread's bookkeeping below.
  if (thread_woken) std::this_thread::yield();
  after_iteration(job, host_seconds, samples, now, std::move(span), between);
}

void LocalTurns::after_iteration(JobRecordState& job, double host_seconds,
                                 const std::vector<std::pair<double, std::size_t>>& samples,
                                 SteadyClock::time_point now, TraceRecorder::Span span,
                                 const std::function<void()>& between) {
  const std::optional<JobMemoryStats> mem = memory_.promote_ephemeral(job.id);
  std::unique_lock lock(mu_, std::defer_lock);
  if (!mem) throw_job_gone(job, "memory call", lock);  // cancelled since it became idle above
  lock.lock();
  // A reported profile is its process's (report_memory): nothing was allocated here.
  if (!memory_reported_) {
    decisions_.note_iteration(job, host_seconds, samples,
                              mem->by_class[static_cast<std::size_t>(Lifetime::persistent)].in_use);
  } else if (job.state == JobState::idle) {
    decisions_.show(job);
  }
  lock.unlock();
  // The profile is whole: what goes with the turn elsewhere (a connected job's release) goes now,
  // ahead of the statistics and the trace below. Its failure is thrown once they are done.
  std::exception_ptr failed;
  if (between) {
    try {
      between();
    } catch (...) {
      failed = std::current_exception();
    }
  }
  const DeviceMemoryStats device = memory_.device_stats();
  const std::size_t unowned = memory_.bytes_on_device(kUnattributedJob);
  lock.lock();
  // Profiles count block bytes; the device holds whole pages. What that cost at the device's
  // peak is left free by admission and beside the extras' predicted curves.
  decisions_.set_headroom(device.peak_reserved > device.peak_allocated
                              ? device.peak_reserved - device.peak_allocated
                              : 0);
  decisions_.set_unowned(unowned);
  const auto admitted_now = decisions_.decide();  // a smaller take may have let a pending job in
  lock.unlock();
  wake_all(admitted_now);

  trace_->span(std::move(span));
  memory_.trace_counters(job.spec.name, *mem, device, seconds_since_start(now) * 1e6);
  if (failed) std::rethrow_exception(failed);
}

void LocalTurns::finish(JobRecordState& job, bool cancelled) {
  Wakes to_wake;
  // A job whose blocks outlive it leaves them to nobody: the decisions made as it goes must
  // already count them as taken (they are exact again once they are orphaned, below).
  const bool orphan = job.spec.blocks_outlive_job;
  const std::size_t leaving = orphan ? memory_.bytes_on_device(job.id) : 0;
  const std::size_t unowned = memory_.bytes_on_device(kUnattributedJob);
  {
    std::unique_lock lock(mu_);
    if (job.state == JobState::cancelled && !cancelled) job.retired = true;
    if (job.ended()) return;
    // A turn granted to a waiting job holds the lane's stream as an iteration does.
    const bool was_running = job.holds_lane();
    parts_.streams.forget(job.id);  // its lane stream's run too, when it was running
    if (was_running) parts_.lanes.release(job.lane);
    job.state = cancelled ? JobState::cancelled : JobState::left;
    if (job.timer) {
      // Re-recording supersedes its pending records, so the pair can serve another job now.
      parts_.clock.release(*job.timer);
      job.timer.reset();
    }
    attribution::leave_iteration(job);
    decisions_.remove(job.id);
    if (was_running) parts_.waits.iteration_gone();
    jobs_.remove(job.id);
    job.wake(true);
    decisions_.set_unowned(unowned + leaving);
    to_wake = decisions_.decide();  // its lane share is free: others may start or be admitted
  }
  wake_all(to_wake);
  // Its memory may still be in use by work it enqueued. The frees are stream-ordered: nothing
  // reuses, moves or unmaps the memory before the work enqueued so far on every stream the job
  // used has finished (add_job_stream), and nobody waits for that here.
  memory_.release(job.id, orphan);  // orphaned: its holders free its blocks when they are done
  if (!orphan) return;
  const std::size_t now_unowned = memory_.bytes_on_device(kUnattributedJob);
  std::unique_lock lock(mu_);
  decisions_.set_unowned(now_unowned);
  const auto admitted_now = decisions_.decide();
  lock.unlock();
  wake_all(admitted_now);
}

// --- its jobs, for the facade ----------------------------------------------------------------

std::shared_ptr<JobRecordState> LocalTurns::job_by_id(JobId id) const {
  std::lock_guard lock(mu_);
  return jobs_.find(id);
}

void LocalTurns::throw_if_cancelled(JobId id) const {
  std::lock_guard lock(mu_);
  if (const JobRecordState* job = jobs_.cancelled(id)) throw JobCancelled(job->spec.name);
}

std::vector<std::shared_ptr<JobRecordState>> LocalTurns::history() const {
  std::lock_guard lock(mu_);
  return jobs_.history();
}

void LocalTurns::check_usable(const JobRecordState& job, const char* what) const {
  std::lock_guard lock(mu_);
  job.check_usable(what);
}

Placement LocalTurns::placement(const JobRecordState& job) const {
  std::lock_guard lock(mu_);
  job.check_usable("allocate");
  return {.running = job.state == JobState::running, .stream = job.stream};
}

bool LocalTurns::holder_frees(const JobRecordState& job) const {
  std::lock_guard lock(mu_);
  if (job.ended() && job.spec.blocks_outlive_job) return true;
  job.check_usable("free");
  return false;
}

void LocalTurns::bind_stream(StreamHandle stream, const std::shared_ptr<JobRecordState>& job) {
  std::lock_guard lock(mu_);
  job->check_usable("bind_stream");
  parts_.streams.bind(stream, job);
}

int LocalTurns::others_running(const JobRecordState& job, bool& running) const {
  std::lock_guard lock(mu_);
  job.check_usable("allocate");  // cancelled meanwhile: that says more
  running = job.state == JobState::running;
  // One that this thread began cannot end while this thread waits (a program that drives two
  // jobs from one thread, their iterations overlapping; found by fuzz_c_api, whose wait never
  // ended).
  return jobs_.others_running(job, std::this_thread::get_id());
}

StreamHandle LocalTurns::stream_of(const JobRecordState& job) const {
  std::lock_guard lock(mu_);
  return job.stream;
}

void LocalTurns::fill_stats(const JobRecordState& job, JobStats& s) const {
  std::lock_guard lock(mu_);
  s.id = job.id;
  s.name = job.spec.name;
  s.kind = job.spec.kind;
  s.device = device_;
  s.lane = job.lane;
  s.state = job.state;
#define SALUS_STATS_COPY(type, name, what) s.name = job.name;
  SALUS_JOB_TURN_STATS_FIELDS(SALUS_STATS_COPY)
#undef SALUS_STATS_COPY
}

// --- what it learns of its jobs --------------------------------------------------------------
// The GPU time of their iterations, measured by the clock (iteration_clock.hpp) and charged once
// their work has finished, and their memory: the curve of each iteration, or what their process
// reports. The profiles are JobProfiles'; the decisions charge them, with the attained time.

void LocalTurns::hand_off_timer(JobRecordState& job, bool timed) {
  if (!job.timer) return;
  std::shared_ptr<JobRecordState> self = jobs_.find(job.id);
  const bool present = self != nullptr;
  parts_.clock.hand_off(std::move(self), *job.timer, timed && present);
  job.timer.reset();
}

void LocalTurns::settle_timings() {
  settle();
}

void LocalTurns::settle() {
  std::vector<IterationClock::Settled> settled = parts_.clock.settle();  // polls without mu_
  if (settled.empty()) return;
  std::lock_guard lock(mu_);
  for (const auto& [job, seconds] : settled) decisions_.charge_measured(*job, seconds);
}

std::optional<GpuTime> LocalTurns::take_gpu_time(JobRecordState& job) {
  settle();
  std::lock_guard lock(mu_);
  if (job.host_timed) return std::nullopt;
  return parts_.profiles.take_unreported(job);
}

void LocalTurns::report_gpu_time(JobRecordState& job, GpuTime gpu) {
  std::lock_guard lock(mu_);
  decisions_.charge_reported(job, gpu);
}

void LocalTurns::report_memory(JobRecordState& job, const MeasuredMemory& measured) {
  std::lock_guard lock(mu_);
  decisions_.note_reported(job, measured);
}

}  // namespace salus
