#include "salus/runtime.hpp"

#include <fmt/format.h>

#include <fstream>
#include <mutex>

#include "iteration_sched/device_scheduler.hpp"
#include "iteration_sched/trace.hpp"
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
  Impl(std::shared_ptr<DeviceBackend> device_backend, RuntimeOptions options)
      : backend(std::move(device_backend)),
        memory(std::make_shared<MemoryManager>(backend, options.memory)),
        trace(std::make_shared<TraceRecorder>()),
        policy(options.policy) {
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
      schedulers.push_back(std::make_shared<DeviceScheduler>(backend, memory, trace, d,
                                                             options.policies.make(policy)));
    }
  }

  DeviceScheduler& scheduler(int device) const {
    if (device < 0 || device >= static_cast<int>(schedulers.size())) {
      throw InvalidArgument(fmt::format("device {} does not exist (the runtime has {} devices)",
                                        device, schedulers.size()));
    }
    return *schedulers[static_cast<std::size_t>(device)];
  }

  std::shared_ptr<DeviceBackend> backend;
  std::shared_ptr<MemoryManager> memory;
  std::shared_ptr<TraceRecorder> trace;
  std::string policy;
  std::vector<std::shared_ptr<DeviceScheduler>> schedulers;
};

Runtime::Runtime(std::shared_ptr<DeviceBackend> backend, RuntimeOptions options)
    : impl_(std::make_unique<Impl>(std::move(backend), std::move(options))) {}

Runtime::~Runtime() = default;

Runtime& Runtime::default_runtime() {
  // The one explicit default runtime of the process.
  static Runtime runtime(make_default_backend(SimConfig::uniform(1)));
  return runtime;
}

Job Runtime::add_job(JobSpec spec) {
  auto& scheduler = impl_->scheduler(spec.device);
  auto state = scheduler.add(std::move(spec));
  return Job(impl_->schedulers[static_cast<std::size_t>(scheduler.device())], std::move(state));
}

DevicePtr Runtime::allocate(std::size_t bytes, int device, StreamHandle stream) {
  DeviceScheduler& scheduler = impl_->scheduler(device);
  if (auto job = scheduler.job_on(stream)) return scheduler.allocate(*job, bytes, std::nullopt);
  if (JobRecordState* job = current_thread_job(); job && job->spec.device == device) {
    // A framework's own stream is where the block is used: it lives there, so that its reuse
    // and moves wait for the work enqueued on it. No stream (0) means the job's lane.
    return scheduler.allocate(*job, bytes, std::nullopt,
                              stream.value != 0 ? std::optional(stream) : std::nullopt);
  }
  return impl_->memory->allocate({bytes, device, stream, kUnattributedJob, Lifetime::persistent});
}

void Runtime::deallocate(DevicePtr ptr) {
  // A job's block goes back through its scheduler, so the job's memory curve sees the free.
  if (const auto block = impl_->memory->find(ptr)) {
    DeviceScheduler& scheduler = impl_->scheduler(block->device);
    if (auto job = scheduler.job_by_id(block->job)) {
      scheduler.deallocate(*job, ptr);
      return;
    }
  }
  impl_->memory->deallocate(ptr);
}

MemoryManager& Runtime::memory() {
  return *impl_->memory;
}
DeviceBackend& Runtime::backend() {
  return *impl_->backend;
}
std::string_view Runtime::policy() const {
  return impl_->policy;
}

std::vector<JobStats> Runtime::job_stats() const {
  std::vector<JobStats> out;
  for (const auto& scheduler : impl_->schedulers) {
    auto stats = scheduler->all_stats();
    out.insert(out.end(), stats.begin(), stats.end());
  }
  return out;
}

std::string Runtime::trace_json() const {
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
  return *scheduler_;
}

StreamHandle Job::begin_iteration() {
  return scheduler().begin(*state_);
}
void Job::end_iteration() {
  scheduler().end(*state_);
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
  if (scheduler_ && state_) {
    try {
      scheduler_->finish(*state_, false);
    } catch (const std::exception&) {
      // Leaving must not throw (it runs in destructors); the memory is freed with the runtime.
    }
  }
}

void Job::cancel() {
  scheduler().finish(*state_, true);
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
  return scheduler().stream_of(*state_);
}
JobStats Job::stats() const {
  return scheduler().stats(*state_);
}

}  // namespace salus
