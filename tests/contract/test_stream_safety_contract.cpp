// Stream safety, the contract every backend keeps (see contract/backend_fixture.hpp for what a
// contract suite is and how to add a backend): memory freed on the host while work queued on a
// stream still touches it must not be unmapped, released or handed to another stream before that
// work is done. Each test queues a kernel on a block (BackendHarness::enqueue_work: on the sim a
// slow host function stamping the memory, on the fake driver an unfinished kernel), frees the
// block, runs the operation that would reuse the memory, drains the GPU and checks that the work
// found its own bytes (sim), that nothing was released under it (fake: no violations), that the
// reuse waited on the GPU rather than the host (fake), and that every byte is accounted for.
// Backend-specific: test_stream_safety.cpp (sim: failing allocations, harvesting and the runtime,
// under real timing) and test_stream_safety_cuda_fake.cpp (the same paths on the
// fake driver's model of queued work).
#include <gtest/gtest.h>

#include <deque>
#include <vector>

#include "contract/backend_fixture.hpp"
#include "support/stream_work.hpp"

namespace salus::testing::contract {
namespace {

class StreamSafetyContract : public ContractTest {
 protected:
  StreamHandle new_stream(int device = 0) {
    const StreamHandle s = streams_.emplace_back(backend, device).handle();
    handles_.push_back(s);
    return s;
  }

  void TearDown() override {
    // A failed test may leave work queued; it must finish before the memory goes.
    if (backend) {
      for (const StreamHandle s : handles_) backend->synchronize_stream(s);
      backend->synchronize_stream({});
    }
    harness->finish_all_work();
    memory.reset();
    streams_.clear();
    ContractTest::TearDown();
  }

  // Once every stream is drained and everything freed: all accounted for, nothing held, and
  // nothing on the way there released memory under work.
  void expect_clean_end() {
    expect_balanced(*memory);
    harness->expect_no_violations("at the end");
    harness->expect_nothing_held();
  }

  std::vector<StreamHandle> handles_;
  std::deque<Stream> streams_;  // a deque: Stream does not move while handed out
};

// The reported case: 48 MiB of a 64 MiB device freed on s1 while s1's kernel on it is queued; s2
// then needs 48 MiB, which only s1's cached pages can give.
TEST_P(StreamSafetyContract, AnotherStreamsAllocationDoesNotTakePagesUnderQueuedWork) {
  build(1, 64 * MiB);
  const StreamHandle s1 = new_stream(), s2 = new_stream();
  const JobId a = memory->register_job("a"), b = memory->register_job("b");
  const DevicePtr p = alloc(48 * MiB, 0, a, Lifetime::ephemeral, s1);
  const std::uint64_t old_work = harness->enqueue_work(s1, p, 48 * MiB, 1, true);
  memory->deallocate(p);

  harness->mark();
  const DevicePtr q = alloc(48 * MiB, 0, b, Lifetime::ephemeral, s2);
  harness->expect_no_violations("while s2 took the pages s1's kernel still uses");
  if (const auto waits = harness->host_waits()) {
    EXPECT_EQ(*waits, 0u) << "the reuse should wait on the GPU, not the host";
  }
  harness->expect_still_queued(old_work);
  const std::uint64_t new_work = harness->enqueue_work(s2, q, 48 * MiB, 2, false);
  harness->expect_runs_after(new_work, old_work);

  harness->drain(handles_);
  EXPECT_EQ(harness->bad_stamps(q, 48 * MiB, 2), 0u) << "a's work wrote b's block";
  memory->deallocate(q);
  expect_clean_end();
}

// A stream's wait for an event is for the record it saw, as in CUDA: recording the event again
// elsewhere (at once, on an idle stream) does not release it. Fences take their events from a pool
// (memory/event_pool.hpp), so an event whose last fence went is recorded again while waits of its
// last use are still queued; a backend that let the newer record end the older wait would run
// the waiting stream's work before the work it waited for (the sim did: the stress test saw
// foreign bytes).
TEST_P(StreamSafetyContract, AWaitIsForTheRecordItSawNotALaterOne) {
  build(1, 64 * MiB);
  const StreamHandle s1 = new_stream(), s2 = new_stream(), idle = new_stream();
  const DevicePtr p = alloc(4 * MiB, 0, kUnattributedJob, Lifetime::ephemeral, s1);
  const std::uint64_t old_work = harness->enqueue_work(s1, p, 4 * MiB, 5, true);
  {
    const Event event(backend, 0);
    event.record(s1);
    backend->stream_wait_event(s2, event.handle(), 0);
    event.record(idle);  // completes at once: nothing is queued on `idle`
    EXPECT_TRUE(event.query());
  }
  const std::uint64_t new_work = harness->enqueue_work(s2, p, 4 * MiB, 6, false);
  harness->expect_still_queued(old_work);
  harness->expect_runs_after(new_work, old_work);
  harness->drain(handles_);
  EXPECT_EQ(harness->bad_stamps(p, 4 * MiB, 6), 0u) << "s2's work ran before s1's, which it waited for";
  memory->deallocate(p);
  expect_clean_end();
}

// trim() returns cached pages to the driver: those under queued work only once it is done.
TEST_P(StreamSafetyContract, TrimDoesNotUnmapPagesUnderQueuedWork) {
  build(1, 64 * MiB);
  const StreamHandle s1 = new_stream();
  const DevicePtr p = alloc(48 * MiB, 0, kUnattributedJob, Lifetime::ephemeral, s1);
  (void)harness->enqueue_work(s1, p, 48 * MiB, 3, true);
  memory->deallocate(p);
  harness->mark();
  (void)memory->trim();
  harness->expect_no_violations("while trimming pages a queued kernel still uses");
  if (const auto waits = harness->host_waits()) {
    RecordProperty("trim_host_waits", static_cast<int>(*waits));
  }
  harness->drain(handles_);
  expect_clean_end();
}

// Releasing a job frees its blocks on every stream; its kernels on the allocation stream and on a
// lane stream it declared still run when another job's stream takes the memory (the pool has 7
// pages left; the other 21 only the released job's pages can give).
TEST_P(StreamSafetyContract, ReleasedJobsPagesWaitForItsWorkOnEveryStream) {
  build(1, 64 * MiB);
  const JobId job = memory->register_job("leaving"), next = memory->register_job("next");
  const StreamHandle s1 = new_stream(), lane = new_stream(), s2 = new_stream();
  const DevicePtr on_s1 = alloc(24 * MiB, 0, job, Lifetime::persistent, s1);
  const DevicePtr on_lane = alloc(24 * MiB, 0, job, Lifetime::persistent, s1);
  const DevicePtr small = alloc(100 * KiB, 0, job, Lifetime::ephemeral, s1);
  memory->add_job_stream(job, 0, lane);
  const std::uint64_t w1 = harness->enqueue_work(s1, on_s1, 24 * MiB, 4, true);
  const std::uint64_t w_small = harness->enqueue_work(s1, small, 100 * KiB, 5, false);
  const std::uint64_t w2 = harness->enqueue_work(lane, on_lane, 24 * MiB, 6, true);
  memory->release_job(job);

  harness->mark();
  const DevicePtr q = alloc(56 * MiB, 0, next, Lifetime::ephemeral, s2);
  harness->expect_no_violations("while another stream took a released job's pages");
  if (const auto waits = harness->host_waits()) {
    EXPECT_EQ(*waits, 0u) << "the reuse should wait on the GPU, not the host";
  }
  const std::uint64_t new_work = harness->enqueue_work(s2, q, 56 * MiB, 7, false);
  harness->expect_runs_after(new_work, w1);  // the job's work on its allocation stream
  harness->expect_runs_after(new_work, w_small);
  harness->expect_runs_after(new_work, w2);  // the job's work on its lane stream

  harness->drain(handles_);
  EXPECT_EQ(harness->bad_stamps(q, 56 * MiB, 7), 0u) << "the leaving job's work wrote next's block";
  EXPECT_FALSE(memory->job_stats(job).alive);
  memory->deallocate(q);
  expect_clean_end();
}

// An allocation that reclaims another stream's free pages and still fails (28 pages wanted, the 24
// of s1's freed block are all there is) must not have unmapped pages that queued work uses, and
// loses nothing: once the work is done the pages serve a request that fits.
TEST_P(StreamSafetyContract, AFailingAllocationElsewhereLeavesPagesUnderQueuedWorkAlone) {
  build(1, 64 * MiB);
  const JobId a = memory->register_job("a"), b = memory->register_job("b"),
              c = memory->register_job("c");
  const StreamHandle s1 = new_stream(), s2 = new_stream(), s3 = new_stream();
  const DevicePtr p = alloc(48 * MiB, 0, a, Lifetime::ephemeral, s1);
  const DevicePtr kept = alloc(16 * MiB, 0, b, Lifetime::persistent, s3);  // the device is full
  (void)harness->enqueue_work(s1, p, 48 * MiB, 8, true);
  memory->deallocate(p);

  EXPECT_THROW((void)alloc(56 * MiB, 0, c, Lifetime::ephemeral, s2), OutOfMemory);
  harness->expect_no_violations("while a failing allocation reclaimed pages under work");
  EXPECT_EQ(memory->device_stats(0).allocated, 16 * MiB);
  EXPECT_EQ(memory->job_stats(c).in_use, 0u);

  harness->drain(handles_);
  const DevicePtr q = alloc(48 * MiB, 0, c, Lifetime::ephemeral, s2);
  memory->deallocate(q);
  memory->deallocate(kept);
  expect_clean_end();
}

// The same on the work's own stream: the allocation takes the stream's own cached pages
// (unmapping them from the freed block's range) and then fails (30 pages wanted, 28 to be had);
// the freed block's queued work must still find its pages.
TEST_P(StreamSafetyContract, AFailingAllocationOnTheWorksOwnStreamLeavesItsPagesAlone) {
  build(1, 64 * MiB);
  const StreamHandle s = new_stream();
  const JobId a = memory->register_job("a");
  const DevicePtr p = alloc(48 * MiB, 0, a, Lifetime::ephemeral, s);
  const DevicePtr live = alloc(8 * MiB, 0, a, Lifetime::ephemeral, s);  // fences p's range in
  (void)harness->enqueue_work(s, p, 48 * MiB, 9, true);
  memory->deallocate(p);
  EXPECT_THROW((void)alloc(60 * MiB, 0, a, Lifetime::ephemeral, s), OutOfMemory);
  harness->expect_no_violations("while a failing allocation on the work's stream took its pages");
  harness->drain(handles_);
  memory->deallocate(live);
  expect_clean_end();
}

INSTANTIATE_TEST_SUITE_P(Backends, StreamSafetyContract, ::testing::ValuesIn(contract_backends()),
                         ContractBackendName);

}  // namespace
}  // namespace salus::testing::contract
