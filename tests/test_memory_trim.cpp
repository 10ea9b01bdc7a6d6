// trim() gives every unused page back; trim_idle() (torch.cuda.empty_cache's) only those unused
// since its previous call, so a caller that trims every step keeps what its steps use. Counted in
// chunks the backend holds, across a stream's queued work too.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "support/memory_fixture.hpp"
#include "support/stream_gate.hpp"

namespace salus::testing {
namespace {

class MemoryTrim : public SimMemoryTest {};

TEST_F(MemoryTrim, TrimGivesEveryUnusedPageBack) {
  memory->deallocate(alloc(6 * MiB));
  ASSERT_GE(backend->chunk_bytes(Location::gpu(0)), 6 * MiB);
  EXPECT_GE(memory->trim(), 6 * MiB);
  EXPECT_EQ(backend->chunk_bytes(Location::gpu(0)), 0u);
}

TEST_F(MemoryTrim, TrimIdleKeepsWhatWasUsedSinceItsLastCall) {
  memory->deallocate(alloc(6 * MiB));
  const std::size_t step = backend->chunk_bytes(Location::gpu(0));
  ASSERT_GE(step, 6 * MiB);
  EXPECT_EQ(memory->trim_idle(), 0u) << "used since the (absent) previous call";
  EXPECT_EQ(backend->chunk_bytes(Location::gpu(0)), step);
  for (int i = 0; i < 3; ++i) {  // steps that use the pages between calls keep them
    memory->deallocate(alloc(6 * MiB));
    EXPECT_EQ(backend->chunk_bytes(Location::gpu(0)), step) << "step " << i << " reused them";
    EXPECT_EQ(memory->trim_idle(), 0u) << "step " << i;
  }
  // A step that used half of them: the other half goes at the next call, the rest one later.
  memory->deallocate(alloc(2 * MiB));
  const std::size_t released = memory->trim_idle();
  EXPECT_GT(released, 0u);
  EXPECT_EQ(backend->chunk_bytes(Location::gpu(0)), step - released);
  EXPECT_EQ(memory->trim_idle(), step - released);
  EXPECT_EQ(backend->chunk_bytes(Location::gpu(0)), 0u);
}

// The page's last use is work still queued on its stream when the block was freed: trim_idle
// waits for that work before it unmaps the page (a kernel may still write it), and the release
// one call later finds the page idle.
TEST_F(MemoryTrim, TrimIdleWaitsForTheWorkQueuedBeforeAFree) {
  const StreamHandle stream = backend->create_stream(0, 0);
  const DevicePtr p = alloc(4 * MiB, 0, kUnattributedJob, Lifetime::persistent, stream);
  std::atomic<bool> done{false};
  std::promise<void> gate = test_support::block_stream(*backend, stream, done);
  memory->deallocate(p);
  auto first = std::async(std::launch::async, [&] { return memory->trim_idle(); });
  EXPECT_EQ(first.wait_for(std::chrono::milliseconds(30)), std::future_status::timeout)
      << "returned with the stream's work still queued";
  gate.set_value();
  EXPECT_EQ(first.get(), 0u) << "used until the previous call (there was none): kept";
  EXPECT_TRUE(done.load()) << "returned before the stream's work had finished";
  EXPECT_GE(backend->chunk_bytes(Location::gpu(0)), 4 * MiB);
  EXPECT_GE(memory->trim_idle(), 4 * MiB);
  EXPECT_EQ(backend->chunk_bytes(Location::gpu(0)), 0u);
  backend->destroy_stream(stream);
}

}  // namespace
}  // namespace salus::testing
