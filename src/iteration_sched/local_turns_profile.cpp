// LocalTurns: what it learns of its jobs. The GPU time of their iterations, measured by the
// clock (iteration_clock.hpp) and charged once their work has finished, and their memory: the
// curve of each iteration, or what their process reports.

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "iteration_sched/local_turns.hpp"

namespace salus {

void LocalTurns::hand_off_timer(JobRecordState& job, bool timed) {
  if (!job.timer) return;
  const auto self = jobs_.find(job.id);
  const bool present = self != jobs_.end();
  parts_.clock.hand_off(present ? self->second : nullptr, *job.timer, timed && present);
  job.timer.reset();
}

void LocalTurns::settle_timings() {
  std::vector<IterationClock::Settled> settled = parts_.clock.settle();  // polls without mu_
  if (settled.empty()) return;
  std::lock_guard lock(mu_);
  for (const auto& [job, seconds] : settled) {
    charge_gpu_time(*job, seconds);
    job->unreported_gpu.seconds += seconds;
    ++job->unreported_gpu.iterations;
  }
}

std::optional<GpuTime> LocalTurns::take_gpu_time(JobRecordState& job) {
  settle_timings();
  std::lock_guard lock(mu_);
  if (job.host_timed) return std::nullopt;
  return std::exchange(job.unreported_gpu, GpuTime{});
}

void LocalTurns::report_gpu_time(JobRecordState& job, GpuTime gpu) {
  std::lock_guard lock(mu_);
  job.gpu_time_reported = true;
  if (gpu.iterations > 0) charge_gpu_time(job, gpu.seconds, gpu.iterations);
}

void LocalTurns::charge_gpu_time(JobRecordState& job, double seconds, std::uint32_t iterations) {
  job.attained_seconds += std::max(seconds, 0.0);
  job.profile.note_gpu_time(seconds, iterations);
  // A job that left keeps its statistics but is no longer the decision core's.
  if (job.state == JobState::idle || job.state == JobState::waiting ||
      job.state == JobState::running) {
    core_.update(view_of(job));
  }
}

void LocalTurns::trace_memory(const JobRecordState& job, const JobMemoryStats& mem,
                                   const DeviceMemoryStats& device, SteadyClock::time_point now) {
  constexpr double kMiB = 1 << 20;
  const double at_us = seconds_since_start(now) * 1e6;
  trace_->counter({fmt::format("memory gpu{}", device_),
                   device_,
                   at_us,
                   {{"allocated_MiB", static_cast<double>(device.allocated) / kMiB},
                    {"reserved_MiB", static_cast<double>(device.reserved) / kMiB},
                    {"lent_MiB", static_cast<double>(device.lent) / kMiB},
                    {"borrowed_peer_MiB", static_cast<double>(device.borrowed_peer) / kMiB},
                    {"borrowed_host_MiB", static_cast<double>(device.borrowed_host) / kMiB}}});
  auto tier_mib = [&](Tier tier) {
    return static_cast<double>(mem.in_use_by_tier[static_cast<std::size_t>(tier)]) / kMiB;
  };
  trace_->counter({fmt::format("tiers {}", job.spec.name),
                   device_,
                   at_us,
                   {{"local_MiB", tier_mib(Tier::local)},
                    {"peer_MiB", tier_mib(Tier::peer)},
                    {"host_MiB", tier_mib(Tier::host)}}});
}

void LocalTurns::report_memory(JobRecordState& job, const MeasuredMemory& measured) {
  std::lock_guard lock(mu_);
  job.profile.note_reported(measured);
  if (job.state == JobState::idle) core_.update(view_of(job));
}

std::optional<MeasuredMemory> LocalTurns::measured_memory(const JobRecordState& job) const {
  std::lock_guard lock(mu_);
  return job.profile.known_memory();
}

}  // namespace salus
