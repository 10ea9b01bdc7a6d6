// Issue 19, each as a small deterministic reproduction: a job's end (cancel or leave) racing a
// free, an allocation or a bind, with blocks used on a second stream of their job. The soak
// (tests/soak, Soak.<mode>.<policy>.<spill>) and python_bindings/tests/test_cancel_races.py race
// the same things at random moments.
//
// The work queued on a second stream here touches no memory: it only records that it ran, so a
// missing fence shows as wrong order (an assertion), not as a fault that would end the process.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "salus/runtime.hpp"
#include "salus/sim.hpp"
#include "support/memory_fixture.hpp"

namespace salus::testing {
namespace {

constexpr std::size_t kDevice = 8 * MiB;  // one 8 MiB block takes the whole device

std::shared_ptr<DeviceBackend> small_sim() {
  return make_sim_backend(SimConfig::uniform(1, kDevice));
}

RuntimeOptions fair() {
  RuntimeOptions options;
  options.policy = "fair";
  return options;
}

JobSpec job_spec(std::string name, bool blocks_outlive_job = false) {
  JobSpec spec;
  spec.name = std::move(name);
  spec.blocks_outlive_job = blocks_outlive_job;
  return spec;
}

// Work queued on `stream` behind 50 ms of simulated kernel: a stand-in for a kernel that reads a
// block there. `ran` says when the stream got to it.
struct QueuedUse {
  std::atomic<bool> ran{false};
  void enqueue(DeviceBackend& backend, StreamHandle stream) {
    launch_sim_kernel(backend, stream, 0, 0.05);
    backend.launch_host_func(stream, [this] { ran.store(true); });
  }
};

enum class End { cancel, leave };

void end(Job& job, End how) {
  if (how == End::cancel) {
    job.cancel();
  } else {
    job.leave();
  }
}

class OrphanedBlock : public ::testing::TestWithParam<End> {};

// blocks_outlive_job: the job's block is used on its bound stream, the job ends with that use
// queued, then the block's holder frees it. Another job's stream that takes its pages must be
// ordered after the use (the block keeps every fence its job had: Invariant 8), as must trim.
TEST_P(OrphanedBlock, StaysFencedByItsJobsOtherStreamsAfterTheJobEnds) {
  auto backend = small_sim();
  Runtime runtime(backend, fair());
  const StreamHandle bound = backend->create_stream(0, 0);
  const StreamHandle other = backend->create_stream(0, 0);
  Job a = runtime.add_job(job_spec("tensors", true));
  runtime.bind_stream(0, bound, a.id());
  const DevicePtr block = a.allocate(kDevice);  // lives on a's lane (the default stream)
  QueuedUse use;
  use.enqueue(*backend, bound);
  end(a, GetParam());
  runtime.deallocate(block, kDevice, 0);  // the holder (a tensor) goes
  Job b = runtime.add_job(job_spec("next"));
  const DevicePtr taken = runtime.allocate(kDevice, 0, other, b.id());  // a's pages, on `other`
  std::atomic<bool> ordered{false};
  backend->launch_host_func(other, [&] { ordered.store(use.ran.load()); });
  backend->synchronize_stream(other);
  EXPECT_TRUE(ordered.load()) << "another stream got the pages while the job's bound stream "
                                 "still had work on them queued";
  runtime.deallocate(taken);
  backend->synchronize_stream(bound);
  b.leave();
  runtime.memory().retire_stream(0, bound);
  runtime.memory().retire_stream(0, other);
  backend->destroy_stream(bound);
  backend->destroy_stream(other);
}

TEST_P(OrphanedBlock, TrimWaitsForItsJobsOtherStreams) {
  auto backend = small_sim();
  Runtime runtime(backend, fair());
  const StreamHandle bound = backend->create_stream(0, 0);
  Job a = runtime.add_job(job_spec("tensors", true));
  runtime.bind_stream(0, bound, a.id());
  const DevicePtr block = a.allocate(kDevice);
  QueuedUse use;
  use.enqueue(*backend, bound);
  end(a, GetParam());
  runtime.deallocate(block, kDevice, 0);
  (void)runtime.memory().trim();  // unmaps the pages: only once the queued use is done
  EXPECT_TRUE(use.ran.load()) << "trim unmapped pages the job's bound stream still used";
  backend->synchronize_stream(bound);
  runtime.memory().retire_stream(0, bound);
  backend->destroy_stream(bound);
}

INSTANTIATE_TEST_SUITE_P(RuntimeCancelRaces, OrphanedBlock,
                         ::testing::Values(End::cancel, End::leave), [](const auto& info) {
                           return info.param == End::cancel ? "Cancel" : "Leave";
                         });

// Invariant 8: memory handed to a CPU consumer (the simulated PyTorch mode: the glue's
// Runtime::allocate with no stream, which the host writes at once) has no work pending on any
// stream. Here the job's own block, used on its bound stream, is freed and taken again.
TEST(RuntimeCancelRaces, HostConsumerNeverGetsMemoryWithWorkPendingOnAnotherStream) {
  auto backend = small_sim();
  RuntimeOptions options = fair();
  options.host_compute = true;  // what salus::torch's CPU mode sets
  Runtime runtime(backend, options);
  const StreamHandle bound = backend->create_stream(0, 0);
  Job a = runtime.add_job(job_spec("cpu"));
  runtime.bind_stream(0, bound, a.id());
  const DevicePtr block = runtime.allocate(kDevice, 0, StreamHandle{}, a.id());
  QueuedUse use;
  use.enqueue(*backend, bound);
  a.deallocate(block);
  const DevicePtr again = runtime.allocate(kDevice, 0, StreamHandle{}, a.id());
  EXPECT_TRUE(use.ran.load()) << "handed to the host while the bound stream's work on it was "
                                 "still queued";
  a.deallocate(again);
  backend->synchronize_stream(bound);
  a.leave();
  runtime.memory().retire_stream(0, bound);
  backend->destroy_stream(bound);
}

// A cancel from another thread racing bind_stream: the caller must hear JobCancelled.
TEST(RuntimeCancelRaces, BindStreamRacingACancelSaysJobCancelled) {
  auto backend = small_sim();
  Runtime runtime(backend, fair());
  const StreamHandle stream = backend->create_stream(0, 0);
  int unknown = 0;
  for (int round = 0; round < 100; ++round) {
    Job job = runtime.add_job(job_spec("bound"));
    std::thread canceller([&] { job.cancel(); });
    try {
      for (int tries = 0; tries < 1'000'000; ++tries) runtime.bind_stream(0, stream, job.id());
      ADD_FAILURE() << "bind_stream went on working after a cancel";
    } catch (const JobCancelled&) {
    } catch (const UnknownJob& e) {
      if (unknown++ == 0) ADD_FAILURE() << "round " << round << ": " << e.what();
    }
    canceller.join();
  }
  EXPECT_EQ(unknown, 0) << "of 100 cancelled jobs";
  runtime.memory().retire_stream(0, stream);
  backend->destroy_stream(stream);
}

// Attribution by job id (the C ABI, the PyTorch glue) of a cancelled job that has not left, after
// many other jobs came and went on its device: still JobCancelled.
TEST(RuntimeCancelRaces, CancelledJobStaysCancelledWhileManyOthersComeAndGo) {
  Runtime runtime(small_sim(), fair());
  Job a = runtime.add_job(job_spec("slow to notice"));
  a.cancel();
  for (int i = 0; i < 600; ++i) runtime.add_job(job_spec("other")).leave();
  EXPECT_THROW((void)runtime.allocate(4096, 0, StreamHandle{}, a.id()), JobCancelled);
  EXPECT_THROW(a.begin_iteration(), JobCancelled);
}

// A job whose thread loops begin, allocate, free, end, cancelled from another thread at a random
// moment: its thread hears JobCancelled, whichever call the cancel lands in. (A cancel between a
// begin's release of the scheduler's lock and its memory call made that call say UnknownJob, in
// about 1 of 100 such cancels: issue 34, item 4.)
TEST(RuntimeCancelRaces, ACancelAtARandomMomentIsAlwaysJobCancelled) {
  Runtime runtime(make_sim_backend(SimConfig::uniform(1, 64 * MiB)), fair());
  std::mt19937 random(7);
  int cancelled = 0;
  std::vector<std::string> other;
  for (int trial = 0; trial < 600; ++trial) {
    Job job = runtime.add_job(job_spec("looping", trial % 2 == 1));
    std::atomic<bool> go{false};
    std::thread looping([&] {
      while (!go.load()) std::this_thread::yield();
      try {
        for (;;) {
          (void)job.begin_iteration();
          job.deallocate(job.allocate(4096));
          job.end_iteration();
        }
      } catch (const JobCancelled&) {
        ++cancelled;
      } catch (const std::exception& e) {
        other.push_back(e.what());
      }
    });
    go.store(true);
    std::this_thread::sleep_for(std::chrono::microseconds(random() % 200));
    job.cancel();
    looping.join();
  }
  EXPECT_EQ(cancelled, 600);
  EXPECT_TRUE(other.empty()) << other.size() << " cancels were heard otherwise, the first: "
                             << other.front();
}

class RacingAllocations : public ::testing::TestWithParam<bool> {};

// Six threads allocate and free on one job while another thread cancels it: an allocation that
// loses the race must leave nothing allocated. With blocks_outlive_job the threads then free
// what they still hold (valid until then).
TEST_P(RacingAllocations, ThatLoseToACancelLeakNothing) {
  const bool outlive = GetParam();
  Runtime runtime(make_sim_backend(SimConfig::uniform(1, 64 * MiB)), fair());
  for (int round = 0; round < 20; ++round) {
    Job job = runtime.add_job(job_spec("raced", outlive));
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 6; ++t) {
      threads.emplace_back([&, t] {
        std::vector<DevicePtr> held;
        ready.fetch_add(1);
        try {
          for (std::size_t n = 0;; ++n) {
            held.push_back(job.allocate(4 * KiB + (n * 7919 + t * 104729) % (256 * KiB)));
            if (held.size() > 4) {
              job.deallocate(held.front());
              held.erase(held.begin());
            }
          }
        } catch (const Error&) {
          // The cancel's answer.
        }
        if (outlive) {
          for (const DevicePtr ptr : held) runtime.deallocate(ptr);
        }
      });
    }
    while (ready.load() < 6) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::microseconds(200 * (round % 10)));
    job.cancel();
    for (std::thread& thread : threads) thread.join();
    job.leave();
    ASSERT_EQ(runtime.memory().device_stats(0).allocated, 0u)
        << "round " << round << ": allocations that lost the race left their blocks allocated";
  }
}

INSTANTIATE_TEST_SUITE_P(RuntimeCancelRaces, RacingAllocations, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Outlive" : "Release"; });

// --- the same races with real bytes, and the CPU consumer -------------------------------------

constexpr std::size_t kBlock = 1 * MiB;

struct Reader {
  std::atomic<bool> ran{false};
  std::atomic<bool> intact{false};
};

// Queues on `stream` a simulated kernel, then a host function that checks the pattern `seed` at
// `ptr`: the reader stands for a kernel still reading the block when the host lets go of it.
void queue_reader(DeviceBackend& backend, StreamHandle stream, DevicePtr ptr, std::uint64_t seed,
                  Reader& reader) {
  launch_sim_kernel(backend, stream, 0, 0.2);
  backend.launch_host_func(stream, [ptr, seed, &reader] {
    reader.intact = check_pattern(ptr, kBlock, seed);
    reader.ran = true;
  });
}

enum class SecondStream { lane, bound };

struct OrphanCase {
  bool blocks_outlive_job;
  SecondStream where;
  End ending;
};

std::string name_of(const ::testing::TestParamInfo<OrphanCase>& info) {
  const OrphanCase& c = info.param;
  return std::string(c.blocks_outlive_job ? "Outlive" : "Release") +
         (c.where == SecondStream::lane ? "Lane" : "Bound") +
         (c.ending == End::cancel ? "Cancel" : "Leave");
}

class OrphanedBlockBytes : public ::testing::TestWithParam<OrphanCase> {};

// A persistent block made on one stream is read on a second stream of its job when the job ends;
// then the holder frees it and another user reuses its address in stream order. The reader must
// still see the job's bytes: the free waits for every stream the job used.
TEST_P(OrphanedBlockBytes, AReaderQueuedOnTheJobsOtherStreamSeesItsBytes) {
  const OrphanCase c = GetParam();
  auto backend = make_sim_backend(SimConfig::uniform(1, 64 * MiB));
  Runtime runtime(backend);
  JobSpec spec{.name = "holder"};
  spec.blocks_outlive_job = c.blocks_outlive_job;
  Job job = runtime.add_job(spec);
  const DevicePtr block = job.allocate(kBlock);  // persistent, on the device's default stream
  fill_pattern(block, kBlock, 1);

  Stream framework(backend, 0);
  StreamHandle second = framework.handle();
  if (c.where == SecondStream::bound) {
    runtime.bind_stream(0, second, job.id());
  } else {
    second = job.begin_iteration();
  }
  Reader reader;
  queue_reader(*backend, second, block, 1, reader);
  if (c.where == SecondStream::lane) job.end_iteration();
  end(job, c.ending);
  if (c.blocks_outlive_job) runtime.deallocate(block);  // the holder lets go
  // Another user takes the same address on the same stream and writes it in stream order.
  const DevicePtr again = runtime.allocate(kBlock, 0, StreamHandle{});
  ASSERT_EQ(again, block) << "the test needs the address reused";
  backend->launch_host_func(StreamHandle{}, [again] { fill_pattern(again, kBlock, 2); });
  backend->synchronize_stream(second);
  backend->synchronize_stream(StreamHandle{});
  ASSERT_TRUE(reader.ran);
  EXPECT_TRUE(reader.intact) << "the new user's write landed before the old reader ran";
  runtime.deallocate(again);
  EXPECT_EQ(runtime.memory().device_stats(0).allocated, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    RuntimeCancelRaces, OrphanedBlockBytes,
    ::testing::Values(OrphanCase{true, SecondStream::lane, End::cancel},
                      OrphanCase{true, SecondStream::lane, End::leave},
                      OrphanCase{true, SecondStream::bound, End::cancel},
                      OrphanCase{true, SecondStream::bound, End::leave},
                      OrphanCase{false, SecondStream::lane, End::cancel},
                      OrphanCase{false, SecondStream::bound, End::leave}),
    name_of);

// A CPU consumer gets memory with no work pending on it: a block freed on the host while a
// kernel still reads it is handed to the next allocation only once that kernel is done.
TEST(RuntimeCancelRaces, ACpuConsumerNeverGetsMemoryQueuedWorkStillReads) {
  auto backend = make_sim_backend(SimConfig::uniform(1, 64 * MiB));
  Runtime runtime(backend, {.host_compute = true});
  Job job = runtime.add_job({.name = "cpu"});
  auto it = job.iteration();
  const DevicePtr block = job.allocate(kBlock);
  fill_pattern(block, kBlock, 3);
  Reader reader;
  queue_reader(*backend, it.stream(), block, 3, reader);
  job.deallocate(block);  // freed on the host at once, as a tensor going out of scope
  const DevicePtr again = job.allocate(kBlock);
  ASSERT_EQ(again, block) << "the test needs the address reused";
  EXPECT_TRUE(reader.ran) << "handed to the host while a kernel still reads it";
  fill_pattern(again, kBlock, 4);  // the CPU consumer writes at once
  backend->synchronize_stream(it.stream());
  EXPECT_TRUE(reader.intact);
  job.deallocate(again);
}

// ... also when the block's last reader ran on another stream (record_stream).
TEST(RuntimeCancelRaces, ACpuConsumerWaitsForOtherStreamsRecordedOnTheBlock) {
  auto backend = make_sim_backend(SimConfig::uniform(1, 64 * MiB));
  Runtime runtime(backend, {.host_compute = true});
  Stream other(backend, 0);
  const DevicePtr block = runtime.allocate(kBlock, 0, StreamHandle{});
  fill_pattern(block, kBlock, 5);
  Reader reader;
  queue_reader(*backend, other.handle(), block, 5, reader);
  runtime.record_stream(block, other.handle());
  runtime.deallocate(block);
  const DevicePtr again = runtime.allocate(kBlock, 0, StreamHandle{});
  ASSERT_EQ(again, block);
  EXPECT_TRUE(reader.ran);
  fill_pattern(again, kBlock, 6);
  other.synchronize();
  EXPECT_TRUE(reader.intact);
  runtime.deallocate(again);
}

// Compute on the job's own thread is its device time: fair and the statistics see the work.
TEST(RuntimeCancelRaces, AnIterationsHostTimeCountsAsItsDeviceTime) {
  auto backend = make_sim_backend(SimConfig::uniform(1, 64 * MiB));
  Runtime runtime(backend);
  runtime.set_host_compute(true);
  Job job = runtime.add_job({.name = "cpu"});
  for (int i = 0; i < 3; ++i) {
    auto it = job.iteration();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const JobStats s = job.stats();
  EXPECT_GE(s.attained_seconds, 0.055);
  EXPECT_GE(s.iteration_seconds, 0.018);
  runtime.set_host_compute(false);
  {
    auto it = job.iteration();  // now timed on the stream, which ran nothing
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_LT(job.stats().attained_seconds, s.attained_seconds + 0.015);
}

}  // namespace
}  // namespace salus::testing
