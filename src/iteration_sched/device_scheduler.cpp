#include "iteration_sched/device_scheduler.hpp"
#include "waits/cpus.hpp"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <exception>
#include <thread>

#include "iteration_sched/attribution.hpp"
#include "log/log.hpp"
#include "memory/curves.hpp"
#include "memory/safe_points.hpp"

namespace salus {

namespace {

constexpr double kHostWeight = 0.5;  // weight of the newest iteration in JobRecordState::host_seconds

// CPUs this process may run on (its affinity), at least 1.
// With harvesting, jobs are admitted against what the device can reach (its own memory, what
// peers lend, the host); where their pages live is the memory manager's business.
std::size_t budget_of(const MemoryManager& memory, int device) {
  return memory.reachable_bytes(device);
}

}  // namespace

JobRecordState::JobRecordState(JobId job, JobSpec job_spec, std::uint64_t order)
    : id(job), spec(std::move(job_spec)), arrival(order) {
  profile.iteration_seconds = spec.hints.iteration_seconds;
  profile.persistent_bytes = spec.hints.persistent_bytes;
  profile.ephemeral_peak_bytes = spec.hints.ephemeral_peak_bytes;
  profile.memory_known = spec.hints.persistent_bytes > 0 || spec.hints.ephemeral_peak_bytes > 0;
}

DeviceScheduler::DeviceScheduler(std::shared_ptr<DeviceBackend> backend,
                                 std::shared_ptr<MemoryManager> memory,
                                 std::shared_ptr<TraceRecorder> trace, int device,
                                 std::unique_ptr<Policy> policy,
                                 std::shared_ptr<const std::atomic<bool>> host_compute,
                                 std::chrono::milliseconds allocation_wait_limit,
                                 std::chrono::microseconds turn_spin, const RuntimeParts& parts)
    : backend_(std::move(backend)),
      memory_(std::move(memory)),
      trace_(std::move(trace)),
      device_(device),
      policy_(std::move(policy)),
      epoch_(trace_->epoch()),
      allocation_wait_limit_(allocation_wait_limit),
      turn_spin_(std::max(turn_spin, std::chrono::microseconds::zero())),
      many_cpus_(waits::usable_cpus() > 1),
      turns_(parts.gate
                 ? std::unique_ptr<TurnSource>(std::make_unique<GatedTurns>(parts.gate, *this))
                 : std::make_unique<LocalTurns>(*this)),
      memory_reported_(parts.memory_profiles == MemoryProfiles::reported),
      clock_(backend_, device, std::move(host_compute)),
      lanes_(backend_, device, policy_->lanes() == LanePlan::memory_aware),
      core_(*policy_, budget_of(*memory_, device)) {}

DeviceScheduler::~DeviceScheduler() {
  // Lane streams drain here (Stream's destructor). Their heaps retire first: nothing may record
  // on a destroyed stream, and their address ranges serve the next stream instead.
  for (const StreamHandle lane : lanes_.all()) {
    try {
      memory_->retire_stream(device_, lane);
    } catch (const Error& e) {
      log::error("retiring lane stream {:#x} of device {} failed: {}", lane.value, device_,
                 e.what());
    }
  }
  lanes_.clear();
}

double DeviceScheduler::seconds_since_start(SteadyClock::time_point t) const {
  return std::chrono::duration<double>(t - epoch_).count();
}

JobView DeviceScheduler::view_of(const JobRecordState& job) const {
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
  v.curve = clock_.on_host() ? nullptr : &job.profile.curve;
  v.memory_known = job.profile.memory_known;
  v.memory_resident = true;  // a job builds its weights before its first turn
  return v;
}

std::shared_ptr<JobRecordState> DeviceScheduler::add(JobSpec spec) {
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

void DeviceScheduler::refuse_if_never_fits(const JobSpec& spec) const {
  const MemoryHints& h = spec.hints;
  const std::size_t budget = budget_of(*memory_, device_);
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

void DeviceScheduler::forget_old_jobs() {
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

void DeviceScheduler::check_usable(const JobRecordState& job, const char* what) const {
  if (job.state == JobState::cancelled) throw JobCancelled(job.spec.name);
  if (job.state == JobState::left) {
    throw InvalidArgument(fmt::format("{}: job '{}' has left", what, job.spec.name));
  }
}

void DeviceScheduler::check_running(const JobRecordState& job, const char* what) const {
  check_usable(job, what);
  if (job.state != JobState::running) {
    throw InvalidArgument(fmt::format("{}: job '{}' is not inside an iteration (it is {})", what,
                                      job.spec.name, to_string(job.state)));
  }
}

std::vector<std::shared_ptr<JobRecordState>> DeviceScheduler::run_decisions() {
  std::vector<std::shared_ptr<JobRecordState>> to_wake;
  if (waits_.holding()) return to_wake;  // an allocation waits for running iterations to end
  const sched::Decision decision = core_.decide(seconds_since_start(SteadyClock::now()));
  for (const sched::Start& start : decision.starts) {
    auto it = jobs_.find(start.job);
    if (it == jobs_.end()) continue;
    JobRecordState& job = *it->second;
    job.lane = start.lane;
    job.stream = lanes_.take(job.lane, job.spec.kind);
    streams_.run(job.stream, it->second);
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

void DeviceScheduler::prefetch_next(std::optional<int> lane) {
  if (!lane) return;
  if (const auto next = core_.next_in_lane(*lane)) memory::prefetch(*memory_, *next);
}

void DeviceScheduler::wake(const std::vector<std::shared_ptr<JobRecordState>>& jobs) {
  for (const auto& job : jobs) wake_one(*job);
}

void DeviceScheduler::wake_one(JobRecordState& job, bool all) {
  job.signal.fetch_add(1, std::memory_order_release);
  // A spinning waiter is not in the wait, nor is a wait with no thread: no system call then.
  if (all) {
    job.wakeup.notify_all();
  } else {
    job.wakeup.notify_one();
  }
  if (job.on_wake) job.on_wake();
}

std::optional<SteadyClock::time_point> DeviceScheduler::recheck() {
  std::vector<std::shared_ptr<JobRecordState>> to_wake;
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

void DeviceScheduler::end(JobRecordState& job, const std::function<void()>& between) {
  settle_timings();
  std::unique_lock lock(mu_);
  check_running(job, "end_iteration");
  const StreamHandle stream = job.stream;
  const std::optional<IterationTimers::Pair> timer = job.timer;
  lock.unlock();
  // The end event goes on the stream before the decision below lets the next job of this lane
  // enqueue behind it: only this iteration's work lies between the two events.
  const bool timed = timer && clock_.stop(job.spec.name, *timer, stream);
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
  streams_.stop(job.stream);
  lanes_.release(job.lane);
  attribution::leave_iteration(job);
  core_.finish(job.id, seconds_since_start(now));
  // A reported profile is whole before the switch (its process measured the iteration): the
  // decision below plans with it. Measured here, it is finished only after (after_iteration).
  if (memory_reported_) core_.update(view_of(job));
  waits_.iteration_gone();
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

void DeviceScheduler::after_iteration(JobRecordState& job, double host_seconds,
                                      const std::vector<std::pair<double, std::size_t>>& samples,
                                      SteadyClock::time_point now, TraceRecorder::Span span,
                                      const std::function<void()>& between) {
  // Surviving ephemeral blocks (optimizer state made in the first step) become persistent.
  JobMemoryStats mem;
  try {
    memory_->promote_ephemeral(job.id);
    mem = memory_->job_stats(job.id);
  } catch (const UnknownJob&) {
    rethrow_if_finished(job);  // cancelled since it became idle above: its memory is gone
    throw;
  }
  {
    std::lock_guard lock(mu_);
    finish_profile(job, host_seconds, samples,
                   mem.by_class[static_cast<std::size_t>(Lifetime::persistent)].in_use);
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

DevicePtr DeviceScheduler::allocate(JobRecordState& job, std::size_t bytes,
                                    std::optional<Lifetime> lifetime,
                                    std::optional<StreamHandle> on_stream) {
  std::unique_lock lock(mu_);
  check_usable(job, "allocate");
  const bool inside = job.state == JobState::running;
  const Lifetime life = lifetime.value_or(inside ? Lifetime::ephemeral : Lifetime::persistent);
  // A block lives on the stream that uses it first: the one named (the block is then ordered
  // against the job's lanes too, see add_job_stream), else the job's last lane stream (or the
  // device default), which also orders its memory outside an iteration. Blocks of jobs that
  // compute on the host use no stream: they all live on the device's default stream, one heap
  // whose partly used pages serve every job, not one heap per lane.
  const bool host = clock_.on_host();
  const StreamHandle stream = on_stream.value_or(host ? StreamHandle{} : job.stream);
  lock.unlock();
  DevicePtr ptr = 0;
  try {
    ptr = allocate_or_wait(job, {.bytes = bytes,
                                 .device = device_,
                                 .stream = stream,
                                 .job = job.id,
                                 .lifetime = life,
                                 .host_access = host});
  } catch (const UnknownJob&) {
    rethrow_if_finished(job);  // cancelled by another thread meanwhile
    throw;
  }
  return ptr;
}

void DeviceScheduler::rethrow_if_finished(const JobRecordState& job) const {
  std::lock_guard lock(mu_);
  check_usable(job, "memory call");
}

void DeviceScheduler::deallocate(JobRecordState& job, DevicePtr ptr,
                                 MemoryManager::FreeCheck check) {
  if (!holder_frees(job)) {
    try {
      // The owner is checked where the block is freed, under the lock that frees it: a cancel
      // from another thread may have freed the job's blocks, and another job reused the address.
      check.job = job.id;
      (void)memory_->deallocate(ptr, check);  // the job's memory curve sees it (curves.hpp)
      return;
    } catch (const InvalidArgument&) {
      // The job may have ended meanwhile and handed the block to nobody (then it is still the
      // holder's to free, below); else a JobCancelled says more than "not this job's block".
      if (!holder_frees(job)) throw;
    }
  }
  // Its blocks outlived it and are still its holders' to free: refusing would leak them. No
  // address of such a block is reused while it is held, so `ptr` is still the holder's.
  check.job.reset();
  (void)memory_->deallocate(ptr, check);
}

bool DeviceScheduler::holder_frees(const JobRecordState& job) const {
  std::lock_guard lock(mu_);
  const bool ended = job.state == JobState::cancelled || job.state == JobState::left;
  if (ended && job.spec.blocks_outlive_job) return true;
  check_usable(job, "free");
  return false;
}

std::shared_ptr<JobRecordState> DeviceScheduler::job_by_id(JobId id) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

// Whose stream an allocation is on: the bindings answer without mu_ (stream_bindings.hpp).
std::shared_ptr<JobRecordState> DeviceScheduler::job_on(StreamHandle stream) {
  return streams_.job_on(stream);
}

void DeviceScheduler::bind_stream(StreamHandle stream, const std::shared_ptr<JobRecordState>& job) {
  // The memory manager first: it refuses a handle that is no stream of this device, and from now
  // on the job's memory is ordered against the work enqueued on the stream.
  try {
    memory_->add_job_stream(job->id, device_, stream);
  } catch (const UnknownJob&) {
    rethrow_if_finished(*job);  // cancelled meanwhile: JobCancelled says more
    throw;
  }
  std::lock_guard lock(mu_);
  check_usable(*job, "bind_stream");  // under mu_ with the binding: a finish cannot slip between
  streams_.bind(stream, job);
}

void DeviceScheduler::unbind_stream(StreamHandle stream) {
  if (!streams_.unbind(stream)) {
    throw InvalidArgument(
        fmt::format("unbind_stream: stream {:#x} of device {} is bound to no job", stream.value,
                    device_));
  }
}

void DeviceScheduler::forget_stream(StreamHandle stream) {
  (void)streams_.unbind(stream);  // none is fine
}

void DeviceScheduler::throw_if_cancelled(JobId id) const {
  std::lock_guard lock(mu_);
  for (const auto& job : history_) {
    if (job->id == id && job->state == JobState::cancelled && !job->retired) {
      throw JobCancelled(job->spec.name);
    }
  }
}

void DeviceScheduler::finish(JobRecordState& job, bool cancelled) {
  std::vector<std::shared_ptr<JobRecordState>> to_wake;
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
    streams_.forget(job.id);  // its lane stream's run too, when it was running
    if (was_running) lanes_.release(job.lane);
    job.state = cancelled ? JobState::cancelled : JobState::left;
    if (job.timer) {
      // Re-recording supersedes its pending records, so the pair can serve another job now.
      clock_.release(*job.timer);
      job.timer.reset();
    }
    attribution::leave_iteration(job);
    core_.remove(job.id);
    if (was_running) waits_.iteration_gone();
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

std::size_t DeviceScheduler::bytes_on_device(JobId job) const {
  try {
    const JobMemoryStats stats = memory_->job_stats(job);
    return stats.in_use_by_device.at(static_cast<std::size_t>(device_));
  } catch (const UnknownJob&) {
    return 0;  // released meanwhile (a cancel): it holds nothing
  }
}

JobStats DeviceScheduler::stats(const JobRecordState& job) {
  settle_timings();
  return read_stats(job);
}

JobStats DeviceScheduler::read_stats(const JobRecordState& job) {
  JobStats s;
  {
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
  s.memory = memory_->job_stats(job.id);
  return s;
}

StreamHandle DeviceScheduler::stream_of(const JobRecordState& job) const {
  std::lock_guard lock(mu_);
  return job.stream;
}

std::vector<JobStats> DeviceScheduler::all_stats() {
  settle_timings();
  std::vector<std::shared_ptr<JobRecordState>> jobs;
  {
    std::lock_guard lock(mu_);
    jobs = history_;
  }
  std::vector<JobStats> out;
  for (const auto& job : jobs) out.push_back(read_stats(*job));
  std::sort(out.begin(), out.end(),
            [](const JobStats& a, const JobStats& b) { return a.id < b.id; });
  return out;
}

}  // namespace salus
