// The memory manager on streams Salus did not create (a framework's own), on simulated GPUs only:
// page moves (demote, activate, remap) on a spilling mesh, streams coming and going under
// threads, and a device scheduler's lane streams. What every backend must do with such streams is
// the contract in contract/test_framework_streams_contract.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "iteration_sched/device_scheduler.hpp"
#include "memory/safe_points.hpp"
#include "salus/memory.hpp"
#include "salus/scheduler.hpp"
#include "support/framework_streams.hpp"
#include "support/harvest_fixture.hpp"
#include "support/memory_fixture.hpp"

namespace salus::testing {
namespace {

using harvest::harvesting;

constexpr std::size_t kBlock = 4 * MiB;

class FrameworkStreams : public SimMemoryTest {
 protected:
  // A stream made the way a framework makes its own: straight from the backend.
  StreamHandle outside_stream(int device = 0) { return backend->create_stream(device, 0); }

  // What a framework does before destroying its stream.
  void retire_and_destroy(int device, StreamHandle stream) {
    memory->retire_stream(device, stream);
    backend->destroy_stream(stream);
  }

  // Device stats agree with the blocks the test holds, and so does the job's view.
  void expect_balanced(int device, const std::vector<DevicePtr>& live, std::size_t each,
                       JobId job = kUnattributedJob) {
    testing::expect_balanced(*memory, device, live, each, job);
  }
};

// On a 4-GPU mesh that spills to peers: pages of an outside stream's freed blocks, and
// of a second stream's blocks spilled to peers, move (demote, activate, remap) and read back.
TEST_F(FrameworkStreams, OutsideStreamsOnAMeshWithSpillingKeepEveryByte) {
  build(SimConfig::nvlink_mesh(4, 256 * MiB),
        harvesting({64 * MiB, 64 * MiB, 64 * MiB, 64 * MiB}, SpillPolicy::peer_then_host));
  const StreamHandle s = outside_stream();
  std::vector<DevicePtr> first;
  for (int i = 0; i < 16; ++i) {
    first.push_back(alloc(kBlock, 0, kUnattributedJob, Lifetime::persistent, s));
    fill_pattern(first.back(), kBlock, 10 + i);
  }
  for (DevicePtr p : first) memory->deallocate(p);

  const JobId job = memory->register_job("filler");
  const StreamHandle s2 = outside_stream();
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 24; ++i) {  // 96 MiB on a 64 MiB device: a third spills
    blocks.push_back(alloc(kBlock, 0, job, Lifetime::persistent, s2));
    fill_pattern(blocks.back(), kBlock, 500 + i);
  }
  EXPECT_EQ(memory->device_stats(0).borrowed_peer, 32 * MiB);
  expect_balanced(0, blocks, kBlock, job);

  memory::set_job_quiescent(*memory, job);
  EXPECT_GT(memory::demote(*memory, job, 0), 0u);
  (void)memory::activate_job(*memory, job);
  memory->remap(blocks[3], Location::gpu(2));
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_TRUE(check_pattern(blocks[i], kBlock, 500 + i)) << "block " << i;
  }
  expect_balanced(0, blocks, kBlock, job);
  EXPECT_EQ(memory->job_stats(job).in_use, blocks.size() * kBlock);

  // The outside stream is still usable after all that.
  const DevicePtr again = alloc(kBlock, 0, kUnattributedJob, Lifetime::persistent, s);
  fill_pattern(again, kBlock, 7);
  EXPECT_TRUE(check_pattern(again, kBlock, 7));
  memory->deallocate(again);
  for (DevicePtr p : blocks) memory->deallocate(p);
  retire_and_destroy(0, s);
  retire_and_destroy(0, s2);
  memory->trim();
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(memory->device_stats(d).allocated, 0u) << "device " << d;
    EXPECT_EQ(memory->device_stats(d).reserved, 0u) << "device " << d;
  }
}

// Threads make, use, retire and destroy streams while another allocates on a long-lived stream:
// lookups stay lock-free while heaps are added, retired and re-bound under them.
TEST_F(FrameworkStreams, StreamsComeAndGoWhileOthersAllocate) {
  build(SimConfig::uniform(1, 256 * MiB));
  constexpr int kThreads = 4;
  constexpr int kCycles = 100;
  std::atomic<int> bad{0};
  std::atomic<bool> stop{false};
  std::thread steady([&] {
    std::uint64_t seed = 1;
    while (!stop.load()) {
      const DevicePtr p = alloc(kBlock);
      fill_pattern(p, kBlock, seed);
      if (!check_pattern(p, kBlock, seed)) ++bad;
      memory->deallocate(p);
      ++seed;
    }
  });
  std::vector<std::thread> churn;
  for (int t = 0; t < kThreads; ++t) {
    churn.emplace_back([&, t] {
      for (int i = 0; i < kCycles; ++i) {
        const StreamHandle s = outside_stream();
        const std::uint64_t seed = 1000 * (t + 1) + i;
        const DevicePtr p = alloc(kBlock, 0, kUnattributedJob, Lifetime::persistent, s);
        fill_pattern(p, kBlock, seed);
        if (!check_pattern(p, kBlock, seed)) ++bad;
        if (memory->find(p)->stream != s) ++bad;
        memory->deallocate(p);
        retire_and_destroy(0, s);
      }
    });
  }
  for (auto& th : churn) th.join();
  stop = true;
  steady.join();
  EXPECT_EQ(bad.load(), 0);
  const DeviceMemoryStats d = memory->device_stats(0);
  EXPECT_EQ(d.allocated, 0u);
  EXPECT_LE(d.stream_heaps, static_cast<std::size_t>(kThreads) * 4 + 1)
      << "retired heaps are re-bound, not piled up";
  memory->trim();
  EXPECT_EQ(memory->device_stats(0).reserved, 0u);
}

// A device scheduler retires its lane streams' heaps before it destroys the streams: afterwards
// nothing asks the destroyed streams anything (trim works), and a new stream takes their ranges.
TEST(FrameworkStreamsScheduler, LaneStreamsRetireWithTheScheduler) {
  auto backend = make_sim(SimConfig::uniform(1, 64 * MiB));
  auto memory = std::make_shared<MemoryManager>(backend);
  {
    DeviceScheduler scheduler(backend, memory, std::make_shared<TraceRecorder>(), 0,
                              PolicyRegistry::with_builtins().make("fifo"),
                              make_site_choice(/*host_compute=*/false),
                              std::chrono::milliseconds(0));
    JobSpec spec;
    spec.name = "j";
    const auto job = scheduler.turns().add(spec);
    const StreamHandle lane = scheduler.turns().begin(*job);
    EXPECT_NE(lane.value, 0u);
    const DevicePtr p = scheduler.allocate(*job, 8 * MiB, Lifetime::ephemeral);
    EXPECT_EQ(memory->find(p)->stream, lane);
    scheduler.deallocate(*job, p);
    scheduler.turns().end(*job);
    scheduler.turns().finish(*job, false);
  }
  const std::size_t heaps = memory->device_stats(0).stream_heaps;
  EXPECT_GE(heaps, 1u);
  EXPECT_NO_THROW(memory->trim());
  EXPECT_EQ(memory->device_stats(0).reserved, 0u);
  const StreamHandle s = backend->create_stream(0, 0);
  const DevicePtr q = memory->allocate({kBlock, 0, s, kUnattributedJob, Lifetime::persistent});
  EXPECT_EQ(memory->device_stats(0).stream_heaps, heaps) << "the lane's heap was re-bound";
  memory->deallocate(q);
  memory->retire_stream(0, s);
  backend->destroy_stream(s);
}

}  // namespace
}  // namespace salus::testing
