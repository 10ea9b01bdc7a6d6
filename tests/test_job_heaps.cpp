// Each job lists the stream heaps it has had blocks in (memory::JobRecord::heaps), and a cancel
// or leave frees what it finds through that list. The race that matters: an allocation that
// makes the job's first block in a heap (so lists the heap) while another thread cancels the job.
// Either the cancel walks that heap after the block is linked, or the allocation sees the job
// gone and drops its block; a block linked after the walk would stay charged to nobody for ever.
// The suite name matches ThreadSanitizer's selection in scripts/test.sh ("Concurren").
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "salus/error.hpp"
#include "salus/runtime.hpp"
#include "salus/sim.hpp"

namespace salus::testing {
namespace {

constexpr std::size_t kBlock = 256 * 1024;
constexpr int kStreams = 12;

// One round: a job allocates on fresh streams (each a heap it has never used) from two threads
// while a third cancels it at a random moment. Afterwards nothing of it may be left anywhere.
void round(std::uint32_t seed, bool leave) {
  auto backend = make_sim_backend(SimConfig::uniform(1, 64 * MiB));
  Runtime runtime(backend);
  std::vector<StreamHandle> streams;
  for (int i = 0; i < kStreams; ++i) streams.push_back(backend->create_stream(0, 0));
  JobSpec spec;
  spec.name = "raced";
  Job job = runtime.add_job(spec);
  const JobId id = job.id();
  std::atomic<bool> go{false};
  std::atomic<int> succeeded{0};
  auto allocator = [&](int first) {
    while (!go.load()) std::this_thread::yield();
    for (int i = first; i < kStreams; i += 2) {
      try {
        (void)runtime.allocate(kBlock, 0, streams[static_cast<std::size_t>(i)], id);
        succeeded.fetch_add(1);
      } catch (const JobCancelled&) {  // the typed refusals of a job that is gone
      } catch (const UnknownJob&) {
      } catch (const InvalidArgument&) {  // "job ... has left"
      }
    }
  };
  std::thread a(allocator, 0);
  std::thread b(allocator, 1);
  std::mt19937 rng(seed);
  const int spins = std::uniform_int_distribution<int>(0, 2000)(rng);
  go.store(true);
  for (int i = 0; i < spins; ++i) std::this_thread::yield();
  if (leave) {
    job.leave();
  } else {
    job.cancel();
  }
  a.join();
  b.join();
  const DeviceMemoryStats stats = runtime.memory().stats().devices[0];
  EXPECT_EQ(stats.allocated, 0u) << "seed " << seed << ": a block of the gone job was left ("
                                 << succeeded.load() << " allocations had succeeded)";
  for (StreamHandle s : streams) {
    backend->synchronize_stream(s);
    runtime.retire_stream(0, s);
    backend->destroy_stream(s);
  }
}

TEST(ConcurrentJobHeaps, ACancelRacingFirstAllocationsInNewHeapsLeavesNothing) {
  for (std::uint32_t seed = 1; seed <= 40; ++seed) round(seed, false);
}

TEST(ConcurrentJobHeaps, ALeaveRacingFirstAllocationsInNewHeapsLeavesNothing) {
  for (std::uint32_t seed = 101; seed <= 140; ++seed) round(seed, true);
}

}  // namespace
}  // namespace salus::testing
