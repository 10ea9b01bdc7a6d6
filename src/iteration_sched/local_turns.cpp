// LocalTurns: the queue's jobs, its decisions and an iteration's end. A job's wait for its turn
// is in local_turns_wait.cpp, what the queue learns of its jobs in local_turns_profile.cpp.
#include "iteration_sched/local_turns.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <thread>

#include "iteration_sched/attribution.hpp"
#include "memory/curves.hpp"
#include "memory/safe_points.hpp"
#include "waits/cpus.hpp"

namespace salus {

namespace {

constexpr double kHostWeight = 0.5;  // weight of the newest iteration in JobRecordState::host_seconds

}  // namespace

// With harvesting, jobs are admitted against what the device can reach (its own memory, what
// peers lend, the host); where their pages live is the memory manager's business.
LocalTurns::LocalTurns(std::shared_ptr<MemoryManager> memory, std::shared_ptr<TraceRecorder> trace,
                       int device, const Policy& policy, TurnParts parts,
                       std::chrono::microseconds turn_spin, bool memory_reported)
    : memory_(std::move(memory)),
      trace_(std::move(trace)),
      device_(device),
      policy_(policy),
      parts_(parts),
      epoch_(trace_->epoch()),
      turn_spin_(std::max(turn_spin, std::chrono::microseconds::zero())),
      many_cpus_(waits::usable_cpus() > 1),
      memory_reported_(memory_reported),
      core_(policy_, memory_->reachable_bytes(device)) {}

double LocalTurns::seconds_since_start(SteadyClock::time_point t) const {
  return std::chrono::duration<double>(t - epoch_).count();
}

JobView LocalTurns::view_of(const JobRecordState& job) const {
  JobView v;
  v.id = job.id;
  v.kind = job.spec.kind;
  v.priority = job.spec.priority;
  v.arrival = job.arrival;
  v.iterations_done = job.iterations;
  v.expected_iterations = job.spec.expected_iterations;
  v.iteration_seconds = job.profile.iteration_seconds;
  v.attained_seconds = job.attained_seconds;
  v.persistent_bytes = job.profile.persistent_bytes;
  v.ephemeral_peak_bytes = job.profile.ephemeral_peak_bytes;
  // A curve's time axis is the iteration's wall time alone. Jobs that compute on the host share
  // the CPU cores when they run at once, so their memory does not rise and fall on that
  // schedule: plans then count each iteration's flat peak instead.
  v.curve = parts_.clock.on_host() ? nullptr : &job.profile.curve;
  v.memory_known = job.profile.memory_known;
  v.memory_resident = true;  // a job builds its weights before its first turn
  return v;
}

std::shared_ptr<JobRecordState> LocalTurns::add(JobSpec spec) {
  if (spec.name.empty()) throw InvalidArgument("add_job: a job needs a name");
  refuse_if_never_fits(spec);
  const JobId id = memory_->register_job(spec.name, spec.limits);
  const std::size_t unowned = bytes_on_device(kUnattributedJob);
  std::lock_guard lock(mu_);
  auto job = std::make_shared<JobRecordState>(id, std::move(spec), arrivals_++);
  core_.set_unowned(unowned);  // its admission sees what is free now

  core_.add(view_of(*job));
  jobs_.emplace(id, job);
  history_.push_back(job);
  forget_old_jobs();
  return job;
}

void LocalTurns::refuse_if_never_fits(const JobSpec& spec) const {
  const MemoryHints& h = spec.hints;
  const std::size_t budget = memory_->reachable_bytes(device_);
  if (h.persistent_bytes <= budget && h.ephemeral_peak_bytes <= budget - h.persistent_bytes) {
    return;
  }
  // Its hints say it cannot run even alone: refused now, not left waiting for good.
  const bool overflow = h.ephemeral_peak_bytes > kUnlimited - h.persistent_bytes;
  const DeviceMemoryStats device = memory_->device_stats(device_);
  throw OutOfMemory({.job = kUnattributedJob,
                     .job_name = spec.name,
                     .device = device_,
                     .requested_bytes = overflow ? kUnlimited
                                                 : h.persistent_bytes + h.ephemeral_peak_bytes,
                     .device_in_use_bytes = device.allocated,
                     .device_limit_bytes = device.limit,
                     .reason = fmt::format("its hints (persistent {} bytes + ephemeral peak {} "
                                           "bytes) exceed the {} bytes device {} can ever give a "
                                           "job, so it could never be admitted",
                                           h.persistent_bytes, h.ephemeral_peak_bytes, budget,
                                           device_)});
}

void LocalTurns::forget_old_jobs() {
  const std::size_t finished = history_.size() - jobs_.size();
  if (finished <= 2 * kFinishedJobsKept) return;
  std::size_t excess = finished - kFinishedJobsKept;
  // Oldest first: history_ is in arrival order.
  std::erase_if(history_, [&](const std::shared_ptr<JobRecordState>& job) {
    // A cancelled job whose handle has not left yet still answers JobCancelled (throw_if_cancelled).
    const bool cancelled_held = job->state == JobState::cancelled && !job->retired;
    if (excess == 0 || jobs_.contains(job->id) || cancelled_held) return false;
    --excess;
    return true;
  });
}

void LocalTurns::check_usable_locked(const JobRecordState& job, const char* what) const {
  if (job.state == JobState::cancelled) throw JobCancelled(job.spec.name);
  if (job.state == JobState::left) {
    throw InvalidArgument(fmt::format("{}: job '{}' has left", what, job.spec.name));
  }
}

void LocalTurns::check_running(const JobRecordState& job, const char* what) const {
  check_usable_locked(job, what);
  if (job.state != JobState::running) {
    throw InvalidArgument(fmt::format("{}: job '{}' is not inside an iteration (it is {})", what,
                                      job.spec.name, to_string(job.state)));
  }
}

LocalTurns::Wakes LocalTurns::run_decisions() {
  Wakes to_wake;
  if (parts_.waits.holding()) return to_wake;  // an allocation waits for running iterations to end
  const sched::Decision decision = core_.decide(seconds_since_start(SteadyClock::now()));
  for (const sched::Start& start : decision.starts) {
    auto it = jobs_.find(start.job);
    if (it == jobs_.end()) continue;
    JobRecordState& job = *it->second;
    job.lane = start.lane;
    job.stream = parts_.lanes.take(job.lane, job.spec.kind);
    parts_.streams.run(job.stream, it->second);
    job.started = true;
    to_wake.push_back(it->second);
  }
  for (const sched::Start& start : decision.starts) prefetch_next(start.lane);
  if (decision.recheck_after_seconds) {
    const auto at =
        SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                 std::chrono::duration<double>(*decision.recheck_after_seconds));
    if (!recheck_at_ || at < *recheck_at_) recheck_at_ = at;
    // Some waiter must watch the clock: wake the waiting jobs so one of them waits until then.
    for (auto& [id, job] : jobs_) {
      if (job->state == JobState::waiting && !job->started) to_wake.push_back(job);
    }
  }
  return to_wake;
}

void LocalTurns::prefetch_next(std::optional<int> lane) {
  if (!lane) return;
  if (const auto next = core_.next_in_lane(*lane)) memory::prefetch(*memory_, *next);
}

void LocalTurns::wake(const Wakes& jobs) {
  for (const auto& job : jobs) wake_one(*job);
}

void LocalTurns::wake_one(JobRecordState& job, bool all) {
  job.signal.fetch_add(1, std::memory_order_release);
  // A spinning waiter is not in the wait, nor is a wait with no thread: no system call then.
  if (all) {
    job.wakeup.notify_all();
  } else {
    job.wakeup.notify_one();
  }
  if (job.on_wake) job.on_wake();
}

std::optional<SteadyClock::time_point> LocalTurns::recheck() {
  Wakes to_wake;
  std::optional<SteadyClock::time_point> next;
  {
    std::lock_guard lock(mu_);
    if (recheck_at_ && SteadyClock::now() >= *recheck_at_) {
      recheck_at_.reset();
      to_wake = run_decisions();
    }
    next = recheck_at_;
  }
  wake(to_wake);
  return next;
}

void LocalTurns::decide() {
  Wakes to_wake;
  {
    std::lock_guard lock(mu_);
    to_wake = run_decisions();  // asks the memory waits again: a hold taken since starts nothing
  }
  wake(to_wake);
}

void LocalTurns::end(JobRecordState& job, const std::function<void()>& between) {
  settle_timings();
  std::unique_lock lock(mu_);
  check_running(job, "end_iteration");
  const StreamHandle stream = job.stream;
  const std::optional<IterationTimers::Pair> timer = job.timer;
  lock.unlock();
  // The end event goes on the stream before the decision below lets the next job of this lane
  // enqueue behind it: only this iteration's work lies between the two events.
  const bool timed = timer && parts_.clock.stop(job.spec.name, *timer, stream);
  // Its memory curve ends here: what it frees from now on is not this iteration's.
  memory::CurveSamples samples = memory::end_curve(*memory_, job.id);
  lock.lock();
  check_running(job, "end_iteration");  // a cancel meanwhile released the timer
  // The switch first: decide and let the next job in; this iteration's bookkeeping comes after.
  const auto now = SteadyClock::now();
  const double host_seconds = std::chrono::duration<double>(now - job.iteration_started).count();
  job.state = JobState::idle;
  ++job.iterations;
  job.host_seconds = job.host_seconds > 0.0
                         ? (1 - kHostWeight) * job.host_seconds + kHostWeight * host_seconds
                         : host_seconds;
  parts_.streams.stop(job.stream);
  parts_.lanes.release(job.lane);
  attribution::leave_iteration(job);
  core_.finish(job.id, seconds_since_start(now));
  // A reported profile is whole before the switch (its process measured the iteration): the
  // decision below plans with it. Measured here, it is finished only after (after_iteration).
  if (memory_reported_) core_.update(view_of(job));
  parts_.waits.iteration_gone();
  const auto to_wake = run_decisions();
  hand_off_timer(job, timed);
  if (job.host_timed && !job.gpu_time_reported) charge_gpu_time(job, host_seconds);
  TraceRecorder::Span span{job.spec.name,
                           device_,
                           std::max(job.lane, 0),
                           seconds_since_start(job.iteration_started) * 1e6,
                           seconds_since_start(now) * 1e6,
                           job.iterations,
                           seconds_since_start(std::min(job.wait_started, job.iteration_started)) * 1e6};
  // Whether a woken job has a thread in its wait (a wait with no thread is told by on_wake).
  const bool thread_woken = std::any_of(to_wake.begin(), to_wake.end(),
                                        [](const auto& j) { return j->waiter; });
  lock.unlock();
  wake(to_wake);
  // The woken job is the latency-critical path; on a busy or single core let it run before this
  // thread's bookkeeping below.
  if (thread_woken) std::this_thread::yield();
  after_iteration(job, host_seconds, samples, now, std::move(span), between);
}

void LocalTurns::after_iteration(JobRecordState& job, double host_seconds,
                                 const std::vector<std::pair<double, std::size_t>>& samples,
                                 SteadyClock::time_point now, TraceRecorder::Span span,
                                 const std::function<void()>& between) {
  // Surviving ephemeral blocks (optimizer state made in the first step) become persistent.
  JobMemoryStats mem;
  try {
    memory_->promote_ephemeral(job.id);
    mem = memory_->job_stats(job.id);
  } catch (const UnknownJob&) {
    check_usable(job, "memory call");  // cancelled since it became idle above: its memory is gone
    throw;
  }
  {
    std::lock_guard lock(mu_);
    // A reported profile is its process's (report_memory): nothing was allocated here.
    if (!memory_reported_) {
      job.profile.note_iteration(
          host_seconds, samples, mem.by_class[static_cast<std::size_t>(Lifetime::persistent)].in_use);
    }
    if (job.state == JobState::idle) core_.update(view_of(job));
  }
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
  const DeviceMemoryStats device = memory_->device_stats(device_);
  const std::size_t unowned = bytes_on_device(kUnattributedJob);
  std::unique_lock lock(mu_);
  // Profiles count block bytes; the device holds whole pages. What that cost at the device's
  // peak is left free by admission and beside the extras' predicted curves.
  core_.set_headroom(device.peak_reserved > device.peak_allocated
                               ? device.peak_reserved - device.peak_allocated
                               : 0);
  core_.set_unowned(unowned);
  const auto admitted_now = run_decisions();  // a smaller take may have let a pending job in
  lock.unlock();
  wake(admitted_now);

  trace_->span(std::move(span));
  trace_memory(job, mem, device, now);
  if (failed) std::rethrow_exception(failed);
}

void LocalTurns::finish(JobRecordState& job, bool cancelled) {
  Wakes to_wake;
  // A job whose blocks outlive it leaves them to nobody: the decisions made as it goes must
  // already count them as taken (they are exact again once they are orphaned, below).
  const std::size_t leaving = job.spec.blocks_outlive_job ? bytes_on_device(job.id) : 0;
  const std::size_t unowned = bytes_on_device(kUnattributedJob);
  {
    std::unique_lock lock(mu_);
    if (job.state == JobState::cancelled && !cancelled) job.retired = true;
    if (job.state == JobState::left || job.state == JobState::cancelled) return;
    // A turn granted to a waiting job (not taken yet, or a wait that ran out of time) holds the
    // lane's stream as an iteration does.
    const bool was_running =
        job.state == JobState::running || (job.state == JobState::waiting && job.started);
    parts_.streams.forget(job.id);  // its lane stream's run too, when it was running
    if (was_running) parts_.lanes.release(job.lane);
    job.state = cancelled ? JobState::cancelled : JobState::left;
    if (job.timer) {
      // Re-recording supersedes its pending records, so the pair can serve another job now.
      parts_.clock.release(*job.timer);
      job.timer.reset();
    }
    attribution::leave_iteration(job);
    core_.remove(job.id);
    if (was_running) parts_.waits.iteration_gone();
    jobs_.erase(job.id);
    wake_one(job, true);
    core_.set_unowned(unowned + leaving);
    to_wake = run_decisions();  // its lane share is free: others may start or be admitted
  }
  wake(to_wake);
  // Its memory may still be in use by work it enqueued. The frees are stream-ordered: nothing
  // reuses, moves or unmaps the memory before the work enqueued so far on every stream the job
  // used has finished (add_job_stream), and nobody waits for that here.
  if (job.spec.blocks_outlive_job) {
    memory_->orphan_job(job.id);  // its holders free its blocks, whenever they are done
    const std::size_t now_unowned = bytes_on_device(kUnattributedJob);
    std::unique_lock lock(mu_);
    core_.set_unowned(now_unowned);
    const auto admitted_now = run_decisions();
    lock.unlock();
    wake(admitted_now);
  } else {
    memory_->release_job(job.id);
  }
}

std::size_t LocalTurns::bytes_on_device(JobId job) const {
  try {
    const JobMemoryStats stats = memory_->job_stats(job);
    return stats.in_use_by_device.at(static_cast<std::size_t>(device_));
  } catch (const UnknownJob&) {
    return 0;  // released meanwhile (a cancel): it holds nothing
  }
}

// --- its jobs, for the facade ----------------------------------------------------------------

std::shared_ptr<JobRecordState> LocalTurns::job_by_id(JobId id) const {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

void LocalTurns::throw_if_cancelled(JobId id) const {
  std::lock_guard lock(mu_);
  for (const auto& job : history_) {
    if (job->id == id && job->state == JobState::cancelled && !job->retired) {
      throw JobCancelled(job->spec.name);
    }
  }
}

std::vector<std::shared_ptr<JobRecordState>> LocalTurns::history() const {
  std::lock_guard lock(mu_);
  return history_;
}

void LocalTurns::check_usable(const JobRecordState& job, const char* what) const {
  std::lock_guard lock(mu_);
  check_usable_locked(job, what);
}

Placement LocalTurns::placement(const JobRecordState& job) const {
  std::lock_guard lock(mu_);
  check_usable_locked(job, "allocate");
  return {.running = job.state == JobState::running, .stream = job.stream};
}

bool LocalTurns::holder_frees(const JobRecordState& job) const {
  std::lock_guard lock(mu_);
  const bool ended = job.state == JobState::cancelled || job.state == JobState::left;
  if (ended && job.spec.blocks_outlive_job) return true;
  check_usable_locked(job, "free");
  return false;
}

void LocalTurns::bind_stream(StreamHandle stream, const std::shared_ptr<JobRecordState>& job) {
  std::lock_guard lock(mu_);
  check_usable_locked(*job, "bind_stream");
  parts_.streams.bind(stream, job);
}

int LocalTurns::others_running(const JobRecordState& job, bool& running) const {
  std::lock_guard lock(mu_);
  check_usable_locked(job, "allocate");  // cancelled meanwhile: that says more
  running = job.state == JobState::running;
  // One that this thread began cannot end while this thread waits (a program that drives two
  // jobs from one thread, their iterations overlapping; found by fuzz_c_api, whose wait never
  // ended).
  const auto me = std::this_thread::get_id();
  int others = 0;
  for (const auto& [id, other] : jobs_) {
    if (other.get() == &job) continue;
    const bool runs = other->state == JobState::running && other->began_by != me;
    const bool starting = other->state == JobState::waiting && other->started;  // its own thread
    if (runs || starting) ++others;
  }
  return others;
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
#define SALUS_STATS_COPY(type, name, what) s.name = job.profile.name;
  SALUS_JOB_PROFILE_FIELDS(SALUS_STATS_COPY)
#undef SALUS_STATS_COPY
  s.memory_curve = job.profile.curve;
}

}  // namespace salus
