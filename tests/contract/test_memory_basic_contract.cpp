// Memory basics, the contract every backend keeps (see contract/backend_fixture.hpp for what a
// contract suite is and how to add a backend): allocation, accounting, promotion, job release,
// budgets, bad input and inconsistent options. Backend-specific: test_memory_cuda_fake.cpp (access
// descriptors, the driver's granularity and failing driver calls).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "contract/backend_fixture.hpp"

namespace salus::testing::contract {
namespace {

constexpr auto kPersistent = static_cast<std::size_t>(Lifetime::persistent);
constexpr auto kEphemeral = static_cast<std::size_t>(Lifetime::ephemeral);

class MemoryBasicContract : public ContractTest {
 protected:
  void SetUp() override { build(2, 256 * MiB); }
};

TEST_P(MemoryBasicContract, AllocatedBytesAreUsableAndAligned) {
  const DevicePtr small = alloc(100);
  const DevicePtr big = alloc(5 * MiB + 3);
  EXPECT_EQ(small % MemoryManager::kBlockAlignment, 0u);
  EXPECT_EQ(big % MemoryManager::kBlockAlignment, 0u);
  harness->fill(small, 100, 1);
  harness->fill(big, 5 * MiB + 3, 2);
  EXPECT_TRUE(harness->check(small, 100, 1));
  EXPECT_TRUE(harness->check(big, 5 * MiB + 3, 2));

  const auto info = memory->find(big);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->requested, 5 * MiB + 3);
  EXPECT_EQ(info->bytes, 5 * MiB + 512);
  EXPECT_EQ(info->device, 0);
  EXPECT_FALSE(memory->find(big + 512).has_value());

  memory->deallocate(small);
  memory->deallocate(big);
  EXPECT_EQ(memory->device_stats(0).allocated, 0u);
}

TEST_P(MemoryBasicContract, SameStreamReusesAFreedBlockAtOnce) {
  const DevicePtr a = alloc(3 * MiB);
  memory->deallocate(a);
  const DevicePtr b = alloc(3 * MiB);
  EXPECT_EQ(a, b);
  const auto s = memory->device_stats(0);
  EXPECT_EQ(s.chunk_creates, 2u) << "the second allocation must reuse the cached pages";
  memory->deallocate(b);
}

TEST_P(MemoryBasicContract, MultiPageBlocksNeedNotBeContiguousAndFreedPagesComeBack) {
  // Interleave blocks so that freed pages are scattered, then ask for one block that needs them.
  build(1, 64 * MiB);
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(alloc(4 * MiB));  // 64 MiB: the whole device
  EXPECT_THROW(alloc(2 * MiB), OutOfMemory);
  for (std::size_t i = 0; i < blocks.size(); i += 2) memory->deallocate(blocks[i]);
  // 32 MiB free in eight separate holes; one 32 MiB block still fits because pages are stitched.
  const DevicePtr big = alloc(32 * MiB);
  harness->fill(big, 32 * MiB, 7);
  EXPECT_TRUE(harness->check(big, 32 * MiB, 7));
  EXPECT_EQ(memory->device_stats(0).reserved, 64 * MiB);
}

TEST_P(MemoryBasicContract, AccountingPerJobClassAndDevice) {
  const JobId a = memory->register_job("a");
  const JobId b = memory->register_job("b");
  const DevicePtr w = alloc(10 * MiB, 0, a, Lifetime::persistent);
  const DevicePtr x = alloc(4 * MiB, 0, a, Lifetime::ephemeral);
  const DevicePtr y = alloc(2 * MiB, 1, a, Lifetime::ephemeral);
  const DevicePtr z = alloc(1 * MiB, 1, b, Lifetime::persistent);

  const JobMemoryStats sa = memory->job_stats(a);
  EXPECT_EQ(sa.by_class[kPersistent].in_use, 10 * MiB);
  EXPECT_EQ(sa.by_class[kEphemeral].in_use, 6 * MiB);
  EXPECT_EQ(sa.by_class[kEphemeral].blocks, 2u);
  EXPECT_EQ(sa.in_use, 16 * MiB);
  ASSERT_EQ(sa.in_use_by_device.size(), 2u);
  EXPECT_EQ(sa.in_use_by_device[0], 14 * MiB);
  EXPECT_EQ(sa.in_use_by_device[1], 2 * MiB);
  EXPECT_EQ(memory->job_stats(b).in_use, 1 * MiB);
  EXPECT_EQ(memory->device_stats(0).allocated, 14 * MiB);
  EXPECT_EQ(memory->device_stats(1).allocated, 3 * MiB);
  EXPECT_EQ(memory->device_stats(1).by_class[kEphemeral].in_use, 2 * MiB);

  memory->deallocate(x);
  EXPECT_EQ(memory->job_stats(a).by_class[kEphemeral].in_use, 2 * MiB);
  EXPECT_EQ(memory->job_stats(a).by_class[kEphemeral].peak, 6 * MiB);
  EXPECT_EQ(memory->job_stats(a).peak, 16 * MiB);

  for (DevicePtr p : {w, y, z}) memory->deallocate(p);
  const MemoryStats all = memory->stats();
  for (const auto& d : all.devices) EXPECT_EQ(d.allocated, 0u);
  for (const auto& j : all.jobs) EXPECT_EQ(j.in_use, 0u);
}

TEST_P(MemoryBasicContract, PromotionMovesSurvivingEphemeralBlocks) {
  const JobId job = memory->register_job("trainer");
  const DevicePtr activation = alloc(8 * MiB, 0, job, Lifetime::ephemeral);
  const DevicePtr optimizer_state = alloc(3 * MiB, 0, job, Lifetime::ephemeral);
  memory->deallocate(activation);
  EXPECT_EQ(memory->promote_ephemeral(job), 3 * MiB);
  const JobMemoryStats s = memory->job_stats(job);
  EXPECT_EQ(s.by_class[kPersistent].in_use, 3 * MiB);
  EXPECT_EQ(s.by_class[kEphemeral].in_use, 0u);
  EXPECT_EQ(s.promoted_bytes, 3 * MiB);
  EXPECT_EQ(memory->find(optimizer_state)->lifetime, Lifetime::persistent);
  EXPECT_EQ(memory->device_stats(0).by_class[kPersistent].in_use, 3 * MiB);
  EXPECT_EQ(memory->promote_ephemeral(job), 0u);
  // The promoted block frees as persistent.
  memory->deallocate(optimizer_state);
  EXPECT_EQ(memory->job_stats(job).in_use, 0u);
  EXPECT_EQ(memory->device_stats(0).by_class[kPersistent].in_use, 0u);
}

TEST_P(MemoryBasicContract, ReleasingAJobFreesEverythingItHeldOnEveryDevice) {
  const JobId leaver = memory->register_job("leaver");
  const JobId stayer = memory->register_job("stayer");
  const DevicePtr kept = alloc(2 * MiB, 1, stayer);
  harness->fill(kept, 2 * MiB, 3);
  for (int i = 0; i < 10; ++i) {
    (void)alloc(MiB * (i + 1), i % 2, leaver, i % 3 ? Lifetime::ephemeral : Lifetime::persistent);
  }
  const DevicePtr last = alloc(777, 0, leaver);
  memory->release_job(leaver);
  EXPECT_EQ(memory->job_stats(leaver).in_use, 0u);
  EXPECT_FALSE(memory->job_stats(leaver).alive);
  EXPECT_EQ(memory->device_stats(0).allocated, 0u);
  EXPECT_EQ(memory->device_stats(1).allocated, 2 * MiB);
  EXPECT_TRUE(harness->check(kept, 2 * MiB, 3));
  EXPECT_THROW(memory->deallocate(last), InvalidArgument) << "its blocks are gone";
  EXPECT_THROW(alloc(1, 0, leaver), UnknownJob);
  EXPECT_THROW(memory->release_job(leaver), UnknownJob);
  // Its memory serves others.
  const DevicePtr reused = alloc(10 * MiB, 0, stayer);
  memory->deallocate(reused);
  memory->deallocate(kept);
}

TEST_P(MemoryBasicContract, TrimReturnsCachedPages) {
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(alloc(4 * MiB));
  const DevicePtr keep = alloc(1000);
  for (DevicePtr p : blocks) memory->deallocate(p);
  EXPECT_GE(memory->device_stats(0).reserved, 32 * MiB);
  const std::size_t released = memory->trim();
  EXPECT_GE(released, 32 * MiB);
  const auto s = memory->device_stats(0);
  EXPECT_EQ(s.reserved, 2 * MiB) << "only the page under the live small block stays";
  EXPECT_EQ(harness->chunk_bytes(Location::gpu(0)), 2 * MiB);
  harness->fill(keep, 1000, 5);
  EXPECT_TRUE(harness->check(keep, 1000, 5));
  memory->deallocate(keep);
  memory->trim();
  EXPECT_EQ(harness->chunk_bytes(Location::gpu(0)), 0u);
}

TEST_P(MemoryBasicContract, JobBudgetRefusalIsTypedAndChangesNothing) {
  const JobId job = memory->register_job("capped", {.total = 8 * MiB});
  const DevicePtr held = alloc(6 * MiB, 0, job);
  const auto before = memory->device_stats(0);
  try {
    (void)alloc(3 * MiB, 0, job, Lifetime::ephemeral);
    FAIL() << "the budget should refuse";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.info().job, job);
    EXPECT_EQ(e.info().job_name, "capped");
    EXPECT_EQ(e.info().requested_bytes, 3 * MiB);
    EXPECT_EQ(e.info().job_in_use_bytes, 6 * MiB);
    EXPECT_EQ(e.info().job_limit_bytes, 8 * MiB);
    EXPECT_NE(std::string(e.what()).find("capped"), std::string::npos);
    EXPECT_EQ(e.code(), Errc::out_of_memory);
  }
  const auto after = memory->device_stats(0);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_EQ(after.reserved, before.reserved);
  EXPECT_EQ(memory->job_stats(job).in_use, 6 * MiB);
  // Class budgets too.
  memory->set_job_limits(job, {.total = kUnlimited, .persistent = 7 * MiB});
  EXPECT_THROW(alloc(2 * MiB, 0, job, Lifetime::persistent), OutOfMemory);
  const DevicePtr ok = alloc(2 * MiB, 0, job, Lifetime::ephemeral);
  memory->deallocate(ok);
  memory->deallocate(held);
}

TEST_P(MemoryBasicContract, DeviceExhaustionIsTypedAndLeavesStateIntact) {
  build(1, 32 * MiB);
  const JobId job = memory->register_job("greedy");
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 4; ++i) {
    blocks.push_back(alloc(8 * MiB, 0, job));
    harness->fill(blocks.back(), 8 * MiB, static_cast<std::uint64_t>(i));
  }
  const auto before = memory->device_stats(0);
  try {
    (void)alloc(1, 0, job);
    FAIL() << "the device is full";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.info().device, 0);
    EXPECT_EQ(e.info().device_in_use_bytes, 32 * MiB);
    EXPECT_EQ(e.info().device_limit_bytes, 32 * MiB);
    EXPECT_EQ(e.info().job_limit_bytes, 0u) << "no job budget was involved";
  }
  const auto after = memory->device_stats(0);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_EQ(after.reserved, before.reserved);
  EXPECT_EQ(after.out_of_memory, before.out_of_memory + 1);
  EXPECT_EQ(memory->job_stats(job).in_use, 32 * MiB);
  // A request that could not be placed never existed for the job's peaks either (found by
  // fuzzing, issue 12): the peak stays what was really held at once.
  memory->deallocate(blocks[3]);
  EXPECT_THROW((void)alloc(16 * MiB, 0, job), OutOfMemory);
  EXPECT_EQ(memory->job_stats(job).peak, 32 * MiB);
  EXPECT_EQ(memory->job_stats(job).by_class[kEphemeral].peak +
                memory->job_stats(job).by_class[kPersistent].peak,
            32 * MiB);
  blocks[3] = alloc(8 * MiB, 0, job);
  harness->fill(blocks[3], 8 * MiB, 3);
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(harness->check(blocks[static_cast<std::size_t>(i)], 8 * MiB,
                              static_cast<std::uint64_t>(i)));
  }
  memory->deallocate(blocks[1]);
  const DevicePtr again = alloc(8 * MiB, 0, job);
  EXPECT_EQ(again, blocks[1]);
}

TEST_P(MemoryBasicContract, BadInputGetsAClearErrorAndLosesNothing) {
  const DevicePtr live = alloc(4096);
  harness->fill(live, 4096, 9);
  auto expect_invalid = [](auto&& call, const char* needle) {
    try {
      call();
      ADD_FAILURE() << "expected InvalidArgument mentioning '" << needle << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_invalid([&] { (void)alloc(0); }, "size 0");
  // Beyond the device (spilling off): out of memory, as PyTorch's allocator reports it.
  for (const std::size_t bytes : {257 * MiB, std::size_t{SIZE_MAX}}) {
    try {
      (void)alloc(bytes);
      ADD_FAILURE() << "expected OutOfMemory for " << bytes << " bytes";
    } catch (const OutOfMemory& e) {
      EXPECT_EQ(e.info().requested_bytes, bytes);
      EXPECT_EQ(e.info().device_limit_bytes, 256 * MiB);
      EXPECT_NE(std::string(e.what()).find("can never fit"), std::string::npos) << e.what();
    }
  }
  expect_invalid([&] { (void)alloc(64, 2); }, "device 2 does not exist");
  expect_invalid([&] { (void)alloc(64, -1); }, "device -1 does not exist");
  expect_invalid([&] { memory->deallocate(0x1234); }, "unknown pointer");
  expect_invalid([&] { memory->deallocate(live + 512); }, "not a live Salus block");
  expect_invalid([&] { memory->deallocate(live, 4096, 1); }, "not device 1");
  expect_invalid([&] { memory->deallocate(live, 100, 0); }, "does not match");
  EXPECT_THROW((void)alloc(64, 0, JobId{999}), UnknownJob);
  EXPECT_THROW(memory->promote_ephemeral(JobId{999}), UnknownJob);
  EXPECT_THROW(memory->release_job(kUnattributedJob), InvalidArgument);

  // None of that disturbed the live block or the accounting.
  EXPECT_TRUE(harness->check(live, 4096, 9));
  EXPECT_EQ(memory->device_stats(0).allocated, 4096u);
  memory->deallocate(live, 4096, 0);
  expect_invalid([&] { memory->deallocate(live); }, "already freed");
  EXPECT_EQ(memory->device_stats(0).allocated, 0u);
}

TEST_P(MemoryBasicContract, RejectsInconsistentOptions) {
  build(1, 64 * MiB);
  const auto limits = [](std::vector<std::size_t> bytes) {
    MemoryOptions options;
    options.device_limits = std::move(bytes);
    return options;
  };
  EXPECT_THROW(MemoryManager(backend, limits({128 * MiB})), InvalidArgument);
  EXPECT_THROW(MemoryManager(backend, limits({MiB, MiB})), InvalidArgument);
  MemoryOptions no_room;
  no_room.device_headroom_bytes = 0;
  no_room.va_factor = 0;
  EXPECT_THROW(MemoryManager(backend, no_room), InvalidArgument);
  EXPECT_THROW(MemoryManager(nullptr), InvalidArgument);
  MemoryOptions reserve_too_large = limits({16 * MiB});
  reserve_too_large.harvest.lend_reserve_bytes = 32 * MiB;  // more than any device may hold
  EXPECT_THROW(MemoryManager(backend, reserve_too_large), InvalidArgument);
  MemoryManager limited(backend, limits({16 * MiB}));
  EXPECT_EQ(limited.device_stats(0).limit, 16 * MiB);
}

INSTANTIATE_TEST_SUITE_P(Backends, MemoryBasicContract, ::testing::ValuesIn(contract_backends()),
                         ContractBackendName);

}  // namespace
}  // namespace salus::testing::contract
