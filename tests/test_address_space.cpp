// Address space never decides whether an allocation fits, only physical pages do (DESIGN.md,
// invariant 6): a stream's ranges grow when a size class runs out of room.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "support/memory_fixture.hpp"

namespace salus::testing {
namespace {

using AddressSpace = SimMemoryTest;

// Allocates blocks of `bytes` on one stream until the device says no; returns them.
std::vector<DevicePtr> fill_with(MemoryManager& memory, std::size_t bytes, std::string& reason) {
  std::vector<DevicePtr> blocks;
  for (;;) {
    try {
      blocks.push_back(memory.allocate({.bytes = bytes}));
    } catch (const OutOfMemory& e) {
      reason = e.info().reason;
      return blocks;
    }
  }
}

TEST_F(AddressSpace, SmallBlocksCanFillTheWholeDeviceOnOneStream) {
  // The first range for requests of 1 MiB or less covers a quarter of the device: every page
  // must still be usable by them.
  build(SimConfig::uniform(1, 64 * MiB));
  std::string reason;
  const auto blocks = fill_with(*memory, 256 * KiB, reason);
  EXPECT_EQ(blocks.size() * 256 * KiB, 64 * MiB) << reason;
  EXPECT_NE(reason.find("device memory exhausted"), std::string::npos) << reason;
  EXPECT_EQ(reason.find("address space"), std::string::npos) << reason;
  for (std::size_t i = 0; i < blocks.size(); ++i) fill_pattern(blocks[i], 256 * KiB, i);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_TRUE(check_pattern(blocks[i], 256 * KiB, i)) << "block " << i;
  }
  for (DevicePtr p : blocks) memory->deallocate(p);
  EXPECT_EQ(memory->device_stats(0).allocated, 0u);
}

TEST_F(AddressSpace, GrownRangesServeLookupsFreesAndReuse) {
  build(SimConfig::uniform(1, 64 * MiB));
  std::string reason;
  auto blocks = fill_with(*memory, 1 * MiB, reason);  // the largest "small" request
  ASSERT_EQ(blocks.size(), 64u) << reason;
  // The last block lies in a range made after the first one filled up: every call finds it.
  const DevicePtr last = blocks.back();
  const auto info = memory->find(last);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->bytes, 1 * MiB);
  memory->record_stream_use(last, StreamHandle{});
  // Free half, scattered over all ranges: the same count fits again.
  for (std::size_t i = 0; i < blocks.size(); i += 2) memory->deallocate(blocks[i]);
  for (std::size_t i = 0; i < blocks.size(); i += 2) blocks[i] = memory->allocate({.bytes = MiB});
  for (DevicePtr p : blocks) memory->deallocate(p);
  EXPECT_EQ(memory->device_stats(0).allocated, 0u);
  EXPECT_EQ(memory->trim(), 64 * MiB) << "every page comes back from every range";
}

TEST_F(AddressSpace, SmallAndLargeClassesShareThePhysicalPages) {
  // Small blocks fill three quarters of the device, large blocks the rest, then the other way.
  build(SimConfig::uniform(1, 64 * MiB));
  std::vector<DevicePtr> small;
  for (int i = 0; i < 48 * 4; ++i) small.push_back(alloc(256 * KiB));
  std::string reason;
  auto large = fill_with(*memory, 4 * MiB, reason);
  EXPECT_EQ(large.size(), 4u) << reason;
  for (DevicePtr p : small) memory->deallocate(p);
  for (DevicePtr p : large) memory->deallocate(p);
  large = fill_with(*memory, 4 * MiB, reason);
  EXPECT_EQ(large.size(), 16u) << reason;
  for (DevicePtr p : large) memory->deallocate(p);
  small = fill_with(*memory, 512 * KiB, reason);
  EXPECT_EQ(small.size(), 128u) << reason;
  for (DevicePtr p : small) memory->deallocate(p);
}

// Seeded random allocations and frees of both classes on one stream: a refusal is never for
// want of addresses, and a request that fits in whole free pages is never refused.
TEST_F(AddressSpace, RandomWorkloadIsNeverRefusedForAddresses) {
  constexpr std::size_t kLimit = 48 * MiB;
  build(SimConfig::uniform(1, kLimit));
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    std::vector<DevicePtr> live;
    for (int op = 0; op < 600; ++op) {
      if (!live.empty() && rng() % 3 == 0) {
        const std::size_t i = rng() % live.size();
        memory->deallocate(live[i]);
        live[i] = live.back();
        live.pop_back();
        continue;
      }
      const std::size_t bytes = rng() % 4 == 0 ? (1 + rng() % 6) * MiB : 512 * (1 + rng() % 2048);
      try {
        live.push_back(alloc(bytes));
      } catch (const OutOfMemory& e) {
        EXPECT_EQ(e.info().reason.find("address space"), std::string::npos)
            << "seed " << seed << ": " << e.info().reason;
      }
    }
    for (DevicePtr p : live) memory->deallocate(p);
    ASSERT_EQ(memory->device_stats(0).allocated, 0u) << "seed " << seed;
    // Nothing is stranded in a range: the whole device fits in one block again.
    memory->deallocate(alloc(kLimit));
  }
}

}  // namespace
}  // namespace salus::testing
