#include "salus/runtime.hpp"

#include <fmt/format.h>
#include <pthread.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <new>
#include <utility>

#include "cuda/process_fork.hpp"
#include "iteration_sched/attribution.hpp"
#include "iteration_sched/default_runtime.hpp"
#include "iteration_sched/device_scheduler.hpp"
#include "iteration_sched/runtime_access.hpp"
#include "iteration_sched/trace.hpp"
#include "log/log.hpp"
#include "salus/cuda.hpp"

namespace salus {

const char* to_string(JobState state) noexcept {
  switch (state) {
    case JobState::idle:
      return "idle";
    case JobState::waiting:
      return "waiting";
    case JobState::running:
      return "running";
    case JobState::left:
      return "left";
    case JobState::cancelled:
      return "cancelled";
  }
  return "unknown";
}

JobCancelled::JobCancelled(const std::string& job_name)
    : Error(Errc::cancelled, fmt::format("job '{}' was cancelled", job_name)) {}

struct Runtime::Impl {
  Impl(std::shared_ptr<DeviceBackend> device_backend, RuntimeOptions options,
       RuntimeParts parts = {})
      : gate(parts.gate),
        backend(std::move(device_backend)),
        memory(std::make_shared<MemoryManager>(backend, options.memory)),
        trace(std::make_shared<TraceRecorder>()),
        policy(options.policy),
        site(make_site_choice(options.host_compute)) {
    // Validate the name once, with the registry's message listing the known policies.
    (void)options.policies.make(policy);
    // Page moves join the timeline. The manager is shared and may outlive the recorder, so it
    // holds the recorder weakly.
    memory->set_move_observer(
        [recorder = std::weak_ptr<TraceRecorder>(trace)](const MoveRecord& m) {
          auto trace_now = recorder.lock();
          if (!trace_now) return;
          const double end_us = trace_now->micros(m.finished);
          trace_now->move(
              {fmt::format("{} {} -> {}", to_string(m.reason), to_string(m.from), to_string(m.to)),
               m.device, end_us - m.seconds * 1e6, end_us, m.pages, m.bytes});
        });
    for (int d = 0; d < memory->device_count(); ++d) {
      schedulers.push_back(std::make_shared<DeviceScheduler>(
          backend, memory, trace, d, options.policies.make(policy), site,
          options.allocation_wait_limit, options.turn_spin, parts));
    }
  }

  // Throws NotSupported in a forked child: the runtime is the parent's (see process_fork.hpp).
  void check_process() const { process::check_not_inherited(birth, "this salus runtime"); }

  // The present job `id`; throws UnknownJob, or InvalidArgument when it runs on another device
  // than `device` (-1: any).
  std::shared_ptr<JobRecordState> job(JobId id, int device = -1) const {
    // The device named first: that is where the job is, unless the caller is wrong.
    if (device >= 0 && device < static_cast<int>(schedulers.size())) {
      if (auto found = schedulers[static_cast<std::size_t>(device)]->queue().job_by_id(id)) return found;
    }
    for (const auto& s : schedulers) {
      auto found = s->queue().job_by_id(id);
      if (!found) continue;
      if (device >= 0 && s->device() != device) {
        throw InvalidArgument(fmt::format("job '{}' (id {}) runs on device {}, not device {}",
                                          found->spec.name, id.value, s->device(), device));
      }
      return found;
    }
    for (const auto& s : schedulers) s->queue().throw_if_cancelled(id);  // a clearer error than unknown
    throw UnknownJob(id);
  }

  // The memory manager checks what the caller knows of the block where it frees it (and the
  // job's memory curve sees the free there: memory/curves.hpp).
  void deallocate(DevicePtr ptr, const MemoryManager::FreeCheck& check) const {
    check_process();
    (void)memory->deallocate(ptr, check);
  }

  DeviceScheduler& scheduler(int device) const {
    if (device < 0 || device >= static_cast<int>(schedulers.size())) {
      throw InvalidArgument(fmt::format("device {} does not exist (the runtime has {} devices)",
                                        device, schedulers.size()));
    }
    return *schedulers[static_cast<std::size_t>(device)];
  }

  // First, so that it is destroyed last: the schedulers' jobs and the backend may still use it.
  std::shared_ptr<TurnGate> gate;
  std::shared_ptr<DeviceBackend> backend;
  std::shared_ptr<MemoryManager> memory;
  std::shared_ptr<TraceRecorder> trace;
  std::string policy;
  // Where iterations compute (RuntimeOptions::host_compute): read by every device scheduler,
  // chosen by set_host_compute.
  std::shared_ptr<SiteChoice> site;
  std::vector<std::shared_ptr<DeviceScheduler>> schedulers;
  const process::Birth birth = process::birth_now();
  // Tells this runtime's thread-local current job from another's (an address could be reused).
  const std::uint64_t serial = next_serial.fetch_add(1, std::memory_order_relaxed);
  static inline std::atomic<std::uint64_t> next_serial{1};
};

namespace {

void forget_default_in_child() noexcept;

struct DefaultRuntime {
  DefaultRuntime() { ::pthread_atfork(nullptr, nullptr, &forget_default_in_child); }
  std::mutex mu;
  std::shared_ptr<Runtime> runtime;  // guarded by mu
};
DefaultRuntime& default_holder() {
  static DefaultRuntime holder;
  return holder;
}

// A forked child starts with no default runtime (the next use makes one, as after a shutdown).
// The parent's is leaked, never destroyed here (see ~Runtime), and the lock is made anew: a
// thread of the parent may have held it, and that thread does not exist in the child.
void forget_default_in_child() noexcept {
  DefaultRuntime& d = default_holder();
  new (&d.mu) std::mutex;
  if (d.runtime) (void)new std::shared_ptr<Runtime>(std::move(d.runtime));
}

}  // namespace

std::shared_ptr<Runtime> default_runtime_shared() {
  DefaultRuntime& d = default_holder();
  std::lock_guard lock(d.mu);
  if (!d.runtime) d.runtime = std::make_shared<Runtime>(make_default_backend(SimConfig::uniform(1)));
  return d.runtime;
}

std::shared_ptr<Runtime> make_default_runtime(std::shared_ptr<DeviceBackend> backend,
                                              RuntimeOptions options) {
  DefaultRuntime& d = default_holder();
  std::lock_guard lock(d.mu);
  if (d.runtime) throw InvalidArgument("the default runtime exists already");
  d.runtime = std::make_shared<Runtime>(std::move(backend), std::move(options));
  return d.runtime;
}

std::shared_ptr<Runtime> take_default_runtime() {
  DefaultRuntime& d = default_holder();
  std::lock_guard lock(d.mu);
  return std::exchange(d.runtime, nullptr);
}

Runtime::Runtime(std::shared_ptr<DeviceBackend> backend, RuntimeOptions options)
    : impl_(std::make_unique<Impl>(std::move(backend), std::move(options))) {}

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::shared_ptr<Runtime> RuntimeAccess::make(std::shared_ptr<DeviceBackend> backend,
                                             RuntimeOptions options, RuntimeParts parts) {
  auto impl =
      std::make_unique<Runtime::Impl>(std::move(backend), std::move(options), std::move(parts));
  return std::shared_ptr<Runtime>(new Runtime(std::move(impl)));
}

std::shared_ptr<TraceRecorder> RuntimeAccess::trace(Runtime& runtime) {
  return runtime.impl_->trace;
}

void RuntimeAccess::report_memory(Job& job, const MeasuredMemory& measured) {
  job.scheduler().queue().report_memory(*job.state_, measured);
}

void RuntimeAccess::report_gpu_time(Job& job, GpuTime gpu) {
  job.scheduler().queue().report_gpu_time(*job.state_, gpu);
}

void RuntimeAccess::on_wake(Job& job, std::function<void()> on_wake) {
  (void)job.scheduler();  // a handle moved from is refused
  job.state_->on_wake = std::move(on_wake);
}

void RuntimeAccess::end_iteration(Job& job, const std::function<void()>& between) {
  job.scheduler().turns().end(*job.state_, between);  // a gated source refuses `between`
}

std::optional<SteadyClock::time_point> RuntimeAccess::expected_turn(Job& job) {
  return job.scheduler().queue().expected_turn(*job.state_);
}

std::optional<SteadyClock::time_point> RuntimeAccess::recheck(Runtime& runtime) {
  std::optional<SteadyClock::time_point> next;
  for (const auto& s : runtime.impl_->schedulers) {
    if (const auto at = s->queue().recheck(); at && (!next || *at < *next)) next = at;
  }
  return next;
}

Runtime::~Runtime() {
  // In a forked child the runtime is the parent's: destroying it would join stream threads that
  // do not exist here, take locks their holders never release, and free the parent's memory.
  if (impl_ && process::inherited(impl_->birth)) (void)impl_.release();
}

Runtime& Runtime::default_runtime() {
  return *default_runtime_shared();
}

std::shared_ptr<Runtime> Runtime::shared_default() {
  return default_runtime_shared();
}

Runtime& Runtime::init_default_runtime(std::shared_ptr<DeviceBackend> backend,
                                       RuntimeOptions options) {
  return *make_default_runtime(std::move(backend), std::move(options));
}

Job Runtime::add_job(JobSpec spec) {
  impl_->check_process();
  auto& scheduler = impl_->scheduler(spec.device);
  auto state = scheduler.turns().add(std::move(spec));
  return Job(impl_->schedulers[static_cast<std::size_t>(scheduler.device())], std::move(state));
}

DevicePtr Runtime::allocate(std::size_t bytes, int device, StreamHandle stream, JobId job,
                            std::optional<Lifetime> lifetime) {
  impl_->check_process();
  DeviceScheduler& scheduler = impl_->scheduler(device);
  const std::shared_ptr<JobRecordState> owner =
      job != kUnattributedJob
          ? impl_->job(job, device)
          : attribution::owner_of(scheduler, impl_->serial, stream,
                                  [&](JobId id, int on) { return impl_->job(id, on); });
  if (owner) {
    // A framework's own stream is where the block is used: it lives there, so that its reuse
    // and moves wait for the work enqueued on it. No stream (0) means the job's lane.
    return scheduler.allocate(*owner, bytes, lifetime,
                              stream.value != 0 ? std::optional(stream) : std::nullopt);
  }
  return impl_->memory->allocate({.bytes = bytes,
                                  .device = device,
                                  .stream = stream,
                                  .job = kUnattributedJob,
                                  .lifetime = lifetime.value_or(Lifetime::persistent),
                                  .host_access = impl_->site->load(std::memory_order_relaxed)->host_access()});
}

void Runtime::set_host_compute(bool on) {
  impl_->site->store(on ? &ComputeSite::host() : &ComputeSite::gpu(), std::memory_order_relaxed);
}

bool Runtime::host_compute() const {
  return impl_->site->load(std::memory_order_relaxed) == &ComputeSite::host();
}

void Runtime::deallocate(DevicePtr ptr) {
  impl_->deallocate(ptr, {});
}

void Runtime::deallocate(DevicePtr ptr, std::size_t bytes, int device) {
  impl_->deallocate(ptr, {bytes == 0 ? std::nullopt : std::optional(bytes), device, std::nullopt});
}

void Runtime::deallocate(DevicePtr ptr, const MemoryManager::FreeCheck& check) {
  impl_->deallocate(ptr, check);
}

void Runtime::record_stream(DevicePtr ptr, StreamHandle stream) {
  impl_->check_process();
  impl_->memory->record_stream_use(ptr, stream);
}

void Runtime::bind_stream(int device, StreamHandle stream, JobId job) {
  impl_->check_process();
  DeviceScheduler& scheduler = impl_->scheduler(device);
  scheduler.bind_stream(stream, impl_->job(job, device));
}

void Runtime::unbind_stream(int device, StreamHandle stream) {
  impl_->check_process();
  impl_->scheduler(device).unbind_stream(stream);
}

void Runtime::retire_stream(int device, StreamHandle stream) {
  impl_->check_process();
  DeviceScheduler& scheduler = impl_->scheduler(device);
  impl_->memory->retire_stream(device, stream);  // validates before anything changes
  scheduler.forget_stream(stream);
}

void Runtime::set_current_job(JobId job) {
  impl_->check_process();
  int device = 0;
  if (job != kUnattributedJob) device = impl_->job(job)->spec.device;  // refuses a stranger
  attribution::choose({impl_->serial, job, device});
}

JobId Runtime::current_job() const {
  const ThreadJob chosen = attribution::chosen();
  return chosen.runtime == impl_->serial ? chosen.job : kUnattributedJob;
}

int Runtime::current_job_device() const {
  const ThreadJob chosen = attribution::chosen();
  return chosen.runtime == impl_->serial && chosen.job != kUnattributedJob ? chosen.device : -1;
}

Runtime::JobScope::JobScope(const Runtime& runtime, JobId job, int device)
    : previous_(attribution::chosen()) {
  attribution::choose({runtime.impl_->serial, job, device});
}

Runtime::JobScope::~JobScope() {
  attribution::choose(previous_);
}

int Runtime::device_count() const {
  return static_cast<int>(impl_->schedulers.size());
}

MemoryManager& Runtime::memory() {
  impl_->check_process();
  return *impl_->memory;
}
DeviceBackend& Runtime::backend() {
  return *impl_->backend;
}
std::string_view Runtime::policy() const {
  return impl_->policy;
}

std::vector<JobStats> Runtime::job_stats() const {
  impl_->check_process();
  std::vector<JobStats> out;
  for (const auto& scheduler : impl_->schedulers) {
    auto stats = scheduler->all_stats();
    out.insert(out.end(), stats.begin(), stats.end());
  }
  return out;
}

std::string Runtime::trace_json() const {
  impl_->check_process();
  return impl_->trace->json();
}

void Runtime::write_trace(const std::string& path) const {
  std::ofstream out(path);
  if (!out) throw InvalidArgument(fmt::format("write_trace: cannot open '{}' for writing", path));
  out << trace_json();
  if (!out) throw InvalidArgument(fmt::format("write_trace: writing '{}' failed", path));
}

Job::Job(std::shared_ptr<DeviceScheduler> scheduler, std::shared_ptr<JobRecordState> state)
    : scheduler_(std::move(scheduler)), state_(std::move(state)) {}

Job::Job(Job&&) noexcept = default;

Job& Job::operator=(Job&& other) noexcept {
  if (this != &other) {
    leave();
    scheduler_ = std::move(other.scheduler_);
    state_ = std::move(other.state_);
  }
  return *this;
}

Job::~Job() {
  leave();
}

DeviceScheduler& Job::scheduler() const {
  if (!scheduler_) throw InvalidArgument("this Job handle was moved from");
  process::check_not_inherited(scheduler_->birth(), "this job's salus runtime");
  return *scheduler_;
}

StreamHandle Job::begin_iteration() {
  return scheduler().turns().begin(*state_);
}

std::optional<StreamHandle> Job::try_begin_iteration(std::chrono::nanoseconds timeout) {
  DeviceScheduler& s = scheduler();
  if (timeout < std::chrono::nanoseconds::zero()) {
    throw InvalidArgument(
        fmt::format("try_begin_iteration: a timeout of {} ns is negative", timeout.count()));
  }
  // A deadline past the clock's range waits as long as begin_iteration does.
  const auto now = SteadyClock::now();
  if (timeout >= SteadyClock::time_point::max() - now) return begin_iteration();
  const auto deadline = now + std::chrono::duration_cast<SteadyClock::duration>(timeout);
  return s.turns().begin_until(*state_, deadline);
}

void Job::withdraw() {
  scheduler().turns().withdraw(*state_);
}

void Job::end_iteration() {
  scheduler().turns().end(*state_);
}

Job::Iteration::Iteration(Job& job) : job_(&job), stream_(job.begin_iteration()) {}

Job::Iteration::~Iteration() {
  try {
    job_->end_iteration();
  } catch (const Error&) {
    // Cancelled or left while inside: nothing remains to end.
  }
}

DevicePtr Job::allocate(std::size_t bytes, std::optional<Lifetime> lifetime) {
  return scheduler().allocate(*state_, bytes, lifetime);
}

void Job::deallocate(DevicePtr ptr) {
  scheduler().deallocate(*state_, ptr);
}

void Job::leave() {
  // In a forked child the job is the parent's (its scheduler's lock may even be held by a thread
  // that does not exist here): nothing to leave.
  if (scheduler_ && state_ && !process::inherited(scheduler_->birth())) {
    try {
      scheduler_->turns().finish(*state_, false);
    } catch (const std::exception&) {
      // Leaving must not throw (it runs in destructors); the memory is freed with the runtime.
    }
  }
}

void Job::cancel() {
  scheduler().turns().finish(*state_, true);
}

JobId Job::id() const {
  (void)scheduler();
  return state_->id;
}

const std::string& Job::name() const {
  (void)scheduler();
  return state_->spec.name;
}

StreamHandle Job::stream() const {
  return scheduler().queue().stream_of(*state_);
}
JobStats Job::stats() const {
  return scheduler().stats(*state_);
}

}  // namespace salus
