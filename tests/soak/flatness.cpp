#include "soak/flatness.hpp"

#include <algorithm>
#include <cstdio>

namespace salus::soak {
namespace {

double max_of(const std::vector<SeriesPoint>& points, std::size_t begin, std::size_t end) {
  double best = points[begin].value;
  for (std::size_t i = begin; i < end; ++i) best = std::max(best, points[i].value);
  return best;
}

double least_squares_slope(const std::vector<SeriesPoint>& points) {
  double mean_t = 0.0, mean_v = 0.0;
  for (const SeriesPoint& p : points) {
    mean_t += p.seconds;
    mean_v += p.value;
  }
  mean_t /= static_cast<double>(points.size());
  mean_v /= static_cast<double>(points.size());
  double covariance = 0.0, variance = 0.0;
  for (const SeriesPoint& p : points) {
    covariance += (p.seconds - mean_t) * (p.value - mean_v);
    variance += (p.seconds - mean_t) * (p.seconds - mean_t);
  }
  return variance > 0.0 ? covariance / variance : 0.0;
}

}  // namespace

FlatnessVerdict judge_flatness(const std::vector<SeriesPoint>& series, const FlatnessRule& rule) {
  FlatnessVerdict verdict;
  if (series.empty()) return verdict;
  std::vector<SeriesPoint> after;
  for (const SeriesPoint& p : series) {
    verdict.overall_max = std::max(verdict.overall_max, p.value);
    if (p.seconds >= rule.warmup_seconds) after.push_back(p);
  }
  verdict.at_end = series.back().value;
  verdict.samples = after.size();
  if (after.size() < 6) return verdict;
  const std::size_t third = after.size() / 3;
  verdict.judged = true;
  verdict.at_warmup_end = after.front().value;
  verdict.first_third_max = max_of(after, 0, third);
  verdict.last_third_max = max_of(after, after.size() - third, after.size());
  verdict.tolerance =
      std::max(rule.tolerance_absolute, rule.tolerance_fraction * verdict.first_third_max);
  verdict.flat = verdict.last_third_max <= verdict.first_third_max + verdict.tolerance;
  verdict.slope_per_second = least_squares_slope(after);
  return verdict;
}

std::string describe(const std::string& what, const FlatnessVerdict& verdict, double unit,
                     const char* unit_name) {
  char text[512];
  if (!verdict.judged) {
    std::snprintf(text, sizeof text, "%s: NOT JUDGED (%zu samples after warm-up; 6 needed)",
                  what.c_str(), verdict.samples);
    return text;
  }
  std::snprintf(text, sizeof text,
                "%s: %s: after warm-up %.1f %s; max first third %.1f, max last third %.1f "
                "(tolerance %.1f); max overall %.1f; at end %.1f; slope %.3f %s/min over %zu "
                "samples",
                what.c_str(), verdict.flat ? "FLAT" : "NOT FLAT", verdict.at_warmup_end / unit,
                unit_name, verdict.first_third_max / unit, verdict.last_third_max / unit,
                verdict.tolerance / unit, verdict.overall_max / unit, verdict.at_end / unit,
                verdict.slope_per_second * 60.0 / unit, unit_name, verdict.samples);
  return text;
}

}  // namespace salus::soak
