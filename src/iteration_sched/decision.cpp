// DecisionCore: admission into lanes, per-lane waiting queues ordered by the policy's key, and
// the bookkeeping of what runs. Every per-boundary operation is a hash lookup plus O(log n) tree
// updates; only admission retries (a job left, or estimates changed) walk the not-yet-admitted
// jobs. A memory-aware decide() also sums what the lanes and extras hold (O(lanes + extras)) and
// runs the offset search for at most kExtraCandidates waiting jobs.
#include "iteration_sched/decision.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

#include "iteration_sched/memory_offset.hpp"
#include "memory/job_id_format.hpp"
#include "salus/error.hpp"

namespace salus::sched {
namespace {

// Memory-aware plans try at most this many waiting jobs as extras per decide(), so a decision
// stays cheap however long the queue is.
constexpr int kExtraCandidates = 8;

// The policy's key first; among equal keys the job served least recently (0: never), then the
// earliest arrival.
struct WaitKey {
  SortKey key;
  std::uint64_t served = 0;
  std::uint64_t arrival = 0;
  JobId job;
  friend auto operator<=>(const WaitKey&, const WaitKey&) = default;
};

struct JobRecord {
  JobView view;       // view.curve points at `curve` (or is null)
  MemoryCurve curve;  // our own copy: the caller's may change or die
  std::optional<int> lane;
  bool waiting = false;
  bool running = false;
  SortKey key;              // valid while waiting
  std::uint64_t served = 0;  // when it last started (State::starts), 0 before its first start
  double started_at = 0.0;  // valid while running
  bool extra = false;       // valid while running: started beside the lanes, not as a turn
  // What the job is accounted for in its lane (kept so that updates can undo it exactly).
  std::size_t persistent = 0;
  std::size_t peak = 0;

  [[nodiscard]] WaitKey wait_key() const { return {key, served, view.arrival, view.id}; }
  // Runs alone until an iteration has measured its memory (packed and memory-aware plans).
  [[nodiscard]] bool solo() const { return !view.memory_known; }
};

struct Lane {
  std::size_t persistent = 0;
  std::multiset<std::size_t> peaks;
  std::set<WaitKey> waiting;  // admitted members asking for an iteration, best first
  std::size_t members = 0;
  int running = 0;                     // turns (not extras) running: 0 or 1
  std::optional<JobId> turn;           // whose turn runs now
  std::optional<JobId> owner;          // runs_to_completion: who holds the lane

  [[nodiscard]] std::size_t max_peak() const { return peaks.empty() ? 0 : *peaks.rbegin(); }
  [[nodiscard]] std::size_t quota() const { return persistent + max_peak(); }
};

}  // namespace

struct DecisionCore::State {
  const Policy& policy;
  const LanePlan plan;
  const bool exclusive;
  const std::size_t budget;

  std::unordered_map<JobId, JobRecord> jobs;
  std::map<int, Lane> lanes;
  std::set<std::pair<std::uint64_t, JobId>> pending;  // not admitted: (arrival, id)
  std::set<int> ready;  // single/packed lanes that can start an iteration now
  std::set<JobId> running;
  std::size_t committed = 0;         // sum of lane quotas
  std::size_t persistent_total = 0;  // of admitted jobs
  std::size_t pending_total = 0;     // persistent + peak of the pending jobs
  std::size_t pending_resident = 0;  // persistent bytes pending jobs hold already (resident_of)
  // Memory-aware: every admitted waiting job (the extra candidates), and the extras running.
  std::set<WaitKey> waiting_admitted;
  std::set<JobId> extras;
  // Admitted waiting jobs whose memory is not known yet (JobRecord::solo), best first: while one
  // waits or runs, nothing else starts, so that it runs alone.
  std::set<WaitKey> solo_waiting;
  int solo_running = 0;
  std::uint64_t starts = 0;  // iterations started so far: the clock of JobRecord::served
  std::vector<RunningIteration> scratch;
  std::vector<HeldFrom> held;
  bool admission_dirty = false;  // memory-aware: pending jobs to retry at the next decide()
  std::size_t headroom = 0;  // see DecisionCore::set_headroom
  std::size_t unowned = 0;   // see DecisionCore::set_unowned

  // What plans may fill: the budget less what the device loses to whole pages and what no job
  // here owns.
  [[nodiscard]] std::size_t usable() const {
    const std::size_t taken = headroom + unowned;
    return budget > taken ? budget - taken : 0;
  }

  State(const Policy& p, std::size_t budget_bytes)
      : policy(p), plan(p.lanes()), exclusive(p.runs_to_completion()), budget(budget_bytes) {}

  JobRecord& find(JobId id, const char* operation) {
    const auto it = jobs.find(id);
    if (it == jobs.end()) {
      throw InvalidArgument(
          fmt::format("scheduler: {}() for job {}, which is not registered", operation, id));
    }
    return it->second;
  }

  void refresh(int lane_id) {
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

  // What a job holds on the device while it is not admitted (JobView::memory_resident).
  static std::size_t resident_of(const JobRecord& rec) {
    return rec.view.memory_resident ? rec.persistent : 0;
  }

  [[nodiscard]] bool none_admitted() const {
    return std::all_of(lanes.begin(), lanes.end(),
                       [](const auto& entry) { return entry.second.members == 0; });
  }

  // Where `rec` would be admitted now, if anywhere.
  std::optional<int> placement(const JobRecord& rec) const {
    const std::size_t p = rec.persistent;
    const std::size_t e = rec.peak;
    // More than the whole budget (its measured peak grew, or the budget shrank): it can only run
    // alone, so it is admitted only into an empty device rather than left waiting for good.
    if (p > usable() || e > usable() - p) {
      return none_admitted() ? std::optional<int>(plan == LanePlan::single ? 0 : first_free_lane())
                             : std::nullopt;
    }
    // What admitted lanes are committed to, and what the other pending jobs hold already.
    const std::size_t taken = committed + (pending_resident - resident_of(rec));
    if (plan == LanePlan::single) {
      const auto it = lanes.find(0);
      const Lane* lane = it == lanes.end() ? nullptr : &it->second;
      const std::size_t before = lane ? lane->quota() : 0;
      const std::size_t after =
          (lane ? lane->persistent : 0) + p + std::max(lane ? lane->max_peak() : 0, e);
      return taken - before + after <= usable() ? std::optional<int>(0) : std::nullopt;
    }
    // Packed (and the memory-aware backbone): a lane of its own gives the most concurrency; else
    // the lane that grows least.
    if (taken + p + e <= usable()) return first_free_lane();
    std::optional<int> best;
    std::size_t best_growth = 0;
    for (const auto& [id, lane] : lanes) {
      const std::size_t growth = p + (e > lane.max_peak() ? e - lane.max_peak() : 0);
      if (taken + growth <= usable() && (!best || growth < best_growth)) {
        best = id;
        best_growth = growth;
      }
    }
    return best;
  }

  [[nodiscard]] int first_free_lane() const {
    int id = 0;
    for (const auto& entry : lanes) {
      if (entry.first != id) break;
      ++id;
    }
    return id;
  }

  // Whether solo jobs matter: with one lane nothing runs beside anything anyway.
  [[nodiscard]] bool concurrent() const { return plan != LanePlan::single; }

  // A waiting admitted job joins (leaves) its lane's queue and the extra candidates.
  void enqueue(const JobRecord& rec) {
    lanes.at(*rec.lane).waiting.insert(rec.wait_key());
    if (rec.solo() && concurrent()) {
      solo_waiting.insert(rec.wait_key());
    } else if (plan == LanePlan::memory_aware) {
      waiting_admitted.insert(rec.wait_key());
    }
  }
  void dequeue(const JobRecord& rec) {
    lanes.at(*rec.lane).waiting.erase(rec.wait_key());
    waiting_admitted.erase(rec.wait_key());
    solo_waiting.erase(rec.wait_key());
  }

  // Every caller takes `rec` out of `pending` (admission is the only way out besides remove()).
  void admit(JobRecord& rec, int lane_id) {
    pending_total -= rec.persistent + rec.peak;
    pending_resident -= resident_of(rec);
    Lane& lane = lanes[lane_id];
    const std::size_t before = lane.quota();
    lane.persistent += rec.persistent;
    lane.peaks.insert(rec.peak);
    ++lane.members;
    committed = committed - before + lane.quota();
    persistent_total += rec.persistent;
    rec.lane = lane_id;
    if (rec.waiting) enqueue(rec);
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
    if (rec.waiting) dequeue(rec);
    lane.persistent -= rec.persistent;
    lane.peaks.erase(lane.peaks.find(rec.peak));
    --lane.members;
    committed = committed - before + lane.quota();
    persistent_total -= rec.persistent;
    if (lane.owner == rec.view.id) lane.owner.reset();
    rec.lane.reset();
    if (lane.members == 0 && plan != LanePlan::single) lanes.erase(lane_id);
    refresh(lane_id);
  }

  // Under the memory-aware plan extras run in memory the lanes do not hold, so a newcomer's
  // quota must also fit beside their predicted curves: that needs the clock, so admission waits
  // for decide(). With no extra running, admission is the lane rule's alone.
  [[nodiscard]] bool admission_needs_clock() const {
    return plan == LanePlan::memory_aware && !extras.empty();
  }

  // The lanes' quotas and what pending jobs hold already must fit what plans may fill. When they
  // do not (a pending job's resident bytes, grown estimates, more headroom), the admitted jobs
  // that neither run nor hold their lane go back to pending, latest arrival first, until they
  // do; admit_pending then places them again, in fewer lanes.
  void enforce_fit() {
    if (committed + pending_resident <= usable()) return;
    std::vector<JobRecord*> movable;
    for (auto& [id, rec] : jobs) {
      if (rec.lane && !rec.running && lanes.at(*rec.lane).owner != id) movable.push_back(&rec);
    }
    std::sort(movable.begin(), movable.end(), [](const JobRecord* a, const JobRecord* b) {
      return a->view.arrival > b->view.arrival;
    });
    for (JobRecord* rec : movable) {
      if (committed + pending_resident <= usable()) break;
      unadmit(*rec);
      pending.emplace(rec->view.arrival, rec->view.id);
      pending_total += rec->persistent + rec->peak;
      pending_resident += resident_of(*rec);
    }
  }

  void admit_pending() {
    enforce_fit();
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

  // How much the committed bytes grow if `rec` joins `lane_id`.
  [[nodiscard]] std::size_t growth(const JobRecord& rec, int lane_id) const {
    const auto it = lanes.find(lane_id);
    const std::size_t max_peak = it == lanes.end() ? 0 : it->second.max_peak();
    return rec.persistent + (rec.peak > max_peak ? rec.peak - max_peak : 0);
  }

  // What the device is predicted to hold from now on, outside any extra yet to start: every
  // admitted job's persistent bytes; per lane, the curve of the turn it runs and then its whole
  // ephemeral quota from that turn's predicted end (or at once, when it runs nothing or its turn's
  // end is unknown or overdue); and the curves of the running extras. Returns the bytes held
  // throughout; `scratch` and `held` get the rest.
  std::size_t picture(double now) {
    scratch.clear();
    held.clear();
    std::size_t fixed = persistent_total + pending_resident;
    for (const auto& [id, lane] : lanes) {
      if (!lane.turn) {
        fixed += lane.max_peak();
        continue;
      }
      const JobRecord& rec = jobs.at(*lane.turn);
      const double elapsed = now - rec.started_at;
      const double left = predicted_seconds(rec.view) - elapsed;
      if (left > 0.0 && left < std::numeric_limits<double>::infinity()) {
        scratch.push_back({&rec.view, elapsed});
        held.push_back({left, lane.max_peak()});
      } else {
        fixed += lane.max_peak();  // covers the turn itself: it is a member of the lane
      }
    }
    for (const JobId id : extras) {
      const JobRecord& rec = jobs.at(id);
      scratch.push_back({&rec.view, now - rec.started_at});
    }
    return fixed;
  }

  // The picture as the policy sees it: what is held throughout, the running curves, the held
  // lane quotas.
  [[nodiscard]] DeviceView device_view(std::size_t fixed) const {
    return DeviceView{usable(), fixed, scratch, held};
  }

  // The least delay after which `candidate` fits beside the picture (see least_start_offset).
  [[nodiscard]] std::optional<double> fit_delay(std::size_t fixed, const JobView& candidate) const {
    return least_start_offset(device_view(fixed), candidate);
  }

  // How long until `rec` may join `lane_id` beside the running extras. A waiting job that opens
  // a lane takes its first turn at once (decide_lanes runs right after admission), so it needs its
  // persistent bytes and its own curve now and the whole quota only from that turn's predicted
  // end: a newcomer rarely waits for extras that will have fallen by then. Otherwise the growth of
  // the committed bytes is asked for at once, as an endless iteration of that size.
  std::optional<double> admission_delay(const JobRecord& rec, int lane_id, double now) {
    const std::size_t fixed = picture(now) - resident_of(rec);  // its own bytes come below
    const double turn = predicted_seconds(rec.view);
    if (rec.waiting && !lanes.contains(lane_id) && turn < std::numeric_limits<double>::infinity()) {
      held.push_back({turn, rec.peak});
      return least_start_offset(DeviceView{usable(), fixed + rec.persistent, scratch, held},
                                rec.view);
    }
    JobView quota;
    quota.id = rec.view.id;
    quota.ephemeral_peak_bytes = growth(rec, lane_id);
    return fit_delay(fixed, quota);
  }

  // Memory-aware admission at `now`: the lane rule, in the lane rule's order, and the quota it
  // adds held for good beside the extras' curves (asked as an endless iteration of that size).
  // A job that must wait for extras to fall stops admission there, so that no later job takes
  // the memory the lane rule would have given it.
  void admit_pending_beside_extras(double now, Decision& decision) {
    admission_dirty = false;
    for (auto it = pending.begin(); it != pending.end();) {
      JobRecord& rec = jobs.at(it->second);
      const std::optional<int> lane = placement(rec);
      if (!lane) {
        ++it;
        continue;
      }
      const std::optional<double> delay = admission_delay(rec, *lane, now);
      if (!delay || *delay > kOffsetTolerance) {
        admission_dirty = true;  // the extras end or fall: try again then
        if (delay) note_recheck(decision, *delay);
        return;
      }
      admit(rec, *lane);
      it = pending.erase(it);
    }
  }

  static void note_recheck(Decision& decision, double delay) {
    if (!decision.recheck_after_seconds || delay < *decision.recheck_after_seconds) {
      decision.recheck_after_seconds = delay;
    }
  }

  void start(JobRecord& rec, double now, bool extra, Decision& decision) {
    Lane& lane = lanes.at(*rec.lane);
    dequeue(rec);
    rec.waiting = false;
    rec.running = true;
    rec.started_at = now;
    rec.served = ++starts;
    rec.extra = extra;
    if (rec.solo() && concurrent()) ++solo_running;
    if (extra) {
      extras.insert(rec.view.id);
    } else {
      ++lane.running;
      lane.turn = rec.view.id;
    }
    if (exclusive && !lane.owner) lane.owner = rec.view.id;
    running.insert(rec.view.id);
    decision.starts.push_back({rec.view.id, *rec.lane});
    refresh(*rec.lane);
  }

  // A running iteration is over (finished, or its job left).
  void stop(JobRecord& rec) {
    rec.running = false;
    running.erase(rec.view.id);
    if (rec.solo() && concurrent()) --solo_running;
    if (rec.extra) {
      extras.erase(rec.view.id);
      rec.extra = false;
      return;
    }
    Lane& lane = lanes.at(*rec.lane);
    --lane.running;
    lane.turn.reset();
  }

  // A job whose memory is not known yet runs alone: while one runs nothing starts, and while one
  // waits nothing else starts until it has had its turn. Returns true when the device is held.
  bool decide_solo(double now, Decision& decision) {
    if (solo_running > 0) return true;
    if (solo_waiting.empty()) return false;
    if (running.empty()) start(jobs.at(solo_waiting.begin()->job), now, /*extra=*/false, decision);
    return true;
  }

  // The lane rule: an idle lane starts its first waiting member.
  void decide_lanes(double now, Decision& decision) {
    if (concurrent() && decide_solo(now, decision)) return;
    while (!ready.empty()) {
      const int lane_id = *ready.begin();
      const Lane& lane = lanes.at(lane_id);
      const JobId next = exclusive && lane.owner ? *lane.owner : lane.waiting.begin()->job;
      start(jobs.at(next), now, /*extra=*/false, decision);
    }
  }

  // The memory-aware plan is the lane rule plus extras. Why it does not lose to the lane rule:
  // - The lanes (admission, quotas, turns, the order within a lane) are exactly the lane rule's,
  //   and no extra is ever given memory a lane may need for a turn (a lane's quota is lent only
  //   while its running turn's curve is predicted to stay below it), so a turn never waits.
  // - An extra is a further iteration of an admitted job that waits for its lane's turn. It runs
  //   beside the lanes, never instead of a turn, and its work is work the lane no longer has to
  //   do: a lane's jobs finish no later than the lane rule would have finished them.
  // - What is left: extras may also use memory no lane holds yet, so a newcomer whose quota does
  //   not fit beside them waits, at most until they end (admission_delay keeps that rare); and
  //   jobs that leave earlier meet the lane rule's greedy admission in a different state.
  // So "never slower" is checked on random trials (tests/test_scheduler_simulation.cpp), not a
  // theorem: no loss over seeds 1..1000, 5 losses of at most 0.6% over seeds 1..5000. Lending
  // extras only the lanes' unused quota removes the admission wait but loses more (worst 0.955)
  // and gains far less (mean 1.04 instead of 1.28).
  //
  // When an extra may start is the policy's answer (Policy::start_delay over the picture: the
  // same question as the offset search, which is what the built-in "memory_aware" answers with),
  // so a custom memory-aware policy can start extras earlier, later or never. Admission stays the
  // lane rule's own (admission_delay), whatever the policy.
  void decide_memory_aware(double now, Decision& decision) {
    if (admission_dirty) admit_pending_beside_extras(now, decision);
    decide_lanes(now, decision);
    if (solo_running > 0 || !solo_waiting.empty()) return;  // a solo job holds the device
    const std::size_t fixed = picture(now);
    const std::size_t extras_budget = usable();
    auto next = waiting_admitted.begin();
    for (int examined = 0; examined < kExtraCandidates && next != waiting_admitted.end();
         ++examined) {
      JobRecord& rec = jobs.at(next->job);
      ++next;  // before start() erases it
      const std::optional<double> delay = policy.start_delay(
          DeviceView{extras_budget, fixed, scratch, held}, rec.view);
      if (delay && *delay <= kOffsetTolerance) {
        start(rec, now, /*extra=*/true, decision);
        scratch.push_back({&rec.view, 0.0});
      } else if (delay && std::isfinite(*delay)) {  // a custom policy's +inf or NaN: not now
        note_recheck(decision, *delay);
      }
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
  s.pending_total += rec.persistent + rec.peak;
  s.pending_resident += State::resident_of(rec);
  s.admit_pending();
}

void DecisionCore::update(const JobView& job) {
  State& s = *state_;
  JobRecord& rec = s.find(job.id, "update");
  const std::uint64_t arrival = rec.view.arrival;  // registration order never changes
  const bool requeue = rec.waiting && rec.lane.has_value();
  if (requeue) s.dequeue(rec);
  if (rec.running && s.concurrent()) s.solo_running -= rec.solo() ? 1 : 0;
  if (!rec.lane) s.pending_resident -= State::resident_of(rec);  // added back below

  rec.view = job;
  rec.view.arrival = arrival;
  if (job.curve != nullptr && job.curve != &rec.curve) rec.curve = *job.curve;
  if (job.curve == nullptr) rec.curve = MemoryCurve{};
  rec.view.curve = job.curve != nullptr ? &rec.curve : nullptr;
  if (rec.waiting) rec.key = s.policy.key(rec.view);
  if (requeue) s.enqueue(rec);
  if (rec.running && s.concurrent()) s.solo_running += rec.solo() ? 1 : 0;

  const std::size_t persistent = job.persistent_bytes;
  const std::size_t peak = ephemeral_peak(rec.view);
  if (persistent == rec.persistent && peak == rec.peak) {
    if (rec.lane) {
      s.refresh(*rec.lane);
    } else {
      s.pending_resident += State::resident_of(rec);
    }
    return;
  }
  if (rec.lane) {
    s.reaccount(rec, persistent, peak);
    // Estimates grew past the budget: a job that neither runs nor holds its lane goes back to
    // waiting for admission rather than overcommit the device.
    const Lane& lane = s.lanes.at(*rec.lane);
    if (s.committed > s.usable() && !rec.running && lane.owner != job.id) {
      s.unadmit(rec);
      s.pending.emplace(arrival, job.id);
      s.pending_total += rec.persistent + rec.peak;
      s.pending_resident += State::resident_of(rec);
    }
  } else {
    s.pending_total = s.pending_total - (rec.persistent + rec.peak) + (persistent + peak);
    rec.persistent = persistent;
    rec.peak = peak;
    s.pending_resident += State::resident_of(rec);
  }
  s.admit_pending();
}

void DecisionCore::remove(JobId job) {
  State& s = *state_;
  JobRecord& rec = s.find(job, "remove");
  if (rec.running) s.stop(rec);
  if (rec.lane) {
    s.unadmit(rec);
  } else {
    s.pending.erase({rec.view.arrival, job});
    s.pending_total -= rec.persistent + rec.peak;
    s.pending_resident -= State::resident_of(rec);
  }
  s.jobs.erase(job);
  s.admit_pending();
}

void DecisionCore::wait(JobId job) {
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
    s.enqueue(rec);
    s.refresh(*rec.lane);
  }
}

void DecisionCore::withdraw(JobId job) {
  State& s = *state_;
  JobRecord& rec = s.find(job, "withdraw");
  if (!rec.waiting) throw InvalidArgument(fmt::format("scheduler: job {} is not waiting", job));
  if (rec.lane) s.dequeue(rec);  // by its key, which is valid while it waits
  rec.waiting = false;
  if (rec.lane) s.refresh(*rec.lane);  // an exclusive lane's owner no longer makes it ready
}

void DecisionCore::finish(JobId job, double now) {
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
  s.stop(rec);
  s.refresh(*rec.lane);
  if (s.plan == LanePlan::memory_aware && !s.pending.empty()) s.admission_dirty = true;
}

void DecisionCore::progressed(JobId job, double now, double work_seconds) {
  JobRecord& rec = state_->find(job, "progressed");
  if (!rec.running) return;
  // The plans read progress as now - started_at: move the start so that it reads work_seconds.
  // Later only, so finish() still sees an iteration that ended after it started.
  const double elapsed = now - rec.started_at;
  rec.started_at = now - std::clamp(work_seconds, 0.0, std::max(elapsed, 0.0));
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

bool DecisionCore::admitted(JobId job) const {
  const auto it = state_->jobs.find(job);
  return it != state_->jobs.end() && it->second.lane.has_value();
}

bool DecisionCore::waiting(JobId job) const {
  const auto it = state_->jobs.find(job);
  return it != state_->jobs.end() && it->second.waiting;
}

bool DecisionCore::running(JobId job) const {
  const auto it = state_->jobs.find(job);
  return it != state_->jobs.end() && it->second.running;
}

std::optional<int> DecisionCore::lane_of(JobId job) const {
  const auto it = state_->jobs.find(job);
  return it == state_->jobs.end() ? std::nullopt : it->second.lane;
}

void DecisionCore::set_headroom(std::size_t bytes) {
  if (state_->headroom == bytes) return;
  state_->headroom = bytes;
  state_->admit_pending();  // admitted jobs may no longer fit, or pending ones may now
}

void DecisionCore::set_unowned(std::size_t bytes) {
  if (state_->unowned == bytes) return;
  state_->unowned = bytes;
  state_->admit_pending();
}

std::size_t DecisionCore::running_count() const {
  return state_->running.size();
}

std::optional<JobId> DecisionCore::next_in_lane(int lane) const {
  const auto it = state_->lanes.find(lane);
  if (it == state_->lanes.end() || it->second.waiting.empty()) return std::nullopt;
  // A lane held to completion runs only its owner until the owner leaves.
  if (state_->exclusive && it->second.owner) {
    const JobId owner = *it->second.owner;
    return state_->jobs.at(owner).waiting ? std::optional(owner) : std::nullopt;
  }
  return it->second.waiting.begin()->job;
}

int DecisionCore::lane_count() const {
  int count = 0;
  for (const auto& entry : state_->lanes) count += entry.second.members > 0 ? 1 : 0;
  return count;
}

std::size_t DecisionCore::committed_bytes() const {
  return state_->committed;
}

std::size_t DecisionCore::persistent_bytes() const {
  return state_->persistent_total;
}

std::size_t DecisionCore::pending_bytes() const {
  return state_->pending_total;
}

const JobView* DecisionCore::view(JobId job) const {
  const auto it = state_->jobs.find(job);
  return it == state_->jobs.end() ? nullptr : &it->second.view;
}

std::size_t DecisionCore::job_count() const {
  return state_->jobs.size();
}

}  // namespace salus::sched
