// Many threads allocating, freeing, promoting and releasing jobs at once (run under ThreadSanitizer
// in CI). Each thread checks its own blocks' bytes; the end state must balance.
#include <gtest/gtest.h>

#include <random>
#include <thread>
#include <vector>

#include "support/memory_fixture.hpp"

namespace salus::testing {
namespace {

using MemoryConcurrent = SimMemoryTest;

TEST_F(MemoryConcurrent, ThreadsOnSharedAndOwnStreamsKeepBytesAndAccounting) {
  build(SimConfig::uniform(2, 256 * MiB), {.device_limits = {64 * MiB, 64 * MiB}});
  constexpr int kThreads = 6;
  constexpr int kOps = 3000;
  std::vector<Stream> streams;
  for (int i = 0; i < 4; ++i) streams.emplace_back(backend, i % 2);

  std::vector<std::thread> threads;
  std::atomic<int> corrupt{0};
  std::atomic<int> refusals{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 1);
      JobId job = memory->register_job("thread" + std::to_string(t));
      struct Held {
        DevicePtr ptr;
        std::size_t bytes;
        std::uint64_t seed;
      };
      std::vector<Held> held;
      for (int op = 0; op < kOps; ++op) {
        const unsigned dice = static_cast<unsigned>(rng() % 100);
        if (dice < 55 || held.empty()) {
          // Threads share streams 0-1 and have streams 2-3 mostly to themselves.
          const Stream& s = streams[rng() % streams.size()];
          const std::size_t bytes = 1 + rng() % (rng() % 8 == 0 ? 6 * MiB : 64 * KiB);
          try {
            const DevicePtr p = memory->allocate(
                {bytes, s.device(), s.handle(), job,
                 rng() % 2 ? Lifetime::ephemeral : Lifetime::persistent});
            const std::uint64_t seed = static_cast<std::uint64_t>(t) << 32 | static_cast<unsigned>(op);
            fill_pattern(p, bytes, seed);
            held.push_back({p, bytes, seed});
          } catch (const OutOfMemory&) {
            refusals.fetch_add(1);
          }
        } else if (dice < 97) {
          const std::size_t i = rng() % held.size();
          if (!check_pattern(held[i].ptr, held[i].bytes, held[i].seed)) corrupt.fetch_add(1);
          memory->deallocate(held[i].ptr);
          held[i] = held.back();
          held.pop_back();
        } else if (dice < 99) {
          memory->promote_ephemeral(job);
        } else {
          // Leave and come back as a new job: everything held goes at once.
          memory->release_job(job);
          held.clear();
          job = memory->register_job("thread" + std::to_string(t));
        }
      }
      for (const Held& h : held) {
        if (!check_pattern(h.ptr, h.bytes, h.seed)) corrupt.fetch_add(1);
        memory->deallocate(h.ptr);
      }
      memory->release_job(job);
    });
  }
  // Stats and trims run beside the workers.
  std::thread observer([&] {
    for (int i = 0; i < 50; ++i) {
      const MemoryStats s = memory->stats();
      for (const auto& d : s.devices) EXPECT_LE(d.reserved, d.limit);
      if (i % 10 == 0) memory->trim();
      std::this_thread::yield();
    }
  });
  for (auto& th : threads) th.join();
  observer.join();

  EXPECT_EQ(corrupt.load(), 0);
  const MemoryStats s = memory->stats();
  for (const auto& d : s.devices) EXPECT_EQ(d.allocated, 0u);
  for (const auto& j : s.jobs) EXPECT_EQ(j.in_use, 0u) << j.name;
  memory->trim();
  EXPECT_EQ(backend->chunk_bytes(Location::gpu(0)), 0u);
  EXPECT_EQ(backend->chunk_bytes(Location::gpu(1)), 0u);
}

}  // namespace
}  // namespace salus::testing
