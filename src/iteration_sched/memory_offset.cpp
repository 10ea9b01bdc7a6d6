#include "iteration_sched/memory_offset.hpp"

#include <algorithm>
#include <bit>
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

// The candidate's own ephemeral bytes from its start, into `out`.
void candidate_segments(const JobView& job, std::vector<Segment>& out) {
  out.clear();
  if (job.curve == nullptr || !job.curve->known()) {
    out.push_back({0.0, predicted_duration(job), ephemeral_peak(job)});
    return;
  }
  const auto& samples = job.curve->bytes;
  const double duration = job.curve->duration_seconds;
  const double width = duration / static_cast<double>(samples.size());
  for (std::size_t k = 0; k < samples.size(); ++k) {
    const double end = k + 1 == samples.size() ? duration : static_cast<double>(k + 1) * width;
    out.push_back({static_cast<double>(k) * width, end, samples[k]});
  }
}

using LevelChange = std::pair<double, std::int64_t>;  // position, bytes added there

// The sum of the running iterations' remaining curves and the held bytes as disjoint segments
// covering [0, inf), and the last point where the level changes.
struct Combined {
  std::vector<Segment> segments;
  double last_end = 0.0;
};

// What one thread's searches reuse. A decision round asks the same question of up to
// kExtraCandidates candidates over one picture of the device, so the combined function (building
// it, the sort of its level changes above all, is most of a search's cost) is kept with a copy of
// everything it was built from (input_key), and rebuilt only when that differs. It is a pure
// function of those inputs, so a reused one is bit for bit the one a rebuild would give. The
// buffers keep their capacity, so a search allocates nothing in the steady state.
struct SearchScratch {
  std::vector<std::uint64_t> key;
  std::vector<std::uint64_t> built_key;  // the inputs `combined` was built from
  bool built = false;
  std::vector<Segment> pieces;
  std::vector<LevelChange> changes;
  Combined combined;
  std::vector<Segment> own;
  std::vector<std::size_t> cursor;  // per candidate piece: see least_uncovered_offset
};

SearchScratch& search_scratch() {
  thread_local SearchScratch scratch;
  return scratch;
}

std::uint64_t bits(double value) {
  return std::bit_cast<std::uint64_t>(value);
}

// Everything combined_running reads, flattened without ambiguity (the counts first; per running
// iteration a marker, then what append_remaining reads of its job: estimates, curve and samples).
// Doubles go in as bits, so even values that compare equal but differ (0.0 and -0.0) rebuild.
void input_key(std::span<const RunningIteration> running, std::span<const HeldFrom> held,
               std::vector<std::uint64_t>& key) {
  key.clear();
  key.push_back(running.size());
  key.push_back(held.size());
  for (const RunningIteration& r : running) {
    if (r.job == nullptr) {
      key.push_back(0);
      continue;
    }
    const JobView& job = *r.job;
    const MemoryCurve* curve = job.curve;
    key.insert(key.end(), {1, bits(r.elapsed_seconds), bits(job.iteration_seconds),
                           job.ephemeral_peak_bytes, curve != nullptr ? 1U : 0U});
    if (curve != nullptr) {
      key.push_back(bits(curve->duration_seconds));
      key.push_back(curve->bytes.size());
      key.insert(key.end(), curve->bytes.begin(), curve->bytes.end());
    }
  }
  for (const HeldFrom& h : held) key.insert(key.end(), {bits(h.from_seconds), h.bytes});
}

void build_combined(std::span<const RunningIteration> running, std::span<const HeldFrom> held,
                    SearchScratch& s) {
  s.pieces.clear();
  for (const RunningIteration& r : running) {
    if (r.job != nullptr) append_remaining(*r.job, std::max(0.0, r.elapsed_seconds), s.pieces);
  }
  // Sweep the piece boundaries: +bytes where a piece begins, -bytes where it ends.
  s.changes.clear();
  double last_end = 0.0;
  for (const Segment& piece : s.pieces) {
    s.changes.emplace_back(piece.begin, static_cast<std::int64_t>(piece.bytes));
    if (piece.end < kInfinity) {
      s.changes.emplace_back(piece.end, -static_cast<std::int64_t>(piece.bytes));
    }
    last_end = std::max(last_end, piece.end);
  }
  // A held piece only begins: the level changes there, so the search looks past it too.
  for (const HeldFrom& h : held) {
    s.changes.emplace_back(std::max(0.0, h.from_seconds), static_cast<std::int64_t>(h.bytes));
    last_end = std::max(last_end, h.from_seconds);
  }
  std::sort(s.changes.begin(), s.changes.end());
  std::vector<Segment>& combined = s.combined.segments;
  combined.clear();
  std::int64_t level = 0;
  double at = 0.0;
  for (std::size_t i = 0; i < s.changes.size();) {
    const double position = s.changes[i].first;
    if (position > at) combined.push_back({at, position, static_cast<std::size_t>(level)});
    for (; i < s.changes.size() && s.changes[i].first == position; ++i) {
      level += s.changes[i].second;
    }
    at = std::max(at, position);
  }
  combined.push_back({at, kInfinity, static_cast<std::size_t>(level)});
  s.combined.last_end = last_end;
}

const Combined& combined_running(std::span<const RunningIteration> running,
                                 std::span<const HeldFrom> held, SearchScratch& s) {
  input_key(running, held, s.key);
  if (!s.built || s.key != s.built_key) {
    build_combined(running, held, s);
    std::swap(s.built_key, s.key);  // the next call rebuilds `key` anyway
    s.built = true;
  }
  return s.combined;
}

// The least d >= 0 lying in no forbidden interval, where starting at d puts the candidate's piece
// [x, y) over the running piece [a, b) exactly when d lies in the open interval (a - y, b - x)
// (narrowed by the tolerance), forbidden when the two together exceed `available`.
//
// For one candidate piece these intervals' ends both grow with the running piece's index, so
// each piece keeps a cursor at the first running piece whose interval still ends past d, and d
// jumps to the end of every forbidden interval that contains it; the pieces are swept until none
// moves d. Every point passed over lies in some forbidden interval, so d ends at the least point
// in none (infinity when the last, endless running piece forbids it): the same value, computed
// from the same interval ends, as sorting all the intervals and sweeping them would give.
double least_uncovered_offset(const std::vector<Segment>& running, const std::vector<Segment>& own,
                              std::size_t available, std::vector<std::size_t>& cursor) {
  cursor.assign(own.size(), 0);
  double offset = 0.0;
  for (bool moved = true; moved && offset < kInfinity;) {
    moved = false;
    for (std::size_t k = 0; k < own.size() && offset < kInfinity; ++k) {
      const Segment& c = own[k];
      if (c.end <= c.begin) continue;
      std::size_t i = cursor[k];
      while (i < running.size() && running[i].end - c.begin - kOffsetTolerance <= offset) ++i;
      cursor[k] = i;
      for (; i < running.size(); ++i) {
        const Segment& r = running[i];
        const double low = r.begin - c.end + kOffsetTolerance;
        if (low >= offset) break;  // this and every later interval start past `offset`
        if (r.bytes <= available && c.bytes <= available - r.bytes) continue;
        const double high = r.end - c.begin - kOffsetTolerance;
        if (high > offset) {
          offset = high;
          moved = true;
        }
      }
    }
  }
  return offset;
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
  SearchScratch& scratch = search_scratch();
  const Combined& running = combined_running(device.running, device.held, scratch);
  const double last_end = running.last_end;
  candidate_segments(candidate, scratch.own);
  const double offset =
      least_uncovered_offset(running.segments, scratch.own, available, scratch.cursor);
  if (offset == kInfinity) return std::nullopt;
  // A recheck at an offset found earlier lands within rounding of the interval's end.
  if (offset <= kOffsetTolerance) return 0.0;
  // Past the last predicted end, the finish events will bring the caller back anyway.
  if (offset > 0.0 && offset + 2 * kOffsetTolerance >= last_end) return std::nullopt;
  return offset;
}

}  // namespace salus::sched
