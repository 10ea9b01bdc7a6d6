// The Zico-style start-offset search behind the "memory_aware" policy, kept apart from the policy
// classes so that it can be tested on hand-made curves.
#pragma once

#include <cstddef>
#include <optional>
#include <span>

#include "salus/scheduler.hpp"

namespace salus::sched {

// Overlaps shorter than this (seconds) are ignored, so that a start offset found at one decision
// still holds when the clock reaches it despite floating-point rounding of `now - started`.
inline constexpr double kOffsetTolerance = 1e-9;

// The ephemeral peak a job is accounted for: the larger of the hint and its curve's peak.
[[nodiscard]] std::size_t ephemeral_peak(const JobView& job);

// The least d >= 0 such that, for every t in [0, candidate's duration),
//   device.persistent_bytes + sum_r curve_r(elapsed_r + d + t) + candidate_curve(t) <= budget,
// where a running iteration contributes nothing after its predicted end. Unknown curves count as
// their flat peak over the iteration (over all time when the iteration's length is unknown too);
// an iteration that has overrun its prediction is assumed to hold its peak until it ends.
// nullopt when no such d exists before the last running iteration is predicted to end (the
// caller then waits for an iteration to end).
[[nodiscard]] std::optional<double> least_start_offset(const DeviceView& device,
                                                       const JobView& candidate);

// Bytes held from `from_seconds` after now on, for good: memory a lane has reserved for its next
// iteration once the one it runs now is predicted to end.
struct HeldFrom {
  double from_seconds = 0.0;
  std::size_t bytes = 0;
};

// As above, with `held` added to the running curves (and counted among the ends the search looks
// past).
[[nodiscard]] std::optional<double> least_start_offset(const DeviceView& device,
                                                       std::span<const HeldFrom> held,
                                                       const JobView& candidate);

}  // namespace salus::sched
