#include "iteration_sched/turn_memory.hpp"

#include <fmt/format.h>

#include "iteration_sched/job_record.hpp"
#include "memory/safe_points.hpp"

namespace salus {

TurnMemory::TurnMemory(std::shared_ptr<MemoryManager> memory, std::shared_ptr<TraceRecorder> trace,
                       int device)
    : memory_(std::move(memory)), trace_(std::move(trace)), device_(device) {}

std::size_t TurnMemory::reachable_bytes() const {
  return memory_->reachable_bytes(device_);
}

JobId TurnMemory::register_job(const JobSpec& spec) {
  refuse_if_never_fits(spec, reachable_bytes());
  return memory_->register_job(spec.name, spec.limits);
}

void TurnMemory::refuse_if_never_fits(const JobSpec& spec, std::size_t budget) const {
  const MemoryHints& h = spec.hints;
  if (h.persistent_bytes <= budget && h.ephemeral_peak_bytes <= budget - h.persistent_bytes) {
    return;
  }
  const bool overflow = h.ephemeral_peak_bytes > kUnlimited - h.persistent_bytes;
  const DeviceMemoryStats device = device_stats();
  throw OutOfMemory(
      {.job = kUnattributedJob,
       .job_name = spec.name,
       .device = device_,
       .requested_bytes = overflow ? kUnlimited : h.persistent_bytes + h.ephemeral_peak_bytes,
       .device_in_use_bytes = device.allocated,
       .device_limit_bytes = device.limit,
       .reason = fmt::format("its hints (persistent {} bytes + ephemeral peak {} "
                             "bytes) exceed the {} bytes device {} can ever give a "
                             "job, so it could never be admitted",
                             h.persistent_bytes, h.ephemeral_peak_bytes, budget, device_)});
}

std::size_t TurnMemory::bytes_on_device(JobId job) const {
  try {
    const JobMemoryStats stats = memory_->job_stats(job);
    return stats.in_use_by_device.at(static_cast<std::size_t>(device_));
  } catch (const UnknownJob&) {
    return 0;  // released meanwhile (a cancel): it holds nothing
  }
}

void TurnMemory::release(JobId job, bool orphan) {
  if (orphan) {
    memory_->orphan_job(job);
  } else {
    memory_->release_job(job);
  }
}

bool TurnMemory::quiesce(JobId job) {
  try {
    memory::set_job_quiescent(*memory_, job);
    return true;
  } catch (const UnknownJob&) {
    return false;
  }
}

bool TurnMemory::activate(JobId job) {
  try {
    (void)memory::activate_job(*memory_, job);
    return true;
  } catch (const UnknownJob&) {
    return false;
  }
}

bool TurnMemory::begin_iteration(JobId job, StreamHandle stream) {
  try {
    // Its memory (persistent blocks made on another stream included) is used on this stream
    // from now on: frees and page moves are ordered after the work it enqueues here (a job that
    // computes on the host may still queue work on its lane).
    memory_->add_job_stream(job, device_, stream);
    (void)memory::activate_job(*memory_, job);
    memory::begin_curve(*memory_, job);
    return true;
  } catch (const UnknownJob&) {
    return false;
  }
}

memory::CurveSamples TurnMemory::end_curve(JobId job) {
  return memory::end_curve(*memory_, job);
}

std::optional<JobMemoryStats> TurnMemory::promote_ephemeral(JobId job) {
  try {
    (void)memory_->promote_ephemeral(job);
    return memory_->job_stats(job);
  } catch (const UnknownJob&) {
    return std::nullopt;
  }
}

DeviceMemoryStats TurnMemory::device_stats() const {
  return memory_->device_stats(device_);
}

void TurnMemory::prefetch(JobId job) {
  memory::prefetch(*memory_, job);
}

void TurnMemory::trace_counters(std::string_view job_name, const JobMemoryStats& job,
                                const DeviceMemoryStats& device, double at_us) {
  constexpr double kMiB = 1 << 20;
  trace_->counter({fmt::format("memory gpu{}", device_),
                   device_,
                   at_us,
                   {{"allocated_MiB", static_cast<double>(device.allocated) / kMiB},
                    {"reserved_MiB", static_cast<double>(device.reserved) / kMiB},
                    {"lent_MiB", static_cast<double>(device.lent) / kMiB},
                    {"borrowed_peer_MiB", static_cast<double>(device.borrowed_peer) / kMiB},
                    {"borrowed_host_MiB", static_cast<double>(device.borrowed_host) / kMiB}}});
  auto tier_mib = [&](Tier tier) {
    return static_cast<double>(job.in_use_by_tier[static_cast<std::size_t>(tier)]) / kMiB;
  };
  trace_->counter({fmt::format("tiers {}", job_name),
                   device_,
                   at_us,
                   {{"local_MiB", tier_mib(Tier::local)},
                    {"peer_MiB", tier_mib(Tier::peer)},
                    {"host_MiB", tier_mib(Tier::host)}}});
}

void throw_job_gone(const JobRecordState& job, const char* what,
                    std::unique_lock<std::mutex>& lock) {
  lock.lock();
  job.check_usable(what);
  throw UnknownJob(job.id);
}

}  // namespace salus
