#include "iteration_sched/memory_offset.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace salus::sched {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// A piece of a piecewise-constant memory function: `bytes` over [begin, end).
struct Segment {
  double begin = 0.0;
  double end = 0.0;
  std::size_t bytes = 0;
};

// How long an iteration is predicted to take: its curve's duration, else the job's estimate, else
// unknown (infinite).
double predicted_duration(const JobView& job) {
  if (job.curve != nullptr && job.curve->known()) return job.curve->duration_seconds;
  return job.iteration_seconds > 0.0 ? job.iteration_seconds : kInfinity;
}

// `job`'s ephemeral bytes from `elapsed` seconds into its iteration on, re-based so that 0 is now.
void append_remaining(const JobView& job, double elapsed, std::vector<Segment>& out) {
  const double duration = predicted_duration(job);
  const bool has_curve = job.curve != nullptr && job.curve->known();
  if (!has_curve || elapsed >= duration) {
    // No shape known, or the prediction was wrong: hold the peak until it is predicted to end, or
    // for as long as it runs.
    const double end = elapsed < duration ? duration - elapsed : kInfinity;
    out.push_back({0.0, end, ephemeral_peak(job)});
    return;
  }
  const auto& samples = job.curve->bytes;
  const double width = duration / static_cast<double>(samples.size());
  for (std::size_t k = 0; k < samples.size(); ++k) {
    const double end =
        k + 1 == samples.size() ? duration - elapsed : static_cast<double>(k + 1) * width - elapsed;
    if (end <= 0.0) continue;
    const double begin = std::max(0.0, static_cast<double>(k) * width - elapsed);
    out.push_back({begin, end, samples[k]});
  }
}

// The candidate's own ephemeral bytes from its start.
std::vector<Segment> candidate_segments(const JobView& job) {
  if (job.curve == nullptr || !job.curve->known()) {
    return {{0.0, predicted_duration(job), ephemeral_peak(job)}};
  }
  const auto& samples = job.curve->bytes;
  const double duration = job.curve->duration_seconds;
  const double width = duration / static_cast<double>(samples.size());
  std::vector<Segment> out;
  out.reserve(samples.size());
  for (std::size_t k = 0; k < samples.size(); ++k) {
    const double end = k + 1 == samples.size() ? duration : static_cast<double>(k + 1) * width;
    out.push_back({static_cast<double>(k) * width, end, samples[k]});
  }
  return out;
}

// The sum of the running iterations' remaining curves and the held bytes as disjoint segments
// covering [0, inf).
std::vector<Segment> combined_running(std::span<const RunningIteration> running,
                                      std::span<const HeldFrom> held, double& last_end) {
  std::vector<Segment> pieces;
  for (const RunningIteration& r : running) {
    if (r.job != nullptr) append_remaining(*r.job, std::max(0.0, r.elapsed_seconds), pieces);
  }
  // Sweep the piece boundaries: +bytes where a piece begins, -bytes where it ends.
  std::vector<std::pair<double, std::int64_t>> changes;
  changes.reserve(2 * pieces.size());
  last_end = 0.0;
  for (const Segment& s : pieces) {
    changes.emplace_back(s.begin, static_cast<std::int64_t>(s.bytes));
    if (s.end < kInfinity) changes.emplace_back(s.end, -static_cast<std::int64_t>(s.bytes));
    last_end = std::max(last_end, s.end);
  }
  // A held piece only begins: the level changes there, so the search looks past it too.
  for (const HeldFrom& h : held) {
    changes.emplace_back(std::max(0.0, h.from_seconds), static_cast<std::int64_t>(h.bytes));
    last_end = std::max(last_end, h.from_seconds);
  }
  std::sort(changes.begin(), changes.end());
  std::vector<Segment> combined;
  std::int64_t level = 0;
  double at = 0.0;
  for (std::size_t i = 0; i < changes.size();) {
    const double position = changes[i].first;
    if (position > at) combined.push_back({at, position, static_cast<std::size_t>(level)});
    for (; i < changes.size() && changes[i].first == position; ++i) level += changes[i].second;
    at = std::max(at, position);
  }
  combined.push_back({at, kInfinity, static_cast<std::size_t>(level)});
  return combined;
}

}  // namespace

std::size_t ephemeral_peak(const JobView& job) {
  const std::size_t curve_peak =
      job.curve != nullptr && job.curve->known() ? job.curve->peak() : std::size_t{0};
  return std::max(job.ephemeral_peak_bytes, curve_peak);
}

std::optional<double> least_start_offset(const DeviceView& device, const JobView& candidate) {
  if (device.persistent_bytes > device.budget_bytes) return std::nullopt;
  const std::size_t available = device.budget_bytes - device.persistent_bytes;
  double last_end = 0.0;
  const std::vector<Segment> running = combined_running(device.running, device.held, last_end);
  const std::vector<Segment> own = candidate_segments(candidate);

  // Starting at d puts the candidate's piece [x, y) over the running piece [a, b) exactly when
  // d lies in the open interval (a - y, b - x). Over budget there, such a d is forbidden.
  std::vector<std::pair<double, double>> forbidden;
  for (const Segment& r : running) {
    for (const Segment& c : own) {
      if (c.end <= c.begin) continue;
      if (r.bytes <= available && c.bytes <= available - r.bytes) continue;
      const double low = r.begin - c.end + kOffsetTolerance;
      const double high = r.end - c.begin - kOffsetTolerance;
      if (low < high) forbidden.emplace_back(low, high);
    }
  }
  std::sort(forbidden.begin(), forbidden.end());
  double offset = 0.0;
  for (const auto& [low, high] : forbidden) {
    if (low >= offset) break;  // every later interval starts past `offset` too
    offset = std::max(offset, high);
  }
  if (offset == kInfinity) return std::nullopt;
  // A recheck at an offset found earlier lands within rounding of the interval's end.
  if (offset <= kOffsetTolerance) return 0.0;
  // Past the last predicted end, the finish events will bring the caller back anyway.
  if (offset > 0.0 && offset + 2 * kOffsetTolerance >= last_end) return std::nullopt;
  return offset;
}

}  // namespace salus::sched
