// Parts of the simulated backend, alone: a location's memfd (SimPool), the files imported chunks
// map from (ImportedFiles), the memory (SimMemory) and the streams and events (SimStreams). The
// backend over them is tested in test_sim_backend.cpp, test_sim_sharing.cpp and the contracts.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <latch>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda/sim_imported_files.hpp"
#include "cuda/sim_memory.hpp"
#include "cuda/sim_pool.hpp"
#include "cuda/sim_status.hpp"
#include "cuda/sim_streams.hpp"
#include "salus/sim.hpp"
#include "support/expect_throw.hpp"

namespace salus::sim {
namespace {

using salus::test_support::expect_throw_with;
using namespace std::chrono_literals;

constexpr std::size_t kPage = 2 * MiB;

SimConfig two_devices() {
  SimConfig config = SimConfig::uniform(2, 16 * kPage);
  config.host_memory_bytes = 16 * kPage;
  return config;
}

// --- SimPool ---------------------------------------------------------------------------------

TEST(SimPoolPart, AllocatesFirstFitAndCountsWhatIsUsed) {
  SimPool pool(Location::gpu(0), 4 * kPage, kPage);
  EXPECT_EQ(pool.allocate(kPage), 0u);
  EXPECT_EQ(pool.allocate(2 * kPage), kPage);
  EXPECT_EQ(pool.used(), 3 * kPage);
  pool.release(0, kPage);
  EXPECT_EQ(pool.allocate(kPage), 0u) << "the first hole that fits";
  EXPECT_EQ(pool.allocate(kPage), 3 * kPage);
  EXPECT_EQ(pool.used(), pool.capacity());
  EXPECT_GE(pool.fd(), 0);
}

TEST(SimPoolPart, RefusesWhatNoFreeExtentHoldsNamingTheLocationAndUsage) {
  SimPool pool(Location::gpu(1), 4 * kPage, kPage);
  (void)pool.allocate(kPage);
  (void)pool.allocate(kPage);
  pool.release(0, kPage);  // 3 pages free, but in two extents
  try {
    (void)pool.allocate(3 * kPage);
    ADD_FAILURE() << "a 3-page extent does not exist";
  } catch (const DeviceError& e) {
    EXPECT_TRUE(e.is_out_of_memory());
    EXPECT_NE(
        std::string(e.what()).find("6291456 bytes requested, 2097152 of 8388608 bytes in use"),
        std::string::npos)
        << e.what();
  }
  EXPECT_EQ(pool.used(), kPage) << "a refusal takes nothing";
}

TEST(SimPoolPart, ReleasedExtentsCoalesceWithBothNeighbours) {
  SimPool pool(Location::host(), 3 * kPage, kPage);
  for (int i = 0; i < 3; ++i) (void)pool.allocate(kPage);
  pool.release(0, kPage);
  pool.release(2 * kPage, kPage);
  pool.release(kPage, kPage);  // joins the extent before and the one after
  EXPECT_EQ(pool.used(), 0u);
  EXPECT_EQ(pool.allocate(3 * kPage), 0u) << "one extent of the whole capacity again";
}

// --- ImportedFiles ---------------------------------------------------------------------------

struct ImportedFilesPart : ::testing::Test {
  SimPool pool{Location::gpu(0), kPage, kPage};  // any file will do: the pool's memfd
  struct stat st {};
  void SetUp() override { ASSERT_EQ(::fstat(pool.fd(), &st), 0); }
  std::uint64_t dev() const { return static_cast<std::uint64_t>(st.st_dev); }
  std::uint64_t ino() const { return static_cast<std::uint64_t>(st.st_ino); }
};

TEST_F(ImportedFilesPart, TwoDescriptorsOfOneFileShareOneHeldFile) {
  ImportedFiles files;
  const int other = ::dup(pool.fd());
  ASSERT_GE(other, 0);
  auto first = files.hold(pool.fd(), dev(), ino());
  auto second = files.hold(other, dev(), ino());
  ::close(other);
  EXPECT_EQ(first, second);
  EXPECT_NE(first->fd.get(), pool.fd()) << "the caller's descriptor stays the caller's";
  EXPECT_EQ(files.open_files(), 1u);
  const int held = first->fd.get();
  files.drop(std::move(first));
  EXPECT_EQ(files.open_files(), 1u) << "the second chunk still holds it";
  EXPECT_NE(::fcntl(held, F_GETFD), -1);
  files.drop(std::move(second));
  EXPECT_EQ(files.open_files(), 0u);
  EXPECT_EQ(::fcntl(held, F_GETFD), -1) << "closed with its last chunk";
}

TEST_F(ImportedFilesPart, AFailedDuplicateLeavesNoEntry) {
  ImportedFiles files;
  EXPECT_THROW((void)files.hold(-1, dev(), ino()), DeviceError);
  EXPECT_EQ(files.open_files(), 0u);
  auto held = files.hold(pool.fd(), dev(), ino());  // the same key works afterwards
  EXPECT_EQ(files.open_files(), 1u);
}

// --- SimMemory -------------------------------------------------------------------------------

std::vector<AccessGrant> all_read_write() {
  return {{0, Access::read_write}, {1, Access::read_write}};
}

TEST(SimMemoryPart, MappingARangeNotReservedIsRefusedNamingIt) {
  SimMemory memory(two_devices());
  const ChunkHandle chunk = memory.create_chunk(Location::gpu(0), 2 * kPage);
  const DevicePtr base = memory.reserve_address(2 * kPage, 0);
  const DevicePtr outside = base + 64 * kPage;
  expect_throw_with<InvalidArgument>(
      [&] { memory.map(outside, kPage, chunk, 0); },
      fmt::format("map: [{:#x}, +{}) is not inside one reservation", outside, kPage));
  expect_throw_with<InvalidArgument>([&] { memory.map(base + kPage, 2 * kPage, chunk, 0); },
                                     "is not inside one reservation");
  EXPECT_EQ(memory.mapped_bytes(), 0u);
  memory.free_address(base, 2 * kPage);
  memory.release_chunk(chunk);
}

TEST(SimMemoryPart, AReleasedChunksBytesReturnToItsPoolOnlyWithItsLastMapping) {
  SimMemory memory(two_devices());
  const DevicePtr base = memory.reserve_address(2 * kPage, 0);
  const ChunkHandle chunk = memory.create_chunk(Location::gpu(1), 2 * kPage);
  memory.map(base, kPage, chunk, 0);
  memory.map(base + kPage, kPage, chunk, kPage);
  EXPECT_EQ(memory.free_memory(1), 14 * kPage);
  memory.release_chunk(chunk);
  EXPECT_EQ(memory.chunk_bytes(Location::gpu(1)), 2 * kPage) << "still mapped twice";
  expect_throw_with<InvalidArgument>([&] { memory.release_chunk(chunk); }, "already released");
  memory.unmap(base, kPage);
  EXPECT_EQ(memory.chunk_bytes(Location::gpu(1)), 2 * kPage) << "still mapped once";
  memory.unmap(base + kPage, kPage);
  EXPECT_EQ(memory.chunk_bytes(Location::gpu(1)), 0u);
  EXPECT_EQ(memory.free_memory(1), 16 * kPage);
  memory.free_address(base, 2 * kPage);
}

TEST(SimMemoryPart, FreeingAnAddressRangeDropsItsMappingsAndReleasedChunks) {
  SimMemory memory(two_devices());
  const DevicePtr base = memory.reserve_address(kPage, 0);
  const ChunkHandle chunk = memory.create_chunk(Location::host(), kPage);
  memory.map(base, kPage, chunk, 0);
  memory.release_chunk(chunk);
  EXPECT_EQ(memory.reserved_bytes(), kPage);
  memory.free_address(base, kPage);
  EXPECT_EQ(memory.reserved_bytes(), 0u);
  EXPECT_EQ(memory.mapped_bytes(), 0u);
  EXPECT_EQ(memory.chunk_bytes(Location::host()), 0u);
}

TEST(SimMemoryPart, AccessIsPerDeviceAndWhatACopyOrFillMayTouch) {
  SimMemory memory(two_devices());
  const DevicePtr base = memory.reserve_address(2 * kPage, 0);
  const ChunkHandle a = memory.create_chunk(Location::gpu(0), kPage);
  const ChunkHandle h = memory.create_chunk(Location::host(), kPage);
  memory.map(base, kPage, a, 0);
  memory.map(base + kPage, kPage, h, 0);
  // Mapped but inaccessible: neither readable nor writable.
  expect_throw_with<DeviceError>([&] { memory.check_fill(base, kPage); }, "is not writable memory");
  const AccessGrant read_only[] = {{1, Access::read}};
  memory.set_access(base, kPage, read_only);
  EXPECT_EQ(memory.access_of(base, 1), Access::read);
  EXPECT_EQ(memory.access_of(base, 0), Access::none);
  memory.set_access(base + kPage, kPage, all_read_write());
  // Readable source, read-only destination: the destination is named.
  expect_throw_with<DeviceError>(
      [&] { memory.check_copy(base, base + kPage, kPage, false); },
      fmt::format("destination [{:#x}, +{}) is not writable", base, kPage));
  const SimMemory::CopyEnds ends = memory.check_copy(base + kPage, base, kPage, true);
  EXPECT_EQ(ends.dst, Location::host());
  EXPECT_EQ(ends.src, Location::gpu(0));
  const SimMemory::CopyEnds unlocated = memory.check_copy(base + kPage, base, kPage, false);
  EXPECT_FALSE(unlocated.dst.has_value());
  memory.check_fill(base + kPage, kPage);
  memory.free_address(base, 2 * kPage);
  memory.release_chunk(a);
  memory.release_chunk(h);
}

TEST(SimMemoryPart, AnImportedChunkMapsTheExportersBytesAndCountsInNoPool) {
  SimMemory exporter(two_devices());
  SimMemory importer(two_devices());
  const ChunkHandle chunk = exporter.create_chunk(Location::gpu(0), kPage);
  const SharedChunk shared = exporter.export_chunk(chunk);
  const ChunkHandle imported = importer.import_chunk(Location::gpu(0), shared);
  ::close(shared.fd);
  EXPECT_EQ(importer.chunk_bytes(Location::gpu(0)), 0u);
  const DevicePtr out = exporter.reserve_address(kPage, 0);
  const DevicePtr in = importer.reserve_address(kPage, 0);
  exporter.map(out, kPage, chunk, 0);
  importer.map(in, kPage, imported, 0);
  exporter.set_access(out, kPage, all_read_write());
  importer.set_access(in, kPage, all_read_write());
  *reinterpret_cast<int*>(out) = 42;
  EXPECT_EQ(*reinterpret_cast<const int*>(in), 42);
  importer.free_address(in, kPage);
  importer.release_chunk(imported);
  exporter.free_address(out, kPage);
  exporter.release_chunk(chunk);
  const ChunkHandle host = exporter.create_chunk(Location::host(), kPage);
  expect_throw_with<NotSupported>([&] { (void)exporter.export_chunk(host); }, "host memory");
  exporter.release_chunk(host);
}

TEST(ConcurrentSimMemoryPart, ParallelMapsAndUnmapsLeaveNothingBehind) {
  SimMemory memory(two_devices());
  constexpr int kThreads = 4;
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int i = 0; i < 50; ++i) {
        const DevicePtr va = memory.reserve_address(kPage, 0);
        const ChunkHandle c = memory.create_chunk(Location::gpu(t % 2), kPage);
        memory.map(va, kPage, c, 0);
        memory.release_chunk(c);  // freed by the unmap below
        memory.unmap(va, kPage);
        memory.free_address(va, kPage);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(memory.mapped_bytes(), 0u);
  EXPECT_EQ(memory.reserved_bytes(), 0u);
  EXPECT_EQ(memory.chunk_bytes(Location::gpu(0)) + memory.chunk_bytes(Location::gpu(1)), 0u);
}

// --- SimStreams ------------------------------------------------------------------------------

struct SimStreamsPart : ::testing::Test {
  SimStreams streams{2, StreamPriorityRange{0, -5}, process::birth_now()};

  // Holds `stream` until the returned promise is set.
  std::promise<void> block(StreamHandle stream, int device) {
    std::promise<void> gate;
    auto opened = std::make_shared<std::shared_future<void>>(gate.get_future().share());
    streams.stream(stream, device)->push([opened](std::stop_token) { opened->wait(); });
    return gate;
  }
};

TEST_F(SimStreamsPart, WorkEnqueuedAfterAWaitForARecordRunsOnlyOnceTheRecordHas) {
  const StreamHandle producer = streams.create_stream(0, 0);
  const StreamHandle consumer = streams.create_stream(1, 0);
  const EventHandle event = streams.create_event(0, false);
  std::promise<void> gate = block(producer, 0);
  EXPECT_TRUE(streams.record_event(event, producer)) << "pending behind the blocked work";
  EXPECT_FALSE(streams.query_event(event));
  streams.stream_wait_event(consumer, event, 1);
  std::atomic<bool> ran{false};
  streams.stream(consumer, 1)->push([&](std::stop_token) { ran = true; });
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(ran.load()) << "the consumer waits for the producer's record";
  gate.set_value();
  streams.stream(consumer, 1)->synchronize();
  EXPECT_TRUE(ran.load());
  EXPECT_TRUE(streams.query_event(event));
  streams.destroy_event(event);
  streams.destroy_stream(producer);
  streams.destroy_stream(consumer);
}

TEST_F(SimStreamsPart, DestroyingAStreamRunsItsQueuedWorkFirst) {
  const StreamHandle stream = streams.create_stream(1, 0);
  std::atomic<int> done{0};
  auto target = streams.stream(stream, 1);
  for (int i = 0; i < 10; ++i) {
    target->push([&](std::stop_token) {
      std::this_thread::sleep_for(1ms);
      ++done;
    });
  }
  streams.destroy_stream(stream);
  EXPECT_EQ(done.load(), 10);
  expect_throw_with<InvalidArgument>([&] { streams.destroy_stream(stream); },
                                     "destroy_stream: unknown stream");
  expect_throw_with<InvalidArgument>([&] { (void)streams.stream(stream, 1); },
                                     "(never created or destroyed)");
  EXPECT_THROW(target->push([](std::stop_token) {}), InvalidArgument) << "being destroyed";
}

TEST_F(SimStreamsPart, ARecordOnAnIdleStreamCompletesAtOnce) {
  const EventHandle event = streams.create_event(0, true);
  EXPECT_FALSE(streams.record_event(event, StreamHandle{0}));
  EXPECT_TRUE(streams.query_event(event));
  streams.synchronize_event(event);  // returns at once
  EXPECT_EQ(streams.elapsed_seconds(event, event), 0.0);
  EXPECT_EQ(streams.tasks_handed(0), 0u) << "no task for the worker";
  streams.destroy_event(event);
}

TEST_F(SimStreamsPart, TasksAreCountedPerDeviceAndPrioritiesClamped) {
  const StreamHandle urgent = streams.create_stream(1, -100);
  EXPECT_EQ(streams.stream(urgent, 1)->priority, -5);
  EXPECT_EQ(streams.stream(StreamHandle{0}, 0)->priority, 0) << "default: the least urgent";
  for (int i = 0; i < 3; ++i) streams.stream(urgent, 1)->push([](std::stop_token) {});
  streams.stream(urgent, 1)->synchronize();
  EXPECT_EQ(streams.tasks_handed(1), 3u);
  EXPECT_EQ(streams.tasks_handed(0), 0u);
  streams.validate_stream(urgent, 1);
  expect_throw_with<InvalidArgument>([&] { streams.validate_stream(urgent, 0); },
                                     "belongs to device 1, not device 0");
  streams.destroy_stream(urgent);
  expect_throw_with<InvalidArgument>([&] { streams.validate_stream(urgent, 1); },
                                     "is no stream of the sim backend");
}

TEST_F(SimStreamsPart, ElapsedTimeRefusesEventsWithoutTimingOrARecord) {
  const EventHandle plain = streams.create_event(0, false);
  const EventHandle timing = streams.create_event(0, true);
  expect_throw_with<InvalidArgument>([&] { (void)streams.elapsed_seconds(plain, timing); },
                                     "start event 1 was created without timing");
  expect_throw_with<InvalidArgument>([&] { (void)streams.elapsed_seconds(timing, timing); },
                                     "start event 2 was never recorded");
  std::promise<void> gate = block(StreamHandle{0}, 0);
  (void)streams.record_event(timing, StreamHandle{0});
  try {
    (void)streams.elapsed_seconds(timing, timing);
    ADD_FAILURE() << "the record has not run";
  } catch (const DeviceError& e) {
    EXPECT_EQ(e.status_code(), kCudaErrorNotReady);
  }
  gate.set_value();
  streams.synchronize_event(timing);
  EXPECT_EQ(streams.elapsed_seconds(timing, timing), 0.0);
}

TEST_F(SimStreamsPart, AnImportedEventSeesTheExportersRecords) {
  const EventHandle event = streams.create_shareable_event(0);
  const SharedEvent shared = streams.export_event(event);
  const EventHandle imported = streams.import_event(1, shared);
  ::close(shared.fd);
  expect_throw_with<InvalidArgument>([&] { (void)streams.record_event(imported, StreamHandle{0}); },
                                     "was imported");
  std::promise<void> gate = block(StreamHandle{0}, 0);
  (void)streams.record_event(event, StreamHandle{0});
  EXPECT_FALSE(streams.query_event(imported));
  gate.set_value();
  streams.synchronize_event(imported);
  EXPECT_TRUE(streams.query_event(imported));
  expect_throw_with<InvalidArgument>(
      [&] { (void)streams.export_event(streams.create_event(0, false)); }, "is not shareable");
}

// A stream whose task ends only on a stop request, a record behind it and a wait for that record
// on another stream: shutdown stops both and still drains every queue, and forgets the events.
TEST_F(SimStreamsPart, ShutdownStopsWaitsAndDrainsEveryStream) {
  const StreamHandle stuck = streams.create_stream(0, 0);
  const StreamHandle waiter = streams.create_stream(1, 0);
  const EventHandle event = streams.create_event(0, false);
  std::atomic<bool> stopped{false};
  streams.stream(stuck, 0)->push([&](std::stop_token st) {
    std::mutex m;
    std::condition_variable_any cv;
    std::unique_lock lock(m);
    cv.wait(lock, st, [] { return false; });
    stopped = st.stop_requested();
  });
  EXPECT_TRUE(streams.record_event(event, stuck));
  streams.stream_wait_event(waiter, event, 1);
  std::atomic<bool> after{false};
  streams.stream(waiter, 1)->push([&](std::stop_token) { after = true; });
  streams.shutdown();
  EXPECT_TRUE(stopped.load());
  EXPECT_TRUE(after.load()) << "work behind the wait ran before the join";
  expect_throw_with<InvalidArgument>([&] { (void)streams.query_event(event); }, "unknown event");
  expect_throw_with<InvalidArgument>([&] { (void)streams.stream(stuck, 0); }, "unknown stream");
  streams.shutdown();  // idempotent
}

TEST(ConcurrentSimStreamsPart, ManyThreadsCreateRecordAndWait) {
  SimStreams streams{2, StreamPriorityRange{0, 0}, process::birth_now()};
  constexpr int kThreads = 4;
  std::latch start(kThreads);
  std::atomic<int> ran{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int device = t % 2;
      start.arrive_and_wait();
      for (int i = 0; i < 20; ++i) {
        const StreamHandle s = streams.create_stream(device, 0);
        const EventHandle e = streams.create_event(device, false);
        streams.stream(s, device)->push([&](std::stop_token) { ++ran; });
        (void)streams.record_event(e, s);
        streams.stream_wait_event(StreamHandle{0}, e, device);
        streams.synchronize_event(e);
        streams.destroy_event(e);
        streams.destroy_stream(s);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(ran.load(), kThreads * 20);
  EXPECT_GE(streams.tasks_handed(0) + streams.tasks_handed(1), kThreads * 20u);
}

}  // namespace
}  // namespace salus::sim
