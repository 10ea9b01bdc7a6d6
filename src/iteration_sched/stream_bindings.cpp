// DeviceScheduler: which job a stream's allocations belong to. A stream that runs a job's
// iteration belongs to that job; a framework's own stream belongs to the job it is bound to
// (bind_stream) until unbound or retired. The rest of the mechanism is in device_scheduler.cpp.
#include <fmt/format.h>

#include "iteration_sched/device_scheduler.hpp"

namespace salus {

std::shared_ptr<JobRecordState> DeviceScheduler::job_on(StreamHandle stream) {
  // Lanes are created streams, never the default stream: unless a framework bound that one, it
  // is nobody's, and the allocations of jobs computing on the host (all on it) skip the lock.
  if (stream.value == 0 && !default_stream_bound_.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard lock(mu_);
  auto it = running_on_stream_.find(stream.value);
  if (it == running_on_stream_.end()) {
    it = bound_streams_.find(stream.value);
    if (it == bound_streams_.end()) return nullptr;
  }
  auto job = jobs_.find(it->second);
  return job == jobs_.end() ? nullptr : job->second;
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
  check_usable(*job, "bind_stream");
  bound_streams_[stream.value] = job->id;
  if (stream.value == 0) default_stream_bound_.store(true, std::memory_order_release);
}

void DeviceScheduler::unbind_stream(StreamHandle stream) {
  std::lock_guard lock(mu_);
  if (bound_streams_.erase(stream.value) == 0) {
    throw InvalidArgument(
        fmt::format("unbind_stream: stream {:#x} of device {} is bound to no job", stream.value,
                    device_));
  }
}

void DeviceScheduler::forget_stream(StreamHandle stream) {
  std::lock_guard lock(mu_);
  bound_streams_.erase(stream.value);
}

}  // namespace salus
