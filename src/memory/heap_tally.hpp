// A stream heap's operation and block counts, kept under the heap's lock (StreamHeap::tally) and
// summed over a device's heaps for its statistics. A value with no lock.
#pragma once

#include <cstddef>
#include <cstdint>

#include "salus/memory.hpp"

namespace salus::memory {

struct HeapTally {
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::size_t blocks[kLifetimeCount] = {};

  HeapTally& operator+=(const HeapTally& other) {
    allocations += other.allocations;
    frees += other.frees;
    for (std::size_t c = 0; c < kLifetimeCount; ++c) blocks[c] += other.blocks[c];
    return *this;
  }
};

}  // namespace salus::memory
