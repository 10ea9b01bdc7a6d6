// Jobs for the simulator: a training-like memory curve, rows of salus_workloads.csv, and the
// coarsening that simulates long jobs in fewer, longer steps.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "salus/error.hpp"
#include "salus/simulation.hpp"

namespace salus::sched {

MemoryCurve training_curve(double seconds, std::size_t peak_bytes, std::size_t samples,
                           double forward_fraction) {
  if (samples == 0 || !(seconds > 0.0) || !(forward_fraction > 0.0 && forward_fraction < 1.0)) {
    throw InvalidArgument("training_curve: needs samples > 0, seconds > 0, 0 < forward < 1");
  }
  MemoryCurve curve{seconds, {}};
  curve.bytes.reserve(samples);
  const auto n = static_cast<double>(samples);
  const auto peak = static_cast<double>(peak_bytes);
  for (std::size_t k = 0; k < samples; ++k) {
    // The triangle's highest point within [k/n, (k+1)/n).
    const double u =
        std::clamp(forward_fraction, static_cast<double>(k) / n, static_cast<double>(k + 1) / n);
    const double level =
        u <= forward_fraction ? u / forward_fraction : (1.0 - u) / (1.0 - forward_fraction);
    curve.bytes.push_back(static_cast<std::size_t>(std::ceil(peak * level)));
  }
  return curve;
}

SimJob workload_job(std::string name, double jct_seconds, double peak_memory_mb,
                    std::uint64_t iterations) {
  if (!(jct_seconds > 0.0) || !(peak_memory_mb > 0.0) || iterations == 0 ||
      !std::isfinite(jct_seconds) || !std::isfinite(peak_memory_mb)) {
    throw InvalidArgument(fmt::format(
        "workload '{}': needs a finite jct > 0, a finite peak memory > 0 and iterations > 0", name));
  }
  const double peak = peak_memory_mb * 1024.0 * 1024.0;
  // Byte counts are size_t: a larger peak would not convert (found by fuzz_workloads_csv).
  if (!(peak < 0x1p62)) {
    throw InvalidArgument(fmt::format("workload '{}': peak memory of {} MB is too large", name,
                                      peak_memory_mb));
  }
  if (!(jct_seconds / static_cast<double>(iterations) > 0.0)) {
    throw InvalidArgument(fmt::format(
        "workload '{}': {} s over {} iterations leaves no time per iteration", name, jct_seconds,
        iterations));
  }
  SimJob job;
  job.name = std::move(name);
  job.iterations = iterations;
  job.iteration_seconds = jct_seconds / static_cast<double>(iterations);
  job.persistent_bytes = static_cast<std::size_t>(0.3 * peak);
  job.curve = training_curve(job.iteration_seconds, static_cast<std::size_t>(0.7 * peak));
  return job;
}

std::vector<SimJob> jobs_from_workloads_csv(const std::string& path, std::uint64_t max_iterations) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument(fmt::format("workloads: cannot read '{}'", path));
  return jobs_from_workloads_csv(in, max_iterations, path);
}

std::vector<SimJob> jobs_from_workloads_csv(std::istream& in, std::uint64_t max_iterations,
                                            const std::string& source) {
  const std::string& path = source;  // what the messages name
  const auto split = [](const std::string& line) {
    std::vector<std::string> cells;
    std::stringstream stream(line);
    for (std::string cell; std::getline(stream, cell, ',');) cells.push_back(cell);
    return cells;
  };
  std::string line;
  if (!std::getline(in, line)) throw InvalidArgument(fmt::format("workloads: '{}' is empty", path));
  const std::vector<std::string> header = split(line);
  std::unordered_map<std::string, std::size_t> column;
  for (std::size_t i = 0; i < header.size(); ++i) column[header[i]] = i;
  for (const char* needed : {"workload", "jct_seconds", "peak_memory_mb", "iterations"}) {
    if (!column.contains(needed)) {
      throw InvalidArgument(fmt::format("workloads: '{}' has no column '{}'", path, needed));
    }
  }
  std::vector<SimJob> jobs;
  for (int row = 2; std::getline(in, line); ++row) {
    if (line.empty() || line == "\r") continue;
    if (line.back() == '\r') line.pop_back();
    const std::vector<std::string> cells = split(line);
    try {
      if (cells.size() < header.size()) throw std::invalid_argument("too few cells");
      std::uint64_t iterations = std::stoull(cells[column["iterations"]]);
      if (max_iterations > 0) iterations = std::min(iterations, max_iterations);
      const double full_iterations = std::stod(cells[column["iterations"]]);
      const double jct = std::stod(cells[column["jct_seconds"]]);
      // A capped job keeps its per-iteration time.
      const double seconds = jct * static_cast<double>(iterations) / full_iterations;
      jobs.push_back(workload_job(cells[column["workload"]], seconds,
                                  std::stod(cells[column["peak_memory_mb"]]), iterations));
    } catch (const std::logic_error& e) {  // std::stoull / std::stod, a short row
      throw InvalidArgument(fmt::format("workloads: '{}' row {}: {}", path, row, e.what()));
    } catch (const InvalidArgument& e) {  // workload_job: the message names the file and row too
      throw InvalidArgument(fmt::format("workloads: '{}' row {}: {}", path, row, e.what()));
    }
  }
  return jobs;
}

SimJob coarsened(SimJob job, std::uint64_t max_steps) {
  if (max_steps == 0) {
    throw InvalidArgument(fmt::format("coarsened: job '{}' needs max_steps > 0", job.name));
  }
  if (job.iterations <= max_steps) return job;
  // The curve's samples are kept: the simulator stretches them over the new step's work.
  const double work = job.iteration_seconds * static_cast<double>(job.iterations);
  job.iterations = max_steps;
  job.iteration_seconds = work / static_cast<double>(max_steps);
  if (!job.curve.bytes.empty()) job.curve.duration_seconds = job.iteration_seconds;
  return job;
}

}  // namespace salus::sched
