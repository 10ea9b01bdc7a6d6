// The memory manager on streams Salus did not create (a framework's own), on simulated GPUs:
// such a stream is adopted when first met (checked by the backend), so reuse, trim and page moves
// work on it; a bogus handle is refused before anything changes; a device takes any number of
// streams; and a stream's heap retires before the stream is destroyed, its ranges serving the
// next stream, so that streams coming and going forever use bounded memory.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "iteration_sched/device_scheduler.hpp"
#include "memory/safe_points.hpp"
#include "salus/memory.hpp"
#include "salus/scheduler.hpp"
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
    const DeviceMemoryStats d = memory->device_stats(device);
    EXPECT_EQ(d.allocated, live.size() * each);
    EXPECT_EQ(d.by_class[0].blocks + d.by_class[1].blocks, live.size());
    EXPECT_EQ(d.allocations - d.frees, live.size());
    const JobMemoryStats j = memory->job_stats(job);
    EXPECT_EQ(j.in_use_by_device[static_cast<std::size_t>(device)], live.size() * each);
  }

  // Allocates `each` bytes on `stream` until the device says no; every block gets its pattern.
  std::vector<DevicePtr> fill_device(int device, StreamHandle stream, std::size_t each,
                                     std::uint64_t seed, JobId job = kUnattributedJob) {
    std::vector<DevicePtr> blocks;
    for (;;) {
      try {
        blocks.push_back(alloc(each, device, job, Lifetime::persistent, stream));
      } catch (const OutOfMemory&) {
        break;
      }
      fill_pattern(blocks.back(), each, seed + blocks.size());
    }
    return blocks;
  }
};

// The scenario: 60 blocks on an outside stream, freed; then the default stream must be
// able to take nearly the whole device, and reclaim and trim must work on the outside stream.
TEST_F(FrameworkStreams, OutsideStreamPagesServeTheDefaultStreamAndTrimWorks) {
  build(SimConfig::uniform(1, 256 * MiB));
  const StreamHandle s = outside_stream();
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 60; ++i) {
    blocks.push_back(alloc(kBlock, 0, kUnattributedJob, Lifetime::persistent, s));
    fill_pattern(blocks.back(), kBlock, 100 + i);
  }
  expect_balanced(0, blocks, kBlock);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_TRUE(check_pattern(blocks[i], kBlock, 100 + i)) << "block " << i;
  }
  for (DevicePtr p : blocks) memory->deallocate(p);
  backend->synchronize_stream(s);

  const std::vector<DevicePtr> full = fill_device(0, StreamHandle{0}, kBlock, 1000);
  EXPECT_GE(full.size() * kBlock, 256 * MiB - 2 * kBlock) << "the outside stream's pages came back";
  EXPECT_NO_THROW(memory->trim());
  for (std::size_t i = 0; i < full.size(); ++i) {
    EXPECT_TRUE(check_pattern(full[i], kBlock, 1000 + i + 1)) << "block " << i;
  }
  expect_balanced(0, full, kBlock);
  EXPECT_EQ(memory->device_stats(0).stream_heaps, 2u);
  for (DevicePtr p : full) memory->deallocate(p);
  retire_and_destroy(0, s);
  memory->trim();
  const DeviceMemoryStats d = memory->device_stats(0);
  EXPECT_EQ(d.allocated, 0u);
  EXPECT_EQ(d.reserved, 0u);
  EXPECT_EQ(d.mapped, 0u);
}

// The same on a 4-GPU mesh that spills to peers: pages of an outside stream's freed blocks, and
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

// Expects `call` to throw InvalidArgument whose message contains every one of `words`.
template <class F>
void expect_refused(F&& call, const std::vector<std::string>& words) {
  try {
    call();
    ADD_FAILURE() << "not refused";
  } catch (const InvalidArgument& e) {
    for (const std::string& w : words) {
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what() << " lacks " << w;
    }
  }
}

TEST_F(FrameworkStreams, ABogusHandleIsRefusedAtFirstUseAndChangesNothing) {
  build(SimConfig::uniform(2, 64 * MiB));
  const JobId job = memory->register_job("j");
  const StreamHandle bogus{0x1234};
  expect_refused([&] { (void)alloc(kBlock, 0, job, Lifetime::persistent, bogus); },
                 {"0x1234", "device 0"});
  DeviceMemoryStats d = memory->device_stats(0);
  EXPECT_EQ(d.stream_heaps, 0u);
  EXPECT_EQ(d.allocated, 0u);
  EXPECT_EQ(d.out_of_memory, 0u);
  EXPECT_EQ(memory->job_stats(job).peak, 0u) << "nothing was charged";

  const DevicePtr p = alloc(kBlock, 0, job);
  expect_refused([&] { memory->record_stream_use(p, bogus); }, {"0x1234"});
  expect_refused([&] { memory->add_job_stream(job, 0, bogus); }, {"0x1234"});
  memory->deallocate(p);
  // Nothing names the bogus stream: trim and a full device work.
  EXPECT_NO_THROW(memory->trim());
  const std::vector<DevicePtr> full = fill_device(0, StreamHandle{0}, kBlock, 1, job);
  EXPECT_EQ(full.size() * kBlock, 64 * MiB);
  for (DevicePtr q : full) memory->deallocate(q);
  EXPECT_NO_THROW(memory->trim());
  EXPECT_EQ(memory->device_stats(0).stream_heaps, 1u);

  // A destroyed stream, and a stream of another device.
  const StreamHandle gone = outside_stream();
  backend->destroy_stream(gone);
  EXPECT_THROW((void)alloc(kBlock, 0, job, Lifetime::persistent, gone), InvalidArgument);
  const StreamHandle other = outside_stream(1);
  expect_refused([&] { (void)alloc(kBlock, 0, job, Lifetime::persistent, other); },
                 {"device 1", "device 0"});
  EXPECT_EQ(memory->device_stats(0).stream_heaps, 1u);
  const DevicePtr on1 = alloc(kBlock, 1, job, Lifetime::persistent, other);
  memory->deallocate(on1);
  EXPECT_THROW(memory->retire_stream(0, StreamHandle{0}), InvalidArgument);
  // Retiring is refused too for what is no stream of the device (it used to be a no-op).
  expect_refused([&] { memory->retire_stream(0, bogus); }, {"0x1234", "device 0"});
  expect_refused([&] { memory->retire_stream(0, gone); }, {"device 0"});
  expect_refused([&] { memory->retire_stream(0, other); }, {"device 1", "device 0"});
  EXPECT_EQ(memory->device_stats(1).stream_heaps, 1u) << "the refused retire changed nothing";
  const StreamHandle unused = outside_stream();
  EXPECT_NO_THROW(retire_and_destroy(0, unused)) << "a live stream with no heap: a no-op";
  retire_and_destroy(1, other);
  d = memory->device_stats(0);
  EXPECT_EQ(d.allocated, 0u);
}

// 200 streams on one device (the old cap was 64), all live at once.
TEST_F(FrameworkStreams, TwoHundredStreamsOnOneDevice) {
  MemoryOptions options;
  options.va_factor = 1;
  build(SimConfig::uniform(1, 512 * MiB), options);
  std::vector<StreamHandle> streams;
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 200; ++i) {
    streams.push_back(outside_stream());
    blocks.push_back(alloc(64 * KiB, 0, kUnattributedJob, Lifetime::persistent, streams.back()));
    fill_pattern(blocks.back(), 64 * KiB, i);
  }
  EXPECT_EQ(memory->device_stats(0).stream_heaps, 200u);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_TRUE(check_pattern(blocks[i], 64 * KiB, i));
    EXPECT_EQ(memory->find(blocks[i])->stream, streams[i]);
  }
  for (DevicePtr p : blocks) memory->deallocate(p);
  for (StreamHandle s : streams) retire_and_destroy(0, s);
  // A new stream takes a retired heap's ranges instead of a new one.
  const StreamHandle fresh = outside_stream();
  const DevicePtr p = alloc(64 * KiB, 0, kUnattributedJob, Lifetime::persistent, fresh);
  EXPECT_EQ(memory->device_stats(0).stream_heaps, 200u);
  memory->deallocate(p);
  retire_and_destroy(0, fresh);
  memory->trim();
  EXPECT_EQ(memory->device_stats(0).reserved, 0u);
}

// Streams coming and going forever: the heap list, memory and address space stay bounded.
TEST_F(FrameworkStreams, ThousandStreamLifetimesStayBounded) {
  build(SimConfig::uniform(1, 64 * MiB));
  std::size_t max_heaps = 0;
  std::size_t max_reserved = 0;
  for (int i = 0; i < 1000; ++i) {
    const StreamHandle s = outside_stream();
    const DevicePtr p = alloc(kBlock, 0, kUnattributedJob, Lifetime::persistent, s);
    fill_pattern(p, 64 * KiB, i);
    ASSERT_TRUE(check_pattern(p, 64 * KiB, i));
    memory->deallocate(p);
    retire_and_destroy(0, s);
    const DeviceMemoryStats d = memory->device_stats(0);
    max_heaps = std::max(max_heaps, d.stream_heaps);
    max_reserved = std::max(max_reserved, d.reserved);
  }
  EXPECT_LE(max_heaps, 2u);
  EXPECT_LE(max_reserved, 2 * kBlock);
  const DeviceMemoryStats d = memory->device_stats(0);
  EXPECT_EQ(d.allocations, 1000u);
  EXPECT_EQ(d.frees, 1000u);
  EXPECT_EQ(d.allocated, 0u);
}

// A block still live when its stream retires stays valid, is freed later, and its memory serves
// others; the retired heap is re-bound only after that.
TEST_F(FrameworkStreams, ALiveBlockOnARetiredStreamCanStillBeFreedAndReused) {
  build(SimConfig::uniform(1, 64 * MiB));
  const StreamHandle s = outside_stream();
  const DevicePtr kept = alloc(16 * MiB, 0, kUnattributedJob, Lifetime::persistent, s);
  const DevicePtr freed = alloc(16 * MiB, 0, kUnattributedJob, Lifetime::persistent, s);
  fill_pattern(kept, 16 * MiB, 1);
  memory->deallocate(freed);
  retire_and_destroy(0, s);
  EXPECT_EQ(memory->device_stats(0).mapped, 16 * MiB) << "cached pages left with the retire";
  EXPECT_TRUE(check_pattern(kept, 16 * MiB, 1));
  EXPECT_EQ(memory->find(kept)->bytes, 16 * MiB);

  // A new stream cannot take the retired heap while a block lives there.
  const StreamHandle t = outside_stream();
  const DevicePtr other = alloc(kBlock, 0, kUnattributedJob, Lifetime::persistent, t);
  EXPECT_EQ(memory->device_stats(0).stream_heaps, 2u);
  EXPECT_THROW((void)alloc(48 * MiB, 0, kUnattributedJob, Lifetime::persistent, t), OutOfMemory);

  memory->deallocate(kept);
  const DevicePtr big = alloc(60 * MiB, 0, kUnattributedJob, Lifetime::persistent, t);
  fill_pattern(big, 60 * MiB, 2);
  EXPECT_TRUE(check_pattern(big, 60 * MiB, 2));
  const StreamHandle u = outside_stream();
  memory->deallocate(big);
  const DevicePtr reused = alloc(kBlock, 0, kUnattributedJob, Lifetime::persistent, u);
  EXPECT_EQ(memory->device_stats(0).stream_heaps, 2u) << "u took the retired heap";
  memory->deallocate(reused);
  memory->deallocate(other);
  retire_and_destroy(0, t);
  retire_and_destroy(0, u);
  memory->trim();
  EXPECT_EQ(memory->device_stats(0).reserved, 0u);
}

// A job's extra stream, and a stream recorded on a block, retire while blocks name them: later
// frees wait for the retire fence instead of recording on the destroyed stream.
TEST_F(FrameworkStreams, RetiredJobAndRecordedStreamsAreNotUsedAfterRetirement) {
  build(SimConfig::uniform(1, 64 * MiB));
  const JobId job = memory->register_job("j");
  const StreamHandle lane = outside_stream();
  const StreamHandle side = outside_stream();
  memory->add_job_stream(job, 0, lane);
  const DevicePtr a = alloc(kBlock, 0, job);
  const DevicePtr b = alloc(kBlock, 0, job);
  memory->record_stream_use(b, side);
  retire_and_destroy(0, lane);
  retire_and_destroy(0, side);
  // Recording on either destroyed stream would throw from the sim backend.
  EXPECT_NO_THROW(memory->deallocate(a));
  EXPECT_NO_THROW(memory->deallocate(b));
  EXPECT_NO_THROW(memory->trim());
  EXPECT_EQ(memory->device_stats(0).allocated, 0u);
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
                              std::make_shared<std::atomic<bool>>(false));
    JobSpec spec;
    spec.name = "j";
    const auto job = scheduler.add(spec);
    const StreamHandle lane = scheduler.begin(*job);
    EXPECT_NE(lane.value, 0u);
    const DevicePtr p = scheduler.allocate(*job, 8 * MiB, Lifetime::ephemeral);
    EXPECT_EQ(memory->find(p)->stream, lane);
    scheduler.deallocate(*job, p);
    scheduler.end(*job);
    scheduler.finish(*job, false);
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
