// The Zico-style start-offset search behind the "memory_aware" policy, kept apart from the policy
// classes so that it can be tested on hand-made curves.
#pragma once

#include <cstddef>
#include <optional>

#include "salus/scheduler.hpp"

namespace salus::sched {

// Overlaps shorter than this (seconds) are ignored, so that a start offset found at one decision
// still holds when the clock reaches it despite floating-point rounding of `now - started`.
inline constexpr double kOffsetTolerance = 1e-9;

// The ephemeral peak a job is accounted for: the larger of the hint and its curve's peak.
[[nodiscard]] std::size_t ephemeral_peak(const JobView& job);

// The least d >= 0 such that, for every t in [0, candidate's duration),
//   device.persistent_bytes + sum_r curve_r(elapsed_r + d + t) + sum_h held_h(d + t)
//     + candidate_curve(t) <= budget,
// where a running iteration contributes nothing after its predicted end and a device.held entry
// its bytes from its from_seconds on (the search looks past those points too). Unknown curves
// count as their flat peak over the iteration (over all time when the iteration's length is
// unknown too); an iteration that has overrun its prediction is assumed to hold its peak until it
// ends. nullopt when no such d exists before the last running iteration is predicted to end (the
// caller then waits for an iteration to end).
[[nodiscard]] std::optional<double> least_start_offset(const DeviceView& device,
                                                       const JobView& candidate);

}  // namespace salus::sched
