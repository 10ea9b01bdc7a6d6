// Framework streams, the contract every backend keeps (see contract/backend_fixture.hpp for what
// a contract suite is and how to add a backend): the memory manager on streams Salus did not
// create (a framework's own, made through the backend's driver). Such a stream is adopted when
// first met (checked by the backend), so reuse and trim work on it; a bogus handle, a destroyed
// stream and a stream of another device are refused before anything changes; a device takes any
// number of streams; and a stream's heap retires before the stream is destroyed, its ranges
// serving the next stream, so that streams coming and going forever use bounded memory.
// Backend-specific: test_framework_streams.cpp (sim: spilling on a mesh, scheduler lanes, threads)
// and test_framework_streams_cuda_fake.cpp (the driver's stream rules, work queued on the GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "contract/backend_fixture.hpp"
#include "support/framework_streams.hpp"

namespace salus::testing::contract {
namespace {

constexpr std::size_t kBlock = 4 * MiB;

class FrameworkStreamContract : public ContractTest {
 protected:
  StreamHandle outside_stream(int device = 0) { return harness->outside_stream(device); }

  // What a framework does before destroying its stream.
  void retire_and_destroy(int device, StreamHandle stream) {
    memory->retire_stream(device, stream);
    harness->destroy_stream(stream);
  }

  // Device stats agree with the blocks the test holds, and so does the job's view.
  void expect_balanced(int device, const std::vector<DevicePtr>& live, std::size_t each,
                       JobId job = kUnattributedJob) {
    testing::expect_balanced(*memory, device, live, each, job);
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
      harness->fill(blocks.back(), each, seed + blocks.size());
    }
    return blocks;
  }
};

// The scenario: 60 blocks on an outside stream, freed; then the default stream must be
// able to take nearly the whole device, and reclaim and trim must work on the outside stream.
TEST_P(FrameworkStreamContract, OutsideStreamPagesServeTheDefaultStreamAndTrimWorks) {
  build(1, 256 * MiB);
  const StreamHandle s = outside_stream();
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 60; ++i) {
    blocks.push_back(alloc(kBlock, 0, kUnattributedJob, Lifetime::persistent, s));
    harness->fill(blocks.back(), kBlock, 100 + i);
  }
  expect_balanced(0, blocks, kBlock);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_TRUE(harness->check(blocks[i], kBlock, 100 + i)) << "block " << i;
  }
  for (DevicePtr p : blocks) memory->deallocate(p);
  backend->synchronize_stream(s);

  const std::vector<DevicePtr> full = fill_device(0, StreamHandle{0}, kBlock, 1000);
  EXPECT_GE(full.size() * kBlock, 256 * MiB - 2 * kBlock) << "the outside stream's pages came back";
  EXPECT_NO_THROW(memory->trim());
  for (std::size_t i = 0; i < full.size(); ++i) {
    EXPECT_TRUE(harness->check(full[i], kBlock, 1000 + i + 1)) << "block " << i;
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
  EXPECT_EQ(harness->chunk_bytes(Location::gpu(0)), 0u);
  harness->expect_no_violations();
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

TEST_P(FrameworkStreamContract, ABogusHandleIsRefusedAtFirstUseAndChangesNothing) {
  build(2, 64 * MiB);
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
  harness->expect_no_violations();

  // A destroyed stream (the application's mistake: a real driver may have reused the handle), and
  // a stream of another device.
  const StreamHandle gone = outside_stream();
  harness->destroy_stream(gone);
  EXPECT_THROW((void)alloc(kBlock, 0, job, Lifetime::persistent, gone), InvalidArgument);
  harness->expect_destroyed_stream_uses(1);
  const StreamHandle other = outside_stream(1);
  expect_refused([&] { (void)alloc(kBlock, 0, job, Lifetime::persistent, other); },
                 {"device 1", "device 0"});
  EXPECT_EQ(memory->device_stats(0).stream_heaps, 1u);
  // On its own device the stream takes the whole device.
  const DevicePtr on1 = alloc(64 * MiB, 1, job, Lifetime::persistent, other);
  memory->deallocate(on1);
  EXPECT_THROW(memory->retire_stream(0, StreamHandle{0}), InvalidArgument);
  // Retiring is refused too for what is no stream of the device (it used to be a no-op).
  expect_refused([&] { memory->retire_stream(0, bogus); }, {"0x1234", "device 0"});
  expect_refused([&] { memory->retire_stream(0, gone); }, {"device 0"});
  harness->expect_destroyed_stream_uses(1);
  expect_refused([&] { memory->retire_stream(0, other); }, {"device 1", "device 0"});
  EXPECT_EQ(memory->device_stats(1).stream_heaps, 1u) << "the refused retire changed nothing";
  const StreamHandle unused = outside_stream();
  EXPECT_NO_THROW(retire_and_destroy(0, unused)) << "a live stream with no heap: a no-op";
  retire_and_destroy(1, other);
  d = memory->device_stats(0);
  EXPECT_EQ(d.allocated, 0u);
  memory->trim();
  EXPECT_EQ(harness->chunk_bytes(Location::gpu(0)), 0u);
  EXPECT_EQ(memory->device_stats(1).mapped, 0u);
  EXPECT_EQ(harness->chunk_bytes(Location::gpu(1)), 0u);
  harness->expect_no_violations();
}

// 200 streams on one device (the old cap was 64), all live at once.
TEST_P(FrameworkStreamContract, TwoHundredStreamsOnOneDevice) {
  MemoryOptions options;
  options.va_factor = 1;
  build(1, 512 * MiB, options);
  std::vector<StreamHandle> streams;
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 200; ++i) {
    streams.push_back(outside_stream());
    blocks.push_back(alloc(64 * KiB, 0, kUnattributedJob, Lifetime::persistent, streams.back()));
    harness->fill(blocks.back(), 64 * KiB, i);
  }
  EXPECT_EQ(memory->device_stats(0).stream_heaps, 200u);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_TRUE(harness->check(blocks[i], 64 * KiB, i));
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
  harness->expect_no_violations();
}

// Streams coming and going forever: the heap list, memory and address space stay bounded.
TEST_P(FrameworkStreamContract, ThousandStreamLifetimesStayBounded) {
  build(1, 64 * MiB);
  std::size_t max_heaps = 0;
  std::size_t max_reserved = 0;
  for (int i = 0; i < 1000; ++i) {
    const StreamHandle s = outside_stream();
    const DevicePtr p = alloc(kBlock, 0, kUnattributedJob, Lifetime::persistent, s);
    harness->fill(p, 64 * KiB, i);
    ASSERT_TRUE(harness->check(p, 64 * KiB, i));
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
  harness->expect_no_violations();
}

// A block still live when its stream retires stays valid, is freed later, and its memory serves
// others without a violation; the retired heap is re-bound only after that.
TEST_P(FrameworkStreamContract, ALiveBlockOnARetiredStreamCanStillBeFreedAndReused) {
  build(1, 64 * MiB);
  const StreamHandle s = outside_stream();
  const DevicePtr kept = alloc(16 * MiB, 0, kUnattributedJob, Lifetime::persistent, s);
  const DevicePtr freed = alloc(16 * MiB, 0, kUnattributedJob, Lifetime::persistent, s);
  harness->fill(kept, 16 * MiB, 1);
  memory->deallocate(freed);
  retire_and_destroy(0, s);
  EXPECT_EQ(memory->device_stats(0).mapped, 16 * MiB) << "cached pages left with the retire";
  EXPECT_TRUE(harness->check(kept, 16 * MiB, 1));
  EXPECT_EQ(memory->find(kept)->bytes, 16 * MiB);

  // A new stream cannot take the retired heap while a block lives there.
  const StreamHandle t = outside_stream();
  const DevicePtr other = alloc(kBlock, 0, kUnattributedJob, Lifetime::persistent, t);
  EXPECT_EQ(memory->device_stats(0).stream_heaps, 2u);
  EXPECT_THROW((void)alloc(48 * MiB, 0, kUnattributedJob, Lifetime::persistent, t), OutOfMemory);

  memory->deallocate(kept);
  const DevicePtr big = alloc(60 * MiB, 0, kUnattributedJob, Lifetime::persistent, t);
  harness->fill(big, 60 * MiB, 2);
  EXPECT_TRUE(harness->check(big, 60 * MiB, 2));
  harness->expect_no_violations();
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
  EXPECT_EQ(harness->chunk_bytes(Location::gpu(0)), 0u);
  harness->expect_no_violations();
}

// A job's extra stream, and a stream recorded on a block, retire while blocks name them: later
// frees wait for the retire fence instead of recording on the destroyed stream (which the sim
// backend refuses with a throw, the fake driver with a violation).
TEST_P(FrameworkStreamContract, RetiredJobAndRecordedStreamsAreNotUsedAfterRetirement) {
  build(1, 64 * MiB);
  const JobId job = memory->register_job("j");
  const StreamHandle lane = outside_stream();
  const StreamHandle side = outside_stream();
  memory->add_job_stream(job, 0, lane);
  const DevicePtr a = alloc(kBlock, 0, job);
  const DevicePtr b = alloc(kBlock, 0, job);
  memory->record_stream_use(b, side);
  retire_and_destroy(0, lane);
  retire_and_destroy(0, side);
  EXPECT_NO_THROW(memory->deallocate(a));
  EXPECT_NO_THROW(memory->deallocate(b));
  EXPECT_NO_THROW(memory->trim());
  EXPECT_EQ(memory->device_stats(0).allocated, 0u);
  harness->expect_no_violations();
}

INSTANTIATE_TEST_SUITE_P(Backends, FrameworkStreamContract,
                         ::testing::ValuesIn(contract_backends()), ContractBackendName);

}  // namespace
}  // namespace salus::testing::contract
