// A memory manager over simulated GPUs, and helpers to write and check byte patterns through the
// pointers it hands out (the sim backend's memory is real host memory).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "cuda/sim_backend.hpp"
#include "salus/memory.hpp"
#include "salus/sim.hpp"

namespace salus::testing {

inline std::shared_ptr<sim::SimBackend> make_sim(SimConfig config) {
  return std::dynamic_pointer_cast<sim::SimBackend>(make_sim_backend(std::move(config)));
}

// Fills [ptr, ptr + bytes) with a pattern derived from `seed` (every byte depends on its offset).
inline void fill_pattern(DevicePtr ptr, std::size_t bytes, std::uint64_t seed) {
  auto* p = reinterpret_cast<unsigned char*>(ptr);
  std::size_t i = 0;
  const std::uint64_t word = seed * 0x9E3779B97F4A7C15ull | 1;
  for (; i + 8 <= bytes; i += 8) {
    const std::uint64_t v = word ^ i;
    std::memcpy(p + i, &v, 8);
  }
  for (; i < bytes; ++i) p[i] = static_cast<unsigned char>(word >> (i % 8 * 8));
}

// True when every byte still holds the pattern fill_pattern(ptr, bytes, seed) wrote.
inline bool check_pattern(DevicePtr ptr, std::size_t bytes, std::uint64_t seed) {
  const auto* p = reinterpret_cast<const unsigned char*>(ptr);
  std::size_t i = 0;
  const std::uint64_t word = seed * 0x9E3779B97F4A7C15ull | 1;
  for (; i + 8 <= bytes; i += 8) {
    std::uint64_t v;
    std::memcpy(&v, p + i, 8);
    if (v != (word ^ i)) return false;
  }
  for (; i < bytes; ++i) {
    if (p[i] != static_cast<unsigned char>(word >> (i % 8 * 8))) return false;
  }
  return true;
}

class SimMemoryTest : public ::testing::Test {
 protected:
  void build(SimConfig config, MemoryOptions options = {}) {
    memory.reset();
    backend = make_sim(std::move(config));
    memory = std::make_unique<MemoryManager>(backend, std::move(options));
  }
  void SetUp() override { build(SimConfig::uniform(2, 256 * MiB)); }

  DevicePtr alloc(std::size_t bytes, int device = 0, JobId job = kUnattributedJob,
                  Lifetime lifetime = Lifetime::persistent, StreamHandle stream = {}) {
    return memory->allocate({bytes, device, stream, job, lifetime});
  }

  std::shared_ptr<sim::SimBackend> backend;
  std::unique_ptr<MemoryManager> memory;
};

}  // namespace salus::testing
