#include "iteration_sched/simulation.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "iteration_sched/decision.hpp"
#include "salus/error.hpp"

namespace salus::sched {
namespace {

enum class EventKind : std::uint8_t { arrive, finish, wake, recheck };

struct Event {
  double time = 0.0;
  std::uint64_t sequence = 0;  // ties at one instant keep the order they were scheduled in
  EventKind kind = EventKind::recheck;
  std::uint32_t job = 0;
  // std::priority_queue is a max-heap: "greater" is served last.
  friend bool operator<(const Event& a, const Event& b) {
    return a.time != b.time ? a.time > b.time : a.sequence > b.sequence;
  }
};

struct RunningIterationState {
  double start = 0.0;
  std::size_t record = 0;  // index into SimResult::iterations
};

// Everything one run() changes; the Simulation itself stays reusable.
class Run {
 public:
  Run(const Policy& policy, std::size_t budget, const SimOptions& options,
      const std::vector<SimJob>& jobs)
      : core_(policy, budget),
        budget_(budget),
        options_(options),
        jobs_(jobs),
        curves_(jobs.size()) {
    result_.jobs.resize(jobs.size());
    views_.resize(jobs.size());
    asked_.assign(jobs.size(), 0.0);
    for (std::uint32_t i = 0; i < jobs.size(); ++i) prepare(i);
  }

  SimResult execute() {
    std::size_t events = 0;
    double previous = 0.0;
    while (!queue_.empty()) {
      const double now = queue_.top().time;
      account_between(previous, now);
      while (!queue_.empty() && queue_.top().time == now) {
        if (++events > options_.max_events) {
          throw InvalidArgument(fmt::format(
              "simulation: more than {} events; the policy does not settle", options_.max_events));
        }
        const Event event = queue_.top();
        queue_.pop();
        handle(event, now);
      }
      start_what_the_core_decides(now);
      account_at_event();
      previous = now;
    }
    for (std::uint32_t i = 0; i < jobs_.size(); ++i) {
      if (result_.jobs[i].iterations < jobs_[i].iterations) {
        throw InvalidArgument(fmt::format(
            "simulation: job '{}' could never run (persistent {} + ephemeral peak {} bytes "
            "against a budget of {})",
            jobs_[i].name, jobs_[i].persistent_bytes, curves_[i].peak(), budget_));
      }
    }
    std::uint64_t total = 0;
    for (const SimJobResult& job : result_.jobs) {
      result_.makespan_seconds = std::max(result_.makespan_seconds, job.finish_seconds);
      total += job.iterations;
    }
    if (result_.makespan_seconds > 0.0) {
      result_.throughput = static_cast<double>(total) / result_.makespan_seconds;
    }
    return std::move(result_);
  }

 private:
  void prepare(std::uint32_t i) {
    const SimJob& job = jobs_[i];
    if (job.iterations == 0 || !(job.iteration_seconds > 0.0) || !(job.arrival_seconds >= 0.0) ||
        !(job.think_seconds >= 0.0)) {
      throw InvalidArgument(fmt::format(
          "simulation: job '{}' needs iterations > 0, iteration seconds > 0 and non-negative "
          "arrival and think times",
          job.name));
    }
    curves_[i] = job.curve;
    curves_[i].duration_seconds = curves_[i].bytes.empty() ? 0.0 : job.iteration_seconds;
    JobView& view = views_[i];
    view.id = JobId{i};
    view.kind = job.kind;
    view.priority = job.priority;
    view.expected_iterations = job.iterations;
    view.iteration_seconds = job.iteration_seconds;
    view.persistent_bytes = job.persistent_bytes;
    view.ephemeral_peak_bytes = curves_[i].peak();
    view.curve = curves_[i].known() ? &curves_[i] : nullptr;
    result_.jobs[i].name = job.name;
    schedule(job.arrival_seconds, EventKind::arrive, i);
  }

  void schedule(double time, EventKind kind, std::uint32_t job) {
    queue_.push({time, next_sequence_++, kind, job});
  }

  void ask(std::uint32_t job, double now) {
    core_.wait(JobId{job});
    asked_[job] = now;
  }

  void handle(const Event& event, double now) {
    const std::uint32_t id = event.job;
    switch (event.kind) {
      case EventKind::arrive:
        views_[id].arrival = next_arrival_++;  // registration order on the device
        core_.add(views_[id]);
        ask(id, now);
        break;
      case EventKind::wake:
        ask(id, now);
        break;
      case EventKind::recheck:
        break;
      case EventKind::finish: {
        core_.finish(JobId{id}, now);
        running_.erase(id);
        SimJobResult& stats = result_.jobs[id];
        ++stats.iterations;
        stats.attained_seconds += jobs_[id].iteration_seconds;
        JobView& view = views_[id];
        view.iterations_done = stats.iterations;
        view.attained_seconds = stats.attained_seconds;
        if (stats.iterations == jobs_[id].iterations) {
          core_.remove(JobId{id});
          stats.finish_seconds = now;
        } else {
          core_.update(view);
          if (jobs_[id].think_seconds > 0.0) {
            schedule(now + jobs_[id].think_seconds, EventKind::wake, id);
          } else {
            ask(id, now);
          }
        }
        break;
      }
    }
  }

  void start_what_the_core_decides(double now) {
    const Decision decision = core_.decide(now);
    for (const Start& start : decision.starts) {
      const std::uint32_t job = start.job.value;  // the core's ids are indices into the input
      SimIteration record{job, start.lane, asked_[job], now, now + jobs_[job].iteration_seconds,
                          {}};
      if (options_.record_waiting) {
        for (std::uint32_t other = 0; other < jobs_.size(); ++other) {
          if (other != job && core_.waiting(JobId{other})) record.others_waiting.push_back(other);
        }
      }
      SimJobResult& stats = result_.jobs[job];
      const double waited = now - record.asked;
      stats.waiting_seconds += waited;
      stats.max_wait_seconds = std::max(stats.max_wait_seconds, waited);
      running_[job] = {now, result_.iterations.size()};
      schedule(record.end, EventKind::finish, job);
      result_.iterations.push_back(std::move(record));
    }
    if (decision.recheck_after_seconds) {
      const double at = now + *decision.recheck_after_seconds;
      // One pending recheck is enough: an earlier one re-asks, and re-asking schedules again.
      if (at > now && (next_recheck_ <= now || at < next_recheck_)) {
        next_recheck_ = at;
        schedule(at, EventKind::recheck, 0);
      }
    }
  }

  [[nodiscard]] std::size_t memory_at(double t) const {
    std::size_t total = 0;
    for (std::uint32_t i = 0; i < jobs_.size(); ++i) {
      if (core_.admitted(JobId{i})) total += jobs_[i].persistent_bytes;
    }
    for (const auto& [id, run] : running_) total += curves_[id].at(t - run.start);
    return total;
  }

  // Combined memory is measured between events (account_between), not at them: at an instant
  // where one iteration starts exactly as another steps down, rounding of `t - start` would pick
  // either side of the step.
  void account_at_event() {
    result_.peak_committed_bytes = std::max(result_.peak_committed_bytes, core_.committed_bytes());
  }

  // Between two events nothing starts, ends or is admitted, but the running curves step at their
  // sample boundaries: check the middle of every piece between boundaries (where each curve has
  // one value; slivers shorter than the policies' rounding tolerance are skipped).
  void account_between(double from, double to) {
    if (running_.empty() || to <= from) return;
    std::vector<double> cuts = {from, to};
    for (const auto& [id, run] : running_) {
      const MemoryCurve& curve = curves_[id];
      if (!curve.known()) continue;
      const double width = curve.duration_seconds / static_cast<double>(curve.bytes.size());
      for (std::size_t k = 1; k < curve.bytes.size(); ++k) {
        const double at = run.start + width * static_cast<double>(k);
        if (at > from && at < to) cuts.push_back(at);
      }
    }
    std::sort(cuts.begin(), cuts.end());
    for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
      if (cuts[i + 1] - cuts[i] < 1e-7) continue;
      const std::size_t bytes = memory_at(0.5 * (cuts[i] + cuts[i + 1]));
      result_.peak_combined_bytes = std::max(result_.peak_combined_bytes, bytes);
    }
  }

  DecisionCore core_;
  std::size_t budget_;
  const SimOptions& options_;
  const std::vector<SimJob>& jobs_;
  std::vector<MemoryCurve> curves_;  // stretched to each job's iteration; never resized
  std::vector<JobView> views_;
  std::vector<double> asked_;
  std::map<std::uint32_t, RunningIterationState> running_;
  std::priority_queue<Event> queue_;
  std::uint64_t next_sequence_ = 0;
  std::uint64_t next_arrival_ = 0;
  double next_recheck_ = -1.0;
  SimResult result_;
};

}  // namespace

Simulation::Simulation(const Policy& policy, std::size_t budget_bytes, SimOptions options)
    : policy_(policy), budget_(budget_bytes), options_(options) {}

Simulation::Simulation(std::string_view policy_name, std::size_t budget_bytes, SimOptions options)
    : owned_(PolicyRegistry::with_builtins().make(policy_name)),
      policy_(*owned_),
      budget_(budget_bytes),
      options_(options) {}

Simulation::~Simulation() = default;

SimResult Simulation::run(const std::vector<SimJob>& jobs) const {
  Run run(policy_, budget_, options_, jobs);
  return run.execute();
}

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
  if (!(jct_seconds > 0.0) || !(peak_memory_mb > 0.0) || iterations == 0) {
    throw InvalidArgument(
        fmt::format("workload '{}': needs jct > 0, peak memory > 0 and iterations > 0", name));
  }
  const double peak = peak_memory_mb * 1024.0 * 1024.0;
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
    } catch (const std::logic_error& e) {
      throw InvalidArgument(fmt::format("workloads: '{}' row {}: {}", path, row, e.what()));
    }
  }
  return jobs;
}

}  // namespace salus::sched
