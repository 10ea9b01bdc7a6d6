// Stream safety of the memory manager on the CUDA backend, over the fake driver's model of queued
// work: memory freed on the host while GPU work enqueued before the free still uses it must not be
// unmapped or released (nor its pages moved) until that work has finished, whichever path reuses
// it: another stream's allocation, trim, page moves (demote, recall, fetch, prefetch), pages lent
// by a peer or the host going home, releasing a job, or an allocation that fails after reclaiming.
//
// Each test enqueues a kernel on the block (fake_->enqueue_work), frees the block on the host while
// the kernel is unfinished, runs the operation that reuses the memory, and expects no violation
// from the fake (an unmap, address free or chunk release under unfinished work). Memory is tight
// on purpose (64 MiB devices, 2 MiB pages), so the reusing operation must take exactly the pages
// the unfinished work still uses. Where the new user gets the old pages, its own work must also be
// ordered after the old work on the GPU: finishing the new kernel finishes the old one.
//
// A job's work on streams besides the ones it allocates on (a lane's stream) is declared with
// MemoryManager::add_job_stream.
//
// The reuse by another stream's allocation, by trim and after a job's release is the contract
// every backend keeps, in contract/test_stream_safety_contract.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "memory/safe_points.hpp"
#include "salus/memory.hpp"
#include "support/fake_driver.hpp"

namespace salus::testing {
namespace {

using namespace std::chrono_literals;
using test::FakeDriver;
using test::FakeDriverConfig;

constexpr std::size_t kPage = 2 * MiB;
constexpr std::size_t kDevice = 64 * MiB;
constexpr StreamHandle kDefaultStream{0};

// Every device exactly full at its limit: no slack to hide a reuse in.
MemoryOptions tight(int devices) {
  MemoryOptions options;
  options.device_limits.assign(static_cast<std::size_t>(devices), kDevice);
  return options;
}

MemoryOptions harvesting(SpillPolicy spill, std::vector<std::size_t> limits) {
  MemoryOptions options;
  options.device_limits = std::move(limits);
  options.harvest.spill = spill;
  options.harvest.lend_reserve_bytes = 0;
  options.harvest.recall_wait = 0ms;  // nothing here waits for a running job
  return options;
}

class StreamSafetyCudaFake : public ::testing::Test {
 protected:
  void build(int devices, MemoryOptions options) {
    fake_.emplace(FakeDriverConfig::uniform(devices, kDevice));
    backend_ = std::make_shared<cuda::CudaBackend>(fake_->api());
    memory_ = std::make_unique<MemoryManager>(backend_, std::move(options));
  }

  ~StreamSafetyCudaFake() override {
    // Whatever a failed test left queued must not turn teardown into more noise.
    if (fake_) fake_->finish_all_work();
    memory_.reset();
    streams_.clear();
    backend_.reset();
  }

  StreamHandle new_stream(int device = 0) {
    return streams_.emplace_back(backend_, device).handle();
  }

  // A job's kernel over a whole block.
  std::uint64_t work(StreamHandle stream, DevicePtr ptr, std::size_t bytes) {
    return fake_->enqueue_work(stream, ptr, bytes);
  }

  // Host waits since the last clear_calls().
  [[nodiscard]] std::size_t host_waits() const {
    return fake_->count("cuEventSynchronize") + fake_->count("cuStreamSynchronize");
  }

  // Expects no violation so far; forgets those there were, so that a later check reports only
  // new ones.
  void expect_no_violations(const std::string& when) {
    const std::vector<std::string> violations = fake_->violations();
    // One per page: the first few tell the story.
    constexpr std::size_t kShown = 4;
    std::ostringstream listed;
    for (std::size_t i = 0; i < violations.size() && i < kShown; ++i) {
      listed << "\n  " << violations[i];
    }
    if (violations.size() > kShown)
      listed << "\n  ... and " << violations.size() - kShown << " more";
    EXPECT_TRUE(violations.empty())
        << violations.size() << " violations " << when << ":" << listed.str();
    fake_->clear_violations();
  }

  // Once the GPU is idle (the test drained it before freeing the rest) and everything is freed,
  // trim leaves nothing mapped or held, and nothing on the way there released memory under work.
  void expect_clean_end() {
    EXPECT_EQ(fake_->pending_work(), 0u);
    memory_->trim();
    expect_no_violations("at the end");
    EXPECT_EQ(fake_->mapped_bytes(), 0u);
    EXPECT_EQ(fake_->live_chunks(), 0u);
  }

  std::optional<FakeDriver> fake_;
  std::shared_ptr<cuda::CudaBackend> backend_;
  std::deque<Stream> streams_;
  std::unique_ptr<MemoryManager> memory_;  // last: goes first
};

// --- reuse by another stream's allocation ----------------------------------------------------

// Persistent memory allocated on the default stream (outside any iteration) and used by
// kernels on the job's lane stream; the job leaves, and another stream allocates the memory.
TEST_F(StreamSafetyCudaFake, DefaultStreamMemoryUsedOnALaneWaitsForTheLane) {
  build(1, tight(1));
  const JobId job = memory_->register_job("weights on the default stream");
  const JobId next = memory_->register_job("next");
  const StreamHandle lane = new_stream();
  const StreamHandle s2 = new_stream();
  const DevicePtr weights = memory_->allocate({48 * MiB, 0, kDefaultStream, job});
  memory_->add_job_stream(job, 0, lane);
  const std::uint64_t lane_work = work(lane, weights, 48 * MiB);
  memory_->release_job(job);

  fake_->clear_calls();
  const DevicePtr q = memory_->allocate({48 * MiB, 0, s2, next});
  expect_no_violations("while another stream took default-stream pages a lane kernel uses");
  EXPECT_EQ(host_waits(), 0u) << "the reuse should wait on the GPU, not the host";
  const std::uint64_t new_work = work(s2, q, 48 * MiB);
  fake_->finish_work(new_work);
  EXPECT_TRUE(fake_->work_finished(lane_work)) << "s2's work must run after the lane's";

  fake_->finish_all_work();
  memory_->deallocate(q);
  expect_clean_end();
}

// --- page moves (harvesting) -----------------------------------------------------------------

// Where a job's block lives and where its kernels run: the block on the default stream or on a
// stream of its own, the kernels on another stream (the lane) that the job declared.
struct Placement {
  const char* name;
  bool block_on_default_stream;
};

void PrintTo(const Placement& p, std::ostream* os) {
  *os << p.name;
}

class StreamSafetyCudaFakeMoves : public StreamSafetyCudaFake,
                                  public ::testing::WithParamInterface<Placement> {
 protected:
  // A job with a block of `bytes` on device 0, allocated as the parameter says, and a kernel over
  // it queued on its lane; then the job turns quiescent (it promises no new work), with the
  // kernel unfinished.
  struct QueuedJob {
    JobId job;
    StreamHandle lane;
    DevicePtr block = 0;
  };
  QueuedJob quiescent_job_with_queued_work(std::size_t bytes) {
    QueuedJob q{memory_->register_job("quiescent"), new_stream(), 0};
    const StreamHandle alloc = GetParam().block_on_default_stream ? kDefaultStream : new_stream();
    q.block = memory_->allocate({bytes, 0, alloc, q.job});
    memory_->add_job_stream(q.job, 0, q.lane);
    (void)work(q.lane, q.block, bytes);
    memory::set_job_quiescent(*memory_, q.job);
    return q;
  }

  std::size_t pages_at(DevicePtr ptr, std::size_t bytes, Location where) {
    std::size_t n = 0;
    for (DevicePtr page = ptr / kPage * kPage; page < ptr + bytes; page += kPage) {
      const auto chunk = fake_->chunk_at(page);
      n += chunk && chunk->where == where ? 1 : 0;
    }
    return n;
  }
};

// demote: the job's pages go to a peer; the lane's kernel must have finished first.
TEST_P(StreamSafetyCudaFakeMoves, DemoteWaitsForTheJobsLaneWork) {
  build(2, harvesting(SpillPolicy::peer_then_host, {kDevice, kDevice}));
  const QueuedJob q = quiescent_job_with_queued_work(8 * MiB);
  fake_->clear_calls();
  EXPECT_EQ(memory::demote(*memory_, q.job, 0), 8 * MiB);
  expect_no_violations("while demoting pages a lane kernel still uses");
  RecordProperty("demote_host_waits", static_cast<int>(host_waits()));
  EXPECT_EQ(pages_at(q.block, 8 * MiB, Location::gpu(1)), 4u);
  fake_->finish_all_work();
  memory_->release_job(q.job);
  expect_clean_end();
}

// recall: device 1 wants back the pages it lent to the job on device 0.
TEST_P(StreamSafetyCudaFakeMoves, RecallWaitsForTheBorrowersLaneWork) {
  build(2, harvesting(SpillPolicy::peer_then_host, {16 * MiB, 16 * MiB}));
  // 24 MiB on a 16 MiB device: 8 pages of its own, 4 borrowed from device 1.
  const QueuedJob q = quiescent_job_with_queued_work(24 * MiB);
  ASSERT_EQ(pages_at(q.block, 24 * MiB, Location::gpu(1)), 4u);
  const JobId lender_job = memory_->register_job("lender");
  fake_->clear_calls();
  const DevicePtr mine = memory_->allocate({16 * MiB, 1, kDefaultStream, lender_job});
  expect_no_violations("while recalling pages a lane kernel still uses");
  RecordProperty("recall_host_waits", static_cast<int>(host_waits()));
  EXPECT_EQ(pages_at(q.block, 24 * MiB, Location::gpu(1)), 0u) << "the lent pages came back";
  fake_->finish_all_work();
  memory_->deallocate(mine);
  memory_->release_job(q.job);
  expect_clean_end();
}

// fetch: at activation the job's borrowed pages come home; its lane kernel, queued before it
// turned quiescent, still runs.
TEST_P(StreamSafetyCudaFakeMoves, FetchWaitsForTheJobsLaneWork) {
  build(2, harvesting(SpillPolicy::peer_then_host, {16 * MiB, 16 * MiB}));
  const JobId other = memory_->register_job("other");
  const DevicePtr theirs = memory_->allocate({8 * MiB, 0, new_stream(), other});
  // 16 MiB where 8 MiB are left: 4 pages home, 4 on device 1.
  const QueuedJob q = quiescent_job_with_queued_work(16 * MiB);
  ASSERT_EQ(pages_at(q.block, 16 * MiB, Location::gpu(1)), 4u);
  memory_->deallocate(theirs);  // room at home
  fake_->clear_calls();
  EXPECT_EQ(memory::activate_job(*memory_, q.job), 8 * MiB);
  expect_no_violations("while fetching pages a lane kernel still uses");
  RecordProperty("fetch_host_waits", static_cast<int>(host_waits()));
  EXPECT_EQ(pages_at(q.block, 16 * MiB, Location::gpu(0)), 8u);
  fake_->finish_all_work();
  memory_->release_job(q.job);
  expect_clean_end();
}

// prefetch: as fetch, in the background.
TEST_P(StreamSafetyCudaFakeMoves, PrefetchWaitsForTheJobsLaneWork) {
  build(2, harvesting(SpillPolicy::peer_then_host, {16 * MiB, 16 * MiB}));
  std::mutex mu;
  std::condition_variable cv;
  std::size_t prefetched = 0;
  memory_->set_move_observer([&](const MoveRecord& record) {
    if (record.reason != MoveReason::prefetch) return;
    {
      const std::scoped_lock lock(mu);
      prefetched += record.pages;
    }
    cv.notify_all();
  });
  const JobId other = memory_->register_job("other");
  const DevicePtr theirs = memory_->allocate({8 * MiB, 0, new_stream(), other});
  const QueuedJob q = quiescent_job_with_queued_work(16 * MiB);
  ASSERT_EQ(pages_at(q.block, 16 * MiB, Location::gpu(1)), 4u);
  memory_->deallocate(theirs);
  memory::prefetch(*memory_, q.job);
  {
    // The round is reported once its pages are in place; the wait ends as soon as it is.
    std::unique_lock lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, 10s, [&] { return prefetched >= 4; }))
        << "no prefetch round brought the pages home";
  }
  expect_no_violations("while prefetching pages a lane kernel still uses");
  memory_->set_move_observer(nullptr);
  fake_->finish_all_work();
  (void)memory::activate_job(*memory_, q.job);
  memory_->release_job(q.job);
  expect_clean_end();
}

INSTANTIATE_TEST_SUITE_P(StreamSafetyCudaFake, StreamSafetyCudaFakeMoves,
                         ::testing::Values(Placement{"BlockOnDefaultStream", true},
                                           Placement{"BlockOnItsOwnStream", false}),
                         [](const ::testing::TestParamInfo<Placement>& info) {
                           return std::string(info.param.name);
                         });

// A block with pages borrowed from a peer (or the host) is freed while its kernel runs; the lender
// (for host pages: the next device to borrow them) then needs exactly those pages.
struct Lending {
  const char* name;
  SpillPolicy spill;
  Location lender;
};

void PrintTo(const Lending& l, std::ostream* os) {
  *os << l.name;
}

class StreamSafetyCudaFakeLending : public StreamSafetyCudaFake,
                                    public ::testing::WithParamInterface<Lending> {};

TEST_P(StreamSafetyCudaFakeLending, BorrowedPagesGoHomeOnlyAfterTheWork) {
  const Lending lending = GetParam();
  MemoryOptions options = harvesting(lending.spill, {16 * MiB, 16 * MiB});
  options.harvest.host_limit_bytes = 8 * MiB;  // the host's pages too are all there is
  build(2, options);
  const JobId borrower = memory_->register_job("borrower");
  const JobId lender = memory_->register_job("lender");
  const StreamHandle s0 = new_stream(0);
  const StreamHandle s1 = new_stream(1);
  // 24 MiB on a 16 MiB device: its last 4 pages are borrowed.
  const DevicePtr p = memory_->allocate({24 * MiB, 0, s0, borrower});
  std::size_t borrowed = 0;
  for (DevicePtr page = p; page < p + 24 * MiB; page += kPage) {
    borrowed += fake_->chunk_at(page)->where == lending.lender ? 1 : 0;
  }
  ASSERT_EQ(borrowed, 4u);
  const std::uint64_t old_work = work(s0, p, 24 * MiB);
  memory_->deallocate(p);
  expect_no_violations("while freeing a block with borrowed pages under work");

  // Device 1 needs its whole limit (peer), or its own pages plus the host's (host): either way
  // the 4 pages the borrower's kernel may still use.
  fake_->clear_calls();
  const std::size_t wanted = lending.lender.is_host() ? 24 * MiB : 16 * MiB;
  const DevicePtr q = memory_->allocate({wanted, 1, s1, lender});
  expect_no_violations("while the lender reused its pages");
  RecordProperty("lender_host_waits", static_cast<int>(host_waits()));
  const std::uint64_t new_work = work(s1, q, wanted);
  fake_->finish_work(new_work);
  EXPECT_TRUE(fake_->work_finished(old_work)) << "the lender's work must run after the borrower's";

  fake_->finish_all_work();
  memory_->deallocate(q);
  expect_clean_end();
}

INSTANTIATE_TEST_SUITE_P(
    StreamSafetyCudaFake, StreamSafetyCudaFakeLending,
    ::testing::Values(Lending{"peer", SpillPolicy::peer_then_host, Location::gpu(1)},
                      Lending{"host", SpillPolicy::host_only, Location::host()}),
    [](const ::testing::TestParamInfo<Lending>& info) { return std::string(info.param.name); });

// A page shared by a quiescent job's live block and a block another job freed while its
// kernel, queued on the same stream after the first job turned quiescent, still runs: moving the
// page must wait for that kernel too, not only for the quiescent job's own work.
TEST_F(StreamSafetyCudaFake, MovingASharedPageWaitsForTheFreedNeighboursWork) {
  build(2, harvesting(SpillPolicy::peer_then_host, {kDevice, kDevice}));
  const JobId idle = memory_->register_job("idle");
  const JobId busy = memory_->register_job("busy");
  const StreamHandle lane = new_stream();
  const DevicePtr a = memory_->allocate({256 * KiB, 0, lane, idle});
  memory::set_job_quiescent(*memory_, idle);  // its mark on the lane comes before the neighbour's kernel
  const DevicePtr b = memory_->allocate({256 * KiB, 0, lane, busy});
  ASSERT_EQ(a / kPage, b / kPage) << "small blocks share a page";
  const std::uint64_t neighbour = work(lane, b, 256 * KiB);
  memory_->deallocate(b);
  fake_->clear_calls();
  EXPECT_EQ(memory::demote(*memory_, idle, 0), kPage);
  expect_no_violations("while moving a page a freed neighbour's kernel still uses");
  RecordProperty("shared_page_host_waits", static_cast<int>(host_waits()));
  fake_->finish_work(neighbour);
  memory_->release_job(idle);
  expect_clean_end();
}

}  // namespace
}  // namespace salus::testing
