// DecisionCore: admission into lanes, per-lane waiting queues ordered by the policy's key, and
// the bookkeeping of what runs. Every per-boundary operation is a hash lookup plus O(log n) tree
// updates; only admission retries (a job left, or estimates changed) walk the not-yet-admitted
// jobs.
#include "iteration_sched/decision.hpp"

#include <fmt/format.h>

#include <iterator>
#include <limits>
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
  bool admission_dirty = false;  // memory-aware: pending jobs to retry at the next decide()

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

  // Under the memory-aware plan running iterations may overlap beyond any quota, so a newcomer's
  // persistent bytes must also fit beside their predicted curves: that needs the clock, so
  // admission waits for decide().
  [[nodiscard]] bool admission_needs_clock() const {
    return plan == LanePlan::memory_aware && !running.empty();
  }

  void admit_pending() {
    if (admission_needs_clock()) {
      admission_dirty = !pending.empty();
      return;
    }
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

  // Memory-aware admission at `now`: the lane rule, and the job's persistent bytes beside what
  // runs for as long as it runs (asked of the policy as an endless iteration of that size).
  void admit_pending_beside_running(Decision& decision) {
    admission_dirty = false;
    for (auto it = pending.begin(); it != pending.end();) {
      JobRecord& rec = jobs.at(it->second);
      if (!placement(rec)) {
        ++it;
        continue;
      }
      JobView resident;
      resident.id = rec.view.id;
      resident.ephemeral_peak_bytes = rec.persistent;
      const DeviceView device{budget, persistent_total, scratch};
      const std::optional<double> delay = policy.start_delay(device, resident);
      if (delay && *delay <= kOffsetTolerance) {
        admit(rec, 0);
        it = pending.erase(it);
        continue;
      }
      admission_dirty = true;  // memory frees as the running curves fall: try again
      if (delay) note_recheck(decision, *delay);
      ++it;
    }
  }

  static void note_recheck(Decision& decision, double delay) {
    if (!decision.recheck_after_seconds || delay < *decision.recheck_after_seconds) {
      decision.recheck_after_seconds = delay;
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
    scratch.clear();
    scratch.reserve(running.size() + kMemoryAwareCandidates);
    for (const std::uint32_t id : running) {
      const JobRecord& rec = jobs.at(id);
      scratch.push_back({&rec.view, now - rec.started_at});
    }
    if (admission_dirty) admit_pending_beside_running(decision);
    const auto lane_it = lanes.find(0);
    if (lane_it == lanes.end()) return;
    Lane& lane = lane_it->second;
    auto next = lane.waiting.begin();
    for (int examined = 0; examined < kMemoryAwareCandidates && next != lane.waiting.end();
         ++examined) {
      JobRecord& rec = jobs.at(next->job);
      ++next;
      const std::optional<double> delay = delay_of(rec);
      // With nothing running, admission promised that the job fits alone: a policy that says
      // otherwise (estimates moved) must not stall the device forever.
      if ((delay && *delay <= kOffsetTolerance) || (!delay && scratch.empty())) {
        start(rec, now, decision);
        scratch.push_back({&rec.view, 0.0});
        continue;
      }
      if (delay) note_recheck(decision, *delay);
      backfill(rec, delay, next, examined, now, decision);
      return;
    }
  }

  std::optional<double> delay_of(const JobRecord& rec) const {
    return policy.start_delay(DeviceView{budget, persistent_total, scratch}, rec.view);
  }

  // The first waiting job (by key) cannot start yet. Later ones may start now only if that does
  // not push its predicted start back (EASY-style backfilling): fairness as before, but memory
  // that would idle until then is used.
  void backfill(const JobRecord& head, std::optional<double> head_delay,
                std::set<WaitKey>::iterator next, int examined, double now, Decision& decision) {
    double running_until = 0.0;  // when every iteration running now is predicted to be over
    for (const RunningIteration& r : scratch) {
      running_until = std::max(running_until, predicted_seconds(*r.job) - r.elapsed_seconds);
    }
    for (++examined; examined < kMemoryAwareCandidates && next != lanes.at(0).waiting.end();
         ++examined) {
      JobRecord& rec = jobs.at(next->job);
      ++next;
      const std::optional<double> delay = delay_of(rec);
      if (!delay || *delay > kOffsetTolerance) continue;
      bool harmless = false;
      if (head_delay) {
        scratch.push_back({&rec.view, 0.0});
        const std::optional<double> after = delay_of(head);
        scratch.pop_back();
        harmless = after && *after <= *head_delay + kOffsetTolerance;
      } else {
        // The head waits for iterations to end; one that ends before them cannot hold it up.
        harmless = predicted_seconds(rec.view) <= running_until;
      }
      if (!harmless) continue;
      start(rec, now, decision);
      scratch.push_back({&rec.view, 0.0});
    }
  }

  static double predicted_seconds(const JobView& job) {
    if (job.curve != nullptr && job.curve->known()) return job.curve->duration_seconds;
    return job.iteration_seconds > 0.0 ? job.iteration_seconds
                                       : std::numeric_limits<double>::infinity();
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
  s.pending.emplace(job.arrival, job.id);
  s.admit_pending();
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
  if (s.plan == LanePlan::memory_aware && !s.pending.empty()) s.admission_dirty = true;
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
