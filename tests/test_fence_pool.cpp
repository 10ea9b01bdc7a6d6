// FencePool (src/remote/fence_pool.hpp) over the fake driver, which keeps CUDA's two rules for
// interprocess events: no open in the exporting process, and a handle kept past its event's
// destruction is undefined (handles are reused). A process connected to salusd is often granted
// back the pages it gave back behind its own work, with its own fence (the daemon's free list is
// last-in-first-out): opening that fence as CUDA would refuse it, and taking the refusal for "its
// process has exited" dropped the fence, so the page was reused under queued work.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>

#include "cuda/cuda_backend.hpp"
#include "remote/fence_pool.hpp"
#include "salus/sim.hpp"
#include "support/fake_driver.hpp"
#include "support/stream_gate.hpp"

namespace salus {
namespace {

using remote::FencePool;
using test::FakeDriver;
using test::FakeDriverConfig;

constexpr std::size_t kPage = 2 * MiB;

class FencePoolOnFake : public ::testing::Test {
 protected:
  explicit FencePoolOnFake(bool open_own = false)
      : fake_(config(open_own)), backend_(std::make_shared<cuda::CudaBackend>(fake_.api())) {
    chunk_ = backend_->create_chunk(Location::gpu(0), kPage);
    va_ = backend_->reserve_address(kPage, 0);
    backend_->map(va_, kPage, chunk_, 0);
    const std::array<AccessGrant, 1> grant{{{0, Access::read_write}}};
    backend_->set_access(va_, kPage, grant);
    stream_ = backend_->create_stream(0, 0);
  }
  ~FencePoolOnFake() override {
    fake_.finish_all_work();
    backend_->destroy_stream(stream_);
    backend_->unmap(va_, kPage);
    backend_->free_address(va_, kPage);
    backend_->release_chunk(chunk_);
  }
  static FakeDriverConfig config(bool open_own) {
    FakeDriverConfig c = FakeDriverConfig::uniform(1, 1 * GiB);
    c.ipc_open_own_events = open_own;
    return c;
  }
  // Work on the page that stays queued until finished, and `fence` recorded behind it.
  std::uint64_t fenced_work(FencePool::Fence& fence) {
    const std::uint64_t work = fake_.enqueue_work(stream_, va_, kPage);
    backend_->record_event(fence.event->handle(), stream_);
    return work;
  }

  FakeDriver fake_;
  std::shared_ptr<cuda::CudaBackend> backend_;
  ChunkHandle chunk_{};
  DevicePtr va_ = 0;
  StreamHandle stream_{};
};

TEST_F(FencePoolOnFake, AFenceBackInItsOwnProcessIsItsOwnEvent) {
  auto pool = std::make_unique<FencePool>(backend_);
  FencePool::Fence& fence = pool->acquire(0);
  const std::uint64_t work = fenced_work(fence);
  // What the daemon sends back with the pages: the handle as it was exported.
  const SharedEvent back = fence.shared;
  EXPECT_THROW((void)backend_->import_event(0, back), DeviceError)
      << "CUDA opens no event in the process that exported it";
  fake_.clear_calls();
  const std::shared_ptr<const Event> opened = pool->open(0, back);
  EXPECT_EQ(opened, fence.event) << "our own fence is our own event";
  EXPECT_EQ(fake_.count("cuIpcOpenEventHandle"), 0u);
  EXPECT_EQ(pool->own_opened(), 1u);
  EXPECT_FALSE(opened->query()) << "the fence holds while the work is queued";
  fake_.finish_work(work);
  EXPECT_TRUE(opened->query());
}

TEST_F(FencePoolOnFake, AFenceThatPassedIsRecordedAgainNotDestroyed) {
  auto pool = std::make_unique<FencePool>(backend_);
  FencePool::Fence& first = pool->acquire(0);
  fake_.finish_work(fenced_work(first));
  ASSERT_TRUE(first.event->query());
  pool->recycle(first);
  fake_.clear_calls();
  FencePool::Fence& again = pool->acquire(0);
  EXPECT_EQ(&again, &first);
  EXPECT_EQ(fake_.count("cuEventCreate"), 0u);
  EXPECT_EQ(fake_.count("cuEventDestroy"), 0u) << "an exported event outlives its fence";
  EXPECT_EQ(pool->exported(), 1u);
  FencePool::Fence& second = pool->acquire(0);  // the first is busy: a new one
  EXPECT_NE(&second, &first);
  EXPECT_EQ(pool->exported(), 2u);
  pool.reset();
  EXPECT_EQ(fake_.live_events(), 0u) << "the pool destroys what it exported at its end";
}

// Another process holding the first fence's handle (salusd hands it on with the page) after the
// event was recorded again: it opens a live event, and its wait covers the newer record.
class FencePoolTwoProcesses : public FencePoolOnFake {
 protected:
  FencePoolTwoProcesses() : FencePoolOnFake(true) {}
};

TEST_F(FencePoolTwoProcesses, AnOldHandleNamesALiveEventThatCoversItsLaterRecords) {
  FencePool pool(backend_);
  FencePool::Fence& fence = pool.acquire(0);
  const SharedEvent old = fence.shared;
  fake_.finish_work(fenced_work(fence));
  pool.recycle(fence);
  FencePool::Fence& again = pool.acquire(0);
  const std::uint64_t later = fenced_work(again);
  const EventHandle opened = backend_->import_event(0, old);  // the other process
  EXPECT_FALSE(backend_->query_event(opened)) << "the wait covers the later record's work";
  fake_.finish_work(later);
  EXPECT_TRUE(backend_->query_event(opened));
  backend_->destroy_event(opened);
  const auto violations = fake_.violations();
  EXPECT_TRUE(violations.empty()) << violations.front();
}

// A turn's fence is waited for on the host, up to the turn's bound: the wait ends when the work
// completes or the bound passes, whichever is first, so a fence that never completes holds its
// waiter for the bound only (a stream made to wait for it could not be let go).
TEST(WaitForFence, EndsWhenTheWorkCompletesOrAtTheBoundWhicheverIsFirst) {
  const std::shared_ptr<DeviceBackend> backend = make_sim_backend(SimConfig::uniform(1, 64 * MiB));
  const StreamHandle stream = backend->create_stream(0, 0);
  std::atomic<bool> done{false};
  std::promise<void> gate = test_support::block_stream(*backend, stream, done);
  const Event work(backend, 0);
  backend->record_event(work.handle(), stream);

  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  EXPECT_FALSE(remote::wait_for_fence(work, until)) << "the work has not run";
  EXPECT_GE(std::chrono::steady_clock::now(), until) << "it gave up before the bound";
  EXPECT_FALSE(done.load());

  gate.set_value();
  EXPECT_TRUE(remote::wait_for_fence(work, std::chrono::steady_clock::now() + std::chrono::hours(1)));
  EXPECT_TRUE(done.load()) << "it returned before the work had run";
  backend->destroy_stream(stream);
}

}  // namespace
}  // namespace salus
