// DeviceScheduler: what it learns of its jobs. The GPU time of their iterations, measured by the
// clock (iteration_clock.hpp) and charged once their work has finished, and their memory: the
// curve of each iteration, or what their process reports.

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "iteration_sched/device_scheduler.hpp"

namespace salus {

namespace {

constexpr double kEstimateWeight = 0.5;  // weight of the newest measurement
constexpr std::size_t kCurveSamples = 64;  // buckets of a job's memory curve

}  // namespace

void DeviceScheduler::hand_off_timer(JobRecordState& job, bool timed) {
  if (!job.timer) return;
  const auto self = jobs_.find(job.id);
  const bool present = self != jobs_.end();
  clock_.hand_off(present ? self->second : nullptr, *job.timer, timed && present);
  job.timer.reset();
}

void DeviceScheduler::settle_timings() {
  std::vector<IterationClock::Settled> settled = clock_.settle();  // polls without mu_
  if (settled.empty()) return;
  std::lock_guard lock(mu_);
  for (const auto& [job, seconds] : settled) {
    charge_gpu_time(*job, seconds);
    job->unreported_gpu.seconds += seconds;
    ++job->unreported_gpu.iterations;
  }
}

std::optional<GpuTime> DeviceScheduler::take_gpu_time(JobRecordState& job) {
  settle_timings();
  std::lock_guard lock(mu_);
  if (job.host_timed) return std::nullopt;
  return std::exchange(job.unreported_gpu, GpuTime{});
}

void DeviceScheduler::report_gpu_time(JobRecordState& job, GpuTime gpu) {
  std::lock_guard lock(mu_);
  job.gpu_time_reported = true;
  if (gpu.iterations > 0) charge_gpu_time(job, gpu.seconds, gpu.iterations);
}

void DeviceScheduler::charge_gpu_time(JobRecordState& job, double seconds,
                                      std::uint32_t iterations) {
  seconds = std::max(seconds, 0.0);
  job.attained_seconds += seconds;
  // The profile estimates one iteration: a report of several adds their mean.
  const double each = seconds / std::max<std::uint32_t>(iterations, 1);
  JobProfile& p = job.profile;
  p.iteration_seconds =
      p.measured ? (1 - kEstimateWeight) * p.iteration_seconds + kEstimateWeight * each : each;
  p.measured = true;
  // A job that left keeps its statistics but is no longer the decision core's.
  if (job.state == JobState::idle || job.state == JobState::waiting ||
      job.state == JobState::running) {
    core_.update(view_of(job));
  }
}

void DeviceScheduler::trace_memory(const JobRecordState& job, const JobMemoryStats& mem,
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

void DeviceScheduler::finish_profile(JobRecordState& job, double host_seconds,
                                     const std::vector<std::pair<double, std::size_t>>& samples,
                                     std::size_t persistent_bytes) {
  JobProfile& p = job.profile;
  if (memory_reported_) return;  // report_memory keeps it: nothing was allocated here
  p.persistent_bytes = persistent_bytes;
  p.memory_known = true;
  std::size_t peak = 0;
  for (const auto& [t, bytes] : samples) peak = std::max(peak, bytes);
  if (samples.empty()) return;  // nothing allocated through Salus this iteration
  p.note_peak(peak);
  // Resample to a fixed number of buckets, each the highest level reached within it. The
  // samples count from the curve's start (take_turn, before the iteration's timer), the host
  // time from the timer: on a busy machine the last samples can lie past the host time, and a
  // curve cut there lost the iteration's peak. It spans both.
  p.curve.duration_seconds = std::max({host_seconds, samples.back().first, 1e-9});
  p.curve.bytes.assign(kCurveSamples, 0);
  std::size_t level = 0;
  std::size_t next = 0;
  for (std::size_t b = 0; b < kCurveSamples; ++b) {
    const double bucket_end = p.curve.duration_seconds * static_cast<double>(b + 1) / kCurveSamples;
    std::size_t high = level;
    const bool last = b + 1 == kCurveSamples;  // takes whatever rounding left over
    while (next < samples.size() && (last || samples[next].first < bucket_end)) {
      level = samples[next].second;
      high = std::max(high, level);
      ++next;
    }
    p.curve.bytes[b] = high;
  }
}

void DeviceScheduler::report_memory(JobRecordState& job, const MeasuredMemory& measured) {
  std::lock_guard lock(mu_);
  JobProfile& p = job.profile;
  p.persistent_bytes = measured.persistent_bytes;
  p.memory_known = true;
  p.note_peak(measured.ephemeral_peak_bytes);
  p.curve = measured.curve;
  // As measured here: the last iteration's shape beside the largest recent peak; with no shape
  // (a process that sent none), flat at the peak.
  if (p.curve.bytes.empty()) p.curve.bytes.assign(kCurveSamples, p.ephemeral_peak_bytes);
  if (p.curve.duration_seconds <= 0.0) p.curve.duration_seconds = 1e-9;
  if (job.state == JobState::idle) core_.update(view_of(job));
}

std::optional<MeasuredMemory> DeviceScheduler::measured_memory(const JobRecordState& job) const {
  std::lock_guard lock(mu_);
  const JobProfile& p = job.profile;
  // An iteration that allocated nothing ephemeral (one that only built the model, say) says
  // nothing of the job's activations: a keeper that took its peak for 0 would run it beside
  // others that its next iteration's activations do not fit. Until one did (or a hint says),
  // nothing is known.
  if (!p.memory_known || (p.iterations_profiled == 0 && p.ephemeral_peak_bytes == 0)) {
    return std::nullopt;
  }
  return MeasuredMemory{job.profile.persistent_bytes, job.profile.ephemeral_peak_bytes,
                        job.profile.curve};
}

}  // namespace salus
