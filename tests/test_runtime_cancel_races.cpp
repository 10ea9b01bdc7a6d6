// Cancels, leaves and frees at moments nobody chose, in both modes (blocks freed with their job,
// or handed to nobody until their holder frees them: JobSpec::blocks_outlive_job), and memory
// handed to a CPU consumer (RuntimeOptions::host_compute). DESIGN.md, invariants 4 and 8.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "salus/runtime.hpp"
#include "salus/sim.hpp"
#include "support/memory_fixture.hpp"

namespace salus::testing {
namespace {

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
enum class Ending { cancel, leave };

struct OrphanCase {
  bool blocks_outlive_job;
  SecondStream where;
  Ending ending;
};

std::string name_of(const ::testing::TestParamInfo<OrphanCase>& info) {
  const OrphanCase& c = info.param;
  return std::string(c.blocks_outlive_job ? "Outlive" : "Release") +
         (c.where == SecondStream::lane ? "Lane" : "Bound") +
         (c.ending == Ending::cancel ? "Cancel" : "Leave");
}

class RuntimeCancelRacesOrphan : public ::testing::TestWithParam<OrphanCase> {};

// A persistent block made on one stream is read on a second stream of its job when the job ends;
// then the holder frees it and another user reuses its address in stream order. The reader must
// still see the job's bytes: the free waits for every stream the job used.
TEST_P(RuntimeCancelRacesOrphan, AReaderQueuedOnTheJobsOtherStreamSeesItsBytes) {
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
  if (c.ending == Ending::cancel) {
    job.cancel();
  } else {
    job.leave();
  }
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
    Modes, RuntimeCancelRacesOrphan,
    ::testing::Values(OrphanCase{true, SecondStream::lane, Ending::cancel},
                      OrphanCase{true, SecondStream::lane, Ending::leave},
                      OrphanCase{true, SecondStream::bound, Ending::cancel},
                      OrphanCase{true, SecondStream::bound, Ending::leave},
                      OrphanCase{false, SecondStream::lane, Ending::cancel},
                      OrphanCase{false, SecondStream::bound, Ending::leave}),
    name_of);

// Six threads allocate and free on one job while another thread cancels it: an allocation that
// loses the race is refused with JobCancelled and leaves nothing behind, in both modes.
class RuntimeCancelRacesAllocate : public ::testing::TestWithParam<bool> {};

TEST_P(RuntimeCancelRacesAllocate, AllocationsLosingToACancelLeaveNothingAllocated) {
  constexpr int kThreads = 6;
  constexpr int kRounds = 40;
  auto backend = make_sim_backend(SimConfig::uniform(1, 256 * MiB));
  Runtime runtime(backend);
  std::atomic<int> unknown_job{0};
  for (int round = 0; round < kRounds; ++round) {
    JobSpec spec{.name = "round " + std::to_string(round)};
    spec.blocks_outlive_job = GetParam();
    Job job = runtime.add_job(spec);
    const JobId id = job.id();
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(static_cast<std::uint64_t>(round * kThreads + t));
        while (!go) std::this_thread::yield();
        for (;;) {
          DevicePtr p = 0;
          try {
            p = runtime.allocate(4 * KiB + rng() % (2 * MiB), 0, StreamHandle{}, id);
          } catch (const JobCancelled&) {
            return;
          } catch (const UnknownJob&) {
            ++unknown_job;  // a cancelled job that has not left is cancelled, not unknown
            return;
          }
          try {
            runtime.deallocate(p);  // in the release mode a cancel may have freed it already
          } catch (const InvalidArgument&) {
          }
        }
      });
    }
    go = true;
    std::this_thread::sleep_for(std::chrono::microseconds(200 + round * 50));
    job.cancel();
    for (auto& thread : threads) thread.join();
    job.leave();
    ASSERT_EQ(runtime.memory().device_stats(0).allocated, 0u) << "round " << round << " leaked";
  }
  EXPECT_EQ(unknown_job, 0);
  // Nothing is stranded: a fresh job gets the whole device.
  Job fresh = runtime.add_job({.name = "fresh"});
  fresh.deallocate(fresh.allocate(256 * MiB));
}

INSTANTIATE_TEST_SUITE_P(Modes, RuntimeCancelRacesAllocate, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Outlive" : "Release"; });

// A CPU consumer gets memory with no work pending on it: a block freed on the host while a
// kernel still reads it is handed to the next allocation only once that kernel is done.
TEST(RuntimeHostCompute, ACpuConsumerNeverGetsMemoryQueuedWorkStillReads) {
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
TEST(RuntimeHostCompute, ACpuConsumerWaitsForOtherStreamsRecordedOnTheBlock) {
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
TEST(RuntimeHostCompute, AnIterationsHostTimeCountsAsItsDeviceTime) {
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
