// "Flat after warm-up", the soak's verdict on a series (resident memory, reserved bytes).
//
// Samples taken before `warmup_seconds` are ignored (allocator caches, pools, the trace buffer's
// first growth and the scheduler's profiles fill then). The rest is cut into thirds; the series
// is flat when the maximum over the last third is at most the maximum over the first third plus
// a tolerance (absolute bytes, or a fraction of that first maximum, whichever is larger). Maxima,
// not means, so a sawtooth that returns to the same peaks is flat and a ratchet is not. The
// least-squares slope over all post-warm-up samples is reported too (it is not judged: a flat
// series with a big plateau early can have a positive slope).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace salus::soak {

struct SeriesPoint {
  double seconds = 0.0;
  double value = 0.0;
};

struct FlatnessRule {
  double warmup_seconds = 10.0;
  double tolerance_absolute = 0.0;
  double tolerance_fraction = 0.0;
};

struct FlatnessVerdict {
  bool judged = false;  // enough samples after warm-up (at least 6)
  bool flat = false;
  std::size_t samples = 0;     // after warm-up
  double at_warmup_end = 0.0;  // the first sample after warm-up
  double first_third_max = 0.0;
  double last_third_max = 0.0;
  double overall_max = 0.0;  // warm-up included
  double at_end = 0.0;
  double tolerance = 0.0;
  double slope_per_second = 0.0;
};

[[nodiscard]] FlatnessVerdict judge_flatness(const std::vector<SeriesPoint>& series,
                                             const FlatnessRule& rule);
// One line: the numbers judged, scaled by `unit` (e.g. 1 MiB) and named `unit_name`.
[[nodiscard]] std::string describe(const std::string& what, const FlatnessVerdict& verdict,
                                   double unit, const char* unit_name);

}  // namespace salus::soak
