#include "iteration_sched/device_scheduler.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "log/log.hpp"

namespace salus {

DeviceScheduler::DeviceScheduler(std::shared_ptr<DeviceBackend> backend,
                                 std::shared_ptr<MemoryManager> memory,
                                 std::shared_ptr<TraceRecorder> trace, int device,
                                 std::unique_ptr<Policy> policy,
                                 std::shared_ptr<const SiteChoice> site,
                                 std::chrono::milliseconds allocation_wait_limit,
                                 std::chrono::microseconds turn_spin, const RuntimeParts& parts)
    : backend_(std::move(backend)),
      memory_(std::move(memory)),
      device_(device),
      policy_(std::move(policy)),
      allocation_wait_limit_(allocation_wait_limit),
      clock_(backend_, device, std::move(site)),
      lanes_(backend_, device, policy_->lanes() == LanePlan::memory_aware),
      local_(memory_, std::move(trace), device, *policy_,
             TurnParts{.clock = clock_,
                       .streams = streams_,
                       .waits = waits_,
                       .lanes = lanes_,
                       .profiles = profiles_},
             turn_spin, parts.memory_profiles == MemoryProfiles::reported),
      gated_(parts.gate ? std::make_unique<GatedTurns>(parts.gate, local_, profiles_) : nullptr) {}

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

DevicePtr DeviceScheduler::allocate(JobRecordState& job, std::size_t bytes,
                                    std::optional<Lifetime> lifetime,
                                    std::optional<StreamHandle> on_stream) {
  const Placement placed = local_.placement(job);
  const Lifetime life =
      lifetime.value_or(placed.running ? Lifetime::ephemeral : Lifetime::persistent);
  // A block lives on the stream that uses it first: the one named (the block is then ordered
  // against the job's lanes too, see add_job_stream), else where the site puts it (ComputeSite::
  // block_stream).
  const ComputeSite& site = clock_.site();
  const StreamHandle stream = on_stream.value_or(site.block_stream(placed.stream));
  try {
    return allocate_or_wait(job, {.bytes = bytes,
                                  .device = device_,
                                  .stream = stream,
                                  .job = job.id,
                                  .lifetime = life,
                                  .host_access = site.host_access()});
  } catch (const UnknownJob&) {
    local_.check_usable(job, "memory call");  // cancelled by another thread meanwhile
    throw;
  }
}

void DeviceScheduler::deallocate(JobRecordState& job, DevicePtr ptr,
                                 MemoryManager::FreeCheck check) {
  if (!local_.holder_frees(job)) {
    try {
      // The owner is checked where the block is freed, under the lock that frees it: a cancel
      // from another thread may have freed the job's blocks, and another job reused the address.
      check.job = job.id;
      (void)memory_->deallocate(ptr, check);  // the job's memory curve sees it (curves.hpp)
      return;
    } catch (const InvalidArgument&) {
      // The job may have ended meanwhile and handed the block to nobody (then it is still the
      // holder's to free, below); else a JobCancelled says more than "not this job's block".
      if (!local_.holder_frees(job)) throw;
    }
  }
  // Its blocks outlived it and are still its holders' to free: refusing would leak them. No
  // address of such a block is reused while it is held, so `ptr` is still the holder's.
  check.job.reset();
  (void)memory_->deallocate(ptr, check);
}

void DeviceScheduler::bind_stream(StreamHandle stream, const std::shared_ptr<JobRecordState>& job) {
  // The memory manager first: it refuses a handle that is no stream of this device, and from now
  // on the job's memory is ordered against the work enqueued on the stream.
  try {
    memory_->add_job_stream(job->id, device_, stream);
  } catch (const UnknownJob&) {
    local_.check_usable(*job, "memory call");  // cancelled meanwhile: JobCancelled says more
    throw;
  }
  local_.bind_stream(stream, job);
}

void DeviceScheduler::unbind_stream(StreamHandle stream) {
  if (!streams_.unbind(stream)) {
    throw InvalidArgument(
        fmt::format("unbind_stream: stream {:#x} of device {} is bound to no job", stream.value,
                    device_));
  }
}

JobStats DeviceScheduler::stats(const JobRecordState& job) {
  local_.settle_timings();
  return read_stats(job);
}

JobStats DeviceScheduler::read_stats(const JobRecordState& job) {
  JobStats s;
  local_.fill_stats(job, s);
  profiles_.fill_stats(job, s);
  s.memory = memory_->job_stats(job.id);
  return s;
}

std::vector<JobStats> DeviceScheduler::all_stats() {
  local_.settle_timings();
  std::vector<JobStats> out;
  for (const auto& job : local_.history()) out.push_back(read_stats(*job));
  std::sort(out.begin(), out.end(),
            [](const JobStats& a, const JobStats& b) { return a.id < b.id; });
  return out;
}

}  // namespace salus
