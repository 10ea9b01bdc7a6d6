// DecisionCore driven by hand: admission into lanes, start order per policy, exclusive lanes,
// withdrawn waits, memory-aware overlap, re-keying and re-accounting on update, and bad
// transitions.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "iteration_sched/decision.hpp"
#include "salus/error.hpp"
#include "salus/scheduler.hpp"

namespace salus::sched {
namespace {

JobView job(std::uint32_t id, std::size_t persistent, std::size_t peak) {
  JobView view;
  view.id = JobId{id};
  view.arrival = id;
  view.persistent_bytes = persistent;
  view.ephemeral_peak_bytes = peak;
  view.iteration_seconds = 1.0;
  return view;
}

std::vector<std::uint32_t> started(const Decision& decision) {
  std::vector<std::uint32_t> ids;
  for (const Start& s : decision.starts) ids.push_back(s.job.value);
  return ids;
}

class DecisionCoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<Policy> policy(const char* name) { return registry_.make(name); }

 private:
  PolicyRegistry registry_ = PolicyRegistry::with_builtins();
};

using Ids = std::vector<std::uint32_t>;

TEST_F(DecisionCoreTest, SingleLaneSharesOneEphemeralRegionAndTakesTurns) {
  const auto fair = policy("fair");
  DecisionCore core(*fair, 100);
  core.add(job(1, 10, 30));
  core.add(job(2, 20, 40));
  core.add(job(3, 5, 10));
  EXPECT_EQ(core.lane_count(), 1);
  EXPECT_EQ(core.committed_bytes(), 10u + 20 + 5 + 40);
  for (std::uint32_t id : {1, 2, 3}) {
    EXPECT_TRUE(core.admitted(JobId{id}));
    EXPECT_EQ(core.lane_of(JobId{id}), 0);
    core.wait(JobId{id});
  }
  EXPECT_EQ(started(core.decide(0.0)), Ids{1});
  EXPECT_TRUE(core.running(JobId{1}));
  EXPECT_TRUE(core.decide(0.1).starts.empty());  // the lane is busy
  JobView one = *core.view(JobId{1});
  one.attained_seconds = 1.0;
  core.update(one);
  core.finish(JobId{1}, 1.0);
  core.wait(JobId{1});
  EXPECT_EQ(started(core.decide(1.0)), Ids{2});  // least attained, ties by arrival
  core.finish(JobId{2}, 2.0);
  EXPECT_EQ(started(core.decide(2.0)), Ids{3});
  EXPECT_FALSE(core.waiting(JobId{3}));
  EXPECT_TRUE(core.waiting(JobId{1}));
}

TEST_F(DecisionCoreTest, JobThatDoesNotFitWaitsAndIsAdmittedWhenAnotherLeaves) {
  const auto fair = policy("fair");
  DecisionCore core(*fair, 100);
  core.add(job(1, 40, 30));
  core.add(job(2, 40, 10));  // 80 + 30 > 100
  core.add(job(3, 10, 20));  // 50 + 30 <= 100: later but small, admitted
  EXPECT_TRUE(core.admitted(JobId{1}));
  EXPECT_FALSE(core.admitted(JobId{2}));
  EXPECT_TRUE(core.admitted(JobId{3}));
  EXPECT_LE(core.committed_bytes(), 100u);
  core.wait(JobId{2});
  EXPECT_TRUE(core.waiting(JobId{2}));
  EXPECT_FALSE(core.lane_of(JobId{2}).has_value());
  EXPECT_TRUE(core.decide(0.0).starts.empty());  // only the unadmitted job waits
  core.remove(JobId{1});
  EXPECT_TRUE(core.admitted(JobId{2}));
  EXPECT_EQ(core.committed_bytes(), 40u + 10 + 20);
  EXPECT_EQ(started(core.decide(0.0)), Ids{2});
  EXPECT_EQ(core.job_count(), 2u);
}

// Two pending jobs whose weights are resident keep each other out (each fits alone, not beside
// the other's weights). Once the admitted job leaves, nothing would ever change for them: the
// earliest is admitted and starts (salus-bench's jct run hung here, its last jobs waiting for
// good), under every lane plan.
TEST_F(DecisionCoreTest, PendingJobsThatKeepEachOtherOutDoNotWaitForGoodOnAnEmptyDevice) {
  for (const char* name : {"fair", "fifo", "pack", "memory_aware"}) {
    SCOPED_TRACE(name);
    const auto p = policy(name);
    DecisionCore core(*p, 100);
    const auto resident = [](JobView v) {
      v.memory_resident = true;
      return v;
    };
    core.add(resident(job(1, 10, 30)));
    core.add(resident(job(2, 35, 60)));  // fits alone (95), not beside job 1 or job 3's weights
    core.add(resident(job(3, 35, 60)));
    EXPECT_TRUE(core.admitted(JobId{1}));
    EXPECT_FALSE(core.admitted(JobId{2}));
    EXPECT_FALSE(core.admitted(JobId{3}));
    core.wait(JobId{2});
    core.wait(JobId{3});
    core.remove(JobId{1});
    EXPECT_TRUE(core.admitted(JobId{2})) << "the earliest pending job goes in";
    EXPECT_FALSE(core.admitted(JobId{3}));
    EXPECT_EQ(started(core.decide(0.0)), Ids{2});
    core.finish(JobId{2}, 1.0);
    core.remove(JobId{2});
    EXPECT_TRUE(core.admitted(JobId{3}));
    EXPECT_EQ(started(core.decide(1.0)), Ids{3});
  }
}

TEST_F(DecisionCoreTest, PackedOpensLanesWhileTheyFitThenJoinsTheLeastGrowingLane) {
  const auto pack = policy("pack");
  DecisionCore core(*pack, 100);
  core.add(job(1, 10, 30));  // lane 0: 40
  core.add(job(2, 10, 20));  // lane 1: 30
  EXPECT_EQ(core.lane_count(), 2);
  core.add(job(3, 5, 25));  // a lane would need 30 (total 100 ok)
  EXPECT_EQ(core.lane_count(), 3);
  EXPECT_EQ(core.committed_bytes(), 100u);
  core.remove(JobId{3});
  core.add(job(4, 5, 28));  // own lane: 103 > 100; lane 0 grows by 5, lane 1 by 13
  EXPECT_EQ(core.lane_of(JobId{4}), 0);
  EXPECT_EQ(core.committed_bytes(), 75u);
  core.add(job(5, 30, 10));  // every option exceeds 100
  EXPECT_FALSE(core.admitted(JobId{5}));
  EXPECT_LE(core.committed_bytes(), 100u);

  for (std::uint32_t id : {1, 2, 4}) core.wait(JobId{id});
  const Decision first = core.decide(0.0);
  EXPECT_EQ(started(first), (Ids{1, 2}));  // lanes run concurrently, one job each
  core.finish(JobId{1}, 1.0);
  EXPECT_EQ(started(core.decide(1.0)), Ids{4});
  EXPECT_EQ(core.decide(1.0).starts.size(), 0u);
}

TEST_F(DecisionCoreTest, FifoOwnerKeepsTheLaneUntilItLeaves) {
  const auto fifo = policy("fifo");
  DecisionCore core(*fifo, 100);
  core.add(job(1, 10, 10));
  core.add(job(2, 10, 10));
  core.wait(JobId{2});
  core.wait(JobId{1});
  EXPECT_EQ(started(core.decide(0.0)), Ids{1});
  core.finish(JobId{1}, 1.0);
  // Job 1 is between iterations (thinking): job 2 must not take the device.
  EXPECT_TRUE(core.decide(1.0).starts.empty());
  core.wait(JobId{1});
  EXPECT_EQ(started(core.decide(1.5)), Ids{1});
  core.finish(JobId{1}, 2.0);
  core.remove(JobId{1});
  EXPECT_EQ(started(core.decide(2.0)), Ids{2});
}

// withdraw(): a waiting job leaves its lane's queue (its caller stopped waiting) and keeps its
// admission; the lane's next turn goes to the others, exclusive lanes included.
TEST_F(DecisionCoreTest, WithdrawnJobLeavesTheQueueKeepsItsLaneAndMayWaitAgain) {
  const auto fair = policy("fair");
  DecisionCore core(*fair, 100);
  for (std::uint32_t id : {1, 2, 3}) core.add(job(id, 10, 10));
  for (std::uint32_t id : {1, 2, 3}) core.wait(JobId{id});
  EXPECT_EQ(started(core.decide(0.0)), Ids{1});
  core.withdraw(JobId{2});  // next in line by arrival, but it stopped waiting
  EXPECT_FALSE(core.waiting(JobId{2}));
  EXPECT_TRUE(core.admitted(JobId{2})) << "withdrawing keeps the job's lane";
  EXPECT_EQ(core.lane_of(JobId{2}), 0);
  EXPECT_EQ(core.next_in_lane(0), JobId{3});
  core.finish(JobId{1}, 1.0);
  EXPECT_EQ(started(core.decide(1.0)), Ids{3});
  core.wait(JobId{2});
  core.finish(JobId{3}, 2.0);
  EXPECT_EQ(started(core.decide(2.0)), Ids{2});
  EXPECT_EQ(core.committed_bytes(), 3u * 10 + 10) << "the accounting did not move";
}

TEST_F(DecisionCoreTest, WithdrawnLastWaiterLeavesTheLaneIdle) {
  const auto fair = policy("fair");
  DecisionCore core(*fair, 100);
  core.add(job(1, 10, 10));
  core.wait(JobId{1});
  core.withdraw(JobId{1});
  EXPECT_TRUE(core.decide(0.0).starts.empty());
  EXPECT_FALSE(core.next_in_lane(0).has_value());
}

TEST_F(DecisionCoreTest, WithdrawWorksForAJobNotAdmittedYet) {
  const auto fair = policy("fair");
  DecisionCore core(*fair, 100);
  core.add(job(1, 60, 10));
  core.add(job(2, 60, 10));  // does not fit beside job 1
  ASSERT_FALSE(core.admitted(JobId{2}));
  core.wait(JobId{2});
  core.withdraw(JobId{2});
  EXPECT_FALSE(core.waiting(JobId{2}));
  core.remove(JobId{1});
  EXPECT_TRUE(core.admitted(JobId{2}));
  EXPECT_TRUE(core.decide(0.0).starts.empty()) << "admitted, but it does not ask for a turn";
}

TEST_F(DecisionCoreTest, WithdrawnExclusiveOwnerKeepsItsLane) {
  const auto fifo = policy("fifo");
  DecisionCore core(*fifo, 100);
  core.add(job(1, 10, 10));
  core.add(job(2, 10, 10));
  core.wait(JobId{1});
  core.wait(JobId{2});
  EXPECT_EQ(started(core.decide(0.0)), Ids{1});
  core.finish(JobId{1}, 1.0);
  core.wait(JobId{1});
  core.withdraw(JobId{1});
  EXPECT_TRUE(core.decide(1.0).starts.empty()) << "fifo: the owner holds the lane until it leaves";
  core.withdraw(JobId{2});
  core.remove(JobId{1});
  EXPECT_TRUE(core.decide(2.0).starts.empty()) << "job 2 no longer waits";
  core.wait(JobId{2});
  EXPECT_EQ(started(core.decide(2.0)), Ids{2});
}

// The memory-aware plan also keeps every waiting job as an extra candidate: withdrawing leaves
// that set too, or decide() would start a job that no longer asks.
TEST_F(DecisionCoreTest, WithdrawnJobStartsNeitherAsTurnNorAsExtraUnderMemoryAware) {
  const auto aware = policy("memory_aware");
  DecisionCore core(*aware, 100);
  core.add(job(1, 10, 10));
  core.add(job(2, 10, 10));
  core.wait(JobId{1});
  EXPECT_EQ(started(core.decide(0.0)), Ids{1});
  core.wait(JobId{2});
  core.withdraw(JobId{2});
  EXPECT_TRUE(core.decide(0.1).starts.empty());
  core.wait(JobId{2});
  EXPECT_EQ(core.decide(0.2).starts.size(), 1u) << "waiting again, it is a candidate again";
}

TEST_F(DecisionCoreTest, OnlyAWaitingJobMayWithdraw) {
  const auto fair = policy("fair");
  DecisionCore core(*fair, 100);
  EXPECT_THROW(core.withdraw(JobId{9}), InvalidArgument) << "unknown";
  core.add(job(1, 10, 10));
  EXPECT_THROW(core.withdraw(JobId{1}), InvalidArgument) << "idle";
  core.wait(JobId{1});
  EXPECT_EQ(started(core.decide(0.0)), Ids{1});
  EXPECT_THROW(core.withdraw(JobId{1}), InvalidArgument) << "running: finish() ends it";
  EXPECT_TRUE(core.running(JobId{1}));
}

TEST_F(DecisionCoreTest, SrtfStartsTheLeastRemainingAndUpdateReKeys) {
  const auto srtf = policy("srtf");
  DecisionCore core(*srtf, 1000);
  for (std::uint32_t id = 1; id <= 4; ++id) {
    JobView view = job(id, 1, 1);
    view.expected_iterations = 10 * id;
    core.add(view);
    core.wait(JobId{id});
  }
  JobView unknown = job(5, 1, 1);
  unknown.iteration_seconds = 0.0;
  core.add(unknown);
  core.wait(JobId{5});
  JobView three = *core.view(JobId{3});
  three.iterations_done = 29;  // one iteration left: now the shortest
  core.update(three);
  EXPECT_EQ(started(core.decide(0.0)), Ids{3});
  core.finish(JobId{3}, 1.0);
  EXPECT_EQ(started(core.decide(1.0)), Ids{1});
  std::uint32_t current = 1;
  double now = 1.0;
  for (std::uint32_t expected : {2u, 4u, 5u}) {  // 5's length is unknown: last
    now += 1.0;
    core.finish(JobId{current}, now);
    EXPECT_EQ(started(core.decide(now)), Ids{expected});
    current = expected;
  }
}

TEST_F(DecisionCoreTest, MemoryAwareOverlapsComplementaryCurvesAndSaysWhenToRecheck) {
  const auto aware = policy("memory_aware");
  const MemoryCurve rising{4.0, {10, 20, 40, 60}};
  const MemoryCurve early{1.0, {50}};
  DecisionCore core(*aware, 100);
  JobView a = job(1, 10, 0);
  a.curve = &rising;
  JobView b = job(2, 10, 0);
  b.curve = &early;
  JobView c = job(3, 10, 0);
  c.curve = &early;
  core.add(a);
  core.add(b);
  core.add(c);
  // The lane rule: job 1 opens lane 0 (70); jobs 2 and 3 do not fit lanes of their own and join
  // it, growing only its persistent bytes.
  EXPECT_EQ(core.committed_bytes(), 30u + 60);
  EXPECT_EQ(core.lane_count(), 1);
  for (std::uint32_t id : {1, 2, 3}) core.wait(JobId{id});
  // Job 1 takes the lane's turn; job 2 fits beside its rising curve as an extra (30+10+50). Job
  // 3 needs the others at <= 20 for a whole second: [1, 2), once job 2 has ended and before job 1
  // rises to 40.
  const Decision first = core.decide(0.0);
  EXPECT_EQ(started(first), (Ids{1, 2}));
  ASSERT_TRUE(first.recheck_after_seconds.has_value());
  EXPECT_NEAR(*first.recheck_after_seconds, 1.0, 1e-6);
  core.finish(JobId{2}, 1.0);
  // At 1 s job 1 is at 20: 30+20+50 = 100 fits for [1, 2), but at 2 s job 1 rises to 40.
  // Job 3 (1 s long) fits exactly in [1, 2).
  EXPECT_EQ(started(core.decide(1.0)), Ids{3});
  core.finish(JobId{3}, 2.0);
  core.wait(JobId{2});
  // Job 1 is now at 40 then 60: job 2 needs 30+50+x <= 100, x <= 20: only after job 1 ends,
  // when it takes the lane's turn.
  const Decision later = core.decide(2.0);
  EXPECT_TRUE(later.starts.empty());
  core.finish(JobId{1}, 4.0);
  EXPECT_EQ(started(core.decide(4.0)), Ids{2});
}

// A memory-aware policy that answers the start-offset question its own way (a fixed answer the
// test sets), and remembers what the core showed it.
class FixedDelayPolicy final : public Policy {
 public:
  std::string_view name() const override { return "fixed_delay"; }
  SortKey key(const JobView& job) const override { return {static_cast<double>(job.arrival), 0.0}; }
  LanePlan lanes() const override { return LanePlan::memory_aware; }
  std::optional<double> start_delay(const DeviceView& device,
                                    const JobView& candidate) const override {
    asked.push_back(candidate.id);
    running = device.running.size();
    held.assign(device.held.begin(), device.held.end());
    return delay;
  }

  std::optional<double> delay;
  mutable std::vector<JobId> asked;
  mutable std::size_t running = 0;
  mutable std::vector<HeldFrom> held;
};

TEST_F(DecisionCoreTest, MemoryAwareExtrasStartWhenThePolicysStartDelaySays) {
  FixedDelayPolicy custom;
  const MemoryCurve rising{4.0, {10, 20, 40, 60}};
  const MemoryCurve early{1.0, {50}};
  DecisionCore core(custom, 100);
  JobView a = job(1, 10, 0);
  a.curve = &rising;
  JobView b = job(2, 10, 0);
  b.curve = &early;
  core.add(a);
  core.add(b);  // joins lane 0, as under "memory_aware" (which starts it at once as an extra)
  ASSERT_EQ(core.lane_count(), 1);
  core.wait(JobId{1});
  core.wait(JobId{2});

  // The policy says "not before an iteration ends": job 2 waits for the lane's turn.
  custom.delay = std::nullopt;
  const Decision never = core.decide(0.0);
  EXPECT_EQ(started(never), Ids{1});
  EXPECT_FALSE(never.recheck_after_seconds.has_value());
  EXPECT_EQ(custom.asked, std::vector<JobId>{JobId{2}});
  // The policy saw job 1's turn running and lane 0's quota (its largest peak, 60) held from that
  // turn's predicted end on.
  EXPECT_EQ(custom.running, 1u);
  ASSERT_EQ(custom.held.size(), 1u);
  EXPECT_NEAR(custom.held[0].from_seconds, 4.0, 1e-9);
  EXPECT_EQ(custom.held[0].bytes, 60u);

  // A positive answer is when the core asks again.
  custom.delay = 0.5;
  const Decision later = core.decide(0.0);
  EXPECT_TRUE(later.starts.empty());
  ASSERT_TRUE(later.recheck_after_seconds.has_value());
  EXPECT_DOUBLE_EQ(*later.recheck_after_seconds, 0.5);

  // Zero: it starts now, beside the lane's turn.
  custom.delay = 0.0;
  EXPECT_EQ(started(core.decide(0.5)), Ids{2});
  EXPECT_TRUE(core.running(JobId{1}));
  EXPECT_TRUE(core.running(JobId{2}));
  ASSERT_EQ(custom.held.size(), 1u);
  EXPECT_NEAR(custom.held[0].from_seconds, 3.5, 1e-9);
}

TEST_F(DecisionCoreTest, MemoryAwareExtrasNeverUseALaneQuotaPastItsTurn) {
  const auto aware = policy("memory_aware");
  const MemoryCurve falling{2.0, {60, 10}};
  const MemoryCurve heavy_start{1.0, {50}};
  const MemoryCurve tiny{1.0, {1}};
  const MemoryCurve late_bulk{2.0, {5, 45}};
  DecisionCore core(*aware, 100);
  JobView a = job(1, 0, 0);
  a.curve = &falling;
  JobView b = job(2, 0, 0);
  b.curve = &heavy_start;
  JobView c = job(3, 0, 0);
  c.curve = &late_bulk;  // fits beside job 1's turn, but would run on past its end
  JobView d = job(4, 0, 0);
  d.curve = &tiny;
  for (const JobView& view : {a, b, c, d}) core.add(view);
  // The lane rule: jobs 2 and 3 do not fit lanes of their own (60 + 50, 60 + 45 > 100) and join
  // lane 0; job 4 opens lane 1.
  EXPECT_EQ(core.lane_count(), 2);
  EXPECT_EQ(core.lane_of(JobId{4}), 1);
  core.wait(JobId{1});
  EXPECT_EQ(started(core.decide(0.0)), Ids{1});
  for (std::uint32_t id : {2, 3, 4}) core.wait(JobId{id});
  // Job 4 takes lane 1's turn. Job 2 fits beside job 1 once it falls to 10 at 1 s: 0.75 s from
  // now. Job 3 never fits as an extra: from 2 s on, lane 0 holds its whole quota (60) for its
  // next turn.
  const Decision first = core.decide(0.25);
  ASSERT_TRUE(first.recheck_after_seconds.has_value());
  EXPECT_NEAR(*first.recheck_after_seconds, 0.75, 1e-6);
  EXPECT_EQ(started(first), Ids{4});
  EXPECT_TRUE(core.waiting(JobId{3}));
  EXPECT_EQ(started(core.decide(0.25 + *first.recheck_after_seconds)), Ids{2});
  EXPECT_TRUE(core.waiting(JobId{3}));
  core.finish(JobId{4}, 1.25);
  EXPECT_TRUE(core.decide(1.25).starts.empty());
  core.finish(JobId{2}, 2.0);
  core.finish(JobId{1}, 2.0);
  // Job 3 runs as the lane's turn, the first waiting member in the lane rule's order.
  EXPECT_EQ(started(core.decide(2.0)), Ids{3});
}

TEST_F(DecisionCoreTest, MemoryAwareAdmissionWaitsForExtrasToLeaveRoom) {
  const auto aware = policy("memory_aware");
  const MemoryCurve falling{2.0, {60, 10}};
  const MemoryCurve bulk{1.0, {55}};
  const MemoryCurve small{1.0, {40}};
  DecisionCore core(*aware, 100);
  JobView a = job(1, 0, 0);
  a.curve = &falling;
  JobView b = job(2, 0, 0);
  b.curve = &bulk;
  JobView c = job(3, 0, 0);
  c.curve = &small;
  core.add(a);
  core.add(b);  // 60 + 55 > 100: joins lane 0
  EXPECT_EQ(core.committed_bytes(), 60u);
  core.wait(JobId{1});
  core.wait(JobId{2});
  const Decision first = core.decide(0.0);
  EXPECT_EQ(started(first), Ids{1});
  ASSERT_TRUE(first.recheck_after_seconds.has_value());
  EXPECT_NEAR(*first.recheck_after_seconds, 1.0, 1e-6);
  // At 1 s job 1 falls to 10: job 2 runs beside it as an extra (65), ending as job 1's turn does.
  EXPECT_EQ(started(core.decide(1.0)), Ids{2});
  // The lane rule would open lane 1 for job 3 at once (60 + 40), but the extra holds 5 of those
  // bytes until 2 s: admission waits for it rather than overcommit the device.
  core.add(c);
  core.wait(JobId{3});
  const Decision blocked = core.decide(1.0);
  EXPECT_TRUE(blocked.starts.empty());
  EXPECT_FALSE(core.admitted(JobId{3}));
  EXPECT_EQ(core.committed_bytes(), 60u);
  // Room is made only when the extra ends: its finish brings the core back, no recheck needed.
  EXPECT_FALSE(blocked.recheck_after_seconds.has_value());
  core.finish(JobId{2}, 2.0);
  core.finish(JobId{1}, 2.0);
  core.wait(JobId{1});
  core.wait(JobId{2});
  const Decision admitted = core.decide(2.0);
  EXPECT_EQ(core.lane_of(JobId{3}), 1);
  EXPECT_EQ(core.committed_bytes(), 100u);
  // Each lane takes its turn; no room is left for an extra.
  EXPECT_EQ(started(admitted), (Ids{1, 3}));
}

TEST_F(DecisionCoreTest, MemoryAwareAdmitsByTheLaneRule) {
  const auto aware = policy("memory_aware");
  DecisionCore core(*aware, 100);
  core.add(job(1, 10, 80));
  core.add(job(2, 15, 5));  // 25 persistent + its own 5 fits, but job 1 could then never run
  EXPECT_FALSE(core.admitted(JobId{2}));
  EXPECT_LE(core.committed_bytes(), 100u);
  core.add(job(3, 10, 5));
  EXPECT_TRUE(core.admitted(JobId{3}));
  EXPECT_EQ(core.committed_bytes(), 100u);
}

TEST_F(DecisionCoreTest, UpdateFollowsGrowingEstimatesWithoutOvercommitting) {
  const auto fair = policy("fair");
  DecisionCore core(*fair, 100);
  core.add(job(1, 10, 20));
  core.add(job(2, 10, 20));
  core.wait(JobId{1});
  core.wait(JobId{2});
  EXPECT_EQ(core.committed_bytes(), 40u);
  JobView grown = *core.view(JobId{2});
  grown.ephemeral_peak_bytes = 85;  // 20 + 85 > 100: job 2 leaves the lane, keeps waiting
  core.update(grown);
  EXPECT_FALSE(core.admitted(JobId{2}));
  EXPECT_TRUE(core.waiting(JobId{2}));
  EXPECT_EQ(core.committed_bytes(), 30u);
  EXPECT_EQ(started(core.decide(0.0)), Ids{1});
  EXPECT_TRUE(core.decide(0.0).starts.empty());
  grown.ephemeral_peak_bytes = 50;
  core.update(grown);
  EXPECT_TRUE(core.admitted(JobId{2}));
  EXPECT_EQ(core.committed_bytes(), 70u);
  core.finish(JobId{1}, 1.0);
  EXPECT_EQ(started(core.decide(1.0)), Ids{2});
}

TEST_F(DecisionCoreTest, KeepsItsOwnCopyOfTheCurve) {
  const auto aware = policy("memory_aware");
  DecisionCore core(*aware, 100);
  {
    const MemoryCurve temporary{1.0, {70}};
    JobView view = job(1, 0, 0);
    view.curve = &temporary;
    core.add(view);
  }
  ASSERT_NE(core.view(JobId{1})->curve, nullptr);
  EXPECT_EQ(core.view(JobId{1})->curve->peak(), 70u);
  EXPECT_EQ(core.committed_bytes(), 70u);
}

TEST_F(DecisionCoreTest, BadTransitionsThrowNamingTheJob) {
  const auto fair = policy("fair");
  DecisionCore core(*fair, 100);
  core.add(job(7, 10, 10));
  EXPECT_THROW(core.add(job(7, 1, 1)), InvalidArgument);
  EXPECT_THROW(core.finish(JobId{7}, 0.0), InvalidArgument);  // not running
  core.wait(JobId{7});
  try {
    core.wait(JobId{7});
    FAIL() << "waiting twice was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("job 7"), std::string::npos) << e.what();
  }
  EXPECT_THROW(core.finish(JobId{7}, 0.0), InvalidArgument);  // waiting, not running
  EXPECT_EQ(started(core.decide(1.0)), Ids{7});
  EXPECT_THROW(core.wait(JobId{7}), InvalidArgument);         // running
  EXPECT_THROW(core.finish(JobId{7}, 0.5), InvalidArgument);  // before it started
  for (const auto& call : {+[](DecisionCore& c) { c.wait(JobId{99}); },
                           +[](DecisionCore& c) { c.finish(JobId{99}, 1.0); },
                           +[](DecisionCore& c) { c.remove(JobId{99}); },
                           +[](DecisionCore& c) { c.update(job(99, 1, 1)); }}) {
    EXPECT_THROW(call(core), InvalidArgument);
  }
  core.remove(JobId{7});  // mid-iteration: allowed, frees its share
  EXPECT_EQ(core.committed_bytes(), 0u);
  EXPECT_FALSE(core.running(JobId{7}));
  EXPECT_EQ(core.view(JobId{7}), nullptr);
  EXPECT_EQ(core.lane_count(), 0);
}

// Equal keys take turns, least recently served first: the third of three jobs whose keys never
// change (fair with no GPU time, pack's lane) is not left waiting while two alternate.
class DecisionCoreTurns : public DecisionCoreTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(DecisionCoreTurns, EqualKeysNeverStarveAWaitingJob) {
  const auto p = policy(GetParam());
  DecisionCore core(*p, 90);  // one lane: 3 x 20 persistent + 30 peak; two lanes need 100
  for (std::uint32_t id : {1, 2, 3}) core.add(job(id, 20, 30));
  ASSERT_EQ(core.lane_count(), 1);
  for (std::uint32_t id : {1, 2, 3}) core.wait(JobId{id});
  Ids order;
  double now = 0.0;
  for (int turn = 0; turn < 12; ++turn) {
    const Ids started_now = started(core.decide(now));
    ASSERT_EQ(started_now.size(), 1u) << "turn " << turn;
    order.push_back(started_now.front());
    now += 1.0;
    core.finish(JobId{started_now.front()}, now);
    core.wait(JobId{started_now.front()});  // asks for its next iteration at once
  }
  EXPECT_EQ(order, (Ids{1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3}));
}

INSTANTIATE_TEST_SUITE_P(Policies, DecisionCoreTurns,
                         ::testing::Values("fair", "srtf", "pack", "memory_aware", "priority"));

// A job whose memory is not known yet runs alone under plans with concurrent lanes: nothing
// starts beside it, and while it waits nothing new starts until it has had its iteration.
TEST_F(DecisionCoreTest, AJobWithUnknownMemoryRunsAloneUntilMeasured) {
  for (const char* name : {"pack", "memory_aware"}) {
    SCOPED_TRACE(name);
    const auto p = policy(name);
    DecisionCore core(*p, 100);
    core.add(job(1, 10, 20));
    core.add(job(2, 10, 20));
    JobView unknown = job(3, 0, 0);
    unknown.memory_known = false;
    core.add(unknown);
    EXPECT_EQ(core.lane_count(), 3);  // it fits anywhere as far as the core knows
    core.wait(JobId{1});
    EXPECT_EQ(started(core.decide(0.0)), Ids{1});
    core.wait(JobId{3});
    core.wait(JobId{2});
    EXPECT_TRUE(core.decide(0.1).starts.empty()) << "job 2 started beside an unmeasured waiter";
    core.finish(JobId{1}, 1.0);
    core.wait(JobId{1});
    EXPECT_EQ(started(core.decide(1.0)), Ids{3});  // alone
    EXPECT_TRUE(core.decide(1.5).starts.empty()) << "something started beside it";
    EXPECT_EQ(core.running_count(), 1u);
    core.finish(JobId{3}, 2.0);
    unknown.memory_known = true;  // its first iteration measured it
    unknown.persistent_bytes = 10;
    unknown.ephemeral_peak_bytes = 20;
    core.update(unknown);
    const Ids both = started(core.decide(2.0));
    EXPECT_EQ(both.size(), 2u);  // jobs 1 and 2 in their own lanes, at once
  }
}

// A job whose measured needs exceed the whole budget runs alone rather than wait for good.
TEST_F(DecisionCoreTest, AJobLargerThanTheBudgetIsAdmittedOnlyIntoAnEmptyDevice) {
  for (const char* name : {"fair", "pack", "memory_aware", "fifo"}) {
    SCOPED_TRACE(name);
    const auto p = policy(name);
    DecisionCore core(*p, 100);
    core.add(job(1, 10, 20));
    core.add(job(2, 60, 60));
    EXPECT_FALSE(core.admitted(JobId{2}));
    core.remove(JobId{1});
    EXPECT_TRUE(core.admitted(JobId{2}));
    core.wait(JobId{2});
    EXPECT_EQ(started(core.decide(0.0)), Ids{2});
    core.add(job(3, 10, 10));
    EXPECT_FALSE(core.admitted(JobId{3})) << "nothing runs beside it";
    core.finish(JobId{2}, 1.0);
    core.remove(JobId{2});
    EXPECT_TRUE(core.admitted(JobId{3}));
  }
}

// A pending job that holds its weights already (JobView::memory_resident) takes memory: lanes
// that no longer fit beside it merge, so that what the device holds stays within the budget.
TEST_F(DecisionCoreTest, ResidentBytesOfAPendingJobMergeLanesThatNoLongerFit) {
  const auto pack = policy("pack");
  DecisionCore core(*pack, 100);
  JobView a = job(1, 20, 20), b = job(2, 20, 20), c = job(3, 25, 5);
  for (JobView* v : {&a, &b, &c}) v->memory_resident = true;
  core.add(a);
  core.add(b);
  EXPECT_EQ(core.lane_count(), 2);
  EXPECT_EQ(core.committed_bytes(), 80u);
  core.add(c);  // 25 more resident bytes: two lanes of 40 no longer fit beside them
  EXPECT_TRUE(core.admitted(JobId{3}));
  EXPECT_EQ(core.lane_of(JobId{1}), core.lane_of(JobId{2})) << "the lanes did not merge";
  EXPECT_LE(core.committed_bytes() + (core.admitted(JobId{3}) ? 0 : 25), 100u);
  // Without resident bytes (the simulator's jobs), the same jobs keep their lanes.
  DecisionCore sim(*pack, 100);
  sim.add(job(1, 20, 20));
  sim.add(job(2, 20, 20));
  sim.add(job(3, 25, 5));
  EXPECT_FALSE(sim.admitted(JobId{3}));
  EXPECT_EQ(sim.lane_count(), 2);
}

// Headroom (what the device loses to whole pages) shrinks what plans may fill.
TEST_F(DecisionCoreTest, HeadroomShrinksWhatAdmissionMayFill) {
  const auto pack = policy("pack");
  DecisionCore core(*pack, 100);
  core.set_headroom(30);
  core.add(job(1, 20, 20));
  core.add(job(2, 20, 20));
  EXPECT_EQ(core.lane_count(), 1) << "two lanes of 40 need 80, more than 100 - 30";
  EXPECT_EQ(core.committed_bytes(), 60u);
}

// A job that left while its tensors live on (Python's default mode) leaves bytes nobody here
// owns: lanes admitted as if they were free would both run and outgrow the device.
TEST_F(DecisionCoreTest, UnownedBytesAreTakenAndAdmittedLanesMergeWhenTheyAppear) {
  const auto pack = policy("pack");
  DecisionCore core(*pack, 100);
  core.add(job(1, 20, 20));
  core.add(job(2, 20, 20));
  ASSERT_EQ(core.lane_count(), 2) << "two lanes of 40 fit in 100";
  core.set_unowned(30);
  EXPECT_EQ(core.lane_count(), 1) << "80 more than 100 - 30: the later job shares the lane";
  EXPECT_LE(core.committed_bytes(), 70u);
  core.set_unowned(0);
  core.remove(JobId{1});
  core.add(job(3, 20, 20));
  core.decide(0.0);
  EXPECT_EQ(core.lane_count(), 2) << "freed again: a lane of its own";
}

}  // namespace
}  // namespace salus::sched
