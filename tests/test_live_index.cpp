// LiveIndex, the stream heap's table of live blocks by address (issue 12's free path), against
// std::unordered_map on seeded random inserts and erases: finds, sizes and iteration agree, through
// growth and through deletions that shift probe runs back (addresses packed into few home slots).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

#include "memory/arena.hpp"
#include "memory/live_index.hpp"

namespace salus::memory {
namespace {

TEST(LiveIndex, AgreesWithAHashMapOnRandomInsertsAndErases) {
  std::vector<Block> blocks(4096);
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    LiveIndex index;
    std::unordered_map<DevicePtr, Block*> model;
    // Block starts are multiples of 512 B in a small range, so many share a home slot.
    const DevicePtr base = 0x7f0000000000;
    std::uniform_int_distribution<std::size_t> slot(0, blocks.size() - 1);
    for (int op = 0; op < 20000; ++op) {
      const std::size_t i = slot(rng);
      const DevicePtr addr = base + i * 512;
      if (model.contains(addr)) {
        ASSERT_TRUE(index.erase(addr)) << "seed " << seed;
        model.erase(addr);
      } else {
        index.insert(addr, &blocks[i]);
        model.emplace(addr, &blocks[i]);
      }
      // A probe near the change, present or not.
      const DevicePtr probe = base + slot(rng) * 512;
      const auto it = model.find(probe);
      ASSERT_EQ(index.find(probe), it == model.end() ? nullptr : it->second) << "seed " << seed;
      ASSERT_EQ(index.size(), model.size());
    }
    EXPECT_FALSE(index.erase(base + blocks.size() * 512));  // never inserted
    std::size_t visited = 0;
    for (auto& [addr, block] : index) {
      ASSERT_EQ(model.at(addr), block);
      ++visited;
    }
    EXPECT_EQ(visited, model.size());
    for (const auto& [addr, block] : model) ASSERT_TRUE(index.erase(addr));
    EXPECT_TRUE(index.empty());
    EXPECT_EQ(index.find(base), nullptr);
  }
}

}  // namespace
}  // namespace salus::memory
