// DecisionCore: admission into lanes, per-lane waiting queues ordered by the policy's key, and
// the bookkeeping of what runs. Every per-boundary operation is a hash lookup plus O(log n) tree
// updates; only admission retries (a job left, or estimates changed) walk the not-yet-admitted
// jobs.
#include "iteration_sched/decision.hpp"

#include <fmt/format.h>

#include <iterator>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

#include "iteration_sched/memory_offset.hpp"
#include "salus/error.hpp"

namespace salus::sched {
namespace {

// Memory-aware plans ask the policy about at most this many waiting jobs per decide(), so a
// decision stays O(log n) however long the queue is.
constexpr int kMemoryAwareCandidates = 8;

struct WaitKey {
  SortKey key;
  std::uint64_t arrival = 0;
  std::uint32_t job = 0;
  friend auto operator<=>(const WaitKey&, const WaitKey&) = default;
};

struct JobRecord {
  JobView view;       // view.curve points at `curve` (or is null)
  MemoryCurve curve;  // our own copy: the caller's may change or die
  std::optional<int> lane;
  bool waiting = false;
  bool running = false;
  SortKey key;              // valid while waiting
  double started_at = 0.0;  // valid while running
  // What the job is accounted for in its lane (kept so that updates can undo it exactly).
  std::size_t persistent = 0;
  std::size_t peak = 0;

  [[nodiscard]] WaitKey wait_key() const { return {key, view.arrival, view.id}; }
};

struct Lane {
  std::size_t persistent = 0;
  std::multiset<std::size_t> peaks;
  std::set<WaitKey> waiting;  // admitted members asking for an iteration, best first
  std::size_t members = 0;
  int running = 0;
  std::optional<std::uint32_t> owner;  // runs_to_completion: who holds the lane

  [[nodiscard]] std::size_t max_peak() const { return peaks.empty() ? 0 : *peaks.rbegin(); }
  [[nodiscard]] std::size_t quota() const { return persistent + max_peak(); }
};

}  // namespace

struct DecisionCore::State {
  const Policy& policy;
  const LanePlan plan;
  const bool exclusive;
  const std::size_t budget;

  std::unordered_map<std::uint32_t, JobRecord> jobs;
  std::map<int, Lane> lanes;
  std::set<std::pair<std::uint64_t, std::uint32_t>> pending;  // not admitted: (arrival, id)
  std::set<int> ready;  // single/packed lanes that can start an iteration now
  std::set<std::uint32_t> running;
  std::size_t committed = 0;         // sum of lane quotas
  std::size_t persistent_total = 0;  // of admitted jobs
  std::vector<RunningIteration> scratch;

  State(const Policy& p, std::size_t budget_bytes)
      : policy(p), plan(p.lanes()), exclusive(p.runs_to_completion()), budget(budget_bytes) {}

  JobRecord& find(std::uint32_t id, const char* operation) {
    const auto it = jobs.find(id);
    if (it == jobs.end()) {
      throw InvalidArgument(
          fmt::format("scheduler: {}() for job {}, which is not registered", operation, id));
    }
    return it->second;
  }

  void refresh(int lane_id) {
    if (plan == LanePlan::memory_aware) return;  // decide() walks the shared queue itself
    const auto it = lanes.find(lane_id);
    bool can_start = false;
    if (it != lanes.end() && it->second.running == 0) {
      const Lane& lane = it->second;
      if (exclusive && lane.owner) {
        can_start = jobs.at(*lane.owner).waiting;
      } else {
        can_start = !lane.waiting.empty();
      }
    }
    if (can_start) {
      ready.insert(lane_id);
    } else {
      ready.erase(lane_id);
    }
  }

  // Where `rec` would be admitted now, if anywhere.
  std::optional<int> placement(const JobRecord& rec) const {
    const std::size_t p = rec.persistent;
    const std::size_t e = rec.peak;
    if (plan != LanePlan::packed) {
      const auto it = lanes.find(0);
      const Lane* lane = it == lanes.end() ? nullptr : &it->second;
      const std::size_t before = lane ? lane->quota() : 0;
      const std::size_t after =
          (lane ? lane->persistent : 0) + p + std::max(lane ? lane->max_peak() : 0, e);
      return committed - before + after <= budget ? std::optional<int>(0) : std::nullopt;
    }
    // Packed: a lane of its own gives the most concurrency; else the lane that grows least.
    if (committed + p + e <= budget) {
      int id = 0;
      for (const auto& entry : lanes) {
        if (entry.first != id) break;
        ++id;
      }
      return id;
    }
    std::optional<int> best;
    std::size_t best_growth = 0;
    for (const auto& [id, lane] : lanes) {
      const std::size_t growth = p + (e > lane.max_peak() ? e - lane.max_peak() : 0);
      if (committed + growth <= budget && (!best || growth < best_growth)) {
        best = id;
        best_growth = growth;
      }
    }
    return best;
  }

  void admit(JobRecord& rec, int lane_id) {
    Lane& lane = lanes[lane_id];
    const std::size_t before = lane.quota();
    lane.persistent += rec.persistent;
    lane.peaks.insert(rec.peak);
    ++lane.members;
    committed = committed - before + lane.quota();
    persistent_total += rec.persistent;
    rec.lane = lane_id;
    if (rec.waiting) lane.waiting.insert(rec.wait_key());
    refresh(lane_id);
  }

  // Changes what an admitted job is accounted for, in place.
  void reaccount(JobRecord& rec, std::size_t persistent, std::size_t peak) {
    Lane& lane = lanes.at(*rec.lane);
    const std::size_t before = lane.quota();
    lane.persistent = lane.persistent - rec.persistent + persistent;
    lane.peaks.erase(lane.peaks.find(rec.peak));
    lane.peaks.insert(peak);
    committed = committed - before + lane.quota();
    persistent_total = persistent_total - rec.persistent + persistent;
    rec.persistent = persistent;
    rec.peak = peak;
  }

  // Takes an admitted, not running job out of its lane (it leaves, or no longer fits).
  void unadmit(JobRecord& rec) {
    const int lane_id = *rec.lane;
    Lane& lane = lanes.at(lane_id);
    const std::size_t before = lane.quota();
    if (rec.waiting) lane.waiting.erase(rec.wait_key());
    lane.persistent -= rec.persistent;
    lane.peaks.erase(lane.peaks.find(rec.peak));
    --lane.members;
    committed = committed - before + lane.quota();
    persistent_total -= rec.persistent;
    if (lane.owner == rec.view.id) lane.owner.reset();
    rec.lane.reset();
    if (lane.members == 0 && plan == LanePlan::packed) lanes.erase(lane_id);
    refresh(lane_id);
  }

  void admit_pending() {
    for (auto it = pending.begin(); it != pending.end();) {
      JobRecord& rec = jobs.at(it->second);
      if (const auto lane = placement(rec)) {
        admit(rec, *lane);
        it = pending.erase(it);
      } else {
        ++it;
      }
    }
  }

  void start(JobRecord& rec, double now, Decision& decision) {
    Lane& lane = lanes.at(*rec.lane);
    lane.waiting.erase(rec.wait_key());
    rec.waiting = false;
    rec.running = true;
    rec.started_at = now;
    ++lane.running;
    if (exclusive && !lane.owner) lane.owner = rec.view.id;
    running.insert(rec.view.id);
    decision.starts.push_back({rec.view.id, *rec.lane});
    refresh(*rec.lane);
  }

  void decide_lanes(double now, Decision& decision) {
    while (!ready.empty()) {
      const int lane_id = *ready.begin();
      const Lane& lane = lanes.at(lane_id);
      const std::uint32_t next = exclusive && lane.owner ? *lane.owner : lane.waiting.begin()->job;
      start(jobs.at(next), now, decision);
    }
  }

  void decide_memory_aware(double now, Decision& decision) {
    const auto lane_it = lanes.find(0);
    if (lane_it == lanes.end()) return;
    Lane& lane = lane_it->second;
    scratch.clear();
    scratch.reserve(running.size() + kMemoryAwareCandidates);
    for (const std::uint32_t id : running) {
      const JobRecord& rec = jobs.at(id);
      scratch.push_back({&rec.view, now - rec.started_at});
    }
    for (int examined = 0; examined < kMemoryAwareCandidates && !lane.waiting.empty(); ++examined) {
      JobRecord& rec = jobs.at(lane.waiting.begin()->job);
      const DeviceView device{budget, persistent_total, scratch};
      const std::optional<double> delay = policy.start_delay(device, rec.view);
      // With nothing running, admission promised that the job fits alone: a policy that says
      // otherwise (estimates moved) must not stall the device forever.
      const bool starts = (delay && *delay <= 0.0) || (!delay && scratch.empty());
      if (!starts) {
        // Later jobs must not overtake it (fairness): wait for the offset or an event.
        if (delay) decision.recheck_after_seconds = *delay;
        return;
      }
      start(rec, now, decision);
      scratch.push_back({&rec.view, 0.0});
    }
  }
};

DecisionCore::DecisionCore(const Policy& policy, std::size_t budget_bytes)
    : state_(std::make_unique<State>(policy, budget_bytes)) {}

DecisionCore::~DecisionCore() = default;

void DecisionCore::add(const JobView& job) {
  State& s = *state_;
  const auto [it, inserted] = s.jobs.try_emplace(job.id);
  if (!inserted)
    throw InvalidArgument(fmt::format("scheduler: job {} is already registered", job.id));
  JobRecord& rec = it->second;
  rec.view = job;
  if (job.curve != nullptr) rec.curve = *job.curve;
  rec.view.curve = job.curve != nullptr ? &rec.curve : nullptr;
  rec.persistent = job.persistent_bytes;
  rec.peak = ephemeral_peak(rec.view);
  if (const auto lane = s.placement(rec)) {
    s.admit(rec, *lane);
  } else {
    s.pending.emplace(job.arrival, job.id);
  }
}

void DecisionCore::update(const JobView& job) {
  State& s = *state_;
  JobRecord& rec = s.find(job.id, "update");
  const std::uint64_t arrival = rec.view.arrival;  // registration order never changes
  const bool requeue = rec.waiting && rec.lane.has_value();
  if (requeue) s.lanes.at(*rec.lane).waiting.erase(rec.wait_key());

  rec.view = job;
  rec.view.arrival = arrival;
  if (job.curve != nullptr && job.curve != &rec.curve) rec.curve = *job.curve;
  if (job.curve == nullptr) rec.curve = MemoryCurve{};
  rec.view.curve = job.curve != nullptr ? &rec.curve : nullptr;
  if (rec.waiting) rec.key = s.policy.key(rec.view);
  if (requeue) s.lanes.at(*rec.lane).waiting.insert(rec.wait_key());

  const std::size_t persistent = job.persistent_bytes;
  const std::size_t peak = ephemeral_peak(rec.view);
  if (persistent == rec.persistent && peak == rec.peak) {
    if (rec.lane) s.refresh(*rec.lane);
    return;
  }
  if (rec.lane) {
    s.reaccount(rec, persistent, peak);
    // Estimates grew past the budget: a job that neither runs nor holds its lane goes back to
    // waiting for admission rather than overcommit the device.
    const Lane& lane = s.lanes.at(*rec.lane);
    if (s.committed > s.budget && !rec.running && lane.owner != job.id) {
      s.unadmit(rec);
      s.pending.emplace(arrival, job.id);
    }
  } else {
    rec.persistent = persistent;
    rec.peak = peak;
  }
  s.admit_pending();
}

void DecisionCore::remove(std::uint32_t job) {
  State& s = *state_;
  JobRecord& rec = s.find(job, "remove");
  if (rec.running) {
    --s.lanes.at(*rec.lane).running;
    s.running.erase(job);
    rec.running = false;
  }
  if (rec.lane) {
    s.unadmit(rec);
  } else {
    s.pending.erase({rec.view.arrival, job});
  }
  s.jobs.erase(job);
  s.admit_pending();
}

void DecisionCore::wait(std::uint32_t job) {
  State& s = *state_;
  JobRecord& rec = s.find(job, "wait");
  if (rec.waiting) throw InvalidArgument(fmt::format("scheduler: job {} is already waiting", job));
  if (rec.running) {
    throw InvalidArgument(
        fmt::format("scheduler: job {} asked for an iteration while one is running", job));
  }
  rec.waiting = true;
  rec.key = s.policy.key(rec.view);
  if (rec.lane) {
    s.lanes.at(*rec.lane).waiting.insert(rec.wait_key());
    s.refresh(*rec.lane);
  }
}

void DecisionCore::finish(std::uint32_t job, double now) {
  State& s = *state_;
  JobRecord& rec = s.find(job, "finish");
  if (!rec.running) {
    throw InvalidArgument(fmt::format("scheduler: finish() for job {}, which is {}", job,
                                      rec.waiting ? "waiting, not running" : "not running"));
  }
  if (now < rec.started_at) {
    throw InvalidArgument(fmt::format(
        "scheduler: job {} finished at {} s, before it started at {} s", job, now, rec.started_at));
  }
  rec.running = false;
  --s.lanes.at(*rec.lane).running;
  s.running.erase(job);
  s.refresh(*rec.lane);
}

Decision DecisionCore::decide(double now) {
  State& s = *state_;
  Decision decision;
  if (s.plan == LanePlan::memory_aware) {
    s.decide_memory_aware(now, decision);
  } else {
    s.decide_lanes(now, decision);
  }
  return decision;
}

bool DecisionCore::admitted(std::uint32_t job) const {
  const auto it = state_->jobs.find(job);
  return it != state_->jobs.end() && it->second.lane.has_value();
}

bool DecisionCore::waiting(std::uint32_t job) const {
  const auto it = state_->jobs.find(job);
  return it != state_->jobs.end() && it->second.waiting;
}

bool DecisionCore::running(std::uint32_t job) const {
  const auto it = state_->jobs.find(job);
  return it != state_->jobs.end() && it->second.running;
}

std::optional<int> DecisionCore::lane_of(std::uint32_t job) const {
  const auto it = state_->jobs.find(job);
  return it == state_->jobs.end() ? std::nullopt : it->second.lane;
}

int DecisionCore::lane_count() const {
  int count = 0;
  for (const auto& entry : state_->lanes) count += entry.second.members > 0 ? 1 : 0;
  return count;
}

std::size_t DecisionCore::committed_bytes() const {
  return state_->committed;
}

const JobView* DecisionCore::view(std::uint32_t job) const {
  const auto it = state_->jobs.find(job);
  return it == state_->jobs.end() ? nullptr : &it->second.view;
}

std::size_t DecisionCore::job_count() const {
  return state_->jobs.size();
}

}  // namespace salus::sched
