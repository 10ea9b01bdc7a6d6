// Focused harvesting scenarios on simulated GPUs: pointers across demote / recall / fetch, jobs
// released with pages on several tiers, lenders under pressure, where moved pages go, and what
// activation and prefetch may push down.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "memory/safe_points.hpp"
#include "support/harvest_fixture.hpp"
#include "support/memory_fixture.hpp"

namespace salus::testing {
namespace {

using namespace std::chrono_literals;
using namespace harvest;

class HarvestProperty : public SimMemoryTest {
 protected:
  // Where every page under [ptr, ptr + bytes) lives; fails the test on an unmapped page.
  std::vector<Location> locations(DevicePtr ptr, std::size_t bytes) {
    std::vector<Location> out;
    for (DevicePtr page = ptr / kPage * kPage; page < ptr + bytes; page += kPage) {
      const std::optional<Location> where = backend->location_of(page);
      EXPECT_TRUE(where.has_value()) << std::hex << page << " is unmapped";
      out.push_back(where.value_or(Location::host(99)));
    }
    return out;
  }
  bool all_at(DevicePtr ptr, std::size_t bytes, Location where) {
    const std::vector<Location> at = locations(ptr, bytes);
    return std::all_of(at.begin(), at.end(), [&](Location l) { return l == where; });
  }
  void expect_usable(DevicePtr ptr, std::size_t bytes, int device, JobId job, std::uint64_t seed) {
    const std::optional<BlockInfo> info = memory->find(ptr);
    ASSERT_TRUE(info.has_value());
    EXPECT_EQ(info->ptr, ptr);
    EXPECT_EQ(info->requested, bytes);
    EXPECT_EQ(info->device, device);
    EXPECT_EQ(info->job, job);
    for (DevicePtr page = ptr / kPage * kPage; page < ptr + bytes; page += kPage) {
      EXPECT_EQ(backend->access_of(page, device), Access::read_write) << std::hex << page;
    }
    EXPECT_TRUE(check_pattern(ptr, bytes, seed))
        << "block " << std::hex << ptr << " lost its bytes";
  }
};

TEST_F(HarvestProperty, BorrowerPointersSurviveDemoteRecallFetchCycles) {
  build(SimConfig::nvlink_mesh(2, 64 * MiB),
        harvesting({16 * MiB, 16 * MiB}, SpillPolicy::peer_then_host));
  Stream s1(backend, 0), s2(backend, 0);
  const JobId borrower = memory->register_job("borrower");
  const JobId filler = memory->register_job("filler");
  const JobId lender = memory->register_job("lender");
  struct Held {
    DevicePtr ptr;
    std::size_t bytes;
  };
  std::vector<Held> blocks;
  for (auto [bytes, stream] :
       {std::pair{std::size_t{300}, &s1}, {700 * KiB, &s1}, {3 * MiB, &s2}, {4 * MiB + 1, &s2}}) {
    blocks.push_back({memory->allocate({bytes, 0, stream->handle(), borrower}), bytes});
  }
  const std::vector<Held> original = blocks;
  std::uint64_t recalled = 0;
  for (int cycle = 0; cycle < 6; ++cycle) {
    SCOPED_TRACE(::testing::Message() << "cycle " << cycle);
    const auto seed = [&](std::size_t i) {
      return static_cast<std::uint64_t>(100 * cycle + i + 1);
    };
    for (std::size_t i = 0; i < blocks.size(); ++i)
      fill_pattern(blocks[i].ptr, blocks[i].bytes, seed(i));
    memory::set_job_quiescent(*memory, borrower);
    EXPECT_GT(memory::demote(*memory, borrower, 0), 0u);
    for (const Held& b : blocks) EXPECT_TRUE(all_at(b.ptr, b.bytes, Location::gpu(1)));
    // Odd cycles: device 0 fills up meanwhile, so recalled pages can only go to the host.
    const bool crowded = cycle % 2 == 1;
    DevicePtr crowd = 0;
    if (crowded) crowd = memory->allocate({16 * MiB, 0, s1.handle(), filler});
    const DevicePtr mine = memory->allocate({16 * MiB, 1, {}, lender});
    EXPECT_TRUE(all_at(mine, 16 * MiB, Location::gpu(1)));
    EXPECT_EQ(memory->device_stats(1).lent, 0u);
    EXPECT_GT(memory->device_stats(1).recalled_pages, recalled);
    recalled = memory->device_stats(1).recalled_pages;
    const Location parked = crowded ? Location::host() : Location::gpu(0);
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      EXPECT_TRUE(all_at(blocks[i].ptr, blocks[i].bytes, parked));
      expect_usable(blocks[i].ptr, blocks[i].bytes, 0, borrower, seed(i));
    }
    memory->deallocate(mine);
    if (crowd != 0) memory->deallocate(crowd);
    // Freed blocks keep their pages cached, and a lender lends only pages its pool holds: trim so
    // that device 1 can lend again next cycle.
    memory->trim();
    const std::size_t fetched = memory::activate_job(*memory, borrower);
    EXPECT_EQ(fetched > 0, crowded) << "only pages parked on the host wait for activation";
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      EXPECT_TRUE(all_at(blocks[i].ptr, blocks[i].bytes, Location::gpu(0)));
      expect_usable(blocks[i].ptr, blocks[i].bytes, 0, borrower, seed(i));
      EXPECT_EQ(blocks[i].ptr, original[i].ptr);
    }
  }
  const JobMemoryStats stats = memory->job_stats(borrower);
  EXPECT_EQ(stats.activations, 6u);
  EXPECT_EQ(stats.activations_after_move, 6u);
  EXPECT_EQ(stats.activations_waited, 3u);
  EXPECT_EQ(memory->device_stats(0).borrowed_host + memory->device_stats(0).borrowed_peer, 0u);
  memory->release_job(borrower);
  memory->release_job(filler);
  memory->release_job(lender);
}

TEST_F(HarvestProperty, AJobReleasedWithPagesOnTwoPeersAndTheHostFreesThemEverywhere) {
  // Devices 1 and 2 lend two pages each (beyond a 4 MiB reserve); device 3 lends none.
  build(SimConfig::nvlink_mesh(4, 64 * MiB),
        harvesting({8 * MiB, 8 * MiB, 8 * MiB, 4 * MiB}, SpillPolicy::peer_then_host, 4 * MiB));
  const JobId bystander = memory->register_job("bystander");
  const DevicePtr kept = memory->allocate({2 * MiB, 1, {}, bystander});
  fill_pattern(kept, 2 * MiB, 11);
  const std::size_t host_before = memory->stats().host_spill_bytes;

  const JobId job = memory->register_job("spread");
  std::vector<std::pair<DevicePtr, std::size_t>> blocks;
  for (std::size_t bytes : {8 * MiB, std::size_t{4096}, 3 * MiB, 1 * MiB, 6 * MiB + 3, 900 * KiB}) {
    blocks.emplace_back(memory->allocate({bytes, 0, {}, job}), bytes);
    fill_pattern(blocks.back().first, bytes, blocks.size());
  }
  std::set<std::string> places;
  for (const auto& [ptr, bytes] : blocks) {
    for (Location l : locations(ptr, bytes)) places.insert(to_string(l));
  }
  ASSERT_TRUE(places.contains(to_string(Location::gpu(1))) &&
              places.contains(to_string(Location::gpu(2))) &&
              places.contains(to_string(Location::host())))
      << "the setup should spread the job over two peers and the host";
  EXPECT_EQ(memory->device_stats(1).lent, 2 * MiB);  // device 1 also holds the bystander's page
  EXPECT_EQ(memory->device_stats(2).lent, 4 * MiB);
  EXPECT_EQ(memory->device_stats(3).lent, 0u);
  EXPECT_GT(memory->device_stats(0).borrowed_host, 0u);
  memory::set_job_quiescent(*memory, job);  // released while quiescent, as a cancelled waiting job is

  memory->release_job(job);
  for (int d = 0; d < 4; ++d) {
    const DeviceMemoryStats s = memory->device_stats(d);
    EXPECT_EQ(s.lent, 0u) << "device " << d;
    EXPECT_EQ(s.borrowed_peer + s.borrowed_host, 0u) << "device " << d;
  }
  EXPECT_EQ(memory->device_stats(0).allocated, 0u);
  EXPECT_EQ(memory->job_stats(job).in_use, 0u);
  for (std::size_t t = 0; t < kTierCount; ++t)
    EXPECT_EQ(memory->job_stats(job).in_use_by_tier[t], 0u);
  EXPECT_TRUE(check_pattern(kept, 2 * MiB, 11));
  EXPECT_GE(memory->stats().host_spill_bytes, host_before) << "kept for reuse until trim";
  memory->trim();
  EXPECT_EQ(memory->stats().host_spill_bytes, 0u);
  EXPECT_EQ(backend->chunk_bytes(Location::host()), 0u);
  EXPECT_EQ(backend->chunk_bytes(Location::gpu(0)), 0u);
  EXPECT_EQ(backend->chunk_bytes(Location::gpu(2)), 0u);
  EXPECT_EQ(backend->chunk_bytes(Location::gpu(1)), 2 * MiB) << "only the bystander's page";
  memory->release_job(bystander);
  memory->trim();
  EXPECT_EQ(backend->chunk_bytes(Location::gpu(1)), 0u);
}

TEST_F(HarvestProperty, ALenderUnderPressureGetsItsPagesBackFromQuiescentBorrowersOnEveryDevice) {
  build(SimConfig::nvlink_mesh(4, 64 * MiB),
        harvesting({16 * MiB, 16 * MiB, 16 * MiB, 16 * MiB}, SpillPolicy::peer_then_host));
  struct Borrower {
    JobId job;
    int device;
    DevicePtr home;
    DevicePtr away;
  };
  std::vector<Borrower> borrowers;
  for (int d = 1; d < 4; ++d) {
    const JobId job = memory->register_job("borrower" + std::to_string(d));
    // Device 3's borrower frees 4 MiB of its own later: room for its pages to come home to.
    const DevicePtr home = memory->allocate({d == 3 ? 12 * MiB : 16 * MiB, d, {}, job});
    const DevicePtr spare = d == 3 ? memory->allocate({4 * MiB, d, {}, job}) : 0;
    const DevicePtr away = memory->allocate({4 * MiB, d, {}, job});
    ASSERT_TRUE(all_at(away, 4 * MiB, Location::gpu(0)))
        << "device 0 is every device's first lender";
    fill_pattern(home, d == 3 ? 12 * MiB : 16 * MiB, 10 + d);
    fill_pattern(away, 4 * MiB, 20 + d);
    if (spare != 0) memory->deallocate(spare);
    memory::set_job_quiescent(*memory, job);
    borrowers.push_back({job, d, home, away});
  }
  EXPECT_EQ(memory->device_stats(0).lent, 12 * MiB);

  const JobId lender = memory->register_job("lender");
  const DevicePtr mine = memory->allocate({16 * MiB, 0, {}, lender});
  EXPECT_TRUE(all_at(mine, 16 * MiB, Location::gpu(0)));
  EXPECT_EQ(memory->device_stats(0).lent, 0u);
  EXPECT_EQ(memory->device_stats(0).recalled_pages, 6u);
  for (const Borrower& b : borrowers) {
    SCOPED_TRACE(::testing::Message() << "borrower on device " << b.device);
    const Location parked = b.device == 3 ? Location::gpu(3) : Location::host();
    EXPECT_TRUE(all_at(b.away, 4 * MiB, parked));
    expect_usable(b.away, 4 * MiB, b.device, b.job, 20 + static_cast<std::uint64_t>(b.device));
    expect_usable(b.home, b.device == 3 ? 12 * MiB : 16 * MiB, b.device, b.job,
                  10 + static_cast<std::uint64_t>(b.device));
  }
  EXPECT_EQ(memory->device_stats(3).borrowed_host + memory->device_stats(3).borrowed_peer, 0u);
  EXPECT_EQ(memory->device_stats(1).borrowed_host, 4 * MiB);
  EXPECT_EQ(memory->device_stats(2).borrowed_host, 4 * MiB);
  memory->release_job(lender);
  for (const Borrower& b : borrowers) memory->release_job(b.job);
}

// Pages that go down a tier take the best tier on offer, even when some of the pages the
// harvester counted cannot move (they share a page with a running job's block).
TEST_F(HarvestProperty, DemotedPagesTakeThePeerBeforeTheHostWhenSomePagesCannotMove) {
  // Device 1 lends exactly two pages (8 MiB limit, 4 MiB reserve).
  build(SimConfig::nvlink_mesh(2, 64 * MiB),
        harvesting({16 * MiB, 8 * MiB}, SpillPolicy::peer_then_host, 4 * MiB));
  Stream stream(backend, 0);
  const JobId idle = memory->register_job("idle");
  const JobId running = memory->register_job("running");
  const DevicePtr large = memory->allocate({4 * MiB, 0, stream.handle(), idle});
  const DevicePtr small = memory->allocate({512 * KiB, 0, stream.handle(), idle});
  const DevicePtr neighbour = memory->allocate({512 * KiB, 0, stream.handle(), running});
  ASSERT_EQ(small / kPage, neighbour / kPage) << "small blocks share a page";
  fill_pattern(large, 4 * MiB, 1);
  fill_pattern(small, 512 * KiB, 2);
  memory::set_job_quiescent(*memory, idle);

  // Three pages counted, two movable, two peer pages on offer (and the host).
  EXPECT_EQ(memory::demote(*memory, idle, 0), 4 * MiB);
  EXPECT_TRUE(all_at(small, 512 * KiB, Location::gpu(0))) << "shared with a running job";
  EXPECT_TRUE(all_at(large, 4 * MiB, Location::gpu(1)))
      << "the peer had room for both movable pages, yet one went to the host";
  EXPECT_TRUE(check_pattern(large, 4 * MiB, 1));
  EXPECT_TRUE(check_pattern(small, 512 * KiB, 2));
  memory->release_job(idle);
  memory->release_job(running);
}

// A lender takes its pages back; the borrower's pages go to its own memory when it has room, even
// when other pages in the same heap (of a running job) cannot move.
TEST_F(HarvestProperty, RecalledPagesGoToTheBorrowersOwnMemoryBeforeTheHost) {
  build(SimConfig::nvlink_mesh(2, 64 * MiB),
        harvesting({8 * MiB, 16 * MiB}, SpillPolicy::peer_then_host));
  const JobId idle = memory->register_job("idle");
  const JobId running = memory->register_job("running");
  const DevicePtr home = memory->allocate({4 * MiB, 0, {}, idle});
  const DevicePtr spare = memory->allocate({4 * MiB, 0, {}, idle});
  const DevicePtr theirs = memory->allocate({4 * MiB, 0, {}, running});
  const DevicePtr away = memory->allocate({4 * MiB, 0, {}, idle});
  ASSERT_TRUE(all_at(theirs, 4 * MiB, Location::gpu(1)));
  ASSERT_TRUE(all_at(away, 4 * MiB, Location::gpu(1)));
  fill_pattern(away, 4 * MiB, 3);
  memory->deallocate(spare);  // room for two pages on device 0
  memory::set_job_quiescent(*memory, idle);

  const JobId lender = memory->register_job("lender");
  const DevicePtr mine = memory->allocate({16 * MiB, 1, {}, lender});
  EXPECT_TRUE(all_at(away, 4 * MiB, Location::gpu(0)))
      << "device 0 had room for the idle job's two pages, yet they went to the host";
  EXPECT_TRUE(all_at(theirs, 4 * MiB, Location::gpu(1))) << "a running job's pages stay put";
  EXPECT_TRUE(check_pattern(away, 4 * MiB, 3));
  (void)home;
  memory->deallocate(mine);
  memory->release_job(lender);
  memory->release_job(idle);
  memory->release_job(running);
}

// Bringing a job home must not push other idle jobs down for pages that cannot come home anyway.
TEST_F(HarvestProperty, ActivationDoesNotEvictOthersForPagesThatCannotMove) {
  build(SimConfig::nvlink_mesh(2, 64 * MiB),
        harvesting({8 * MiB, 16 * MiB}, SpillPolicy::peer_then_host));
  Stream stream(backend, 0);
  const JobId other = memory->register_job("other");
  const JobId running = memory->register_job("running");
  const JobId waking = memory->register_job("waking");
  const DevicePtr others = memory->allocate({4 * MiB, 0, stream.handle(), other});
  const DevicePtr big = memory->allocate({4 * MiB, 0, stream.handle(), running});
  const DevicePtr small = memory->allocate({512 * KiB, 0, stream.handle(), waking});
  ASSERT_TRUE(all_at(small, 512 * KiB, Location::gpu(1))) << "device 0 is full: borrowed";
  const DevicePtr neighbour = memory->allocate({512 * KiB, 0, stream.handle(), running});
  ASSERT_EQ(neighbour / kPage, small / kPage) << "the running job shares the borrowed page";
  memory::set_job_quiescent(*memory, other);
  memory::set_job_quiescent(*memory, waking);

  EXPECT_EQ(memory::activate_job(*memory, waking), 0u) << "its one page is shared with a running job";
  EXPECT_TRUE(all_at(others, 4 * MiB, Location::gpu(0)))
      << "another idle job was demoted to make room for a page that could not move";
  EXPECT_EQ(memory->device_stats(0).pages_moved, 0u);
  (void)big;
  memory->release_job(other);
  memory->release_job(running);
  memory->release_job(waking);
}

// activations_after_move counts activations of jobs whose pages moved down, not of every job
// that happened to be quiescent while some other device evicted pages.
TEST_F(HarvestProperty, ActivationsAfterMoveCountOnlyJobsWhosePagesMoved) {
  build(SimConfig::nvlink_mesh(2, 64 * MiB),
        harvesting({8 * MiB, 16 * MiB}, SpillPolicy::peer_then_host));
  const JobId elsewhere = memory->register_job("elsewhere");  // lives on device 1 only
  const JobId idle = memory->register_job("idle");
  const JobId running = memory->register_job("running");
  const DevicePtr far = memory->allocate({4 * MiB, 1, {}, elsewhere});
  const DevicePtr weights = memory->allocate({4 * MiB, 0, {}, idle});
  memory::set_job_quiescent(*memory, elsewhere);
  memory::set_job_quiescent(*memory, idle);
  const DevicePtr work = memory->allocate({8 * MiB, 0, {}, running});  // evicts `idle`
  EXPECT_TRUE(all_at(weights, 4 * MiB, Location::gpu(1)));
  EXPECT_TRUE(all_at(far, 4 * MiB, Location::gpu(1)));
  memory->deallocate(work);
  (void)memory::activate_job(*memory, idle);
  (void)memory::activate_job(*memory, elsewhere);
  EXPECT_EQ(memory->job_stats(idle).activations_after_move, 1u);
  EXPECT_EQ(memory->job_stats(elsewhere).activations_after_move, 0u) << "none of its pages moved";
  memory->release_job(elsewhere);
  memory->release_job(idle);
  memory->release_job(running);
}

// A prefetch that finds no room waits; a free that makes room lets it finish.
TEST_F(HarvestProperty, AStalledPrefetchFinishesOnceAFreeMakesRoom) {
  build(SimConfig::nvlink_mesh(2, 64 * MiB),
        harvesting({8 * MiB, 16 * MiB}, SpillPolicy::peer_then_host));
  const JobId next = memory->register_job("next");
  const JobId running = memory->register_job("running");
  const DevicePtr weights = memory->allocate({4 * MiB, 0, {}, next});
  fill_pattern(weights, 4 * MiB, 9);
  memory::set_job_quiescent(*memory, next);
  ASSERT_EQ(memory::demote(*memory, next, 0), 4 * MiB);
  const DevicePtr a = memory->allocate({4 * MiB, 0, {}, running});
  const DevicePtr b = memory->allocate({4 * MiB, 0, {}, running});
  EXPECT_TRUE(all_at(a, 4 * MiB, Location::gpu(0)) && all_at(b, 4 * MiB, Location::gpu(0)));
  memory::prefetch(*memory, next);
  memory::prefetch(*memory, next);  // a second request for the same job is one target
  // Nothing can come home while the running job holds device 0.
  EXPECT_FALSE(eventually([&] { return memory->job_stats(next).prefetched_bytes > 0; }, 50ms));
  EXPECT_TRUE(all_at(weights, 4 * MiB, Location::gpu(1)));
  memory->deallocate(b);
  EXPECT_TRUE(eventually([&] { return memory->job_stats(next).prefetched_bytes == 4 * MiB; }))
      << "the free made room, but the prefetch never went on";
  EXPECT_TRUE(all_at(weights, 4 * MiB, Location::gpu(0)));
  EXPECT_EQ(memory::activate_job(*memory, next), 0u);
  EXPECT_TRUE(check_pattern(weights, 4 * MiB, 9));
  EXPECT_EQ(memory->job_stats(next).activations_waited, 0u);
  memory->release_job(next);
  memory->release_job(running);
}

// prefetch is for quiescent jobs; asked for a running one it must not push idle jobs down.
TEST_F(HarvestProperty, PrefetchOfARunningJobLeavesIdleJobsAlone) {
  build(SimConfig::nvlink_mesh(2, 64 * MiB),
        harvesting({8 * MiB, 16 * MiB}, SpillPolicy::peer_then_host));
  const JobId running = memory->register_job("running");
  const JobId idle = memory->register_job("idle");
  const JobId probe = memory->register_job("probe");
  (void)memory->allocate({4 * MiB, 0, {}, running});
  const DevicePtr idles = memory->allocate({4 * MiB, 0, {}, idle});
  const DevicePtr spilled = memory->allocate({4 * MiB, 0, {}, running});
  ASSERT_TRUE(all_at(spilled, 4 * MiB, Location::gpu(1)));
  // The probe: a quiescent job on device 1 whose pages sit on the host, with room to come home.
  const DevicePtr probes = memory->allocate({2 * MiB, 1, {}, probe});
  memory::set_job_quiescent(*memory, probe);
  memory->remap(probes, Location::host());
  memory::set_job_quiescent(*memory, idle);

  memory::prefetch(*memory, running);
  memory::prefetch(*memory, probe);
  // Rounds take targets in order: once the probe is home, the running job's turn came before.
  ASSERT_TRUE(eventually([&] { return memory->job_stats(probe).prefetched_bytes == 2 * MiB; }));
  EXPECT_TRUE(all_at(idles, 4 * MiB, Location::gpu(0)))
      << "an idle job was demoted for a running job's prefetch, which can never move";
  EXPECT_TRUE(all_at(spilled, 4 * MiB, Location::gpu(1))) << "a running job's pages stay put";
  memory->deallocate(spilled);
  memory->release_job(running);
  memory->release_job(idle);
  memory->release_job(probe);
}

}  // namespace
}  // namespace salus::testing
