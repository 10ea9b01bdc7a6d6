// Harvesting on simulated GPUs: lenders ranked by link, borrowing when a device runs out, recall
// when the lender needs its pages back, and pages coming home at activation.
#include <gtest/gtest.h>

#include <thread>

#include "memory/safe_points.hpp"
#include "support/harvest_fixture.hpp"
#include "support/memory_fixture.hpp"

namespace salus::testing {
namespace {

MemoryOptions harvesting(std::vector<std::size_t> limits, SpillPolicy spill,
                         std::size_t reserve = 0) {
  MemoryOptions options;
  options.device_limits = std::move(limits);
  options.harvest.spill = spill;
  options.harvest.lend_reserve_bytes = reserve;
  options.harvest.recall_wait = std::chrono::milliseconds(200);
  return options;
}

std::vector<int> lender_devices(const MemoryManager& memory, int device) {
  std::vector<int> out;
  for (const Lender& lender : memory.lenders(device)) out.push_back(lender.device);
  return out;
}

class Harvest : public SimMemoryTest {};

TEST_F(Harvest, LendersAreRankedNvlinkFirstThenPcie) {
  build(SimConfig::two_islands(4, 64 * MiB));
  EXPECT_EQ(lender_devices(*memory, 0), (std::vector<int>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(lender_devices(*memory, 5), (std::vector<int>{4, 6, 7, 0, 1, 2, 3}));
  EXPECT_EQ(memory->lenders(0)[2].link.kind, LinkKind::nvlink);
  EXPECT_EQ(memory->lenders(0)[3].link.kind, LinkKind::pcie);
  build(SimConfig::pcie_only(2, 64 * MiB));
  ASSERT_EQ(memory->lenders(0).size(), 1u);
  EXPECT_EQ(memory->lenders(0)[0].link.kind, LinkKind::pcie);
  build(SimConfig::uniform(2, 64 * MiB));
  EXPECT_TRUE(memory->lenders(0).empty()) << "no peer access, no lender";
  EXPECT_THROW((void)memory->lenders(2), InvalidArgument);
}

TEST_F(Harvest, WithoutSpillingAFullDeviceFailsCleanly) {
  build(SimConfig::nvlink_mesh(2, 64 * MiB), harvesting({16 * MiB, 16 * MiB}, SpillPolicy::none));
  const DevicePtr a = alloc(16 * MiB);
  EXPECT_THROW((void)alloc(2 * MiB), OutOfMemory);
  EXPECT_EQ(memory->device_stats(1).lent, 0u);
  memory->deallocate(a);
}

TEST_F(Harvest, AFullDeviceBorrowsFromItsBestPeerThenTheHost) {
  build(SimConfig::two_islands(2, 64 * MiB),
        harvesting({16 * MiB, 8 * MiB, 16 * MiB, 16 * MiB}, SpillPolicy::peer_then_host));
  const DevicePtr own = alloc(16 * MiB);
  fill_pattern(own, 16 * MiB, 1);
  const DevicePtr spilled = alloc(8 * MiB);  // device 1 (NVLink) has room for all of it
  fill_pattern(spilled, 8 * MiB, 2);
  EXPECT_EQ(backend->location_of(spilled), Location::gpu(1));
  EXPECT_EQ(backend->location_of(spilled + 8 * MiB - 1), Location::gpu(1));
  EXPECT_EQ(backend->access_of(spilled, 0), Access::read_write);
  const DevicePtr further = alloc(4 * MiB);  // device 1 is full: the PCIe peers come next
  EXPECT_TRUE(backend->location_of(further) == Location::gpu(2) ||
              backend->location_of(further) == Location::gpu(3));
  EXPECT_TRUE(check_pattern(own, 16 * MiB, 1));
  EXPECT_TRUE(check_pattern(spilled, 8 * MiB, 2));
  const DeviceMemoryStats d0 = memory->device_stats(0);
  EXPECT_EQ(d0.borrowed_peer, 12 * MiB);
  EXPECT_EQ(d0.borrowed_host, 0u);
  EXPECT_EQ(memory->device_stats(1).lent, 8 * MiB);
  const JobMemoryStats job = memory->job_stats(kUnattributedJob);
  EXPECT_EQ(job.in_use_by_tier[static_cast<std::size_t>(Tier::local)], 16 * MiB);
  EXPECT_EQ(job.in_use_by_tier[static_cast<std::size_t>(Tier::peer)], 12 * MiB);

  memory->deallocate(spilled);
  memory->deallocate(further);
  EXPECT_EQ(memory->device_stats(1).lent, 0u) << "freed remote pages go home at once";
  EXPECT_EQ(memory->device_stats(0).borrowed_peer, 0u);
  memory->deallocate(own);
}

TEST_F(Harvest, HostOnlySpillingSkipsPeers) {
  build(SimConfig::nvlink_mesh(2, 64 * MiB),
        harvesting({8 * MiB, 8 * MiB}, SpillPolicy::host_only));
  const DevicePtr a = alloc(8 * MiB);
  const DevicePtr b = alloc(6 * MiB);
  EXPECT_EQ(backend->location_of(b), Location::host());
  EXPECT_EQ(memory->device_stats(0).borrowed_host, 6 * MiB);
  EXPECT_EQ(memory->stats().host_spill_bytes, 6 * MiB);
  memory->deallocate(b);
  memory->deallocate(a);
  memory->trim();
  EXPECT_EQ(backend->chunk_bytes(Location::host()), 0u);
}

TEST_F(Harvest, LendersKeepTheirReserve) {
  build(SimConfig::nvlink_mesh(2, 64 * MiB),
        harvesting({8 * MiB, 16 * MiB}, SpillPolicy::peer_then_host, 10 * MiB));
  const DevicePtr a = alloc(8 * MiB);
  const DevicePtr b = alloc(10 * MiB);  // device 1 lends 6 MiB (3 pages), the host the rest
  EXPECT_EQ(memory->device_stats(1).lent, 6 * MiB);
  EXPECT_EQ(memory->device_stats(0).borrowed_host, 4 * MiB);
  memory->deallocate(b);
  memory->deallocate(a);
}

TEST_F(Harvest, ALenderUnderPressureGetsItsPagesBackAndBorrowersKeepTheirPointers) {
  build(SimConfig::nvlink_mesh(2, 64 * MiB),
        harvesting({8 * MiB, 8 * MiB}, SpillPolicy::peer_then_host));
  const JobId borrower = memory->register_job("borrower");
  const JobId lender = memory->register_job("lender");
  const DevicePtr home = alloc(8 * MiB, 0, borrower);
  const DevicePtr away = alloc(8 * MiB, 0, borrower);
  fill_pattern(home, 8 * MiB, 3);
  fill_pattern(away, 8 * MiB, 4);
  ASSERT_EQ(backend->location_of(away), Location::gpu(1));
  memory::set_job_quiescent(*memory, borrower);

  const DevicePtr mine = alloc(8 * MiB, 1, lender);  // all of device 1: only a recall makes room
  EXPECT_EQ(backend->location_of(mine), Location::gpu(1));
  EXPECT_EQ(backend->location_of(away), Location::host()) << "device 0 is full: to the host";
  EXPECT_TRUE(check_pattern(away, 8 * MiB, 4));
  EXPECT_TRUE(check_pattern(home, 8 * MiB, 3));
  EXPECT_EQ(memory->device_stats(1).lent, 0u);
  EXPECT_EQ(memory->device_stats(1).recalled_pages, 4u);
  EXPECT_EQ(memory->find(away)->ptr, away);
  memory->release_job(lender);
  memory->release_job(borrower);
}

TEST_F(Harvest, ARunningBorrowerIsNotMovedAndTheLenderFailsAfterWaiting) {
  MemoryOptions options = harvesting({8 * MiB, 8 * MiB}, SpillPolicy::peer_then_host);
  options.harvest.host_limit_bytes = 0;  // nowhere else to go: the lender must wait
  build(SimConfig::nvlink_mesh(2, 64 * MiB), options);
  const JobId borrower = memory->register_job("borrower");
  const DevicePtr home = alloc(8 * MiB, 0, borrower);
  const DevicePtr away = alloc(8 * MiB, 0, borrower);
  (void)home;
  const JobId lender = memory->register_job("lender");
  EXPECT_THROW((void)alloc(8 * MiB, 1, lender), OutOfMemory);
  EXPECT_EQ(backend->location_of(away), Location::gpu(1)) << "an active job's pages stay put";
  memory->release_job(borrower);
  EXPECT_EQ(memory->device_stats(1).lent, 0u) << "a job that ends frees its pages everywhere";
  const DevicePtr mine = alloc(8 * MiB, 1, lender);
  EXPECT_EQ(backend->location_of(mine), Location::gpu(1));
  memory->release_job(lender);
}

TEST_F(Harvest, ALenderWaitsForABorrowerToReachASafePoint) {
  MemoryOptions options = harvesting({8 * MiB, 8 * MiB}, SpillPolicy::peer_then_host);
  options.harvest.host_limit_bytes = 8 * MiB;
  options.harvest.recall_wait = std::chrono::seconds(20);
  build(SimConfig::nvlink_mesh(2, 64 * MiB), options);
  const JobId borrower = memory->register_job("borrower");
  const DevicePtr home = alloc(8 * MiB, 0, borrower);
  const DevicePtr away = alloc(8 * MiB, 0, borrower);
  fill_pattern(away, 8 * MiB, 7);
  const DevicePtr host = alloc(8 * MiB, 0, borrower);  // the host is full now too
  ASSERT_EQ(backend->location_of(host), Location::host());
  const JobId lender = memory->register_job("lender");
  // The borrower frees some of its own memory, then reaches a safe point: the lender's pages
  // can go back to the borrower's device.
  std::jthread safe_point([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    memory->deallocate(home);
    memory::set_job_quiescent(*memory, borrower);
  });
  const DevicePtr mine = alloc(8 * MiB, 1, lender);
  EXPECT_EQ(backend->location_of(mine), Location::gpu(1));
  EXPECT_EQ(backend->location_of(away), Location::gpu(0));
  EXPECT_TRUE(check_pattern(away, 8 * MiB, 7));
  safe_point.join();
  memory->release_job(lender);
  memory->release_job(borrower);
}

TEST_F(Harvest, IdleJobsGoDownATierBeforeTheRunningJobSpillsAndComeBackWhenActive) {
  build(SimConfig::nvlink_mesh(2, 64 * MiB),
        harvesting({16 * MiB, 16 * MiB}, SpillPolicy::peer_then_host));
  const JobId idle = memory->register_job("idle");
  const JobId running = memory->register_job("running");
  const DevicePtr weights = alloc(8 * MiB, 0, idle);
  fill_pattern(weights, 8 * MiB, 5);
  memory::set_job_quiescent(*memory, idle);
  const DevicePtr activations = alloc(16 * MiB, 0, running);
  EXPECT_EQ(backend->location_of(activations), Location::gpu(0));
  EXPECT_EQ(backend->location_of(activations + 16 * MiB - 1), Location::gpu(0));
  EXPECT_EQ(backend->location_of(weights), Location::gpu(1));
  EXPECT_TRUE(check_pattern(weights, 8 * MiB, 5));

  memory->deallocate(activations);
  EXPECT_EQ(memory::activate_job(*memory, idle), 8 * MiB);
  EXPECT_EQ(backend->location_of(weights), Location::gpu(0));
  EXPECT_TRUE(check_pattern(weights, 8 * MiB, 5));
  const JobMemoryStats stats = memory->job_stats(idle);
  EXPECT_EQ(stats.activations, 1u);
  EXPECT_EQ(stats.activations_after_move, 1u);
  EXPECT_EQ(stats.activations_waited, 1u);
  EXPECT_EQ(stats.fetched_bytes, 8 * MiB);
  memory->release_job(idle);
  memory->release_job(running);
}

TEST_F(Harvest, PrefetchBringsPagesHomeBeforeActivation) {
  build(SimConfig::nvlink_mesh(2, 64 * MiB),
        harvesting({16 * MiB, 16 * MiB}, SpillPolicy::peer_then_host));
  const JobId next = memory->register_job("next");
  const DevicePtr weights = alloc(8 * MiB, 0, next);
  fill_pattern(weights, 8 * MiB, 6);
  memory::set_job_quiescent(*memory, next);
  EXPECT_EQ(memory::demote(*memory, next, 0), 8 * MiB);
  EXPECT_EQ(backend->location_of(weights), Location::gpu(1));
  memory::prefetch(*memory, next);
  // The round is over (and the job no longer held) once its bytes are counted.
  EXPECT_TRUE(
      harvest::eventually([&] { return memory->job_stats(next).prefetched_bytes == 8 * MiB; }));
  EXPECT_EQ(backend->location_of(weights + 8 * MiB - 1), Location::gpu(0));
  EXPECT_EQ(memory::activate_job(*memory, next), 0u) << "nothing left to wait for";
  EXPECT_EQ(backend->location_of(weights), Location::gpu(0));
  EXPECT_TRUE(check_pattern(weights, 8 * MiB, 6));
  const JobMemoryStats stats = memory->job_stats(next);
  EXPECT_EQ(stats.prefetched_bytes, 8 * MiB);
  EXPECT_EQ(stats.activations_after_move, 1u);
  EXPECT_EQ(stats.activations_waited, 0u);
  memory->release_job(next);
}

TEST_F(Harvest, BadInputIsNamed) {
  build(SimConfig::nvlink_mesh(2, 64 * MiB), harvesting({}, SpillPolicy::none));
  EXPECT_THROW(memory::set_job_quiescent(*memory, kUnattributedJob), InvalidArgument);
  EXPECT_THROW(memory::set_job_quiescent(*memory, JobId{77}), UnknownJob);
  EXPECT_THROW(memory::prefetch(*memory, JobId{77}), UnknownJob);
  const JobId job = memory->register_job("j");
  EXPECT_THROW((void)memory::demote(*memory, job, 0), NotSupported);
  MemoryOptions bad;
  bad.harvest.move_batch_pages = 0;
  EXPECT_THROW(MemoryManager(backend, bad), InvalidArgument);
}

}  // namespace
}  // namespace salus::testing
