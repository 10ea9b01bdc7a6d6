#include "iteration_sched/job_profile.hpp"

#include <algorithm>

namespace salus {

namespace {

constexpr double kEstimateWeight = 0.5;  // weight of the newest measurement

}  // namespace

JobProfile::JobProfile(const MemoryHints& hints) {
  iteration_seconds = hints.iteration_seconds;
  persistent_bytes = hints.persistent_bytes;
  ephemeral_peak_bytes = hints.ephemeral_peak_bytes;
  memory_known = hints.persistent_bytes > 0 || hints.ephemeral_peak_bytes > 0;
}

void JobProfile::note_peak(std::size_t peak) {
  recent_peaks[iterations_profiled++ % recent_peaks.size()] = peak;
  ephemeral_peak_bytes = *std::max_element(recent_peaks.begin(), recent_peaks.end());
}

void JobProfile::note_gpu_time(double seconds, std::uint32_t iterations) {
  // The profile estimates one iteration: a report of several adds their mean.
  const double each = std::max(seconds, 0.0) / std::max<std::uint32_t>(iterations, 1);
  iteration_seconds =
      measured ? (1 - kEstimateWeight) * iteration_seconds + kEstimateWeight * each : each;
  measured = true;
}

void JobProfile::note_iteration(double host_seconds,
                                const std::vector<std::pair<double, std::size_t>>& samples,
                                std::size_t persistent) {
  persistent_bytes = persistent;
  memory_known = true;
  std::size_t peak = 0;
  for (const auto& [t, bytes] : samples) peak = std::max(peak, bytes);
  if (samples.empty()) return;  // nothing allocated through Salus this iteration
  note_peak(peak);
  // Resample to a fixed number of buckets, each the highest level reached within it. The
  // samples count from the curve's start (take_turn, before the iteration's timer), the host
  // time from the timer: on a busy machine the last samples can lie past the host time, and a
  // curve cut there lost the iteration's peak. It spans both.
  curve.duration_seconds = std::max({host_seconds, samples.back().first, 1e-9});
  curve.bytes.assign(kCurveSamples, 0);
  std::size_t level = 0;
  std::size_t next = 0;
  for (std::size_t b = 0; b < kCurveSamples; ++b) {
    const double bucket_end = curve.duration_seconds * static_cast<double>(b + 1) / kCurveSamples;
    std::size_t high = level;
    const bool last = b + 1 == kCurveSamples;  // takes whatever rounding left over
    while (next < samples.size() && (last || samples[next].first < bucket_end)) {
      level = samples[next].second;
      high = std::max(high, level);
      ++next;
    }
    curve.bytes[b] = high;
  }
}

void JobProfile::note_reported(const MeasuredMemory& measured) {
  persistent_bytes = measured.persistent_bytes;
  memory_known = true;
  note_peak(measured.ephemeral_peak_bytes);
  curve = measured.curve;
  // As measured here: the last iteration's shape beside the largest recent peak; with no shape
  // (a process that sent none), flat at the peak.
  if (curve.bytes.empty()) curve.bytes.assign(kCurveSamples, ephemeral_peak_bytes);
  if (curve.duration_seconds <= 0.0) curve.duration_seconds = 1e-9;
}

std::optional<MeasuredMemory> JobProfile::known_memory() const {
  // An iteration that allocated nothing ephemeral (one that only built the model, say) says
  // nothing of the job's activations: a keeper that took its peak for 0 would run it beside
  // others that its next iteration's activations do not fit. Until one did (or a hint says),
  // nothing is known.
  if (!memory_known || (iterations_profiled == 0 && ephemeral_peak_bytes == 0)) {
    return std::nullopt;
  }
  return MeasuredMemory{persistent_bytes, ephemeral_peak_bytes, curve};
}

}  // namespace salus
