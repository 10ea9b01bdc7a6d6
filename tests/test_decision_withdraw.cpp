// DecisionCore::withdraw: a waiting job leaves its lane's queue (its caller stopped waiting) and
// keeps its admission; the lane's next turn goes to the others, exclusive lanes included.
#include <gtest/gtest.h>

#include <memory>
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

using Ids = std::vector<std::uint32_t>;

Ids started(const Decision& decision) {
  Ids ids;
  for (const Start& s : decision.starts) ids.push_back(s.job.value);
  return ids;
}

std::unique_ptr<Policy> policy(const char* name) {
  return PolicyRegistry::with_builtins().make(name);
}

TEST(DecisionCoreWithdraw, AWithdrawnJobLeavesTheQueueAndMayWaitAgain) {
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

TEST(DecisionCoreWithdraw, TheLastWaiterWithdrawingLeavesTheLaneIdle) {
  const auto fair = policy("fair");
  DecisionCore core(*fair, 100);
  core.add(job(1, 10, 10));
  core.wait(JobId{1});
  core.withdraw(JobId{1});
  EXPECT_TRUE(core.decide(0.0).starts.empty());
  EXPECT_FALSE(core.next_in_lane(0).has_value());
}

TEST(DecisionCoreWithdraw, AJobNotAdmittedYetMayWithdrawToo) {
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

TEST(DecisionCoreWithdraw, AnExclusiveOwnerThatWithdrawsKeepsItsLane) {
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
TEST(DecisionCoreWithdraw, UnderMemoryAwarePlansAWithdrawnJobStartsNeitherAsTurnNorAsExtra) {
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

TEST(DecisionCoreWithdraw, OnlyAWaitingJobMayWithdraw) {
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

}  // namespace
}  // namespace salus::sched
