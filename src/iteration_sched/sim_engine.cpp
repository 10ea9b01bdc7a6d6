// The event loop. Events at one instant are handled together (in the order they were scheduled),
// then every device they touched decides, in device order, and re-rates its running iterations:
// so a device's evolution depends only on its own events, and runs are deterministic.
//
// Cost per event: O(log events) for the queue, plus, on the device it touches, the DecisionCore's
// O(log jobs) and O(running iterations on that device) for rates and memory; nothing loops over
// all jobs or all devices except placement at arrival (O(devices)).
#include "iteration_sched/sim_engine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <queue>

#include "iteration_sched/sim_device.hpp"
#include "iteration_sched/sim_placement.hpp"
#include "salus/error.hpp"

namespace salus::sched::detail {
namespace {

enum class EventKind : std::uint8_t { arrive, finish, wake, recheck };

struct Event {
  double time = 0.0;
  std::uint64_t sequence = 0;  // ties at one instant keep the order they were scheduled in
  std::uint32_t job = 0;
  // Finish events: valid only while equal to the job's generation, which moves each time its
  // running iteration's end is recomputed (the older event is then stale and skipped).
  std::uint32_t generation = 0;
  int device = -1;  // -1: an arrival still to be placed
  EventKind kind = EventKind::recheck;
  // std::priority_queue is a max-heap: "greater" is served last.
  friend bool operator<(const Event& a, const Event& b) {
    return a.time != b.time ? a.time > b.time : a.sequence > b.sequence;
  }
};

struct JobState {
  int device = -1;
  double asked = 0.0;  // when it last asked for an iteration
  std::uint32_t generation = 0;
  bool started = false;  // its first iteration started
};

class Engine {
 public:
  Engine(const Policy& policy, const ClusterSpec& cluster, const SimOptions& options,
         const std::vector<SimJob>& jobs);
  SimResult execute();

 private:
  void check_job(std::uint32_t i) const;
  void prepare(std::uint32_t i);
  void schedule(double time, EventKind kind, std::uint32_t job, int device,
                std::uint32_t generation = 0);
  [[nodiscard]] bool stale(const Event& event) const;
  void handle(const Event& event, double now);
  int choose_device(std::uint32_t job);
  void arrive(std::uint32_t job, double now);
  void ask(std::uint32_t job, double now);
  void finish(std::uint32_t job, double now);
  void touch(int device, double now);
  void settle(int device, double now);
  void start_iteration(int device, const Start& start, double now);
  void conclude();

  SimDevice& device(int d) { return *devices_[static_cast<std::size_t>(d)]; }

  const ContentionModel& model_;
  const SimOptions& options_;
  const std::vector<SimJob>& jobs_;
  const PlacementRule placement_;
  const std::size_t budget_;
  std::vector<std::unique_ptr<SimDevice>> devices_;
  std::vector<MemoryCurve> curves_;  // stretched to each job's iteration; never resized
  std::vector<JobView> views_;
  std::vector<JobState> state_;
  std::vector<DeviceLoad> loads_;  // placement's scratch
  std::vector<int> touched_;       // devices touched at the current instant
  std::vector<char> is_touched_;
  std::vector<char> changed_;  // the device's running set changed at the current instant
  std::priority_queue<Event> queue_;
  std::uint64_t next_sequence_ = 0;
  std::uint64_t next_arrival_ = 0;
  SimResult result_;
};

Engine::Engine(const Policy& policy, const ClusterSpec& cluster, const SimOptions& options,
               const std::vector<SimJob>& jobs)
    : model_(*cluster.contention),
      options_(options),
      jobs_(jobs),
      placement_(parse_placement(cluster.placement)),
      budget_(cluster.device_budget_bytes) {
  if (jobs.size() > std::numeric_limits<std::uint32_t>::max()) {
    throw InvalidArgument(fmt::format("simulation: {} jobs is more than the {} a run can number",
                                      jobs.size(), std::numeric_limits<std::uint32_t>::max()));
  }
  const int count = cluster.machines * cluster.gpus_per_machine;
  for (int d = 0; d < count; ++d) {
    devices_.push_back(
        std::make_unique<SimDevice>(d, policy, budget_, options.timeline_step_seconds));
  }
  loads_.resize(devices_.size());
  is_touched_.assign(devices_.size(), 0);
  changed_.assign(devices_.size(), 0);
  for (std::uint32_t i = 0; i < jobs.size(); ++i) check_job(i);
  curves_.resize(jobs.size());
  views_.resize(jobs.size());
  state_.resize(jobs.size());
  result_.jobs.resize(jobs.size());
  for (std::uint32_t i = 0; i < jobs.size(); ++i) prepare(i);
  if (options.record_iterations) {
    std::uint64_t total = 0;
    for (const SimJob& job : jobs) total += job.iterations;
    // A hint only: a huge (or overflowing) count just grows the vector as it goes.
    result_.iterations.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(total, 1 << 24)));
  }
}

void Engine::check_job(std::uint32_t i) const {
  const SimJob& job = jobs_[i];
  if (job.iterations == 0 || !(job.iteration_seconds > 0.0) ||
      !std::isfinite(job.iteration_seconds) || !(job.arrival_seconds >= 0.0) ||
      !std::isfinite(job.arrival_seconds) || !(job.think_seconds >= 0.0) ||
      !std::isfinite(job.think_seconds)) {
    throw InvalidArgument(fmt::format(
        "simulation: job '{}' needs iterations > 0, a finite iteration time > 0 and finite, "
        "non-negative arrival and think times (got {} iterations of {} s, arrival {} s, think "
        "{} s)",
        job.name, job.iterations, job.iteration_seconds, job.arrival_seconds, job.think_seconds));
  }
  check_occupancy(job.occupancy, fmt::format("simulation: job '{}'", job.name));
  if (job.device < -1 || job.device >= static_cast<int>(devices_.size())) {
    throw InvalidArgument(fmt::format(
        "simulation: job '{}' asks for device {}, but the cluster has devices 0..{} (-1: let "
        "placement choose)",
        job.name, job.device, devices_.size() - 1));
  }
  const std::size_t peak = job.curve.peak();
  if (peak > budget_ || job.persistent_bytes > budget_ - peak) {
    throw InvalidArgument(fmt::format(
        "simulation: job '{}' fits no device even alone (persistent {} + ephemeral peak {} "
        "bytes against a budget of {} per device)",
        job.name, job.persistent_bytes, peak, budget_));
  }
}

void Engine::prepare(std::uint32_t i) {
  const SimJob& job = jobs_[i];
  curves_[i] = job.curve;
  curves_[i].duration_seconds = curves_[i].bytes.empty() ? 0.0 : job.iteration_seconds;
  JobView& view = views_[i];
  view.id = JobId{i};  // the cores' ids are indices into the input
  view.kind = job.kind;
  view.priority = job.priority;
  view.expected_iterations = job.iterations;
  view.iteration_seconds = job.iteration_seconds;
  view.persistent_bytes = job.persistent_bytes;
  view.ephemeral_peak_bytes = curves_[i].peak();
  view.curve = curves_[i].known() ? &curves_[i] : nullptr;
  result_.jobs[i].name = job.name;
  result_.jobs[i].arrival_seconds = job.arrival_seconds;
  schedule(job.arrival_seconds, EventKind::arrive, i, job.device);
}

void Engine::schedule(double time, EventKind kind, std::uint32_t job, int device,
                      std::uint32_t generation) {
  queue_.push({time, next_sequence_++, job, generation, device, kind});
}

bool Engine::stale(const Event& event) const {
  return event.kind == EventKind::finish && event.generation != state_[event.job].generation;
}

SimResult Engine::execute() {
  std::size_t events = 0;
  while (!queue_.empty()) {
    const double now = queue_.top().time;
    while (!queue_.empty() && queue_.top().time == now) {
      const Event event = queue_.top();
      queue_.pop();
      if (stale(event)) continue;
      if (++events > options_.max_events) {
        throw InvalidArgument(fmt::format(
            "simulation: more than {} events; the policy does not settle", options_.max_events));
      }
      handle(event, now);
    }
    std::sort(touched_.begin(), touched_.end());
    for (const int d : touched_) settle(d, now);
    for (const int d : touched_) is_touched_[static_cast<std::size_t>(d)] = 0;
    touched_.clear();
  }
  conclude();
  return std::move(result_);
}

void Engine::handle(const Event& event, double now) {
  switch (event.kind) {
    case EventKind::arrive:
      arrive(event.job, now);
      break;
    case EventKind::wake:
      touch(event.device, now);
      ask(event.job, now);
      break;
    case EventKind::recheck:
      touch(event.device, now);  // settle() asks its core again
      break;
    case EventKind::finish:
      finish(event.job, now);
      break;
  }
}

// Accounts the device up to `now` under its old state before anything on it changes, and has it
// settle once the instant's events are all handled.
void Engine::touch(int d, double now) {
  auto& flag = is_touched_[static_cast<std::size_t>(d)];
  if (flag != 0) return;
  flag = 1;
  touched_.push_back(d);
  device(d).account_until(now);
}

int Engine::choose_device(std::uint32_t job) {
  if (jobs_[job].device >= 0) return jobs_[job].device;
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    const SimDevice& dev = *devices_[d];
    loads_[d] = {dev.unfinished, dev.core.committed_bytes(), dev.core.pending_bytes()};
  }
  const std::size_t need = jobs_[job].persistent_bytes + curves_[job].peak();
  return place(placement_, loads_, budget_, need);
}

void Engine::arrive(std::uint32_t job, double now) {
  const int d = choose_device(job);
  touch(d, now);
  SimDevice& dev = device(d);
  state_[job].device = d;
  result_.jobs[job].device = d;
  dev.placed.push_back(job);
  ++dev.unfinished;
  ++dev.result.jobs;
  views_[job].arrival = next_arrival_++;  // registration order
  dev.core.add(views_[job]);
  ask(job, now);
}

void Engine::ask(std::uint32_t job, double now) {
  SimDevice& dev = device(state_[job].device);
  dev.core.wait(JobId{job});
  state_[job].asked = now;
  ++dev.waiting;
}

void Engine::finish(std::uint32_t job, double now) {
  const int d = state_[job].device;
  touch(d, now);
  SimDevice& dev = device(d);
  const RunningIter done = dev.stop(job);
  changed_[static_cast<std::size_t>(d)] = 1;
  dev.core.finish(JobId{job}, now);
  dev.result.work_seconds += done.work;
  if (options_.record_iterations) result_.iterations[done.record].end = now;

  SimJobResult& stats = result_.jobs[job];
  ++stats.iterations;
  stats.attained_seconds += done.wall_seconds(now);
  stats.work_seconds += done.work;
  // The policy sees what the runtime would measure: the wall time its iterations took.
  JobView& view = views_[job];
  view.iterations_done = stats.iterations;
  view.attained_seconds = stats.attained_seconds;
  if (stats.iterations == jobs_[job].iterations) {
    dev.core.remove(JobId{job});
    --dev.unfinished;
    stats.finish_seconds = now;
    return;
  }
  dev.core.update(view);
  if (jobs_[job].think_seconds > 0.0) {
    schedule(now + jobs_[job].think_seconds, EventKind::wake, job, d);
  } else {
    ask(job, now);
  }
}

void Engine::settle(int d, double now) {
  SimDevice& dev = device(d);
  // The plans predict running curves from progress; an iteration slowed by contention is less far
  // along than its wall time says (memory curves follow progress here, see RunningIter).
  for (const RunningIter& it : dev.running()) {
    if (it.slowed) dev.core.progressed(JobId{it.job}, now, it.progress_at(now));
  }
  const Decision decision = dev.core.decide(now);
  for (const Start& start : decision.starts) start_iteration(d, start, now);
  auto& changed = changed_[static_cast<std::size_t>(d)];
  if (changed != 0 || !decision.starts.empty()) {
    dev.rerate(now, model_, [&](const RunningIter& it) {
      const std::uint32_t generation = ++state_[it.job].generation;
      schedule(it.end, EventKind::finish, it.job, d, generation);
    });
  }
  changed = 0;
  dev.result.peak_committed_bytes =
      std::max(dev.result.peak_committed_bytes, dev.core.committed_bytes());
  if (decision.recheck_after_seconds) {
    // The core plans in progress (see progressed() above): its delay is work still to be done by
    // the running iterations, which slowed ones do more slowly. Waking after the same wall time
    // would find them short of it and ask again, ever closer, forever; wake when the fastest of
    // them can have got there (under the built-in models all run at one rate, so this is exact).
    double rate = 0.0;
    for (const RunningIter& it : dev.running()) rate = std::max(rate, it.rate);
    const double delay = *decision.recheck_after_seconds;
    const double at = now + (rate > 0.0 && rate < 1.0 ? delay / rate : delay);
    // One pending recheck is enough: an earlier one re-asks, and re-asking schedules again.
    if (at > now && (dev.next_recheck <= now || at < dev.next_recheck)) {
      dev.next_recheck = at;
      schedule(at, EventKind::recheck, 0, d);
    }
  }
}

void Engine::start_iteration(int d, const Start& start, double now) {
  SimDevice& dev = device(d);
  const std::uint32_t job = start.job.value;
  JobState& js = state_[job];
  SimJobResult& stats = result_.jobs[job];
  const double waited = now - js.asked;
  stats.waiting_seconds += waited;
  stats.max_wait_seconds = std::max(stats.max_wait_seconds, waited);
  if (!js.started) {
    js.started = true;
    stats.first_start_seconds = now;
  }
  --dev.waiting;
  RunningIter it;
  it.job = job;
  it.occupancy = jobs_[job].occupancy;
  it.work = jobs_[job].iteration_seconds;
  it.start = now;
  it.curve = curves_[job].known() ? &curves_[job] : nullptr;
  if (options_.record_iterations) {
    it.record = result_.iterations.size();
    SimIteration record{job, d, start.lane, js.asked, now, now, {}};
    if (options_.record_waiting) {
      for (const std::uint32_t other : dev.placed) {
        if (other != job && dev.core.waiting(JobId{other})) record.others_waiting.push_back(other);
      }
    }
    result_.iterations.push_back(std::move(record));
  }
  dev.start(it);
}

void Engine::conclude() {
  for (std::uint32_t i = 0; i < jobs_.size(); ++i) {
    if (result_.jobs[i].iterations < jobs_[i].iterations) {
      throw InvalidArgument(fmt::format(
          "simulation: job '{}' could never run on device {} (persistent {} + ephemeral peak {} "
          "bytes against a budget of {})",
          jobs_[i].name, state_[i].device, jobs_[i].persistent_bytes, curves_[i].peak(), budget_));
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
  for (const std::unique_ptr<SimDevice>& dev : devices_) {
    dev->finalize(result_.makespan_seconds);
    result_.peak_combined_bytes =
        std::max(result_.peak_combined_bytes, dev->result.peak_combined_bytes);
    result_.peak_committed_bytes =
        std::max(result_.peak_committed_bytes, dev->result.peak_committed_bytes);
    result_.devices.push_back(dev->result);
    if (options_.timeline_step_seconds > 0.0) result_.timelines.push_back(std::move(dev->timeline));
  }
}

}  // namespace

SimResult simulate_cluster(const Policy& policy, const ClusterSpec& cluster,
                           const SimOptions& options, const std::vector<SimJob>& jobs) {
  Engine engine(policy, cluster, options, jobs);
  return engine.execute();
}

}  // namespace salus::sched::detail
