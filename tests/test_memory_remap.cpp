// Remapping a live range onto other physical chunks keeps its address and its bytes.
#include <gtest/gtest.h>

#include "support/memory_fixture.hpp"

namespace salus::testing {
namespace {

class MemoryRemap : public SimMemoryTest {
 protected:
  void SetUp() override { build(SimConfig::nvlink_mesh(2, 128 * MiB)); }
};

TEST_F(MemoryRemap, MovesPagesBetweenDevicesAndHostKeepingAddressAndBytes) {
  const std::size_t bytes = 5 * MiB + 100;  // three pages, the last one partly used
  const DevicePtr p = alloc(bytes);
  fill_pattern(p, bytes, 42);
  ASSERT_EQ(backend->location_of(p), Location::gpu(0));

  memory->remap(p, Location::gpu(1));
  EXPECT_EQ(backend->location_of(p), Location::gpu(1));
  EXPECT_EQ(backend->location_of(p + bytes - 1), Location::gpu(1));
  EXPECT_TRUE(check_pattern(p, bytes, 42));
  EXPECT_EQ(backend->access_of(p, 0), Access::read_write) << "the owner keeps access after a remap";

  memory->remap(p, Location::host());
  EXPECT_EQ(backend->location_of(p), Location::host());
  EXPECT_TRUE(check_pattern(p, bytes, 42));

  // Writes through the same pointer land in the new pages, and survive the way back.
  fill_pattern(p, bytes, 43);
  memory->remap(p, Location::gpu(0));
  EXPECT_EQ(backend->location_of(p), Location::gpu(0));
  EXPECT_TRUE(check_pattern(p, bytes, 43));
  EXPECT_EQ(memory->find(p)->bytes, bytes + 412);

  memory->deallocate(p);
  memory->trim();
  EXPECT_EQ(backend->chunk_bytes(Location::gpu(0)), 0u);
  EXPECT_EQ(backend->chunk_bytes(Location::gpu(1)), 0u) << "remote pages are released, not leaked";
  EXPECT_EQ(backend->chunk_bytes(Location::host()), 0u);
}

TEST_F(MemoryRemap, NeighboursSharingAPageKeepTheirBytes) {
  const DevicePtr a = alloc(1000);
  const DevicePtr b = alloc(3000);
  fill_pattern(a, 1000, 1);
  fill_pattern(b, 3000, 2);
  memory->remap(a, Location::host());
  EXPECT_TRUE(check_pattern(a, 1000, 1));
  EXPECT_TRUE(check_pattern(b, 3000, 2));
  EXPECT_EQ(backend->location_of(b), Location::host()) << "b shares a's page";
  memory->deallocate(a);
  memory->deallocate(b);
}

TEST_F(MemoryRemap, RejectsUnknownPointers) {
  EXPECT_THROW(memory->remap(0x1000, Location::host()), InvalidArgument);
  const DevicePtr p = alloc(4096);
  EXPECT_THROW(memory->remap(p + 512, Location::host()), InvalidArgument);
  memory->deallocate(p);
  EXPECT_THROW(memory->remap(p, Location::host()), InvalidArgument);
}

}  // namespace
}  // namespace salus::testing
