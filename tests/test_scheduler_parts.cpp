// The parts of a device's scheduler that own their state under a lock of their own
// (device_scheduler.hpp's lock rule): StreamBindings, whose stream an allocation is on, and
// IterationClock, the timing of iterations, each alone, without a scheduler; and GatedTurns, the
// turn source of a connected runtime, over a gate that records what it is asked.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "iteration_sched/device_scheduler.hpp"
#include "iteration_sched/iteration_clock.hpp"
#include "iteration_sched/job_profile.hpp"
#include "iteration_sched/lane_streams.hpp"
#include "iteration_sched/local_turns.hpp"
#include "iteration_sched/memory_waits.hpp"
#include "iteration_sched/runtime_access.hpp"
#include "iteration_sched/stream_bindings.hpp"
#include "salus/sim.hpp"
#include "support/fake_driver.hpp"
#include "support/turn_parts_fixture.hpp"

namespace salus {
namespace {

std::shared_ptr<JobRecordState> job_named(std::uint64_t id, const std::string& name) {
  JobSpec spec;
  spec.name = name;
  return std::make_shared<JobRecordState>(JobId{static_cast<std::uint32_t>(id)}, std::move(spec), id);
}

// --- StreamBindings -------------------------------------------------------------------------------

TEST(StreamBindings, AnIterationRunningOnAStreamOwnsItAheadOfItsBinding) {
  StreamBindings bindings;
  const auto bound = job_named(1, "bound");
  const auto running = job_named(2, "running");
  const StreamHandle s{0x10};
  EXPECT_EQ(bindings.job_on(s), nullptr);
  bindings.bind(s, bound);
  EXPECT_EQ(bindings.job_on(s), bound);
  bindings.run(s, running);
  EXPECT_EQ(bindings.job_on(s), running);
  EXPECT_EQ(bindings.running_on(s), running);
  bindings.stop(s);
  EXPECT_EQ(bindings.job_on(s), bound) << "the binding outlives the iteration";
  EXPECT_EQ(bindings.running_on(s), nullptr);
  EXPECT_TRUE(bindings.unbind(s));
  EXPECT_FALSE(bindings.unbind(s)) << "a stream bound to no job says so";
  EXPECT_EQ(bindings.job_on(s), nullptr);
}

TEST(StreamBindings, TheDefaultStreamIsNobodysUntilAFrameworkBindsIt) {
  StreamBindings bindings;
  const auto job = job_named(1, "a");
  EXPECT_EQ(bindings.job_on(StreamHandle{}), nullptr);
  bindings.bind(StreamHandle{}, job);
  EXPECT_EQ(bindings.job_on(StreamHandle{}), job);
  EXPECT_TRUE(bindings.unbind(StreamHandle{}));
  EXPECT_EQ(bindings.job_on(StreamHandle{}), nullptr);
}

TEST(StreamBindings, ForgettingAJobEndsItsBindingsAndItsRunAndNoOneElses) {
  StreamBindings bindings;
  const auto a = job_named(1, "a");
  const auto b = job_named(2, "b");
  const StreamHandle a_own{0x10}, a_lane{0x20}, b_own{0x30}, b_lane{0x40};
  bindings.bind(a_own, a);
  bindings.run(a_lane, a);
  bindings.bind(b_own, b);
  bindings.run(b_lane, b);
  bindings.forget(a->id);
  EXPECT_EQ(bindings.job_on(a_own), nullptr);
  EXPECT_EQ(bindings.job_on(a_lane), nullptr);
  EXPECT_EQ(bindings.job_on(b_own), b);
  EXPECT_EQ(bindings.job_on(b_lane), b);
  EXPECT_EQ(a.use_count(), 1) << "the bindings hold no reference to a forgotten job";
}

// Readers ask while a writer binds, runs and forgets (under ThreadSanitizer in CI): each answer
// is one of the jobs the stream was given, never a torn one.
TEST(StreamBindingsConcurrency, ReadersSeeWholeAnswersWhileAWriterChangesThem) {
  StreamBindings bindings;
  const auto a = job_named(1, "a");
  const auto b = job_named(2, "b");
  const StreamHandle s{0x10};
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> answers{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        const auto owner = bindings.job_on(s);
        if (owner) {
          EXPECT_TRUE(owner == a || owner == b);
        }
        answers.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  for (int i = 0; i < 2000; ++i) {
    bindings.bind(s, a);
    bindings.run(s, b);
    bindings.stop(s);
    bindings.forget(a->id);
  }
  while (answers.load() < 100) std::this_thread::yield();  // the readers did read meanwhile
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(bindings.job_on(s), nullptr);
}

// --- IterationClock, over the fake driver --------------------------------------------------------

class IterationClockOnFake : public ::testing::Test {
 protected:
  test::FakeDriver fake_{test::FakeDriverConfig::uniform(1, 256 * MiB)};
  std::shared_ptr<cuda::CudaBackend> backend_ = std::make_shared<cuda::CudaBackend>(fake_.api());
  std::shared_ptr<SiteChoice> site_ = make_site_choice(/*host_compute=*/false);
  IterationClock clock_{backend_, 0, site_};
  StreamHandle stream_ = backend_->create_stream(0, 0);

  void TearDown() override { backend_->destroy_stream(stream_); }
};

TEST_F(IterationClockOnFake, ATimingIsSettledOnceItsWorkHasRunAndNotBefore) {
  const auto job = job_named(1, "a");
  const std::optional<IterationClock::Timer> timer = clock_.start("a", stream_);
  ASSERT_TRUE(timer.has_value());
  fake_.advance_clock(7.0);  // 7 ms of GPU time
  fake_.hold_events(true);   // the iteration's work is still running as it ends
  ASSERT_TRUE(clock_.stop("a", *timer, stream_));
  clock_.hand_off(job, *timer, /*timed=*/true);
  EXPECT_TRUE(clock_.settle().empty()) << "its end event has not completed";
  EXPECT_TRUE(clock_.settle().empty()) << "a pending timing stays pending";
  fake_.hold_events(false);
  fake_.complete_events();
  const std::vector<IterationClock::Settled> settled = clock_.settle();
  ASSERT_EQ(settled.size(), 1u);
  EXPECT_EQ(settled[0].job, job);
  EXPECT_NEAR(settled[0].seconds, 0.007, 1e-6);
  EXPECT_TRUE(clock_.settle().empty()) << "a timing is settled once";
}

TEST_F(IterationClockOnFake, TimersAreReusedWhetherReadOrNotAndUntimedOnesAreNeverRead) {
  const auto job = job_named(1, "a");
  const auto first = clock_.start("a", stream_);
  ASSERT_TRUE(first && clock_.stop("a", *first, stream_));
  clock_.hand_off(job, *first, /*timed=*/false);  // its end went unrecorded: nothing to read
  EXPECT_TRUE(clock_.settle().empty());
  const std::size_t creates = fake_.count("cuEventCreate");
  const auto second = clock_.start("a", stream_);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->start, first->start) << "the pair came back to the pool";
  EXPECT_EQ(fake_.count("cuEventCreate"), creates) << "no event made for a pooled pair";
  ASSERT_TRUE(clock_.stop("a", *second, stream_));
  clock_.hand_off(job, *second, /*timed=*/true);
  ASSERT_EQ(clock_.settle().size(), 1u);
  const auto third = clock_.start("a", stream_);
  ASSERT_TRUE(third.has_value());
  EXPECT_EQ(third->start, first->start) << "a read pair came back too";
  EXPECT_EQ(fake_.count("cuEventCreate"), creates);
  clock_.release(*third);
}

TEST_F(IterationClockOnFake, AnIterationWhoseEventsFailGoesUnmeasuredAndItsTimingIsDropped) {
  const auto job = job_named(1, "a");
  fake_.fail_next("cuEventRecord", CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_FALSE(clock_.start("a", stream_).has_value()) << "a start that failed times nothing";
  const auto timer = clock_.start("a", stream_);
  ASSERT_TRUE(timer.has_value());
  fake_.fail_next("cuEventRecord", CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_FALSE(clock_.stop("a", *timer, stream_)) << "an end that failed says so";
  clock_.hand_off(job, *timer, /*timed=*/false);
  const auto read = clock_.start("a", stream_);
  ASSERT_TRUE(read && clock_.stop("a", *read, stream_));
  clock_.hand_off(job, *read, /*timed=*/true);
  fake_.fail_next("cuEventElapsedTime", CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_TRUE(clock_.settle().empty()) << "a timing that cannot be read is dropped";
  EXPECT_TRUE(clock_.settle().empty()) << "and not read again";
}

TEST_F(IterationClockOnFake, TheComputeSiteIsAskedOfTheRuntimeEachTime) {
  EXPECT_EQ(&clock_.site(), &ComputeSite::gpu());
  site_->store(&ComputeSite::host());  // RuntimeOptions::host_compute may change while it runs
  EXPECT_EQ(&clock_.site(), &ComputeSite::host());
}

// --- ComputeSite: what computing on the host changes, each consequence asked of the site ---

TEST(ComputeSite, OnTheGpuBlocksFollowTheLaneAndPlansUseTheMeasuredCurve) {
  const ComputeSite& gpu = ComputeSite::gpu();
  const MemoryCurve curve{0.01, {1, 2, 3}};
  EXPECT_FALSE(gpu.timed_on_host());
  EXPECT_EQ(gpu.block_stream(StreamHandle{7}), StreamHandle{7});
  EXPECT_FALSE(gpu.host_access());
  EXPECT_EQ(gpu.plan_curve(curve), &curve);
  EXPECT_TRUE(gpu.pages_rest_while_waiting());
  EXPECT_TRUE(gpu.may_spin());
}

TEST(ComputeSite, OnTheHostBlocksShareTheDefaultStreamAndNothingMovesOrSpins) {
  const ComputeSite& host = ComputeSite::host();
  const MemoryCurve curve{0.01, {1, 2, 3}};
  EXPECT_TRUE(host.timed_on_host());
  EXPECT_EQ(host.block_stream(StreamHandle{7}), StreamHandle{}) << "one heap for every job";
  EXPECT_TRUE(host.host_access());
  EXPECT_EQ(host.plan_curve(curve), nullptr) << "plans count the flat peak";
  EXPECT_FALSE(host.pages_rest_while_waiting()) << "other threads may touch its memory";
  EXPECT_FALSE(host.may_spin());
}

// The runtime's switch chooses the site every device scheduler asks, and its blocks say so.
TEST(ComputeSite, TheRuntimesSwitchChoosesTheSiteOfTheNextAllocation) {
  Runtime runtime(make_sim_backend(SimConfig::uniform(1, 64 * MiB)));
  EXPECT_FALSE(runtime.host_compute());
  Job job = runtime.add_job({.name = "a"});
  job.begin_iteration();
  const DevicePtr on_lane = job.allocate(MiB);
  runtime.set_host_compute(true);
  EXPECT_TRUE(runtime.host_compute());
  const DevicePtr on_default = job.allocate(MiB);
  EXPECT_NE(runtime.memory().find(on_lane)->stream, StreamHandle{});
  EXPECT_EQ(runtime.memory().find(on_default)->stream, StreamHandle{});
  job.deallocate(on_lane);
  job.deallocate(on_default);
  job.end_iteration();
}

// --- LaneStreams: a lane keeps its stream; slots are reused once free ---

TEST(LaneStreams, ALaneKeepsItsStreamAndAStreamIsMadeOnlyOnFirstUse) {
  LaneStreams lanes(make_sim_backend(SimConfig::uniform(1, 64 * MiB)), 0, /*slots=*/false);
  EXPECT_FALSE(lanes.stream_of(0).has_value());
  int lane = 1;
  const StreamHandle first = lanes.take(lane, JobKind::training);
  EXPECT_EQ(lane, 1) << "without slots, the lane the plan gave";
  lanes.release(1);
  int again = 1;
  EXPECT_EQ(lanes.take(again, JobKind::inference), first) << "the lane's stream is kept";
  EXPECT_EQ(lanes.stream_of(1), first);
  EXPECT_FALSE(lanes.stream_of(0).has_value()) << "lane 0 was never used";
  EXPECT_EQ(lanes.all().size(), 1u);
  int bad = -1;
  EXPECT_THROW((void)lanes.take(bad, JobKind::training), InvalidArgument);
  EXPECT_EQ(lanes.all().size(), 1u) << "a refused lane makes nothing";
  lanes.clear();
  EXPECT_TRUE(lanes.all().empty());
}

TEST(LaneStreams, RunningIterationsTakeFreeSlotsAndAFreedOneIsTakenFirst) {
  LaneStreams lanes(make_sim_backend(SimConfig::uniform(1, 64 * MiB)), 0, /*slots=*/true);
  int a = 0, b = 0, c = 0;
  const StreamHandle sa = lanes.take(a, JobKind::training);
  const StreamHandle sb = lanes.take(b, JobKind::training);
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1) << "slot 0 is busy: the second iteration gets a stream of its own";
  EXPECT_NE(sa, sb);
  lanes.release(a);
  EXPECT_EQ(lanes.take(c, JobKind::training), sa) << "the freed slot, with its stream";
  EXPECT_EQ(c, 0);
  EXPECT_EQ(lanes.all().size(), 2u);
}

// --- MemoryWaits: when an allocation short of memory waits, and who gives way ---

constexpr JobId kA{1}, kB{2}, kC{3};

TEST(MemoryWaits, OnlyTheLastHoldsEndLetsDecisionsGoOn) {
  MemoryWaits waits;
  EXPECT_FALSE(waits.holding());
  waits.hold(true);
  waits.hold(false);
  EXPECT_TRUE(waits.holding());
  EXPECT_FALSE(waits.release(false)) << "another hold lives";
  EXPECT_TRUE(waits.holding());
  EXPECT_TRUE(waits.release(true)) << "the last one";
  EXPECT_FALSE(waits.holding());
}

TEST(MemoryWaits, WaitingHelpsWhileAnIterationRunsThatIsNotShortOfMemory) {
  MemoryWaits waits;
  const auto now = MemoryWaits::Clock::now();
  waits.start_waiting(kA, 10);
  waits.hold(true);
  EXPECT_TRUE(waits.worth_waiting(kA, /*others=*/1, /*self_running=*/true, now));
  EXPECT_FALSE(waits.worth_waiting(kA, 0, true, now)) << "nothing else runs: it cannot fit";
  // The other running iteration is short of memory too: its hold cancels it out.
  waits.start_waiting(kB, 20);
  waits.hold(true);
  EXPECT_TRUE(waits.worth_waiting(kA, 1, true, now))
      << "B held more, so B gives way and A waits for what it frees";
  EXPECT_FALSE(waits.worth_waiting(kB, 1, true, now)) << "B held the most: it gives way";
  waits.stop_waiting(kB);
  EXPECT_FALSE(waits.release(true)) << "A's hold lives";
}

TEST(MemoryWaits, OfWaitersHoldingAlikeTheNewestGivesWay) {
  MemoryWaits waits;
  const auto now = MemoryWaits::Clock::now();
  for (const JobId job : {kA, kB, kC}) {
    waits.start_waiting(job, 8);
    waits.hold(true);
  }
  EXPECT_TRUE(waits.worth_waiting(kA, 2, true, now));
  EXPECT_TRUE(waits.worth_waiting(kB, 2, true, now));
  EXPECT_FALSE(waits.worth_waiting(kC, 2, true, now)) << "the newest of equals gives way";
}

TEST(MemoryWaits, AGiveUpGrantsTheOthersAGraceButNotItself) {
  MemoryWaits waits;
  const auto now = MemoryWaits::Clock::now();
  waits.start_waiting(kA, 4);
  EXPECT_FALSE(waits.worth_waiting(kA, 0, false, now));
  waits.gave_up(kB);  // its memory may come back as its error unwinds
  EXPECT_TRUE(waits.worth_waiting(kA, 0, false, now));
  EXPECT_FALSE(waits.worth_waiting(kB, 0, false, now)) << "its own failure is no reason to wait";
  // At most two graces a wait: one that began long ago has had them.
  const auto long_ago = now - 3 * MemoryWaits::kGiveBackGrace;
  EXPECT_FALSE(waits.worth_waiting(kA, 0, false, long_ago));
}

TEST(MemoryWaitsConcurrency, AWaiterWakesWhenAnIterationIsGone) {
  MemoryWaits waits;
  const std::uint64_t seen = waits.gone();
  std::atomic<bool> changed{false};
  std::thread waiter([&] { changed = waits.wait_for_change(seen, std::chrono::seconds(60)); });
  waits.iteration_gone();
  waiter.join();
  EXPECT_TRUE(changed.load()) << "it waited out its limit: the end was not told";
  EXPECT_EQ(waits.gone(), seen + 1);
  EXPECT_FALSE(waits.wait_for_change(waits.gone(), std::chrono::milliseconds(1)))
      << "nothing gone since: the wait runs out";
}


// --- JobProfile: what a device learns of a job, a value with no lock -----------------------------

TEST(JobProfile, AMeasurementReplacesTheHintedTimeAndLaterOnesMoveTheEstimate) {
  JobProfile p({.iteration_seconds = 1.0});
  EXPECT_EQ(p.iteration_seconds, 1.0) << "the hint, until a measurement";
  p.note_gpu_time(0.2);
  EXPECT_DOUBLE_EQ(p.iteration_seconds, 0.2) << "the first measurement replaces the hint";
  p.note_gpu_time(0.4);
  EXPECT_DOUBLE_EQ(p.iteration_seconds, 0.3);
  p.note_gpu_time(1.0, 4);  // four iterations reported together: their mean counts
  EXPECT_DOUBLE_EQ(p.iteration_seconds, 0.275);
  p.note_gpu_time(-1.0);  // a clock that went backwards counts as nothing
  EXPECT_DOUBLE_EQ(p.iteration_seconds, 0.1375);
}

TEST(JobProfile, PlansCountTheLargestOfTheLastFourPeaks) {
  JobProfile p;
  for (std::size_t peak : {10, 50, 20, 30}) p.note_peak(peak);
  EXPECT_EQ(p.ephemeral_peak_bytes, 50u);
  p.note_peak(40);
  EXPECT_EQ(p.ephemeral_peak_bytes, 50u) << "50 is still one of the last four";
  p.note_peak(5);
  EXPECT_EQ(p.ephemeral_peak_bytes, 40u) << "50 is five peaks ago";
}

// The samples count from the curve's start, the host time from the timer: a curve cut at the
// host time would lose what came after it on a busy machine.
TEST(JobProfile, ACurveSpansTheHostTimeAndTheLastSampleAndEachBucketKeepsItsHighest) {
  JobProfile p;
  p.note_iteration(1.0, {{0.0, 100}, {0.5, 300}, {0.6, 200}, {1.5, 50}}, 7);
  EXPECT_EQ(p.persistent_bytes, 7u);
  EXPECT_TRUE(p.memory_known);
  EXPECT_EQ(p.ephemeral_peak_bytes, 300u);
  EXPECT_DOUBLE_EQ(p.curve.duration_seconds, 1.5);
  ASSERT_EQ(p.curve.bytes.size(), JobProfile::kCurveSamples);
  EXPECT_EQ(p.curve.bytes.front(), 100u);
  EXPECT_EQ(*std::max_element(p.curve.bytes.begin(), p.curve.bytes.end()), 300u)
      << "the peak between two bucket ends is kept";
  EXPECT_EQ(p.curve.bytes[21], 300u);  // 0.5 s of 1.5 s: bucket 21 of 64
  EXPECT_EQ(p.curve.bytes[26], 200u);
  EXPECT_EQ(p.curve.bytes.back(), 200u) << "the last bucket takes the last samples too";
}

TEST(JobProfile, NothingIsKnownOfItsMemoryUntilAnIterationAllocatedOrAHintSays) {
  JobProfile p;
  EXPECT_FALSE(p.known_memory());
  p.note_iteration(0.1, {}, 1 << 20);  // it built its weights and allocated nothing ephemeral
  EXPECT_FALSE(p.known_memory()) << "a peak of 0 says nothing of its activations";
  p.note_iteration(0.1, {{0.0, 64}}, 1 << 20);
  ASSERT_TRUE(p.known_memory());
  EXPECT_EQ(p.known_memory()->ephemeral_peak_bytes, 64u);
  EXPECT_EQ(p.known_memory()->persistent_bytes, std::size_t{1} << 20);
  EXPECT_TRUE(JobProfile({.ephemeral_peak_bytes = 8}).known_memory()) << "a hint is known";
}

TEST(JobProfile, AReportWithNoShapeIsFlatAtItsLargestRecentPeak) {
  JobProfile p;
  p.note_reported({.persistent_bytes = 5, .ephemeral_peak_bytes = 90, .curve = {}});
  p.note_reported({.persistent_bytes = 6, .ephemeral_peak_bytes = 30, .curve = {}});
  EXPECT_EQ(p.persistent_bytes, 6u);
  EXPECT_EQ(p.ephemeral_peak_bytes, 90u);
  ASSERT_EQ(p.curve.bytes.size(), JobProfile::kCurveSamples);
  EXPECT_EQ(p.curve.bytes.front(), 90u);
  EXPECT_EQ(p.curve.bytes.back(), 90u);
  EXPECT_GT(p.curve.duration_seconds, 0.0);
}

// --- LocalTurns: a device's turn queue, with its parts and no facade ----------------------------

struct QueueAlone : test::TurnPartsOnSim {
  LocalTurns turns{memory, std::make_shared<TraceRecorder>(), 0, *policy, parts(),
                   std::chrono::microseconds(0), false};

  std::shared_ptr<JobRecordState> add(const std::string& name) {
    JobSpec spec;
    spec.name = name;
    return turns.add(spec);
  }
};

TEST_F(QueueAlone, TheNextJobOfALaneStartsWhenTheRunningOneEndsOnTheSameStream) {
  const auto a = add("a");
  const auto b = add("b");
  const StreamHandle lane = turns.begin(*a);
  EXPECT_EQ(streams.job_on(lane), a) << "the lane's stream is a's while it runs";
  const auto now = std::chrono::steady_clock::now();
  EXPECT_FALSE(turns.begin_until(*b, now)) << "one lane, and a runs in it";
  EXPECT_EQ(b->state, JobState::waiting) << "b keeps its place";
  turns.end(*a);
  const std::optional<StreamHandle> next = turns.begin_until(*b, now + std::chrono::seconds(60));
  ASSERT_TRUE(next) << "a's end started b";
  EXPECT_EQ(*next, lane) << "behind a's work on the lane's stream";
  EXPECT_EQ(streams.job_on(lane), b);
  turns.end(*b);
  turns.finish(*a, false);
  turns.finish(*b, true);
  EXPECT_EQ(a->iterations, 1u);
  EXPECT_EQ(b->iterations, 1u);
  EXPECT_THROW(turns.throw_if_cancelled(b->id), JobCancelled);
  EXPECT_EQ(turns.job_by_id(a->id), nullptr) << "a left";
  EXPECT_EQ(turns.history().size(), 2u) << "statistics outlive the jobs";
}

TEST_F(QueueAlone, AnAllocationsHoldStartsNothingUntilItEnds) {
  const auto a = add("a");
  const auto b = add("b");
  (void)turns.begin(*a);
  const auto now = std::chrono::steady_clock::now();
  EXPECT_FALSE(turns.begin_until(*b, now));
  waits.hold(false);  // an allocation outside any iteration waits for memory
  turns.end(*a);
  EXPECT_FALSE(turns.begin_until(*b, now)) << "a hold keeps b from starting";
  ASSERT_TRUE(waits.release(false));
  turns.decide();
  EXPECT_TRUE(turns.begin_until(*b, now)) << "the hold's end decided, and b started";
  turns.end(*b);
  turns.finish(*a, false);
  turns.finish(*b, false);
}
}  // namespace
}  // namespace salus

// --- GatedTurns, over a gate that records what it is asked -------------------------------------

namespace salus {
namespace {

// A TurnGate that grants every turn at once and writes each call down, "<call> <job>"; a call
// named in `fail` throws DeviceError once.
class RecordingGate final : public TurnGate {
 public:
  std::vector<std::string> calls;
  std::string fail;

  void add(JobId job, const JobSpec&) override { note("add", job); }
  bool acquire(JobId job, std::optional<std::chrono::steady_clock::time_point>) override {
    note("acquire", job);
    return true;
  }
  void order_after(JobId job, StreamHandle) override { note("order_after", job); }
  void release(JobId job, const MeasuredMemory*, const GpuTime*) override { note("release", job); }
  void withdraw(JobId job) override { note("withdraw", job); }
  void finish(JobId job, bool cancelled) noexcept override {
    calls.push_back(std::string(cancelled ? "cancel " : "finish ") + std::to_string(job.value));
  }

 private:
  void note(const std::string& call, JobId job) {
    calls.push_back(call + " " + std::to_string(job.value));
    if (call == fail) {
      fail.clear();
      throw DeviceError("TurnGate::" + call, "SALUSD_GONE", 0, "the test gate refused");
    }
  }
};

struct Gated : ::testing::Test {
  std::shared_ptr<RecordingGate> gate = std::make_shared<RecordingGate>();
  std::shared_ptr<Runtime> runtime = RuntimeAccess::make(
      make_sim_backend(SimConfig::uniform(1, 64 * MiB)), RuntimeOptions{}, {.gate = gate});

  Job add(const std::string& name) {
    JobSpec spec;
    spec.name = name;
    return runtime->add_job(spec);
  }
  std::string id(const Job& job) const { return std::to_string(job.id().value); }
};

// The daemon's turn first and the scheduler's second; back in the other order: the local turn
// has ended (its stream is the next job's) when the daemon's goes back.
TEST_F(Gated, TheDaemonsTurnComesFirstAndGoesBackLast) {
  Job job = add("a");
  { Job::Iteration it(job); }
  job.leave();
  const std::string j = id(job);
  EXPECT_EQ(gate->calls, (std::vector<std::string>{"add " + j, "acquire " + j, "order_after " + j,
                                                   "release " + j, "finish " + j}));
  EXPECT_EQ(job.stats().iterations, 1u);
}

TEST_F(Gated, AStreamThatCannotBeOrderedEndsTheLocalTurnAndGivesTheDaemonsBack) {
  Job a = add("a");
  gate->fail = "order_after";
  EXPECT_THROW({ Job::Iteration it(a); }, DeviceError);
  const std::string j = id(a);
  EXPECT_EQ(gate->calls, (std::vector<std::string>{"add " + j, "acquire " + j, "order_after " + j,
                                                   "release " + j}));
  // The local turn went back too: another job of the device gets its turn.
  Job b = add("b");
  { Job::Iteration it(b); }
  EXPECT_EQ(b.stats().iterations, 1u);
}

TEST_F(Gated, AJobTheDaemonRefusesIsNoJobHereAndACancelReachesTheDaemon) {
  gate->fail = "add";
  EXPECT_THROW((void)add("refused"), DeviceError);
  EXPECT_EQ(runtime->job_stats().front().state, JobState::left) << "refused there, gone here";
  Job b = add("b");
  b.cancel();
  EXPECT_EQ(gate->calls.back(), "cancel " + id(b));
}

TEST_F(Gated, SalusdsOwnLoopEndsNoGatedIterationWithItsHook) {
  Job job = add("a");
  (void)job.begin_iteration();
  try {
    RuntimeAccess::end_iteration(job, [] {});
    ADD_FAILURE() << "a gated job's turn goes back to salusd with Job::end_iteration";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("Job::end_iteration"));
  }
  job.end_iteration();  // nothing was lost: the iteration still ends
  EXPECT_EQ(job.stats().iterations, 1u);
}

}  // namespace
}  // namespace salus
