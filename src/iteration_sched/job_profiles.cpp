#include "iteration_sched/job_profiles.hpp"

#include <algorithm>

#include "iteration_sched/job_record.hpp"

namespace salus {

void JobProfiles::copy(const JobProfile& profile, Snapshot& seen) {
  seen.iteration_seconds = profile.iteration_seconds;
  seen.persistent_bytes = profile.persistent_bytes;
  seen.ephemeral_peak_bytes = profile.ephemeral_peak_bytes;
  seen.memory_known = profile.memory_known;
  seen.curve = profile.curve;  // a copy assignment: the snapshot's storage is reused
}

void JobProfiles::snapshot(const JobRecordState& job, Snapshot& seen) const {
  std::lock_guard lock(mu_);
  copy(job.learned.profile_, seen);
}

void JobProfiles::charge_measured(JobRecordState& job, double seconds, Snapshot& seen) {
  std::lock_guard lock(mu_);
  LearnedOfJob& learned = job.learned;
  learned.profile_.note_gpu_time(seconds);
  learned.unreported_gpu_.seconds += seconds;
  ++learned.unreported_gpu_.iterations;
  copy(learned.profile_, seen);
}

bool JobProfiles::charge_host_time(JobRecordState& job, double seconds, Snapshot& seen) {
  std::lock_guard lock(mu_);
  LearnedOfJob& learned = job.learned;
  if (learned.gpu_time_reported_) return false;
  learned.profile_.note_gpu_time(seconds);
  copy(learned.profile_, seen);
  return true;
}

void JobProfiles::charge_reported(JobRecordState& job, GpuTime gpu, Snapshot& seen) {
  std::lock_guard lock(mu_);
  LearnedOfJob& learned = job.learned;
  learned.gpu_time_reported_ = true;
  if (gpu.iterations > 0) learned.profile_.note_gpu_time(gpu.seconds, gpu.iterations);
  copy(learned.profile_, seen);
}

void JobProfiles::note_iteration(JobRecordState& job, double host_seconds,
                                 const std::vector<std::pair<double, std::size_t>>& samples,
                                 std::size_t persistent_bytes, Snapshot& seen) {
  std::lock_guard lock(mu_);
  job.learned.profile_.note_iteration(host_seconds, samples, persistent_bytes);
  copy(job.learned.profile_, seen);
}

void JobProfiles::note_reported(JobRecordState& job, const MeasuredMemory& measured,
                                Snapshot& seen) {
  std::lock_guard lock(mu_);
  job.learned.profile_.note_reported(measured);
  copy(job.learned.profile_, seen);
}

std::optional<MeasuredMemory> JobProfiles::known_memory(const JobRecordState& job) const {
  std::lock_guard lock(mu_);
  return job.learned.profile_.known_memory();
}

GpuTime JobProfiles::take_unreported(JobRecordState& job) {
  std::lock_guard lock(mu_);
  return std::exchange(job.learned.unreported_gpu_, GpuTime{});
}

void JobProfiles::fill_stats(const JobRecordState& job, JobStats& s) const {
  std::lock_guard lock(mu_);
  const JobProfile& profile = job.learned.profile_;
#define SALUS_STATS_COPY(type, name, what) s.name = profile.name;
  SALUS_JOB_PROFILE_FIELDS(SALUS_STATS_COPY)
#undef SALUS_STATS_COPY
  s.memory_curve = profile.curve;
}

}  // namespace salus
