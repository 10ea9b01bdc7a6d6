// What a runtime keeps about its past is bounded, so that a process that runs jobs for weeks does
// not grow (the soak test saw RSS grow otherwise): the trace keeps its most recent events, and
// the statistics the most recent finished jobs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "iteration_sched/trace.hpp"
#include "salus/runtime.hpp"
#include "salus/sim.hpp"

namespace salus {
namespace {

TEST(TraceRecorder, KeepsTheMostRecentEventsAndCountsTheDroppedOnes) {
  TraceRecorder trace(10);
  for (int i = 0; i < 25; ++i) {
    trace.span({"job" + std::to_string(i), 0, 0, double(i), double(i) + 0.5,
                static_cast<std::uint64_t>(i)});
  }
  EXPECT_EQ(trace.dropped(), 15u);
  const std::string json = trace.json();
  EXPECT_EQ(json.find("\"job14\""), std::string::npos) << "an old span survived";
  EXPECT_NE(json.find("\"job15\""), std::string::npos) << "a recent span was dropped";
  EXPECT_NE(json.find("\"job24\""), std::string::npos);
}

TEST(TraceRecorder, DropsFromTheKindHeldMostSoEveryKindKeepsItsRecentPast) {
  TraceRecorder trace(4);
  for (int i = 0; i < 10; ++i) trace.span({"job" + std::to_string(i), 0, 0, double(i), double(i) + 1, 0});
  trace.counter({"memory gpu0", 0, 11.0, {{"allocated", 1.0}}});
  trace.move({"demote gpu0 -> host", 0, 12.0, 13.0, 1, 2 << 20});
  EXPECT_EQ(trace.dropped(), 8u);
  const std::string json = trace.json();
  EXPECT_NE(json.find("memory gpu0"), std::string::npos);
  EXPECT_NE(json.find("demote gpu0 -> host"), std::string::npos);
  EXPECT_NE(json.find("\"job9\""), std::string::npos);
}

TEST(TraceRecorder, ZeroEventsRecordsNothing) {
  TraceRecorder trace(0);
  trace.span({"job", 0, 0, 0.0, 1.0, 0});
  EXPECT_EQ(trace.dropped(), 1u);
  EXPECT_EQ(trace.json().find("\"job\""), std::string::npos);
}

}  // namespace
}  // namespace salus

namespace salus {
namespace {

TEST(RuntimeRetention, FinishedJobsAreForgottenOldestFirstLiveOnesNever) {
  Runtime runtime(make_sim_backend(SimConfig::uniform(1, 64 * MiB)), {.policy = "fair"});
  Job first = runtime.add_job({.name = "stays"});
  for (int i = 0; i < 2000; ++i) {
    Job job = runtime.add_job({.name = "short" + std::to_string(i)});
    job.leave();
  }
  const std::vector<JobStats> stats = runtime.job_stats();
  EXPECT_LE(stats.size(), 1u + 512u);
  EXPECT_GE(stats.size(), 1u + 256u);
  EXPECT_EQ(stats.front().name, "stays") << "a live job was forgotten";
  EXPECT_EQ(stats.back().name, "short1999") << "the most recent finished job was forgotten";
  first.leave();
}

}  // namespace
}  // namespace salus
