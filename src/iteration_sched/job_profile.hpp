// What a device learns of one job from its iterations: how long one takes on the GPU, what it
// holds between iterations, and how its ephemeral memory rises and falls within one (its curve).
// The policies plan with it (JobView). It starts from the job's hints.
//
// A value with no lock: its owner guards it (a job's profile is its device's JobProfiles', under
// that one's mutex: job_profiles.hpp). Nothing here calls out.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "iteration_sched/turn_gate.hpp"
#include "salus/runtime.hpp"
#include "salus/stats_fields.h"

namespace salus {

struct JobProfile {
  // Buckets of a curve measured here.
  static constexpr std::size_t kCurveSamples = 64;

  explicit JobProfile(const MemoryHints& hints = {});

  // What JobStats shows of it (salus/stats_fields.h).
#define SALUS_STATS_MEMBER(type, name, what) type name = 0;
  SALUS_JOB_PROFILE_FIELDS(SALUS_STATS_MEMBER)
#undef SALUS_STATS_MEMBER
  MemoryCurve curve;
  bool measured = false;      // at least one iteration was timed on the GPU
  bool memory_known = false;  // hinted, or an iteration has ended (JobView::memory_known)
  // The ephemeral peaks of the last iterations (ephemeral_peak_bytes is the largest).
  std::array<std::size_t, 4> recent_peaks{};
  std::uint64_t iterations_profiled = 0;

  // Records one iteration's ephemeral peak. Peaks vary between iterations (the first makes the
  // optimizer's state; batches differ): plans count the largest of the last few, so that lanes
  // placed side by side by one lucky iteration do not outgrow the device in the next.
  void note_peak(std::size_t peak);
  // `iterations` iterations took `seconds` of GPU time together: the estimate of one moves
  // towards their mean (the first measurement replaces the hint).
  void note_gpu_time(double seconds, std::uint32_t iterations = 1);
  // An iteration measured here ended: it took `host_seconds`, its ephemeral bytes went through
  // `samples` (seconds since its start, bytes), and the job holds `persistent_bytes` after it.
  void note_iteration(double host_seconds, const std::vector<std::pair<double, std::size_t>>& samples,
                      std::size_t persistent_bytes);
  // What the job's own process measured (MemoryProfiles::reported) replaces what is known.
  void note_reported(const MeasuredMemory& measured);
  // What is known of its memory, for a keeper elsewhere; nullopt while nothing is.
  [[nodiscard]] std::optional<MeasuredMemory> known_memory() const;
};

}  // namespace salus
