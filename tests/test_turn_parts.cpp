// The parts of a device's turn queue (local_turns.hpp), each alone: JobProfiles (what the device
// learns of its jobs: a leaf with its own lock), TurnJobs (the jobs present and their history),
// TurnMemory (the memory side of a turn), TurnDecisions (the core, and what its decisions start),
// and the spin near a due signal (waits/spin_near_due.hpp); then TurnWaits, through the queue.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "iteration_sched/job_profiles.hpp"
#include "iteration_sched/job_record.hpp"
#include "iteration_sched/local_turns.hpp"
#include "iteration_sched/turn_decisions.hpp"
#include "iteration_sched/turn_jobs.hpp"
#include "iteration_sched/turn_memory.hpp"
#include "salus/sim.hpp"
#include "support/turn_parts_fixture.hpp"
#include "waits/spin_near_due.hpp"

namespace salus {
namespace {

using std::chrono::microseconds;
using std::chrono::seconds;

JobSpec spec_named(const std::string& name) {
  JobSpec spec;
  spec.name = name;
  return spec;
}

JobRecordState record(std::uint32_t id, const std::string& name) {
  return JobRecordState(JobId{id}, spec_named(name), id);
}

// --- JobProfiles ---------------------------------------------------------------------------------

// The core keeps a pointer to the snapshot's curve while it copies it: the snapshot must own the
// curve (not alias the profile's), and one reused keeps its storage, so a view allocates nothing.
TEST(JobProfiles, ASnapshotOwnsItsCurveAndAReusedOneKeepsItsStorage) {
  JobProfiles profiles;
  JobRecordState job = record(1, "a");
  JobProfiles::Snapshot seen;
  profiles.note_iteration(job, 1.0, {{0.0, 100}, {0.5, 300}}, 7, seen);
  EXPECT_EQ(seen.persistent_bytes, 7u);
  EXPECT_EQ(seen.ephemeral_peak_bytes, 300u);
  EXPECT_TRUE(seen.memory_known);
  ASSERT_EQ(seen.curve.bytes.size(), JobProfile::kCurveSamples);
  EXPECT_EQ(seen.curve.bytes.front(), 100u);
  const std::size_t* storage = seen.curve.bytes.data();

  JobProfiles::Snapshot other;
  profiles.note_iteration(job, 1.0, {{0.0, 50}}, 7, other);
  EXPECT_EQ(other.curve.bytes.front(), 50u);
  EXPECT_EQ(seen.curve.bytes.front(), 100u) << "a snapshot owns its curve";

  profiles.snapshot(job, seen);
  EXPECT_EQ(seen.curve.bytes.front(), 50u);
  EXPECT_EQ(seen.curve.bytes.data(), storage) << "a reused snapshot keeps its curve's storage";
}

TEST(JobProfiles, MeasuredGpuTimeWaitsToBeTakenAndIsTakenOnce) {
  JobProfiles profiles;
  JobRecordState job = record(1, "a");
  JobProfiles::Snapshot seen;
  profiles.charge_measured(job, 0.2, seen);
  EXPECT_DOUBLE_EQ(seen.iteration_seconds, 0.2) << "the first measurement replaces the hint";
  profiles.charge_measured(job, 0.4, seen);
  EXPECT_DOUBLE_EQ(seen.iteration_seconds, 0.3);
  const GpuTime taken = profiles.take_unreported(job);
  EXPECT_DOUBLE_EQ(taken.seconds, 0.6);
  EXPECT_EQ(taken.iterations, 2u);
  const GpuTime again = profiles.take_unreported(job);
  EXPECT_EQ(again.iterations, 0u) << "taken once";
  EXPECT_EQ(again.seconds, 0.0);
}

TEST(JobProfiles, AProcessThatReportsItsGpuTimeIsNoLongerChargedItsHostTime) {
  JobProfiles profiles;
  JobRecordState job = record(1, "a");
  JobProfiles::Snapshot seen;
  EXPECT_TRUE(profiles.charge_host_time(job, 1.0, seen));
  EXPECT_DOUBLE_EQ(seen.iteration_seconds, 1.0);
  profiles.charge_reported(job, GpuTime{.seconds = 0.0, .iterations = 0}, seen);
  EXPECT_DOUBLE_EQ(seen.iteration_seconds, 1.0) << "a report of no iteration changes nothing";
  EXPECT_FALSE(profiles.charge_host_time(job, 5.0, seen)) << "its process reports from now on";
  profiles.snapshot(job, seen);
  EXPECT_DOUBLE_EQ(seen.iteration_seconds, 1.0);
  profiles.charge_reported(job, GpuTime{.seconds = 0.6, .iterations = 2}, seen);
  EXPECT_DOUBLE_EQ(seen.iteration_seconds, 0.65) << "towards the reported mean, 0.3";
  EXPECT_EQ(profiles.take_unreported(job).iterations, 0u) << "reported time is not reported back";
}

TEST(JobProfiles, WhatAProcessReportsIsWhatAKeeperAndTheStatisticsSee) {
  JobProfiles profiles;
  JobRecordState job = record(1, "a");
  EXPECT_FALSE(profiles.known_memory(job)) << "nothing known yet";
  JobProfiles::Snapshot seen;
  profiles.note_reported(job, {.persistent_bytes = 5, .ephemeral_peak_bytes = 90, .curve = {}},
                         seen);
  const std::optional<MeasuredMemory> known = profiles.known_memory(job);
  ASSERT_TRUE(known);
  EXPECT_EQ(known->persistent_bytes, 5u);
  EXPECT_EQ(known->ephemeral_peak_bytes, 90u);
  JobStats stats;
  profiles.fill_stats(job, stats);
  EXPECT_EQ(stats.persistent_bytes, 5u);
  EXPECT_EQ(stats.ephemeral_peak_bytes, 90u);
  EXPECT_EQ(stats.memory_curve.bytes, seen.curve.bytes);
  EXPECT_EQ(stats.memory_curve.bytes.front(), 90u) << "flat at the peak: no shape was sent";
}

// The queue charges under its lock while a connected job's release takes the time and the
// statistics read the profile, neither under the queue's lock (under ThreadSanitizer in CI).
TEST(ConcurrentJobProfiles, TimeChargedWhileAnotherThreadTakesItIsTakenExactlyOnce) {
  JobProfiles profiles;
  JobRecordState job = record(1, "a");
  constexpr std::uint32_t kCharges = 2000;
  std::atomic<bool> reading{false};
  std::atomic<bool> done{false};
  std::thread charger([&] {
    while (!reading.load()) std::this_thread::yield();
    JobProfiles::Snapshot seen;
    for (std::uint32_t i = 0; i < kCharges; ++i) profiles.charge_measured(job, 0.5, seen);
    done = true;
  });
  std::uint64_t iterations = 0;
  double seconds_taken = 0.0;
  std::uint64_t reads = 0;
  do {
    const GpuTime taken = profiles.take_unreported(job);
    iterations += taken.iterations;
    seconds_taken += taken.seconds;
    JobStats stats;
    profiles.fill_stats(job, stats);
    EXPECT_TRUE(stats.iteration_seconds == 0.0 || stats.iteration_seconds == 0.5);
    ++reads;
    reading = true;
  } while (!done.load());
  charger.join();
  const GpuTime rest = profiles.take_unreported(job);
  iterations += rest.iterations;
  seconds_taken += rest.seconds;
  EXPECT_EQ(iterations, kCharges) << "each charge taken once, none lost";
  EXPECT_DOUBLE_EQ(seconds_taken, 0.5 * kCharges);
  EXPECT_GT(reads, 0u);
}

// --- TurnJobs ------------------------------------------------------------------------------------

TEST(TurnJobs, JobsArriveInOrderAndTheirRecordsOutliveTheirLeaving) {
  TurnJobs jobs;
  const auto a = jobs.add(JobId{7}, spec_named("a"));
  const auto b = jobs.add(JobId{3}, spec_named("b"));
  EXPECT_EQ(a->arrival, 0u);
  EXPECT_EQ(b->arrival, 1u) << "arrival is the table's order, not the ids'";
  EXPECT_EQ(jobs.find(JobId{3}), b);
  EXPECT_EQ(jobs.find(JobId{4}), nullptr);
  jobs.remove(JobId{7});
  EXPECT_EQ(jobs.find(JobId{7}), nullptr) << "it left";
  EXPECT_EQ(jobs.present().size(), 1u);
  ASSERT_EQ(jobs.history().size(), 2u) << "its statistics outlive it";
  EXPECT_EQ(jobs.history().front(), a);
}

TEST(TurnJobs, HistoryKeepsTheNewestThatLeftAndEveryCancelledJobStillHeld) {
  constexpr std::size_t kKept = TurnJobs::kFinishedJobsKept;
  TurnJobs jobs;
  const auto held = jobs.add(JobId{1}, spec_named("held"));
  held->state = JobState::cancelled;  // its handle has not left: it answers JobCancelled
  jobs.remove(held->id);
  const auto oldest = jobs.add(JobId{2}, spec_named("oldest"));
  jobs.remove(oldest->id);
  std::uint32_t id = 3;
  for (; id < 3 + 3 * kKept; ++id) jobs.remove(jobs.add(JobId{id}, spec_named("j"))->id);
  EXPECT_LE(jobs.history().size(), 2 * kKept + 1) << "bounded";
  EXPECT_GE(jobs.history().size(), kKept) << "the last kept";
  EXPECT_EQ(jobs.history().back()->id, JobId{id - 1}) << "the newest is kept";
  EXPECT_EQ(jobs.cancelled(JobId{1}), held.get()) << "a cancelled job still held is never dropped";
  EXPECT_EQ(jobs.cancelled(JobId{2}), nullptr);
  for (const auto& job : jobs.history()) EXPECT_NE(job, oldest) << "the oldest was dropped";

  held->retired = true;  // its handle left: it is an ordinary finished job now
  for (const std::uint32_t last = id + 2 * kKept; id < last; ++id) {
    jobs.remove(jobs.add(JobId{id}, spec_named("j"))->id);
  }
  EXPECT_EQ(jobs.cancelled(JobId{1}), nullptr) << "dropped once retired";
}

TEST(TurnJobs, OthersRunningCountsTheIterationsAnotherThreadMayEnd) {
  TurnJobs jobs;
  std::thread::id elsewhere;
  std::thread([&] { elsewhere = std::this_thread::get_id(); }).join();
  const auto me = std::this_thread::get_id();
  const auto self = jobs.add(JobId{1}, spec_named("self"));
  self->state = JobState::running;
  self->began_by = elsewhere;  // itself never counts
  const auto mine = jobs.add(JobId{2}, spec_named("mine"));
  mine->state = JobState::running;
  mine->began_by = me;  // this thread cannot end it while it waits
  const auto theirs = jobs.add(JobId{3}, spec_named("theirs"));
  theirs->state = JobState::running;
  theirs->began_by = elsewhere;
  const auto starting = jobs.add(JobId{4}, spec_named("starting"));
  starting->state = JobState::waiting;
  starting->started = true;  // granted: its own thread runs it
  const auto queued = jobs.add(JobId{5}, spec_named("queued"));
  queued->state = JobState::waiting;
  EXPECT_EQ(jobs.others_running(*self, me), 2);
  EXPECT_EQ(jobs.others_running(*self, elsewhere), 2) << "now `mine` counts and `theirs` not";
}

// --- TurnMemory ----------------------------------------------------------------------------------

struct TurnMemoryAlone : ::testing::Test {
  std::shared_ptr<DeviceBackend> backend = make_sim_backend(SimConfig::uniform(1, 64 * MiB));
  std::shared_ptr<MemoryManager> manager = std::make_shared<MemoryManager>(backend);
  std::shared_ptr<TraceRecorder> trace = std::make_shared<TraceRecorder>();
  TurnMemory memory{manager, trace, 0};
};

TEST_F(TurnMemoryAlone, AJobWhoseHintsCanNeverFitIsRefusedAtRegistration) {
  JobSpec big = spec_named("big");
  big.hints.persistent_bytes = memory.reachable_bytes();
  big.hints.ephemeral_peak_bytes = 1;
  EXPECT_THROW((void)memory.register_job(big), OutOfMemory);
  JobSpec fits = spec_named("fits");
  fits.hints.persistent_bytes = memory.reachable_bytes();
  const JobId id = memory.register_job(fits);
  EXPECT_EQ(memory.bytes_on_device(id), 0u);
  EXPECT_TRUE(memory.quiesce(id));
}

TEST_F(TurnMemoryAlone, ACallForAReleasedJobSaysItIsGoneInsteadOfThrowing) {
  const JobId id = memory.register_job(spec_named("a"));
  const DevicePtr block = manager->allocate({.bytes = 4096, .device = 0, .job = id});
  EXPECT_GE(memory.bytes_on_device(id), 4096u);
  EXPECT_TRUE(memory.quiesce(id));
  EXPECT_TRUE(memory.activate(id));
  EXPECT_TRUE(memory.begin_iteration(id, StreamHandle{}));
  EXPECT_TRUE(memory.promote_ephemeral(id).has_value());
  (void)block;
  memory.release(id, /*orphan=*/false);  // a cancel from another thread, say
  EXPECT_FALSE(memory.quiesce(id));
  EXPECT_FALSE(memory.activate(id));
  EXPECT_FALSE(memory.begin_iteration(id, StreamHandle{}));
  EXPECT_FALSE(memory.promote_ephemeral(id).has_value());
  EXPECT_TRUE(memory.end_curve(id).empty());
  EXPECT_EQ(memory.bytes_on_device(id), 0u);
}

TEST_F(TurnMemoryAlone, AJobFoundGoneThrowsWhatItsStateSaysUnderTheLock) {
  std::mutex mu;
  JobRecordState job = record(1, "a");
  auto thrown_by = [&](JobState state) -> std::string {
    job.state = state;
    std::unique_lock lock(mu, std::defer_lock);
    try {
      throw_job_gone(job, "memory call", lock);
    } catch (const JobCancelled&) {
      EXPECT_TRUE(lock.owns_lock());
      return "cancelled";
    } catch (const InvalidArgument& e) {
      EXPECT_TRUE(lock.owns_lock());
      return std::string("invalid: ") + e.what();
    } catch (const UnknownJob&) {
      EXPECT_TRUE(lock.owns_lock());
      return "unknown";
    }
    return "nothing";
  };
  EXPECT_EQ(thrown_by(JobState::cancelled), "cancelled");
  EXPECT_NE(thrown_by(JobState::left).find("memory call: job 'a' has left"), std::string::npos);
  EXPECT_EQ(thrown_by(JobState::idle), "unknown") << "gone for no reason it knows of";
}

TEST_F(TurnMemoryAlone, TheTraceCountsTheDevicesMemoryAndTheJobsTiers) {
  const JobId id = memory.register_job(spec_named("a"));
  const std::optional<JobMemoryStats> stats = memory.promote_ephemeral(id);
  ASSERT_TRUE(stats);
  memory.trace_counters("a", *stats, memory.device_stats(), 10.0);
  const std::string json = trace->json();
  EXPECT_NE(json.find("memory gpu0"), std::string::npos);
  EXPECT_NE(json.find("tiers a"), std::string::npos);
}

// --- TurnDecisions -------------------------------------------------------------------------------

struct DecisionsAlone : test::TurnPartsOnSim {
  TurnMemory turn_memory{memory, std::make_shared<TraceRecorder>(), 0};
  TurnJobs jobs;
  TurnDecisions decisions{*policy, turn_memory.reachable_bytes(), parts(), jobs, turn_memory,
                          SteadyClock::now()};

  std::shared_ptr<JobRecordState> add(const std::string& name) {
    JobSpec spec = spec_named(name);
    const auto& job = jobs.add(memory->register_job(spec.name), spec);
    decisions.add(*job);
    return job;
  }
  // What the queue does as a job asks for its turn.
  void ask(JobRecordState& job) {
    job.state = JobState::waiting;
    decisions.ask(job.id);
  }
};

TEST_F(DecisionsAlone, AStartedJobRunsOnItsLanesStreamAndIsToBeWoken) {
  const auto a = add("a");
  ask(*a);
  EXPECT_TRUE(decisions.asking(a->id));
  const Wakes woken = decisions.decide();
  ASSERT_EQ(woken.size(), 1u);
  EXPECT_EQ(woken.front(), a);
  EXPECT_TRUE(a->started);
  EXPECT_EQ(a->lane, 0);
  EXPECT_EQ(lanes.stream_of(0), a->stream);
  EXPECT_EQ(streams.running_on(a->stream), a) << "its allocations are its own";
  EXPECT_FALSE(decisions.asking(a->id)) << "started: no longer queued";
}

TEST_F(DecisionsAlone, NothingStartsWhileAnAllocationHoldsNewStarts) {
  const auto a = add("a");
  ask(*a);
  waits.hold(false);
  EXPECT_TRUE(decisions.decide().empty());
  EXPECT_FALSE(a->started);
  ASSERT_TRUE(waits.release(false));
  EXPECT_EQ(decisions.decide().size(), 1u);
  EXPECT_TRUE(a->started);
}

TEST_F(DecisionsAlone, GpuTimeCountsForAJobThatLeftThoughTheCoreForgetsIt) {
  const auto a = add("a");
  decisions.charge_measured(*a, 0.5);
  EXPECT_DOUBLE_EQ(a->attained_seconds, 0.5);
  decisions.charge_measured(*a, -1.0);  // a clock that went backwards counts as nothing
  EXPECT_DOUBLE_EQ(a->attained_seconds, 0.5);
  a->state = JobState::left;
  decisions.remove(a->id);
  decisions.charge_measured(*a, 0.25);  // its last iteration's work finished after it left
  EXPECT_DOUBLE_EQ(a->attained_seconds, 0.75) << "its statistics still count it";
  EXPECT_EQ(profiles.take_unreported(*a).iterations, 3u);
}

TEST_F(DecisionsAlone, TheNextJobOfALaneExpectsItsTurnWhenTheIterationAheadIsDue) {
  const auto a = add("a");
  const auto b = add("b");
  ask(*a);
  ASSERT_EQ(decisions.decide().size(), 1u);
  a->state = JobState::running;
  a->iteration_started = SteadyClock::now();
  ask(*b);
  EXPECT_TRUE(decisions.decide().empty()) << "one lane, and a runs in it";
  EXPECT_FALSE(decisions.expected_turn(*b)) << "a's iterations have no known length yet";
  a->host_seconds = 2.0;
  EXPECT_EQ(decisions.expected_turn(*b), a->iteration_started + seconds(2));
  EXPECT_FALSE(decisions.expected_turn(*a)) << "a is not next in the lane";
}

// --- SpinNearDue ---------------------------------------------------------------------------------

TEST(SpinNearDue, NoWindowIsOff) {
  EXPECT_FALSE(waits::SpinNearDue(microseconds(0)).on());
  EXPECT_FALSE(waits::SpinNearDue(microseconds(-5)).on());
}

TEST(SpinNearDue, AWindowThatOpensAfterTheWaitMustLookAtTheClockDoesNothing) {
  const waits::SpinNearDue spin(microseconds(50));
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<std::uint32_t> signal{0};
  std::unique_lock lock(mu);
  const auto now = SteadyClock::now();
  EXPECT_EQ(spin.wait(signal, cv, lock, now + std::chrono::hours(1), now),
            waits::SpinNearDue::Step::none);
  EXPECT_TRUE(lock.owns_lock());
}

TEST(SpinNearDue, ASpinUntilTheWaitMustLookAtTheClockEndsThereWithTheLockHeld) {
  const waits::SpinNearDue spin(microseconds(50));
  if (!spin.on()) GTEST_SKIP() << "one CPU: spinning is off";
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<std::uint32_t> signal{0};
  std::unique_lock lock(mu);
  const auto now = SteadyClock::now();
  EXPECT_EQ(spin.wait(signal, cv, lock, now, now), waits::SpinNearDue::Step::spun)
      << "due now: it spins, until the time it must look at the clock";
  EXPECT_TRUE(lock.owns_lock());
  EXPECT_EQ(signal.load(), 0u);
}

// A sleeper before the window: the signal's notify wakes it (the waiter sets `asleep` under the
// lock, which it releases only in the wait, so the notify cannot come before it sleeps).
TEST(ConcurrentSpinNearDue, ASleeperBeforeTheWindowIsWokenByTheSignal) {
  const waits::SpinNearDue spin(microseconds(50));
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<std::uint32_t> signal{0};
  bool asleep = false;  // under mu
  std::optional<waits::SpinNearDue::Step> step;
  std::thread waiter([&] {
    std::unique_lock lock(mu);
    asleep = true;
    while (signal.load() == 0) {
      step = spin.wait(signal, cv, lock, SteadyClock::now() + std::chrono::hours(1), std::nullopt);
    }
    EXPECT_TRUE(lock.owns_lock());
  });
  for (bool told = false; !told;) {
    std::lock_guard lock(mu);
    if (asleep) {
      signal.fetch_add(1);
      cv.notify_all();
      told = true;
    }
  }
  waiter.join();
  EXPECT_EQ(step, waits::SpinNearDue::Step::slept);
}

// A spinner in the window releases the lock, watches the signal and takes the lock back once it
// moves: the giver takes the lock meanwhile.
TEST(ConcurrentSpinNearDue, ASpinnerLetsTheGiverLockAndTakesTheLockBackWhenTheSignalMoves) {
  // A window far wider than any test: only the signal ends the spin.
  const waits::SpinNearDue spin(std::chrono::hours(1));
  if (!spin.on()) GTEST_SKIP() << "one CPU: spinning is off";
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<std::uint32_t> signal{0};
  std::atomic<bool> spinning{false};
  std::atomic<std::uint32_t> seen_after{0};
  std::optional<waits::SpinNearDue::Step> step;
  std::thread waiter([&] {
    std::unique_lock lock(mu);
    spinning = true;
    const auto now = SteadyClock::now();
    step = spin.wait(signal, cv, lock, now, now + std::chrono::hours(1));
    EXPECT_TRUE(lock.owns_lock());
    seen_after = signal.load();
  });
  while (!spinning.load()) std::this_thread::yield();
  {
    std::lock_guard lock(mu);  // the spinner released it
    signal.fetch_add(1);
  }
  waiter.join();
  EXPECT_EQ(step, waits::SpinNearDue::Step::spun);
  EXPECT_EQ(seen_after.load(), 1u) << "it returned once the signal moved";
}

// --- TurnWaits, through the queue ----------------------------------------------------------------

struct Queue : test::TurnPartsOnSim {
  LocalTurns turns{memory, std::make_shared<TraceRecorder>(), 0, *policy, parts(), microseconds(0),
                   false};

  std::shared_ptr<JobRecordState> add(const std::string& name) {
    return turns.add(spec_named(name));
  }
  JobState state_of(const JobRecordState& job) {
    JobStats stats;
    turns.fill_stats(job, stats);
    return stats.state;
  }
};

TEST_F(Queue, AGrantWithdrawnUnusedGoesToTheNextJobAndCountsNoIteration) {
  const auto a = add("a");
  const auto b = add("b");
  const auto c = add("c");
  const StreamHandle lane = turns.begin(*a);
  const auto now = SteadyClock::now();
  EXPECT_FALSE(turns.begin_until(*b, now));
  EXPECT_FALSE(turns.begin_until(*c, now));
  turns.end(*a);  // grants b's turn; no thread is in b's wait
  EXPECT_EQ(streams.job_on(lane), b) << "granted: b holds the lane";
  turns.withdraw(*b);
  EXPECT_EQ(state_of(*b), JobState::idle);
  EXPECT_EQ(b->iterations, 0u);
  EXPECT_EQ(streams.job_on(lane), c) << "the lane went to c";
  EXPECT_EQ(turns.begin_until(*c, now), lane);
  turns.end(*c);
  for (const auto& job : {a, b, c}) turns.finish(*job, false);
}

// A thread in begin waits for the end of the iteration ahead (under ThreadSanitizer in CI).
using ConcurrentQueue = Queue;

TEST_F(ConcurrentQueue, AWaiterInBeginIsWokenByTheEndAndTakesTheLane) {
  const auto a = add("a");
  const auto b = add("b");
  const StreamHandle lane = turns.begin(*a);
  std::optional<StreamHandle> b_lane;
  std::thread waiter([&] { b_lane = turns.begin(*b); });
  while (state_of(*b) != JobState::waiting) std::this_thread::yield();
  turns.end(*a);
  waiter.join();
  EXPECT_EQ(b_lane, lane);
  EXPECT_EQ(state_of(*b), JobState::running);
  turns.end(*b);
  EXPECT_EQ(b->iterations, 1u);
  turns.finish(*a, false);
  turns.finish(*b, false);
}

TEST_F(ConcurrentQueue, ACancelEndsAWaitInBeginWithJobCancelled) {
  const auto a = add("a");
  const auto b = add("b");
  (void)turns.begin(*a);
  std::atomic<int> cancelled{0};
  std::thread waiter([&] {
    try {
      (void)turns.begin(*b);
    } catch (const JobCancelled&) {
      ++cancelled;
    }
  });
  while (state_of(*b) != JobState::waiting) std::this_thread::yield();
  turns.finish(*b, /*cancelled=*/true);
  waiter.join();
  EXPECT_EQ(cancelled.load(), 1);
  EXPECT_THROW(turns.throw_if_cancelled(b->id), JobCancelled);
  turns.end(*a);
  turns.finish(*a, false);
}

}  // namespace
}  // namespace salus
