// Stream-ordered reuse: a block freed on one stream is reused at once on that stream, and memory
// reaches another stream only after the freeing stream's work has finished.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "support/memory_fixture.hpp"
#include "support/stream_gate.hpp"

namespace salus::testing {
namespace {

using namespace std::chrono_literals;

class MemoryStreamOrder : public SimMemoryTest {
 protected:
  void SetUp() override {
    // Four pages: small enough that a second stream must take the first one's pages.
    build(SimConfig::uniform(1, 64 * MiB), {.device_limits = {8 * MiB}});
    a = Stream(backend, 0);
    b = Stream(backend, 0);
  }

  std::promise<void> block_stream(const Stream& stream, std::atomic<bool>& done) {
    return test_support::block_stream(*backend, stream.handle(), done);
  }

  Stream a;
  Stream b;
};

TEST_F(MemoryStreamOrder, FreedBlockIsReusedAtOnceOnItsOwnStream) {
  std::atomic<bool> a_done{false};
  auto gate = block_stream(a, a_done);
  const DevicePtr p = alloc(2 * MiB, 0, kUnattributedJob, Lifetime::ephemeral, a.handle());
  memory->deallocate(p);
  // Work on `a` is still pending, yet the same stream may reuse the block: its next work runs
  // after the pending work anyway.
  const DevicePtr q = alloc(2 * MiB, 0, kUnattributedJob, Lifetime::ephemeral, a.handle());
  EXPECT_EQ(p, q);
  EXPECT_FALSE(a_done.load());
  gate.set_value();
  a.synchronize();
  memory->deallocate(q);
}

TEST_F(MemoryStreamOrder, AnotherStreamGetsThePagesOnlyBehindTheFreeingStreamsWork) {
  std::atomic<bool> a_done{false};
  auto gate = block_stream(a, a_done);
  const DevicePtr p = alloc(8 * MiB, 0, kUnattributedJob, Lifetime::ephemeral, a.handle());
  memory->deallocate(p);  // every page of the device is now a free block of stream a

  // Stream b needs every page. The host is not blocked: b gets the pages at once, and b's work is
  // made to wait on the GPU for a's work, which may still write them.
  const DevicePtr q = alloc(8 * MiB, 0, kUnattributedJob, Lifetime::ephemeral, b.handle());
  EXPECT_FALSE(a_done.load()) << "the allocation waited on the host for a's work";
  EXPECT_GE(memory->device_stats(0).cross_stream_reuses, 4u);
  std::atomic<bool> a_done_when_b_ran{false};
  std::atomic<bool> b_ran{false};
  backend->launch_host_func(b.handle(), [&] {
    a_done_when_b_ran.store(a_done.load());
    b_ran.store(true);
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(b_ran.load()) << "b's work ran while a's work on the same pages was pending";
  gate.set_value();
  b.synchronize();
  EXPECT_TRUE(b_ran.load());
  EXPECT_TRUE(a_done_when_b_ran.load());
  memory->deallocate(q);
}

TEST_F(MemoryStreamOrder, TrimWaitsForPendingWorkBeforeReleasingPages) {
  std::atomic<bool> a_done{false};
  auto gate = block_stream(a, a_done);
  const DevicePtr p = alloc(4 * MiB, 0, kUnattributedJob, Lifetime::ephemeral, a.handle());
  memory->deallocate(p);
  std::thread opener([&] {
    std::this_thread::sleep_for(50ms);
    gate.set_value();
  });
  EXPECT_EQ(memory->trim(), 4 * MiB);
  EXPECT_TRUE(a_done.load()) << "pages were released while a's work could still touch them";
  opener.join();
}

TEST_F(MemoryStreamOrder, BlockUsedOnAnotherStreamWaitsForThatStreamToo) {
  const DevicePtr p = alloc(2 * MiB, 0, kUnattributedJob, Lifetime::ephemeral, a.handle());
  memory->record_stream_use(p, b.handle());
  std::atomic<bool> b_done{false};
  auto gate = block_stream(b, b_done);
  memory->deallocate(p);
  // b may still be using the block: a may have it back at once, but a's later work must wait
  // for b's on the GPU.
  const DevicePtr q = alloc(2 * MiB, 0, kUnattributedJob, Lifetime::ephemeral, a.handle());
  std::atomic<bool> a_ran_before_b{false};
  std::atomic<bool> a_ran{false};
  memory->backend().launch_host_func(a.handle(), [&] {
    a_ran_before_b = !b_done.load();
    a_ran = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(a_ran.load()) << "a's work ran while b still used the block";
  gate.set_value();
  a.synchronize();
  EXPECT_TRUE(a_ran.load());
  EXPECT_FALSE(a_ran_before_b.load());
  memory->deallocate(q);
  const DevicePtr r = alloc(2 * MiB, 0, kUnattributedJob, Lifetime::ephemeral, a.handle());
  EXPECT_TRUE(r == p || r == q);
  memory->deallocate(r);
  EXPECT_THROW(memory->record_stream_use(r, b.handle()), InvalidArgument);
}

TEST_F(MemoryStreamOrder, StreamsKeepSeparateAddressRanges) {
  const DevicePtr p = alloc(4096, 0, kUnattributedJob, Lifetime::ephemeral, a.handle());
  memory->deallocate(p);
  const DevicePtr q = alloc(4096, 0, kUnattributedJob, Lifetime::ephemeral, b.handle());
  EXPECT_NE(p, q) << "a block freed on a must not be handed to b directly";
  EXPECT_EQ(memory->find(q)->stream, b.handle());
  memory->deallocate(q);
}

}  // namespace
}  // namespace salus::testing
