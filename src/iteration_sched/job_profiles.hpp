// What a device learns of its jobs: each job's profile (job_profile.hpp: how long an iteration
// takes on the GPU, its memory and curve), the GPU time measured and not yet reported, and whether
// its process reports its own. The turn queue plans with it (a Snapshot for each decision it
// feeds), the facade shows it in statistics, and a connected job's release sends it to salusd.
//
// Lock rule: every public method takes mu_ and calls nothing outside this class, so mu_ is a leaf:
// the turn queue (LocalTurns) calls it with its own lock held. What it guards lies in each job's
// record (JobRecordState::learned), which only this class reaches.
#pragma once

#include <cstddef>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "iteration_sched/job_profile.hpp"
#include "iteration_sched/turn_gate.hpp"
#include "salus/runtime.hpp"
#include "salus/scheduler.hpp"

namespace salus {

struct JobRecordState;

// What a device has learned of one job, kept in its record and guarded by the device's
// JobProfiles: no one else may read or change it (its members are that class's alone).
class LearnedOfJob {
 public:
  explicit LearnedOfJob(const MemoryHints& hints) : profile_(hints) {}

 private:
  friend class JobProfiles;
  JobProfile profile_;
  // GPU time measured with events (charge_measured) and not yet handed to the gate's keeper
  // (take_unreported).
  GpuTime unreported_gpu_;
  // Its process measures its GPU time and reports it (charge_reported): its host time no longer
  // counts, whatever the runtime's host_compute says.
  bool gpu_time_reported_ = false;
};

class JobProfiles {
 public:
  // What the decision core plans with, copied out under the lock. JobView::curve points into it,
  // so it must live across the core's call (the core keeps a copy of its own). A caller that
  // reuses one keeps its curve's storage: a snapshot then allocates nothing.
  struct Snapshot {
    double iteration_seconds = 0.0;
    std::size_t persistent_bytes = 0;
    std::size_t ephemeral_peak_bytes = 0;
    bool memory_known = false;
    MemoryCurve curve;
  };

  // Each call below that changes a profile also copies it, as it leaves it, into `seen`: the
  // caller plans with what it changed under one lock.
  void snapshot(const JobRecordState& job, Snapshot& seen) const;
  // An iteration's GPU time, read from its timing events: it counts in the profile and waits to
  // be taken (take_unreported).
  void charge_measured(JobRecordState& job, double seconds, Snapshot& seen);
  // An iteration timed on the host: its host time counts as its GPU time, unless the job's
  // process reports its own (then nothing changes and it returns false).
  [[nodiscard]] bool charge_host_time(JobRecordState& job, double seconds, Snapshot& seen);
  // The GPU time of `gpu.iterations` iterations as the job's process measured it; from now on
  // the job's host time no longer counts (charge_host_time).
  void charge_reported(JobRecordState& job, GpuTime gpu, Snapshot& seen);
  // An iteration measured here ended: see JobProfile::note_iteration.
  void note_iteration(JobRecordState& job, double host_seconds,
                      const std::vector<std::pair<double, std::size_t>>& samples,
                      std::size_t persistent_bytes, Snapshot& seen);
  // What the job's process measured (MemoryProfiles::reported) replaces what is known.
  void note_reported(JobRecordState& job, const MeasuredMemory& measured, Snapshot& seen);

  // What is known of the job's memory; nullopt while nothing is (JobProfile::known_memory).
  [[nodiscard]] std::optional<MeasuredMemory> known_memory(const JobRecordState& job) const;
  // The GPU time measured since the previous call (charge_measured), now reported.
  [[nodiscard]] GpuTime take_unreported(JobRecordState& job);
  // The profile's fields of the job's statistics.
  void fill_stats(const JobRecordState& job, JobStats& stats) const;

 private:
  static void copy(const JobProfile& profile, Snapshot& seen);

  mutable std::mutex mu_;  // guards every JobRecordState::learned of the device
};

}  // namespace salus
