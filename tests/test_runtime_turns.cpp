// Job::try_begin_iteration and Job::withdraw: a wait for a turn with a deadline keeps the job's
// place in the queue; withdrawing ends it (handing back a turn granted meanwhile). What the
// Python module's Ctrl-C handling stands on.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "salus/runtime.hpp"
#include "support/sim_runtime.hpp"

namespace salus::testing {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<DeviceBackend> sim() {
  return one_sim_gpu(512 * MiB);
}

JobSpec spec(std::string name) {
  return job_named(
      std::move(name),
      {.persistent_bytes = 16 * MiB, .ephemeral_peak_bytes = 32 * MiB, .iteration_seconds = 0.002});
}

// Peaks that do not fit side by side in 512 MiB: one lane, whatever the plan.
JobSpec one_lane_spec(std::string name) {
  JobSpec s = spec(std::move(name));
  s.hints.ephemeral_peak_bytes = 300 * MiB;
  return s;
}

int waiting_jobs(const Runtime& runtime) {
  int n = 0;
  for (const JobStats& s : runtime.job_stats()) n += s.state == JobState::waiting ? 1 : 0;
  return n;
}

TEST(RuntimeTurns, TryBeginRunsOutOfTimeAndKeepsThePlaceInTheQueue) {
  Runtime runtime(sim(), {.policy = "fair"});
  Job holder = runtime.add_job(spec("holder"));
  Job first = runtime.add_job(spec("first"));
  Job second = runtime.add_job(spec("second"));
  (void)holder.begin_iteration();
  const auto before = std::chrono::steady_clock::now();
  EXPECT_FALSE(first.try_begin_iteration(30ms).has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - before, 30ms);
  EXPECT_EQ(first.stats().state, JobState::waiting) << "still queued, with no thread waiting";
  std::atomic<bool> second_started{false};
  std::thread t([&] {
    (void)second.begin_iteration();
    second_started = true;
    second.end_iteration();
  });
  while (second.stats().state != JobState::waiting) std::this_thread::yield();
  holder.end_iteration();
  // "first" asked before "second" (equal attained time: arrival breaks the tie): the turn is
  // its own although no thread waits for it yet.
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(second_started.load());
  const auto stream = first.try_begin_iteration(5s);
  ASSERT_TRUE(stream.has_value());
  EXPECT_EQ(*stream, first.stream());
  first.end_iteration();
  t.join();
  EXPECT_TRUE(second_started.load());
  EXPECT_EQ(first.stats().iterations, 1u);
  EXPECT_GE(first.stats().waiting_seconds, 0.03) << "the whole wait counts, across the calls";
}

TEST(RuntimeTurns, BeginIterationGoesOnWithAWaitThatRanOutOfTime) {
  Runtime runtime(sim(), {.policy = "fifo"});
  Job holder = runtime.add_job(spec("holder"));
  Job waiter = runtime.add_job(spec("waiter"));
  (void)holder.begin_iteration();
  EXPECT_FALSE(waiter.try_begin_iteration(0ns).has_value()) << "0 only asks";
  std::thread leave([&] {
    std::this_thread::sleep_for(20ms);
    holder.end_iteration();
    holder.leave();  // fifo: the holder keeps the device until it leaves
  });
  (void)waiter.begin_iteration();
  waiter.end_iteration();
  leave.join();
  EXPECT_EQ(waiter.stats().iterations, 1u);
}

TEST(RuntimeTurns, WithdrawLeavesTheQueueAndTheJobMayAskAgain) {
  Runtime runtime(sim(), {.policy = "fair"});
  Job holder = runtime.add_job(spec("holder"));
  Job waiter = runtime.add_job(spec("waiter"));
  (void)holder.begin_iteration();
  const DevicePtr kept = waiter.allocate(MiB);  // persistent: withdrawing keeps it
  ASSERT_FALSE(waiter.try_begin_iteration(5ms).has_value());
  waiter.withdraw();
  EXPECT_EQ(waiter.stats().state, JobState::idle);
  EXPECT_EQ(waiting_jobs(runtime), 0);
  EXPECT_GT(waiter.stats().waiting_seconds, 0.0);
  holder.end_iteration();
  // Nobody else queues: the holder's next turn comes at once.
  ASSERT_TRUE(holder.try_begin_iteration(0ns).has_value());
  holder.end_iteration();
  ASSERT_TRUE(waiter.try_begin_iteration(5s).has_value());
  waiter.end_iteration();
  EXPECT_EQ(waiter.stats().iterations, 1u);
  EXPECT_EQ(waiter.stats().memory.by_class[static_cast<int>(Lifetime::persistent)].in_use, MiB);
  waiter.deallocate(kept);
}

TEST(RuntimeTurns, WithdrawHandsBackATurnGrantedMeanwhile) {
  Runtime runtime(sim(), {.policy = "fair"});
  Job holder = runtime.add_job(spec("holder"));
  Job waiter = runtime.add_job(spec("waiter"));
  (void)holder.begin_iteration();
  ASSERT_FALSE(waiter.try_begin_iteration(0ns).has_value());
  holder.end_iteration();  // the turn goes to the waiter, which no thread waits for
  waiter.withdraw();
  EXPECT_EQ(waiter.stats().state, JobState::idle);
  EXPECT_EQ(waiter.stats().iterations, 0u) << "a turn handed back is no iteration";
  ASSERT_TRUE(holder.try_begin_iteration(0ns).has_value()) << "the lane is free again";
  holder.end_iteration();
}

TEST(RuntimeTurns, LeavingOrCancellingWithAGrantedTurnFreesTheLane) {
  for (const char* policy : {"fair", "memory_aware"}) {
    SCOPED_TRACE(policy);
    Runtime runtime(sim(), {.policy = policy});
    Job holder = runtime.add_job(one_lane_spec("holder"));
    Job quitter = runtime.add_job(one_lane_spec("quitter"));
    Job canceller = runtime.add_job(one_lane_spec("cancelled"));
    for (Job* job : {&quitter, &canceller}) {
      (void)holder.begin_iteration();
      ASSERT_FALSE(job->try_begin_iteration(0ns).has_value());
      holder.end_iteration();  // grants the pending job its turn, which no thread takes
      if (job == &quitter) {
        job->leave();
      } else {
        job->cancel();
      }
      ASSERT_TRUE(holder.try_begin_iteration(5s).has_value()) << "the lane was freed";
      holder.end_iteration();
    }
    EXPECT_EQ(waiting_jobs(runtime), 0);
  }
}

TEST(RuntimeTurns, WithdrawAndTryBeginRefuseMisuse) {
  Runtime runtime(sim(), {.policy = "fair"});
  Job holder = runtime.add_job(spec("holder"));
  Job waiter = runtime.add_job(spec("waiter"));
  EXPECT_NO_THROW(waiter.withdraw()) << "idle: nothing to withdraw";
  EXPECT_THROW((void)waiter.try_begin_iteration(-1ms), InvalidArgument);
  (void)holder.begin_iteration();
  EXPECT_THROW(holder.withdraw(), InvalidArgument) << "inside an iteration";
  EXPECT_THROW((void)holder.try_begin_iteration(1ms), InvalidArgument) << "already running";
  std::thread t([&] {
    try {
      (void)waiter.begin_iteration();
    } catch (const JobCancelled&) {
    }
  });
  while (waiter.stats().state != JobState::waiting) std::this_thread::yield();
  std::this_thread::sleep_for(5ms);
  EXPECT_THROW(waiter.withdraw(), InvalidArgument) << "a thread waits: cancel wakes it";
  EXPECT_THROW((void)waiter.try_begin_iteration(1ms), InvalidArgument) << "one waiter at a time";
  waiter.cancel();
  t.join();
  EXPECT_NO_THROW(waiter.withdraw()) << "cancelled: nothing to withdraw";
  EXPECT_THROW((void)waiter.try_begin_iteration(1ms), JobCancelled);
  holder.end_iteration();
}

// A grant (another job ends its iteration) and a withdrawal at the same moment, many times, under
// every kind of lane plan: whichever wins, the withdrawn job ends idle, nothing stays queued, and
// both jobs get their turns afterwards. Run under TSan.
// RuntimeOptions::turn_spin: the job next in a lane, whose turn is due (the iteration ahead of it
// is short), watches for it instead of sleeping. With a window longer than the test, its thread
// never sleeps for the turn: a start ends the spin with the turn, a cancel ends it with
// JobCancelled (both move the job's signal), and a leave of the job ahead hands the turn over.
TEST(RuntimeTurnsStress, AJobSpinningForItsTurnTakesItOrIsCancelled) {
  RuntimeOptions options{.policy = "fair"};
  options.turn_spin = std::chrono::seconds(30);
  Runtime runtime(sim(), std::move(options));
  Job ahead = runtime.add_job(one_lane_spec("ahead"));
  Job next = runtime.add_job(one_lane_spec("next"));
  Job cancelled = runtime.add_job(one_lane_spec("cancelled"));
  (void)ahead.begin_iteration();  // an empty iteration: its host time is known, and short
  ahead.end_iteration();
  for (int round = 0; round < 50; ++round) {
    (void)ahead.begin_iteration();
    std::atomic<bool> began{false};
    std::thread waiter([&] {
      (void)next.begin_iteration();
      began.store(true);
      next.end_iteration();
    });
    while (waiting_jobs(runtime) == 0) std::this_thread::yield();
    EXPECT_FALSE(began.load());
    ahead.end_iteration();
    waiter.join();
    EXPECT_TRUE(began.load());
  }
  // Cancelled while it spins: the iteration ahead never ends here, only the cancel can end it.
  (void)ahead.begin_iteration();
  std::atomic<int> outcome{0};  // 1: JobCancelled
  std::thread waiter([&] {
    try {
      (void)cancelled.begin_iteration();
    } catch (const JobCancelled&) {
      outcome.store(1);
    }
  });
  while (waiting_jobs(runtime) == 0) std::this_thread::yield();
  cancelled.cancel();
  waiter.join();
  EXPECT_EQ(outcome.load(), 1);
  ahead.end_iteration();
  EXPECT_EQ(next.stats().iterations, 50u);
}

TEST(RuntimeTurnsStress, WithdrawRacesAGrant) {
  for (const char* policy : {"fair", "pack", "memory_aware"}) {
    SCOPED_TRACE(policy);
    Runtime runtime(sim(), {.policy = policy});
    Job holder = runtime.add_job(one_lane_spec("holder"));
    Job racer = runtime.add_job(one_lane_spec("racer"));
    for (int round = 0; round < 200; ++round) {
      (void)holder.begin_iteration();
      if (racer.try_begin_iteration(0ns)) {
        racer.end_iteration();  // it started beside the holder (an extra): no race this round
        holder.end_iteration();
        continue;
      }
      std::atomic<bool> go{false};
      std::thread grant([&] {
        while (!go.load()) {
        }
        holder.end_iteration();
      });
      go = true;
      racer.withdraw();
      grant.join();
      ASSERT_EQ(racer.stats().state, JobState::idle);
      ASSERT_EQ(waiting_jobs(runtime), 0);
      ASSERT_TRUE(holder.try_begin_iteration(5s).has_value()) << "round " << round;
      holder.end_iteration();
      ASSERT_TRUE(racer.try_begin_iteration(5s).has_value()) << "round " << round;
      racer.end_iteration();
    }
  }
}

// What the Python module does: wait in short slices, and sometimes give up and ask again, while
// other threads take turns. Every iteration still runs alone on the single lane.
TEST(RuntimeTurnsStress, SlicedWaitsAndWithdrawalsBesideBlockingWaiters) {
  Runtime runtime(sim(), {.policy = "fair"});
  std::vector<Job> jobs;
  for (int i = 0; i < 4; ++i) jobs.push_back(runtime.add_job(spec("j" + std::to_string(i))));
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  auto body = [&] {
    if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
    std::this_thread::sleep_for(100us);
    inside.fetch_sub(1);
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      Job& job = jobs[static_cast<std::size_t>(i)];
      for (int n = 0; n < 30; ++n) {
        if (i % 2 == 0) {
          (void)job.begin_iteration();
        } else {
          int slices = 0;
          while (!job.try_begin_iteration(200us)) {
            if (++slices % 3 == 0) job.withdraw();  // "Ctrl-C", then ask again
          }
        }
        body();
        job.end_iteration();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(waiting_jobs(runtime), 0);
  for (const Job& job : jobs) EXPECT_EQ(job.stats().iterations, 30u);
}

}  // namespace
}  // namespace salus::testing
