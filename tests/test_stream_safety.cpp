// Stream safety under memory pressure: memory that work queued on a stream still touches must
// not be unmapped, handed to another stream, or moved under that work, whichever path frees,
// reclaims or moves it (another stream's allocation, trim, an allocation that fails, a job's
// release, spilled pages going home, demote, recall, fetch, prefetch, a runtime job leaving).
//
// Each test queues slow "kernels" (tests/support/stream_work.hpp) that touch a block well after
// the host has freed it or let it move, then does the operation that would reuse or move the
// memory, then waits for every stream and checks: the work found its own bytes, and every byte
// is accounted for. On the simulated backend an unmapped page is a SIGSEGV, so a violation kills
// the test process. The reuse by another stream's allocation, by trim and after a job's release is
// the contract every backend keeps, in contract/test_stream_safety_contract.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <tuple>

#include "memory/safe_points.hpp"
#include "salus/runtime.hpp"
#include "support/harvest_fixture.hpp"
#include "support/memory_fixture.hpp"
#include "support/stream_work.hpp"

namespace salus::testing {
namespace {

using namespace std::chrono_literals;
using harvest::kPage;

// Long enough that the host is done with the reusing operation well before the work runs.
constexpr auto kSlowKernel = 200ms;
// A work item that keeps writing while pages move under it: stamps every millisecond or so, by
// default for about 150 ms.
TouchOptions busy_loop(std::uint64_t key, int rounds = 150) {
  return stamp_rounds(key, rounds, 1ms);
}

class StreamSafety : public SimMemoryTest {
 protected:
  void SetUp() override {}  // each test builds the machine it needs

  // One simulated 64 MiB GPU (32 pages of 2 MiB), all of it Salus's.
  void one_gpu() { build(SimConfig::uniform(1, 64 * MiB)); }

  StreamHandle new_stream(int device = 0) {
    return streams_.emplace_back(backend, device).handle();
  }

  // Every stream this test made, and the default stream.
  void sync_all() {
    for (const Stream& s : streams_) s.synchronize();
    backend->synchronize_stream({});
  }

  void TearDown() override {
    // A failed test may leave work queued; it must finish before the memory goes.
    if (backend) sync_all();
  }

  void expect_work_clean(const StreamWork& w) {
    EXPECT_TRUE(w.all_finished()) << w.finished() << " of " << w.enqueued() << " items finished";
    EXPECT_EQ(w.mismatches(), 0u) << "queued work found foreign or stale bytes, first in block "
                                  << std::hex << w.first_bad();
  }

  StreamWork work;
  std::deque<Stream> streams_;  // a deque: Stream does not move while handed out
};

// A block freed while another stream's work on it is queued leaves that work's fence on its
// pages. An allocation carved over those pages that then fails for want of more pages must give
// the fence back with them: once this stream's own work is done (an iteration's end says so),
// the pages look quiet, and a stream short of pages would unmap them at once under the work.
TEST_F(StreamSafety, AFailedAllocationKeepsItsPagesFencesForAnotherStreamsWork) {
  one_gpu();  // 32 pages
  const StreamHandle s = new_stream(), reader = new_stream(), s2 = new_stream(),
                     s3 = new_stream();
  const JobId a = memory->register_job("a"), b = memory->register_job("b");
  memory->add_job_stream(a, 0, reader);
  const DevicePtr keep = alloc(2 * MiB, 0, a, Lifetime::persistent, s);  // page 0 of s's range
  const DevicePtr p = alloc(8 * MiB, 0, a, Lifetime::ephemeral, s);      // pages 1-4
  work.touch(*backend, reader, {{p, 8 * MiB}}, stamp_once(9, kSlowKernel));
  memory->deallocate(p);
  (void)memory->promote_ephemeral(a);  // an iteration ends: s is idle, its frees are quiet
  const DevicePtr q = alloc(54 * MiB, 0, b, Lifetime::ephemeral, s2);  // the other 27 pages
  // 10 MiB on s: carved over p's 4 pages and one more, which nobody has.
  EXPECT_THROW((void)alloc(10 * MiB, 0, a, Lifetime::ephemeral, s), OutOfMemory);
  const std::uint64_t unmaps = memory->device_stats(0).page_unmaps;
  // Another stream short of pages: p's pages may go only behind the reader's work.
  try {
    memory->deallocate(alloc(8 * MiB, 0, b, Lifetime::ephemeral, s3));
  } catch (const OutOfMemory&) {
  }
  EXPECT_EQ(memory->device_stats(0).page_unmaps, unmaps)
      << "pages under the reader's queued work were unmapped at once";
  sync_all();
  expect_work_clean(work);
  memory->deallocate(q);
  memory->deallocate(keep);
  expect_balanced(*memory);
}

// As above, but the allocation succeeds with the reclaimed pages, at another range of the same
// stream. Stream order makes the new block's work safe; the old range's queued work is not.
// (Waiting for that work, or failing with OutOfMemory, are both fine.)
TEST_F(StreamSafety, AllocationThatReclaimsOwnPagesLeavesQueuedWorkAlone) {
  one_gpu();
  const StreamHandle s = new_stream();
  const JobId a = memory->register_job("a");
  const DevicePtr p = alloc(48 * MiB, 0, a, Lifetime::ephemeral, s);
  const DevicePtr live = alloc(8 * MiB, 0, a, Lifetime::ephemeral, s);
  work.touch(*backend, s, {{p, 48 * MiB}}, stamp_once(7, kSlowKernel));
  memory->deallocate(p);
  try {
    const DevicePtr q = alloc(56 * MiB, 0, a, Lifetime::ephemeral, s);
    work.touch(*backend, s, {{q, 56 * MiB}}, stamp_once(8));
    backend->synchronize_stream(s);
    memory->deallocate(q);
  } catch (const OutOfMemory&) {
  }
  sync_all();
  expect_work_clean(work);
  memory->deallocate(live);
  expect_balanced(*memory);
}

// ---------------------------------------------------------------------------------------------
// Spilling and harvesting. Copies are throttled (a 2 MiB page takes ~10 ms on every link), so a
// page move that does not wait for the work overlaps it for many of its rounds: the writes that
// land on the old page after its copy are lost, and the work's next round sees them missing.

class StreamSafetyHarvestBase : public StreamSafety {
 protected:
  // Two GPUs of `limit` bytes each, NVLink between them; the host takes what they cannot.
  void two_gpus(std::size_t limit, SpillPolicy spill) {
    SimConfig config = SimConfig::nvlink_mesh(2, 64 * MiB, kSlowLinkGbps);
    config.throttle_copies = true;
    config.host_link_bandwidth_gbps = kSlowLinkGbps;
    build(std::move(config), harvest::harvesting({limit, limit}, spill));
  }
  static constexpr double kSlowLinkGbps = 0.2;

  // Fails the test unless every page under [ptr, ptr + bytes) lives at `where`.
  void expect_at(DevicePtr ptr, std::size_t bytes, Location where) {
    for (DevicePtr page = ptr / kPage * kPage; page < ptr + bytes; page += kPage) {
      const auto at = backend->location_of(page);
      ASSERT_TRUE(at.has_value()) << std::hex << page << " is unmapped";
      EXPECT_EQ(to_string(*at), to_string(where)) << std::hex << page;
    }
  }
};

class StreamSafetyHarvest : public StreamSafetyHarvestBase,
                            public ::testing::WithParamInterface<SpillPolicy> {};
class StreamSafetyRecall : public StreamSafetyHarvestBase {};

std::string spill_name(const ::testing::TestParamInfo<SpillPolicy>& info) {
  return to_string(info.param);
}

// Hazard (a): a job's block allocated on one stream (its own, or the default stream) while its
// work runs on another stream it declared. Demoting the block must wait for that work.
TEST_P(StreamSafetyHarvest, DemoteWaitsForWorkOnADeclaredJobStream) {
  for (const bool default_stream : {false, true}) {
    SCOPED_TRACE(default_stream ? "block on the default stream" : "block on its own stream");
    two_gpus(32 * MiB, GetParam());
    StreamWork w;
    const StreamHandle alloc_stream = default_stream ? StreamHandle{} : new_stream();
    const StreamHandle lane = new_stream();
    const JobId x = memory->register_job("x");
    memory->add_job_stream(x, 0, lane);
    const DevicePtr p = alloc(4 * MiB, 0, x, Lifetime::persistent, alloc_stream);
    const TouchOptions loop = busy_loop(100);
    w.touch(*backend, lane, {{p, 4 * MiB}}, loop);
    ASSERT_TRUE(w.wait_started(1));
    memory::set_job_quiescent(*memory, x);  // after enqueueing: the work is its own, from before
    EXPECT_EQ(memory::demote(*memory, x, 0), 4 * MiB);
    sync_all();
    expect_work_clean(w);
    EXPECT_EQ(count_bad_stamps({p, 4 * MiB}, last_key(loop)), 0u) << "the move lost bytes";
    (void)memory::activate_job(*memory, x);
    expect_at(p, 4 * MiB, Location::gpu(0));
    memory->deallocate(p);
    expect_balanced(*memory);
    streams_.clear();
  }
}

// Hazard (b): a quiescent job's block shares a page with another job's block on the same stream.
// That job's work, enqueued after the first went quiescent, still writes its (now freed) block
// when the shared page is demoted: the move must wait for it (or leave the page alone).
TEST_P(StreamSafetyHarvest, DemoteOfAPageSharedWithAFreedBlockWaitsForItsWork) {
  two_gpus(32 * MiB, GetParam());
  const StreamHandle s = new_stream();
  const JobId x = memory->register_job("x"), y = memory->register_job("y");
  const DevicePtr px = alloc(256 * KiB, 0, x, Lifetime::persistent, s);
  const DevicePtr py = alloc(256 * KiB, 0, y, Lifetime::persistent, s);
  ASSERT_EQ(px / kPage, py / kPage) << "the two small blocks should share a page";
  StreamWork x_work;
  x_work.touch(*backend, s, {{px, 256 * KiB}}, stamp_once(200));
  backend->synchronize_stream(s);
  memory::set_job_quiescent(*memory, x);
  work.touch(*backend, s, {{py, 256 * KiB}}, busy_loop(300));  // y's, after x's quiet mark
  ASSERT_TRUE(work.wait_started(1));
  memory->deallocate(py);  // stream-ordered: y's work still writes it
  (void)memory::demote(*memory, x, 0);
  sync_all();
  expect_work_clean(work);
  (void)memory::activate_job(*memory, x);
  EXPECT_EQ(count_bad_stamps({px, 256 * KiB}, 200), 0u) << "x's block lost its bytes";
  memory->deallocate(px);
  expect_balanced(*memory);
}

// The lender runs short and takes back its pages from a quiescent borrower whose work on a
// declared stream still writes them.
TEST_F(StreamSafetyRecall, RecallWaitsForWorkOnTheBorrowersJobStream) {
  two_gpus(16 * MiB, SpillPolicy::peer_then_host);
  const StreamHandle filler_stream = new_stream(1), alloc_stream = new_stream(1);
  const StreamHandle lane = new_stream(1), lender_stream = new_stream(0);
  const JobId filler = memory->register_job("filler"), x = memory->register_job("x");
  const JobId z = memory->register_job("z");
  memory->add_job_stream(x, 1, lane);
  const DevicePtr f = alloc(16 * MiB, 1, filler, Lifetime::persistent, filler_stream);
  const DevicePtr p = alloc(4 * MiB, 1, x, Lifetime::persistent, alloc_stream);
  expect_at(p, 4 * MiB, Location::gpu(0));  // borrowed: device 1 is full
  const TouchOptions loop = busy_loop(400);
  work.touch(*backend, lane, {{p, 4 * MiB}}, loop);
  ASSERT_TRUE(work.wait_started(1));
  memory::set_job_quiescent(*memory, x);
  // Device 0 lent 2 of its 8 pages; it needs all 8 back.
  const DevicePtr q = alloc(16 * MiB, 0, z, Lifetime::persistent, lender_stream);
  EXPECT_GT(memory->device_stats(0).recalled_pages, 0u);
  sync_all();
  expect_work_clean(work);
  EXPECT_EQ(count_bad_stamps({p, 4 * MiB}, last_key(loop)), 0u) << "the recall lost bytes";
  memory->deallocate(q);
  memory->deallocate(f);
  (void)memory::activate_job(*memory, x);
  memory->deallocate(p);
  expect_balanced(*memory);
}

// A job's block spilled at allocation (the device was full); the job's work on a declared stream
// still writes it when the job is activated (fetch) or prefetched and room has appeared.
TEST_P(StreamSafetyHarvest, FetchAndPrefetchWaitForWorkOnADeclaredJobStream) {
  for (const bool prefetch : {false, true}) {
    SCOPED_TRACE(prefetch ? "prefetch" : "fetch (activate_job)");
    two_gpus(16 * MiB, GetParam());
    StreamWork w;
    const StreamHandle filler_stream = new_stream(), alloc_stream = new_stream();
    const StreamHandle lane = new_stream();
    const JobId filler = memory->register_job("filler"), x = memory->register_job("x");
    memory->add_job_stream(x, 0, lane);
    const DevicePtr f = alloc(12 * MiB, 0, filler, Lifetime::persistent, filler_stream);
    const DevicePtr p = alloc(8 * MiB, 0, x, Lifetime::persistent, alloc_stream);
    ASSERT_EQ(memory->job_stats(x).in_use_by_tier[harvest::tier(Tier::local)], 4 * MiB);
    const TouchOptions loop = busy_loop(500);
    w.touch(*backend, lane, {{p, 8 * MiB}}, loop);
    ASSERT_TRUE(w.wait_started(1));
    memory::set_job_quiescent(*memory, x);
    memory->deallocate(f);  // room for x's pages at home
    if (prefetch) {
      memory::prefetch(*memory, x);
      EXPECT_TRUE(harvest::eventually(
          [&] { return memory->job_stats(x).prefetched_bytes > 0 || w.all_finished(); }));
      sync_all();
      (void)memory::activate_job(*memory, x);
    } else {
      EXPECT_GT(memory::activate_job(*memory, x), 0u);
      sync_all();
    }
    expect_work_clean(w);
    EXPECT_EQ(count_bad_stamps({p, 8 * MiB}, last_key(loop)), 0u) << "the fetch lost bytes";
    memory->deallocate(p);
    expect_balanced(*memory);
    streams_.clear();
  }
}

// A block with pages borrowed from a peer or the host, freed while its work is queued: the
// borrowed pages go home, but not before the work is done with them.
TEST_P(StreamSafetyHarvest, SpilledBlockFreedWhileWorkIsQueued) {
  two_gpus(16 * MiB, GetParam());
  const StreamHandle filler_stream = new_stream(), s = new_stream(), other = new_stream(1);
  const JobId filler = memory->register_job("filler"), x = memory->register_job("x");
  const JobId y = memory->register_job("y");
  const DevicePtr f = alloc(12 * MiB, 0, filler, Lifetime::persistent, filler_stream);
  const DevicePtr p = alloc(8 * MiB, 0, x, Lifetime::ephemeral, s);
  ASSERT_EQ(memory->job_stats(x).in_use_by_tier[harvest::tier(Tier::local)], 4 * MiB);
  work.touch(*backend, s, {{p, 8 * MiB}}, stamp_once(600, kSlowKernel));
  memory->deallocate(p);
  // Device 1 takes what it can of its own pages and the host's (the pages x spilled to).
  const DevicePtr q = alloc(16 * MiB, 1, y, Lifetime::ephemeral, other);
  work.touch(*backend, other, {{q, 16 * MiB}}, stamp_once(601));
  sync_all();
  expect_work_clean(work);
  EXPECT_EQ(count_bad_stamps({q, 16 * MiB}, 601), 0u) << "x's work wrote y's block";
  memory->deallocate(q);
  memory->deallocate(f);
  expect_balanced(*memory);
}

INSTANTIATE_TEST_SUITE_P(Spill, StreamSafetyHarvest,
                         ::testing::Values(SpillPolicy::peer_then_host, SpillPolicy::host_only),
                         spill_name);

// ---------------------------------------------------------------------------------------------
// The runtime. A job's persistent memory, allocated before its first iteration (on the device's
// default stream), is used by work enqueued on its lane stream inside an iteration.

class StreamSafetyRuntime : public ::testing::Test {
 protected:
  static RuntimeOptions options(std::size_t limit, SpillPolicy spill = SpillPolicy::none) {
    RuntimeOptions o;
    o.policy = "fair";
    o.memory.device_limits = {limit};
    o.memory.harvest.spill = spill;
    o.memory.harvest.lend_reserve_bytes = 0;
    return o;
  }
  static JobSpec spec(std::string name) {
    JobSpec s;
    s.name = std::move(name);
    s.hints = {
        .persistent_bytes = 8 * MiB, .ephemeral_peak_bytes = 8 * MiB, .iteration_seconds = 0.01};
    return s;
  }
  static std::shared_ptr<DeviceBackend> gpu(bool throttled = false) {
    SimConfig config = SimConfig::uniform(1, 64 * MiB);
    config.throttle_copies = throttled;
    config.host_link_bandwidth_gbps = 0.2;
    return make_sim_backend(std::move(config));
  }
  static void expect_work_clean(const StreamWork& w) {
    EXPECT_TRUE(w.all_finished()) << w.finished() << " of " << w.enqueued() << " items finished";
    EXPECT_EQ(w.mismatches(), 0u) << "queued work found foreign or stale bytes, first in block "
                                  << std::hex << w.first_bad();
  }
};

// The job leaves (or is cancelled from another thread) right after an iteration whose work on
// its block is still queued; another job then allocates that memory and uses it at once.
//  - Lane: the block is persistent (allocated before the first iteration, so on the default
//    stream) and the work is on the job's lane stream.
//  - SideStream: a framework's own stream. Inside the iteration the framework allocates through
//    Runtime::allocate naming that stream (charged to the job running on this thread) and
//    enqueues the work there.
using FinishParam = std::tuple<bool, bool>;  // cancel, side stream
class StreamSafetyRuntimeFinish : public StreamSafetyRuntime,
                                  public ::testing::WithParamInterface<FinishParam> {};

TEST_P(StreamSafetyRuntimeFinish, RuntimeJobFinishingWithQueuedWorkKeepsItsMemoryUntilDone) {
  const auto [cancel, side] = GetParam();
  auto backend = gpu();
  StreamWork work;
  Runtime runtime(backend, options(32 * MiB));
  const Stream side_stream(backend, 0);
  StreamHandle used{};
  {
    Job a = runtime.add_job(spec("a"));
    DevicePtr block = side ? 0 : a.allocate(24 * MiB);
    {
      auto it = a.iteration();
      used = side ? side_stream.handle() : it.stream();
      if (side) block = runtime.allocate(24 * MiB, 0, used);
      const std::optional<BlockInfo> info = runtime.memory().find(block);
      ASSERT_TRUE(info.has_value());
      ASSERT_EQ(info->job, a.id());
      work.touch(*backend, used, {{block, 24 * MiB}}, stamp_once(700, kSlowKernel));
    }
    if (cancel) {
      std::thread([&] { a.cancel(); }).join();
      EXPECT_THROW((void)a.allocate(1 * MiB), JobCancelled);
    } else {
      a.leave();
    }
  }
  Job b = runtime.add_job(spec("b"));
  const DevicePtr mine = b.allocate(24 * MiB);
  work.touch(*backend, StreamHandle{}, {{mine, 24 * MiB}}, stamp_once(701));
  backend->synchronize_stream(used);
  backend->synchronize_stream({});
  expect_work_clean(work);
  EXPECT_EQ(count_bad_stamps({mine, 24 * MiB}, 701), 0u) << "a's work wrote b's block";
  b.deallocate(mine);
  b.leave();
  expect_balanced(runtime.memory());
}

INSTANTIATE_TEST_SUITE_P(Finish, StreamSafetyRuntimeFinish,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<FinishParam>& info) {
                           return std::string(std::get<0>(info.param) ? "Cancel" : "Leave") +
                                  (std::get<1>(info.param) ? "_SideStream" : "_Lane");
                         });

// The job frees its persistent block between iterations while the last iteration's work on it is
// still queued on the lane; another job then allocates that memory.
TEST_F(StreamSafetyRuntime, RuntimeFreeOfPersistentBlockWithQueuedLaneWork) {
  auto backend = gpu();
  StreamWork work;
  Runtime runtime(backend, options(32 * MiB));
  Job a = runtime.add_job(spec("a"));
  Job b = runtime.add_job(spec("b"));
  const DevicePtr weights = a.allocate(24 * MiB);
  StreamHandle lane{};
  {
    auto it = a.iteration();
    lane = it.stream();
    work.touch(*backend, lane, {{weights, 24 * MiB}}, stamp_once(710, kSlowKernel));
  }
  a.deallocate(weights);
  const DevicePtr mine = b.allocate(24 * MiB);
  work.touch(*backend, StreamHandle{}, {{mine, 24 * MiB}}, stamp_once(711));
  backend->synchronize_stream(lane);
  backend->synchronize_stream({});
  expect_work_clean(work);
  EXPECT_EQ(count_bad_stamps({mine, 24 * MiB}, 711), 0u) << "a's work wrote b's block";
  b.deallocate(mine);
  a.leave();
  b.leave();
  expect_balanced(runtime.memory());
}

// Harvesting: job a's persistent block lives on the default stream, its work on the lane. While
// that work still runs, a waits for its next turn (quiescent) and b, running, needs the device:
// a's pages go to the host, which must wait for a's work on the lane.
TEST_F(StreamSafetyRuntime, RuntimeDemoteOfAWaitingJobWaitsForItsLaneWork) {
  auto backend = gpu(/*throttled=*/true);
  StreamWork work;
  Runtime runtime(backend, options(16 * MiB, SpillPolicy::host_only));
  Job a = runtime.add_job(spec("a"));
  Job b = runtime.add_job(spec("b"));
  const DevicePtr weights = a.allocate(8 * MiB);
  StreamHandle lane{};
  // Longer: several threads take turns before b's allocation moves a's pages.
  const TouchOptions loop = busy_loop(720, 400);
  {
    auto it = a.iteration();
    lane = it.stream();
    work.touch(*backend, lane, {{weights, 8 * MiB}}, loop);
  }
  ASSERT_TRUE(work.wait_started(1));
  std::optional<Job::Iteration> b_turn;
  b_turn.emplace(b);  // the lane is free: b starts at once
  std::thread a_thread([&] {
    auto it = a.iteration();  // waits (quiescent) until b's turn ends
  });
  // No ASSERT until a's thread is joined.
  EXPECT_TRUE(harvest::eventually([&] {
    return a.stats().state == JobState::waiting && runtime.memory().job_stats(a.id()).quiescent;
  }));
  try {
    // 12 MiB of 16 with a holding 8: a's pages must make room.
    const DevicePtr scratch = b.allocate(12 * MiB);
    EXPECT_GT(runtime.memory().device_stats(0).pages_moved, 0u);
    b.deallocate(scratch);
  } catch (const Error& e) {
    ADD_FAILURE() << "b could not allocate: " << e.what();
  }
  b_turn.reset();
  a_thread.join();
  backend->synchronize_stream(lane);
  backend->synchronize_stream({});
  expect_work_clean(work);
  EXPECT_EQ(count_bad_stamps({weights, 8 * MiB}, last_key(loop)), 0u) << "a's bytes were lost";
  a.deallocate(weights);
  a.leave();
  b.leave();
  expect_balanced(runtime.memory());
}

}  // namespace
}  // namespace salus::testing
