// DecisionCore's state, internal to decision.cpp (the core's calls, admission and accounting)
// and decision_plans.cpp (the plans: which iterations start, under the lane rule, for jobs whose
// memory is not known yet, and as memory-aware extras).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "iteration_sched/decision.hpp"
#include "iteration_sched/memory_offset.hpp"
#include "memory/job_id_format.hpp"
#include "salus/error.hpp"

namespace salus::sched {
namespace decision {

// The policy's key first; among equal keys the job served least recently (0: never), then the
// earliest arrival.
struct WaitKey {
  SortKey key;
  std::uint64_t served = 0;
  std::uint64_t arrival = 0;
  JobId job;
  friend auto operator<=>(const WaitKey&, const WaitKey&) = default;
};

// A job's seat in the decision core: its lane, its place among the waiters, and what the plan
// accounts it for there. Not a record of its bytes: those are the memory manager's
// (memory::JobRecord), and these are copies of the profile the plan last saw, kept so that an
// update can undo them exactly.
struct JobSeat {
  JobView view;       // view.curve points at `curve` (or is null)
  MemoryCurve curve;  // our own copy: the caller's may change or die
  std::optional<int> lane;
  bool waiting = false;
  bool running = false;
  SortKey key;               // valid while waiting
  std::uint64_t served = 0;  // when it last started (State::starts), 0 before its first start
  double started_at = 0.0;   // valid while running
  bool extra = false;        // valid while running: started beside the lanes, not as a turn
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
  int running = 0;             // turns (not extras) running: 0 or 1
  std::optional<JobId> turn;   // whose turn runs now
  std::optional<JobId> owner;  // runs_to_completion: who holds the lane

  [[nodiscard]] std::size_t max_peak() const { return peaks.empty() ? 0 : *peaks.rbegin(); }
  [[nodiscard]] std::size_t quota() const { return persistent + max_peak(); }
};

}  // namespace decision

struct DecisionCore::State {
  using WaitKey = decision::WaitKey;
  using JobSeat = decision::JobSeat;
  using Lane = decision::Lane;

  // Memory-aware plans try at most this many waiting jobs as extras per decide(), so a decision
  // stays cheap however long the queue is.
  static constexpr int kExtraCandidates = 8;

  const Policy& policy;
  const LanePlan plan;
  const bool exclusive;
  const std::size_t budget;

  std::unordered_map<JobId, JobSeat> jobs;
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
  // Admitted waiting jobs whose memory is not known yet (JobSeat::solo), best first: while one
  // waits or runs, nothing else starts, so that it runs alone.
  std::set<WaitKey> solo_waiting;
  int solo_running = 0;
  std::uint64_t starts = 0;  // iterations started so far: the clock of JobSeat::served
  std::vector<RunningIteration> scratch;
  std::vector<HeldFrom> held;
  bool admission_dirty = false;  // memory-aware: pending jobs to retry at the next decide()
  std::size_t headroom = 0;      // see DecisionCore::set_headroom
  std::size_t unowned = 0;       // see DecisionCore::set_unowned

  // What plans may fill: the budget less what the device loses to whole pages and what no job
  // here owns.
  [[nodiscard]] std::size_t usable() const {
    const std::size_t taken = headroom + unowned;
    return budget > taken ? budget - taken : 0;
  }

  State(const Policy& p, std::size_t budget_bytes)
      : policy(p), plan(p.lanes()), exclusive(p.runs_to_completion()), budget(budget_bytes) {}

  JobSeat& find(JobId id, const char* operation) {
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
  static std::size_t resident_of(const JobSeat& rec) {
    return rec.view.memory_resident ? rec.persistent : 0;
  }

  [[nodiscard]] bool none_admitted() const {
    return std::all_of(lanes.begin(), lanes.end(),
                       [](const auto& entry) { return entry.second.members == 0; });
  }

  // Where `rec` would be admitted now, if anywhere.
  std::optional<int> placement(const JobSeat& rec) const {
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
  void enqueue(const JobSeat& rec) {
    lanes.at(*rec.lane).waiting.insert(rec.wait_key());
    if (rec.solo() && concurrent()) {
      solo_waiting.insert(rec.wait_key());
    } else if (plan == LanePlan::memory_aware) {
      waiting_admitted.insert(rec.wait_key());
    }
  }
  void dequeue(const JobSeat& rec) {
    const WaitKey key = rec.wait_key();
    erase_one(lanes.at(*rec.lane).waiting, key);
    erase_one(waiting_admitted, key);
    erase_one(solo_waiting, key);
  }
  // Keys are unique (they end with the job's id): one descent, not erase(key)'s equal_range.
  static void erase_one(std::set<WaitKey>& set, const WaitKey& key) {
    if (const auto it = set.find(key); it != set.end()) set.erase(it);
  }

  // Every caller takes `rec` out of `pending` (admission is the only way out besides remove()).
  void admit(JobSeat& rec, int lane_id) {
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
  void reaccount(JobSeat& rec, std::size_t persistent, std::size_t peak) {
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
  void unadmit(JobSeat& rec) {
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
    std::vector<JobSeat*> movable;
    for (auto& [id, rec] : jobs) {
      if (rec.lane && !rec.running && lanes.at(*rec.lane).owner != id) movable.push_back(&rec);
    }
    std::sort(movable.begin(), movable.end(), [](const JobSeat* a, const JobSeat* b) {
      return a->view.arrival > b->view.arrival;
    });
    for (JobSeat* rec : movable) {
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
      JobSeat& rec = jobs.at(it->second);
      if (const auto lane = placement(rec)) {
        admit(rec, *lane);
        it = pending.erase(it);
      } else {
        ++it;
      }
    }
    // Pending jobs whose resident bytes keep each other out while none is admitted would wait for
    // good: nothing runs, so nothing they wait for changes (found by salus-bench's jct run, whose
    // last three jobs hung). The earliest goes in; if it then runs short, it is the one that
    // fails (memory waits), and the others' turns come after it.
    if (!pending.empty() && none_admitted()) {
      JobSeat& first = jobs.at(pending.begin()->second);
      pending.erase(pending.begin());
      admit(first, plan == LanePlan::single ? 0 : first_free_lane());
    }
  }

  // How much the committed bytes grow if `rec` joins `lane_id`.
  [[nodiscard]] std::size_t growth(const JobSeat& rec, int lane_id) const {
    const auto it = lanes.find(lane_id);
    const std::size_t max_peak = it == lanes.end() ? 0 : it->second.max_peak();
    return rec.persistent + (rec.peak > max_peak ? rec.peak - max_peak : 0);
  }

  // What the device is predicted to hold from now on, outside any extra yet to start: every
  // admitted job's persistent bytes; per lane, the curve of the turn it runs and then its whole
  // ephemeral quota from that turn's predicted end (or at once, when it runs nothing or its turn's
  // end is unknown or overdue); and the curves of the running extras. Returns the bytes held
  // throughout; `scratch` and `held` get the rest.
  std::size_t picture(double now);

  // The picture as the policy sees it: what is held throughout, the running curves, the held
  // lane quotas.
  [[nodiscard]] DeviceView device_view(std::size_t fixed) const;

  // The least delay after which `candidate` fits beside the picture (see least_start_offset).
  [[nodiscard]] std::optional<double> fit_delay(std::size_t fixed, const JobView& candidate) const;

  // How long until `rec` may join `lane_id` beside the running extras. A waiting job that opens
  // a lane takes its first turn at once (decide_lanes runs right after admission), so it needs its
  // persistent bytes and its own curve now and the whole quota only from that turn's predicted
  // end: a newcomer rarely waits for extras that will have fallen by then. Otherwise the growth of
  // the committed bytes is asked for at once, as an endless iteration of that size.
  std::optional<double> admission_delay(const JobSeat& rec, int lane_id, double now);

  // Memory-aware admission at `now`: the lane rule, in the lane rule's order, and the quota it
  // adds held for good beside the extras' curves (asked as an endless iteration of that size).
  // A job that must wait for extras to fall stops admission there, so that no later job takes
  // the memory the lane rule would have given it.
  void admit_pending_beside_extras(double now, Decision& decision);

  static void note_recheck(Decision& decision, double delay);

  void start(JobSeat& rec, double now, bool extra, Decision& decision);

  // A running iteration is over (finished, or its job left).
  void stop(JobSeat& rec);

  // A job whose memory is not known yet runs alone: while one runs nothing starts, and while one
  // waits nothing else starts until it has had its turn. Returns true when the device is held.
  bool decide_solo(double now, Decision& decision);

  // The lane rule: an idle lane starts its first waiting member.
  void decide_lanes(double now, Decision& decision);

  // The memory-aware plan: the lane rule plus extras (why it does not lose to the lane rule: at
  // the definition, decision_plans.cpp).
  void decide_memory_aware(double now, Decision& decision);

  static double predicted_seconds(const JobView& job);
};

}  // namespace salus::sched
