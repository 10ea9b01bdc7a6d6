// The fake driver's model of queued GPU work, on its own: streams are in-order queues, events
// capture the work before them, host waits complete what they wait for, and releasing memory that
// unfinished work references is recorded as a violation (while aliasing a chunk is not). The
// stream-safety tests of the memory manager rest on this model, so it is pinned down here.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "support/fake_driver.hpp"

namespace salus {
namespace {

using cuda::CudaBackend;
using test::FakeDriver;
using test::FakeDriverConfig;

constexpr std::size_t kPage = 2 * MiB;

class FakeDriverWork : public ::testing::Test {
 protected:
  // A page-sized range mapped read-write for device 0, on a chunk of its own.
  struct Mapped {
    ChunkHandle chunk;
    DevicePtr va = 0;
  };
  Mapped map_page() {
    Mapped m{backend_.create_chunk(Location::gpu(0), kPage), backend_.reserve_address(kPage, 0)};
    backend_.map(m.va, kPage, m.chunk, 0);
    const AccessGrant grant{0, Access::read_write};
    backend_.set_access(m.va, kPage, std::span(&grant, 1));
    return m;
  }
  // Unmaps, frees the range and releases the chunk: every way memory goes back.
  void release(const Mapped& m) {
    backend_.unmap(m.va, kPage);
    backend_.free_address(m.va, kPage);
    backend_.release_chunk(m.chunk);
  }

  FakeDriver fake_{FakeDriverConfig::uniform(2, 1 * GiB)};
  CudaBackend backend_{fake_.api()};
};

TEST_F(FakeDriverWork, EventIsPendingBehindUnfinishedWork) {
  const Mapped m = map_page();
  const StreamHandle s = backend_.create_stream(0, 0);
  const EventHandle never = backend_.create_event(0);
  const EventHandle idle = backend_.create_event(0);
  const EventHandle after = backend_.create_event(0);
  EXPECT_TRUE(backend_.query_event(never)) << "never recorded: complete";
  backend_.record_event(idle, s);
  EXPECT_TRUE(backend_.query_event(idle)) << "recorded on an idle stream: complete";

  const std::uint64_t work = fake_.enqueue_work(s, m.va, kPage);
  EXPECT_GE(work, 1u);
  backend_.record_event(after, s);
  EXPECT_FALSE(backend_.query_event(after));
  EXPECT_TRUE(backend_.query_event(idle)) << "recorded before the work";
  EXPECT_FALSE(fake_.work_finished(work));
  EXPECT_EQ(fake_.pending_work(), 1u);
  const auto queries = fake_.calls("cuEventQuery");
  ASSERT_GE(queries.size(), 2u);
  EXPECT_EQ(queries[queries.size() - 2].result, CUDA_ERROR_NOT_READY);

  fake_.finish_work(work);
  EXPECT_TRUE(fake_.work_finished(work));
  EXPECT_TRUE(backend_.query_event(after));
  EXPECT_EQ(fake_.pending_work(), 0u);
  for (EventHandle e : {never, idle, after}) backend_.destroy_event(e);
  backend_.destroy_stream(s);
  release(m);
  EXPECT_TRUE(fake_.violations().empty());
}

TEST_F(FakeDriverWork, StreamsAreInOrderQueues) {
  const Mapped a = map_page();
  const Mapped b = map_page();
  const StreamHandle s = backend_.create_stream(0, 0);
  const std::uint64_t first = fake_.enqueue_work(s, a.va, kPage);
  // A copy completes by itself, but only once everything before it on its stream has.
  backend_.copy_async(b.va, a.va, kPage, s);
  const std::uint64_t second = fake_.enqueue_work(s, b.va, kPage);
  EXPECT_EQ(fake_.pending_work(), 3u);
  fake_.finish_work(first);
  EXPECT_EQ(fake_.pending_work(), 1u) << "the copy ran once the first kernel had";
  EXPECT_FALSE(fake_.work_finished(second)) << "a kernel finishes only when told";

  // Finishing a kernel finishes what it had to wait for: the GPU cannot get past earlier work.
  const std::uint64_t third = fake_.enqueue_work(s, a.va, kPage);
  const std::uint64_t fourth = fake_.enqueue_work(s, b.va, kPage);
  fake_.finish_work(third);
  EXPECT_TRUE(fake_.work_finished(second));
  EXPECT_FALSE(fake_.work_finished(fourth));
  fake_.finish_work(fourth);
  fake_.finish_work(fourth);  // again: ignored
  fake_.finish_work(12345);   // unknown: ignored
  EXPECT_EQ(fake_.pending_work(), 0u);
  backend_.destroy_stream(s);
  release(a);
  release(b);
  EXPECT_TRUE(fake_.violations().empty());
}

TEST_F(FakeDriverWork, WaitEventChainsAcrossStreams) {
  const Mapped m = map_page();
  const StreamHandle s1 = backend_.create_stream(0, 0);
  const StreamHandle s2 = backend_.create_stream(1, 0);
  const StreamHandle s3 = backend_.create_stream(0, 0);
  const EventHandle e1 = backend_.create_event(0);
  const EventHandle e2 = backend_.create_event(1);
  const EventHandle e3 = backend_.create_event(0);
  const std::uint64_t work = fake_.enqueue_work(s1, m.va, kPage);
  backend_.record_event(e1, s1);
  backend_.stream_wait_event(s2, e1, 0);
  backend_.record_event(e2, s2);
  backend_.stream_wait_event(s3, e2, 0);
  backend_.record_event(e3, s3);
  EXPECT_FALSE(backend_.query_event(e2)) << "s2 waits for s1's kernel";
  EXPECT_FALSE(backend_.query_event(e3)) << "s3 waits for s2, which waits for s1";
  // A wait captures the event's work when it is made: recording e1 again on an idle stream
  // later does not release s2.
  backend_.record_event(e1, backend_.create_stream(0, 0));
  EXPECT_TRUE(backend_.query_event(e1));
  EXPECT_FALSE(backend_.query_event(e3));
  // Work enqueued on s3 after the wait is behind s1's kernel too.
  const std::uint64_t later = fake_.enqueue_work(s3, m.va, kPage);
  fake_.finish_work(later);
  EXPECT_TRUE(fake_.work_finished(work)) << "later work on s3 could only finish after s1's";
  EXPECT_TRUE(backend_.query_event(e2));
  EXPECT_TRUE(backend_.query_event(e3));
  EXPECT_EQ(fake_.pending_work(), 0u);
  release(m);
  EXPECT_TRUE(fake_.violations().empty());
}

TEST_F(FakeDriverWork, HostWaitsCompleteWhatTheyWaitForOnly) {
  const Mapped m = map_page();
  const StreamHandle s1 = backend_.create_stream(0, 0);
  const StreamHandle s2 = backend_.create_stream(0, 0);
  const StreamHandle s3 = backend_.create_stream(0, 0);
  const EventHandle e = backend_.create_event(0);

  // cuEventSynchronize: the event's work finishes, and what it waited for.
  const std::uint64_t a = fake_.enqueue_work(s1, m.va, kPage);
  const std::uint64_t unrelated = fake_.enqueue_work(s3, m.va, kPage);
  backend_.record_event(e, s1);
  backend_.synchronize_event(e);
  EXPECT_TRUE(fake_.work_finished(a));
  EXPECT_TRUE(backend_.query_event(e));
  EXPECT_FALSE(fake_.work_finished(unrelated)) << "another stream's work goes on";

  // cuStreamSynchronize of a stream that waits on another completes that stream's work too.
  const std::uint64_t b = fake_.enqueue_work(s1, m.va, kPage);
  backend_.record_event(e, s1);
  backend_.stream_wait_event(s2, e, 0);
  const std::uint64_t c = fake_.enqueue_work(s2, m.va, kPage);
  backend_.synchronize_stream(s2);
  EXPECT_TRUE(fake_.work_finished(b));
  EXPECT_TRUE(fake_.work_finished(c));
  EXPECT_FALSE(fake_.work_finished(unrelated));
  backend_.synchronize_stream(s3);
  EXPECT_TRUE(fake_.work_finished(unrelated));
  EXPECT_EQ(fake_.pending_work(), 0u);
  release(m);
  EXPECT_TRUE(fake_.violations().empty());
}

TEST_F(FakeDriverWork, ReleasingMemoryUnderUnfinishedWorkIsAViolation) {
  const Mapped m = map_page();
  const StreamHandle s = backend_.create_stream(0, 0);
  const std::uint64_t work = fake_.enqueue_work(s, m.va + 4096, 8192);
  // The driver does not check: every call succeeds, and each is recorded.
  release(m);
  const std::vector<std::string> v = fake_.violations();
  ASSERT_EQ(v.size(), 3u);
  const std::string kernel = "kernel #" + std::to_string(work);
  for (const char* call : {"cuMemUnmap", "cuMemAddressFree", "cuMemRelease"}) {
    const auto it = std::find_if(v.begin(), v.end(), [&](const std::string& s) {
      return s.starts_with(call) && s.find(kernel) != std::string::npos;
    });
    EXPECT_NE(it, v.end()) << call << " is not among the violations";
  }
  char stream[32];
  std::snprintf(stream, sizeof stream, "stream %#llx", static_cast<unsigned long long>(s.value));
  EXPECT_NE(v[0].find(stream), std::string::npos) << v[0];
  EXPECT_EQ(fake_.live_chunks(), 0u) << "the call did what it was asked";
  fake_.clear_violations();
  EXPECT_TRUE(fake_.violations().empty());
  fake_.finish_all_work();
}

TEST_F(FakeDriverWork, CopiesReferenceBothRangesUntilTheyRun) {
  const Mapped from = map_page();
  const Mapped to = map_page();
  const StreamHandle s = backend_.create_stream(0, 0);
  const std::uint64_t work = fake_.enqueue_work(s, from.va, kPage);
  backend_.copy_async(to.va, from.va, kPage, s);
  backend_.unmap(to.va, kPage);
  const std::vector<std::string> v = fake_.violations();
  // The kernel does not touch `to`; the copy queued behind it does.
  ASSERT_EQ(v.size(), 1u);
  EXPECT_NE(v[0].find("copy #"), std::string::npos) << v[0];
  fake_.finish_work(work);
  EXPECT_EQ(fake_.pending_work(), 0u);
  backend_.unmap(from.va, kPage);
  EXPECT_EQ(fake_.violations().size(), 1u) << "nothing new once the copy ran";
  backend_.release_chunk(from.chunk);
  backend_.release_chunk(to.chunk);
}

TEST_F(FakeDriverWork, NoViolationOnceTheWorkFinished) {
  const StreamHandle s = backend_.create_stream(0, 0);
  const EventHandle e = backend_.create_event(0);
  // Finished by the test, by a host wait on an event, and by a host wait on the stream.
  for (int how = 0; how < 3; ++how) {
    const Mapped m = map_page();
    const std::uint64_t work = fake_.enqueue_work(s, m.va, kPage);
    backend_.record_event(e, s);
    if (how == 0) fake_.finish_work(work);
    if (how == 1) backend_.synchronize_event(e);
    if (how == 2) backend_.synchronize_stream(s);
    release(m);
  }
  EXPECT_TRUE(fake_.violations().empty());
}

// The pattern that lets memory move without the host waiting: the chunk is mapped at a second
// address (another stream's range) whose stream waits on the GPU for the old work; the old address
// is unmapped once that work has finished.
TEST_F(FakeDriverWork, AliasingAChunkIsNotAViolation) {
  const Mapped m = map_page();
  const DevicePtr alias = backend_.reserve_address(kPage, 0);
  const StreamHandle s1 = backend_.create_stream(0, 0);
  const StreamHandle s2 = backend_.create_stream(0, 0);
  const EventHandle e = backend_.create_event(0);
  const std::uint64_t old_work = fake_.enqueue_work(s1, m.va, kPage);
  backend_.record_event(e, s1);
  backend_.map(alias, kPage, m.chunk, 0);  // the same chunk twice
  const AccessGrant grant{0, Access::read_write};
  backend_.set_access(alias, kPage, std::span(&grant, 1));
  backend_.stream_wait_event(s2, e, 0);
  const std::uint64_t new_work = fake_.enqueue_work(s2, alias, kPage);
  EXPECT_EQ(fake_.chunk_at(alias)->handle, fake_.chunk_at(m.va)->handle);
  EXPECT_TRUE(fake_.violations().empty());

  fake_.finish_work(old_work);
  EXPECT_TRUE(backend_.query_event(e));
  backend_.unmap(m.va, kPage);  // the old work has finished; the new one uses the alias
  backend_.free_address(m.va, kPage);
  EXPECT_TRUE(fake_.violations().empty()) << fake_.violations().front();
  // The chunk itself is still in use through the alias.
  backend_.release_chunk(m.chunk);
  ASSERT_EQ(fake_.violations().size(), 1u);
  EXPECT_NE(fake_.violations()[0].find("cuMemRelease"), std::string::npos);
  EXPECT_NE(fake_.violations()[0].find("kernel #" + std::to_string(new_work)), std::string::npos);
  fake_.finish_work(new_work);
  backend_.unmap(alias, kPage);
  backend_.free_address(alias, kPage);
  EXPECT_EQ(fake_.violations().size(), 1u);
  EXPECT_EQ(fake_.live_chunks(), 0u);
}

TEST_F(FakeDriverWork, UnmappingTheOtherAliasUnderWorkIsFine) {
  const Mapped m = map_page();
  const DevicePtr alias = backend_.reserve_address(kPage, 0);
  backend_.map(alias, kPage, m.chunk, 0);
  const StreamHandle s = backend_.create_stream(0, 0);
  const std::uint64_t work = fake_.enqueue_work(s, m.va, kPage);
  backend_.unmap(alias, kPage);  // the work was enqueued against m.va, not the alias
  backend_.free_address(alias, kPage);
  EXPECT_TRUE(fake_.violations().empty());
  backend_.unmap(m.va, kPage);
  EXPECT_EQ(fake_.violations().size(), 1u);
  fake_.finish_work(work);
  backend_.free_address(m.va, kPage);
  backend_.release_chunk(m.chunk);
  EXPECT_EQ(fake_.violations().size(), 1u);
}

TEST_F(FakeDriverWork, HeldEventsBlockTheirStreamUntilCompleted) {
  const Mapped m = map_page();
  const StreamHandle s1 = backend_.create_stream(0, 0);
  const StreamHandle s2 = backend_.create_stream(0, 0);
  const EventHandle e = backend_.create_event(0);
  fake_.hold_events(true);
  backend_.record_event(e, s1);
  fake_.hold_events(false);
  EXPECT_FALSE(backend_.query_event(e));
  backend_.stream_wait_event(s2, e, 0);
  backend_.copy_async(m.va, m.va, 4096, s2);
  EXPECT_EQ(fake_.pending_work(), 1u) << "the copy waits for the held event";
  fake_.complete_events();
  EXPECT_TRUE(backend_.query_event(e));
  EXPECT_EQ(fake_.pending_work(), 0u);
  release(m);
  EXPECT_TRUE(fake_.violations().empty());
}

TEST_F(FakeDriverWork, LegacyStreamIsOrderedAgainstBlockingStreamsOnly) {
  const Mapped m = map_page();
  const cuda::DriverApi api = fake_.api();
  CUcontext context = nullptr;
  ASSERT_EQ(api.cuDevicePrimaryCtxRetain(&context, 0), CUDA_SUCCESS);
  ASSERT_EQ(api.cuCtxSetCurrent(context), CUDA_SUCCESS);
  CUstream blocking = nullptr;
  CUstream non_blocking = nullptr;
  ASSERT_EQ(api.cuStreamCreateWithPriority(&blocking, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(api.cuStreamCreateWithPriority(&non_blocking, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  CUevent on_blocking = nullptr;
  CUevent on_non_blocking = nullptr;
  ASSERT_EQ(api.cuEventCreate(&on_blocking, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  ASSERT_EQ(api.cuEventCreate(&on_non_blocking, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  const std::uint64_t legacy = fake_.enqueue_work(StreamHandle{0}, m.va, kPage);
  EXPECT_EQ(api.cuEventRecord(on_blocking, blocking), CUDA_SUCCESS);
  EXPECT_EQ(api.cuEventRecord(on_non_blocking, non_blocking), CUDA_SUCCESS);
  EXPECT_EQ(api.cuEventQuery(on_blocking), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(api.cuEventQuery(on_non_blocking), CUDA_SUCCESS);
  // And the other way: the legacy stream waits for a blocking stream's work.
  const std::uint64_t on_stream = fake_.enqueue_work(blocking, m.va, kPage);
  EXPECT_EQ(api.cuStreamSynchronize(nullptr), CUDA_SUCCESS);
  EXPECT_TRUE(fake_.work_finished(legacy));
  EXPECT_TRUE(fake_.work_finished(on_stream));
  EXPECT_EQ(api.cuEventDestroy(on_blocking), CUDA_SUCCESS);
  EXPECT_EQ(api.cuEventDestroy(on_non_blocking), CUDA_SUCCESS);
  EXPECT_EQ(api.cuStreamDestroy(blocking), CUDA_SUCCESS);
  EXPECT_EQ(api.cuStreamDestroy(non_blocking), CUDA_SUCCESS);
  EXPECT_EQ(api.cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(api.cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  release(m);
  EXPECT_TRUE(fake_.violations().empty());
}

TEST_F(FakeDriverWork, WorkNeedsAKnownStreamAndAMappedRange) {
  const Mapped m = map_page();
  const StreamHandle s = backend_.create_stream(0, 0);
  EXPECT_THROW((void)fake_.enqueue_work(StreamHandle{0xdead0}, m.va, kPage), std::invalid_argument);
  EXPECT_THROW((void)fake_.enqueue_work(s, m.va, 2 * kPage), std::invalid_argument);
  EXPECT_THROW((void)fake_.enqueue_work(s, m.va, 0), std::invalid_argument);
  EXPECT_EQ(fake_.pending_work(), 0u);
  EXPECT_EQ(fake_.count("enqueue_work"), 0u) << "not a driver call";
  release(m);
}

// Unfinished work, held events and a stream destroyed with work queued: tearing the fake down
// neither waits nor fails.
TEST(FakeDriverWorkTeardown, UnfinishedWorkDoesNotHang) {
  FakeDriver fake(FakeDriverConfig::uniform(1, 1 * GiB));
  auto backend = std::make_shared<CudaBackend>(fake.api());
  const ChunkHandle chunk = backend->create_chunk(Location::gpu(0), kPage);
  const DevicePtr va = backend->reserve_address(kPage, 0);
  backend->map(va, kPage, chunk, 0);
  const StreamHandle s = backend->create_stream(0, 0);
  (void)fake.enqueue_work(s, va, kPage);
  fake.hold_events(true);
  Event event(backend, 0);
  event.record(s);
  backend->destroy_stream(s);  // queued work outlives its stream, as with the driver
  EXPECT_FALSE(event.query());
  event.synchronize();  // the host waits: the GPU got there (the fake never blocks)
  EXPECT_EQ(fake.pending_work(), 0u);
  (void)backend->create_stream(0, 0);
}

}  // namespace
}  // namespace salus
