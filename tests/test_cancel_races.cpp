// Issue 19, each as a small deterministic reproduction: a job's end (cancel or leave) racing a
// free, an allocation or a bind, with blocks used on a second stream of their job. The soak
// (tests/soak, Soak.<mode>.<policy>.<spill>) and python_bindings/tests/test_cancel_races.py race
// the same things at random moments.
//
// The work queued on a second stream here touches no memory: it only records that it ran, so a
// missing fence shows as wrong order (an assertion), not as a fault that would end the process.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "salus/runtime.hpp"
#include "salus/sim.hpp"

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
  Runtime runtime(backend, fair());
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

}  // namespace
}  // namespace salus::testing
