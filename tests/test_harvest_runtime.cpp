// Harvesting through the runtime: jobs in their own threads share device 0 of a simulated NVLink
// pair, with more persistent memory between them than device 0 may hold. The runtime marks a job
// quiescent while it waits for its turn, activates it when it is admitted and prefetches the next
// job in a lane; the jobs write a byte pattern into their persistent buffers in every iteration
// and check it at the start of the next one, and check that their pointers never change.
//
// The suite names contain "Runtime" and "Concurren": scripts/test.sh runs them under TSan too.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <latch>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "memory/safe_points.hpp"
#include "salus/runtime.hpp"
#include "salus/sim.hpp"
#include "support/harvest_fixture.hpp"
#include "support/memory_fixture.hpp"

namespace salus::testing {
namespace {

using namespace std::chrono_literals;
using harvest::eventually;
using harvest::kPage;

RuntimeOptions harvesting_runtime(std::string policy, std::vector<std::size_t> limits) {
  RuntimeOptions options;
  options.policy = std::move(policy);
  options.memory.device_limits = std::move(limits);
  options.memory.harvest.spill = SpillPolicy::peer_then_host;
  options.memory.harvest.lend_reserve_bytes = 0;
  options.memory.harvest.recall_wait = 500ms;
  return options;
}

void gpu_work(DeviceBackend& backend, StreamHandle stream, std::chrono::microseconds duration) {
  backend.launch_host_func(stream, [duration] { std::this_thread::sleep_for(duration); });
}

struct Buffer {
  DevicePtr ptr = 0;
  std::size_t bytes = 0;
};

// What one job's thread saw; checked by the main thread once every thread is done.
struct Outcome {
  int iterations = 0;
  int corrupted = 0;     // a buffer's bytes were not what the job last wrote
  int moved_blocks = 0;  // find() disagreed with the pointer, size or owner
  int ephemeral_refused = 0;
  std::string error;
  JobMemoryStats memory;
  double max_wait_seconds = 0.0;  // longest wait for a turn
};

// One job's life: persistent buffers made before the first iteration; in each iteration their
// pattern is checked, an ephemeral workspace is used, and a new pattern is written. `made`, when
// given: the jobs' iterations begin only once every job has made its buffers, so that they hold
// them at once whatever the threads' timing (on a busy machine one job ran all its iterations
// before the other had made its buffers, and no page had to move). `before_workspace`, when
// given, runs inside each iteration just before its workspace is allocated.
void run_job(Runtime& runtime, Job& job, const std::vector<std::size_t>& sizes, int iterations,
             std::size_t workspace, std::uint64_t tag, Outcome& out, std::latch* made = nullptr,
             const std::function<void()>& before_workspace = {}) {
  try {
    std::vector<Buffer> buffers;
    try {
      for (std::size_t bytes : sizes) buffers.push_back({job.allocate(bytes), bytes});
    } catch (...) {
      if (made != nullptr) made->count_down();  // the others must not wait for good
      throw;
    }
    if (made != nullptr) made->arrive_and_wait();
    auto seed = [&](int iteration, std::size_t i) {
      return tag * 1'000'000 + static_cast<std::uint64_t>(iteration) * 100 + i + 1;
    };
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      fill_pattern(buffers[i].ptr, buffers[i].bytes, seed(0, i));
    }
    for (int it = 1; it <= iterations; ++it) {
      Job::Iteration iteration(job);
      for (std::size_t i = 0; i < buffers.size(); ++i) {
        const std::optional<BlockInfo> info = runtime.memory().find(buffers[i].ptr);
        if (!info || info->ptr != buffers[i].ptr || info->requested != buffers[i].bytes ||
            info->job != job.id() || info->lifetime != Lifetime::persistent) {
          ++out.moved_blocks;
        }
        if (!check_pattern(buffers[i].ptr, buffers[i].bytes, seed(it - 1, i))) ++out.corrupted;
      }
      if (before_workspace) before_workspace();
      if (workspace > 0) {
        try {
          const DevicePtr scratch = job.allocate(workspace);
          fill_pattern(scratch, workspace, seed(it, 99));
          gpu_work(runtime.backend(), iteration.stream(), 300us);
          if (!check_pattern(scratch, workspace, seed(it, 99))) ++out.corrupted;
          job.deallocate(scratch);
        } catch (const OutOfMemory&) {
          ++out.ephemeral_refused;
        }
      } else {
        gpu_work(runtime.backend(), iteration.stream(), 300us);
      }
      for (std::size_t i = 0; i < buffers.size(); ++i) {
        fill_pattern(buffers[i].ptr, buffers[i].bytes, seed(it, i));
      }
      ++out.iterations;
    }
    const JobStats stats = job.stats();
    out.memory = stats.memory;
    out.max_wait_seconds = stats.max_wait_seconds;
    job.leave();
  } catch (const std::exception& e) {
    out.error = e.what();
  }
}

class HarvestRuntimeConcurrency : public ::testing::TestWithParam<const char*> {};

// 2 x ~9.6 MiB of persistent memory for a 16 MiB device: whoever allocates second spills 2 pages
// to the peer, and device 0 is full. A workspace then needs room that only the other job's pages
// can give, and what Salus guarantees is this: an allocation that comes up short demotes the pages
// of the device's quiescent jobs before it borrows pages for itself (memory/placement.cpp). A job
// is quiescent only while it waits in begin_iteration; before its first ask it is active and its
// pages stay put. So the first workspace is allocated once the other job waits for its turn (fair
// and fifo run one iteration at a time): without that, on a busy machine the spilled job ran all
// its iterations on borrowed pages before the other asked for a turn, and no page moved. How
// many pages trade after the first demote depends on the threads' timing, and is not checked.
// (Both jobs are admitted at once: with harvesting, admission counts what device 0 can reach.)
TEST_P(HarvestRuntimeConcurrency, JobsThatDoNotFitTogetherKeepTheirBytesAndPointers) {
  auto backend = make_sim_backend(SimConfig::nvlink_mesh(2, 64 * MiB));
  Runtime runtime(backend, harvesting_runtime(GetParam(), {16 * MiB, 64 * MiB}));
  std::atomic<std::uint64_t> observed_pages{0};
  std::atomic<std::uint64_t> demoted_pages{0};
  runtime.memory().set_move_observer([&](const MoveRecord& m) {
    observed_pages.fetch_add(m.pages, std::memory_order_relaxed);
    if (m.reason == MoveReason::demote && m.device == 0) {
      demoted_pages.fetch_add(m.pages, std::memory_order_relaxed);
    }
  });
  const std::vector<std::size_t> sizes = {4 * MiB, 4 * MiB, 3 * MiB / 2 + 300, 64 * KiB};
  constexpr int kIterations = 30;
  std::vector<Job> jobs;
  for (const char* name : {"a", "b"}) {
    JobSpec spec;
    spec.name = name;
    spec.expected_iterations = kIterations;
    jobs.push_back(runtime.add_job(spec));
  }
  const JobId ids[] = {jobs[0].id(), jobs[1].id()};
  std::vector<Outcome> outcomes(jobs.size());
  std::vector<std::thread> threads;
  std::latch made(static_cast<std::ptrdiff_t>(jobs.size()));
  // The first workspace of the test (whichever job's turn came first) waits for the other job to
  // be quiescent, waiting for its turn; every later one goes at once.
  std::atomic<bool> first_workspace{true};
  std::atomic<bool> other_was_quiescent{false};
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    const JobId other = ids[1 - j];
    threads.emplace_back([&, j, other] {
      run_job(runtime, jobs[j], sizes, kIterations, 4 * MiB, j + 1, outcomes[j], &made, [&] {
        if (!first_workspace.exchange(false)) return;
        other_was_quiescent = eventually(
            [&] { return runtime.memory().job_stats(other).quiescent != 0; });
      });
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(other_was_quiescent.load())
      << "the other job never waited for its turn while the first workspace waited";

  for (std::size_t j = 0; j < jobs.size(); ++j) {
    SCOPED_TRACE(::testing::Message() << "job " << j);
    const Outcome& o = outcomes[j];
    EXPECT_EQ(o.error, "");
    EXPECT_EQ(o.iterations, kIterations);
    EXPECT_EQ(o.corrupted, 0) << "bytes changed behind the job's back";
    EXPECT_EQ(o.moved_blocks, 0) << "a block changed address, size or owner";
    EXPECT_EQ(o.ephemeral_refused, 0) << "harvesting should make room for every workspace";
    EXPECT_GT(o.memory.activations, 0u);
  }
  const DeviceMemoryStats d0 = runtime.memory().device_stats(0);
  EXPECT_GT(demoted_pages.load(), 0u)
      << "the first workspace found device 0 full and the other job quiescent, yet none of that "
         "job's pages went down";
  EXPECT_GT(d0.pages_moved, 0u) << "the jobs never traded pages";
  EXPECT_EQ(observed_pages.load(), d0.pages_moved + runtime.memory().device_stats(1).pages_moved)
      << "every moved page is reported to the observer";
  std::printf(
      "  [%s] device 0: %llu pages moved (%llu recalled by device 1); activations %llu/%llu, "
      "after a move %llu/%llu, waited %llu/%llu, fetched %llu/%llu MiB, prefetched "
      "%llu/%llu MiB\n",
      GetParam(), static_cast<unsigned long long>(d0.pages_moved),
      static_cast<unsigned long long>(runtime.memory().device_stats(1).recalled_pages),
      static_cast<unsigned long long>(outcomes[0].memory.activations),
      static_cast<unsigned long long>(outcomes[1].memory.activations),
      static_cast<unsigned long long>(outcomes[0].memory.activations_after_move),
      static_cast<unsigned long long>(outcomes[1].memory.activations_after_move),
      static_cast<unsigned long long>(outcomes[0].memory.activations_waited),
      static_cast<unsigned long long>(outcomes[1].memory.activations_waited),
      static_cast<unsigned long long>(outcomes[0].memory.fetched_bytes / MiB),
      static_cast<unsigned long long>(outcomes[1].memory.fetched_bytes / MiB),
      static_cast<unsigned long long>(outcomes[0].memory.prefetched_bytes / MiB),
      static_cast<unsigned long long>(outcomes[1].memory.prefetched_bytes / MiB));
  std::printf("  [%s] longest wait for a turn: %.1f / %.1f ms\n", GetParam(),
              outcomes[0].max_wait_seconds * 1e3, outcomes[1].max_wait_seconds * 1e3);
  runtime.memory().set_move_observer(nullptr);  // it refers to this function's locals
  // Everything went home: nothing lent, borrowed or allocated once both jobs left.
  for (int d = 0; d < 2; ++d) {
    const DeviceMemoryStats s = runtime.memory().device_stats(d);
    EXPECT_EQ(s.allocated, 0u) << "device " << d;
    EXPECT_EQ(s.lent, 0u) << "device " << d;
    EXPECT_EQ(s.borrowed_peer + s.borrowed_host, 0u) << "device " << d;
  }
}

// Room at home for the waiting job: under fair its pages come home in the background while the
// other job runs, so its activation has nothing left to wait for. Under fifo the running job owns
// the device until it leaves, so the waiter is not prefetched (it would only be pushed down again)
// and its pages come home when it is admitted.
TEST_P(HarvestRuntimeConcurrency, TheNextJobIsPrefetchedWhileTheCurrentOneRuns) {
  auto backend = make_sim_backend(SimConfig::nvlink_mesh(2, 64 * MiB));
  Runtime runtime(backend, harvesting_runtime(GetParam(), {24 * MiB, 64 * MiB}));
  constexpr int kIterations = 30;
  JobSpec spec;
  spec.expected_iterations = kIterations;
  spec.name = "a";
  Job a = runtime.add_job(spec);
  spec.name = "b";
  Job b = runtime.add_job(spec);
  const std::vector<std::size_t> sizes = {8 * MiB};
  // `a` takes 8 MiB, an unattributed block most of the rest, so `b` spills 6 MiB to the peer;
  // the unattributed block then goes, leaving room (cached pages) for b's pages to come home.
  const DevicePtr a_weights = a.allocate(8 * MiB);
  const DevicePtr filler = runtime.allocate(14 * MiB, 0, {});
  const DevicePtr b_weights = b.allocate(8 * MiB);
  fill_pattern(a_weights, 8 * MiB, 1);
  fill_pattern(b_weights, 8 * MiB, 2);
  const auto b_home = [&] {
    return runtime.memory().job_stats(b.id()).in_use_by_tier[static_cast<std::size_t>(Tier::local)];
  };
  ASSERT_EQ(b_home(), 2 * MiB) << "b should start with 6 MiB on the peer";
  runtime.deallocate(filler);

  const StreamHandle stream = a.begin_iteration();
  std::atomic<bool> b_ran{false};
  std::thread tb([&] {
    Job::Iteration iteration(b);
    b_ran = true;
    EXPECT_TRUE(check_pattern(b_weights, 8 * MiB, 2));
  });
  const bool prefetches = std::string_view(GetParam()) != "fifo";
  if (prefetches) {
    // b waits for its turn, quiescent; the runtime prefetches it meanwhile.
    EXPECT_TRUE(eventually([&] { return b_home() == 8 * MiB; }))
        << "b's pages did not come home while a ran";
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(b_home(), 2 * MiB) << "fifo: b cannot run before a leaves, so nothing to prefetch";
  }
  EXPECT_FALSE(b_ran.load()) << "b ran inside a's iteration";
  gpu_work(runtime.backend(), stream, 200us);
  EXPECT_TRUE(check_pattern(a_weights, 8 * MiB, 1));
  a.end_iteration();
  a.leave();  // under fifo, b gets the device only once a is gone
  tb.join();
  if (prefetches) {
    // The prefetcher counts its bytes once its round is over, which may be after b got in.
    EXPECT_TRUE(eventually([&] { return b.stats().memory.prefetched_bytes == 6 * MiB; }))
        << b.stats().memory.prefetched_bytes;
    const JobMemoryStats first = b.stats().memory;
    EXPECT_EQ(first.fetched_bytes, 0u);
    EXPECT_EQ(first.activations_waited, 0u) << "b's activation waited for pages";
    EXPECT_GE(first.activations, 1u);
  } else {
    const JobMemoryStats first = b.stats().memory;
    EXPECT_EQ(first.prefetched_bytes, 0u);
    EXPECT_EQ(first.fetched_bytes, 6 * MiB) << "b's pages come home when it is admitted";
    EXPECT_EQ(first.activations_waited, 1u);
  }

  // Then b and a newcomer take turns for a while, each checking its bytes every iteration.
  b.deallocate(b_weights);
  spec.name = "c";
  Job c = runtime.add_job(spec);
  std::vector<Outcome> outcomes(2);
  std::thread t1([&] { run_job(runtime, b, sizes, kIterations, 2 * MiB, 2, outcomes[0]); });
  std::thread t2([&] { run_job(runtime, c, sizes, kIterations, 2 * MiB, 3, outcomes[1]); });
  t1.join();
  t2.join();
  for (std::size_t j = 0; j < 2; ++j) {
    SCOPED_TRACE(::testing::Message() << "job " << j);
    EXPECT_EQ(outcomes[j].error, "");
    EXPECT_EQ(outcomes[j].iterations, kIterations);
    EXPECT_EQ(outcomes[j].corrupted, 0);
    EXPECT_EQ(outcomes[j].moved_blocks, 0);
    EXPECT_EQ(outcomes[j].ephemeral_refused, 0);
    EXPECT_GT(outcomes[j].memory.activations, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(HarvestRuntime, HarvestRuntimeConcurrency,
                         ::testing::Values("fair", "fifo"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// The memory manager straight from several threads: jobs on devices 0 and 1 of a four-GPU mesh
// (two per device, sharing the device's default stream, so their small blocks share pages) go
// quiescent and active over and over, writing and checking their buffers only while active, while
// a chaos thread demotes, prefetches and trims at random. Nothing may change a byte or a pointer.
TEST(HarvestConcurrency, JobsGoingQuiescentAndActiveUnderDemotesAndPrefetchesKeepTheirBytes) {
  auto backend = make_sim_backend(SimConfig::nvlink_mesh(4, 64 * MiB));
  MemoryOptions options;
  options.device_limits = {12 * MiB, 12 * MiB, 8 * MiB, 8 * MiB};
  options.harvest.spill = SpillPolicy::peer_then_host;
  options.harvest.host_limit_bytes = 48 * MiB;
  options.harvest.recall_wait = 50ms;
  MemoryManager memory(backend, options);
  constexpr int kJobs = 4;
  const int rounds = 150;
  std::vector<JobId> ids;
  for (int j = 0; j < kJobs; ++j) ids.push_back(memory.register_job("job" + std::to_string(j)));
  std::atomic<int> running{kJobs};
  std::vector<Outcome> outcomes(kJobs);

  auto worker = [&](int j) {
    Outcome& out = outcomes[static_cast<std::size_t>(j)];
    const JobId id = ids[static_cast<std::size_t>(j)];
    const int device = j / 2;
    std::mt19937 rng(static_cast<unsigned>(1000 + j));
    try {
      std::vector<Buffer> buffers;
      for (std::size_t bytes : {3 * MiB, 300 * KiB, std::size_t{4096} + 7, 1 * MiB + 3}) {
        buffers.push_back({memory.allocate({bytes, device, {}, id}), bytes});
      }
      std::uint64_t seed = static_cast<std::uint64_t>(j) << 32;
      for (const Buffer& b : buffers) fill_pattern(b.ptr, b.bytes, seed + b.bytes);
      for (int round = 0; round < rounds; ++round) {
        memory::set_job_quiescent(memory, id);
        if (rng() % 3 == 0) memory::prefetch(memory, id);
        if (rng() % 2 == 0) std::this_thread::yield();
        (void)memory::activate_job(memory, id);
        for (const Buffer& b : buffers) {
          const std::optional<BlockInfo> info = memory.find(b.ptr);
          if (!info || info->ptr != b.ptr || info->job != id) ++out.moved_blocks;
          if (!check_pattern(b.ptr, b.bytes, seed + b.bytes)) ++out.corrupted;
        }
        try {
          const std::size_t bytes = (1 + rng() % 4) * MiB - rng() % 1000;
          const DevicePtr scratch = memory.allocate({bytes, device, {}, id, Lifetime::ephemeral});
          fill_pattern(scratch, bytes, seed + 7);
          if (!check_pattern(scratch, bytes, seed + 7)) ++out.corrupted;
          memory.deallocate(scratch);
        } catch (const OutOfMemory&) {
          ++out.ephemeral_refused;
        }
        ++seed;
        for (const Buffer& b : buffers) fill_pattern(b.ptr, b.bytes, seed + b.bytes);
        ++out.iterations;
      }
      for (const Buffer& b : buffers) memory.deallocate(b.ptr);
    } catch (const std::exception& e) {
      out.error = e.what();
    }
    running.fetch_sub(1);
  };

  std::size_t demoted = 0, chaos_ops = 0;
  std::string chaos_error;
  std::thread chaos([&] {
    std::mt19937 rng(7);
    try {
      while (running.load() > 0) {
        const JobId id = ids[rng() % ids.size()];
        switch (rng() % 8) {
          case 0:
            memory.trim();
            break;
          case 1:
            memory::prefetch(memory, id);
            break;
          default:
            demoted += memory::demote(memory, id, static_cast<int>(rng() % 2));
            break;
        }
        ++chaos_ops;
        std::this_thread::yield();
      }
    } catch (const std::exception& e) {
      chaos_error = e.what();
    }
  });
  std::vector<std::thread> threads;
  for (int j = 0; j < kJobs; ++j) threads.emplace_back(worker, j);
  for (std::thread& t : threads) t.join();
  chaos.join();

  EXPECT_EQ(chaos_error, "");
  for (int j = 0; j < kJobs; ++j) {
    SCOPED_TRACE(::testing::Message() << "job " << j);
    const Outcome& o = outcomes[static_cast<std::size_t>(j)];
    EXPECT_EQ(o.error, "");
    EXPECT_EQ(o.iterations, rounds);
    EXPECT_EQ(o.corrupted, 0) << "bytes changed behind the job's back";
    EXPECT_EQ(o.moved_blocks, 0);
    const JobMemoryStats s = memory.job_stats(ids[static_cast<std::size_t>(j)]);
    EXPECT_EQ(s.activations, static_cast<std::uint64_t>(rounds));
    EXPECT_EQ(s.in_use, 0u);
  }
  std::printf("  %zu chaos operations, %zu MiB demoted; pages moved on devices 0/1: %llu/%llu\n",
              chaos_ops, demoted / MiB,
              static_cast<unsigned long long>(memory.device_stats(0).pages_moved),
              static_cast<unsigned long long>(memory.device_stats(1).pages_moved));
  EXPECT_GT(demoted, 0u) << "the chaos thread never caught a job quiescent";
  for (JobId id : ids) memory.release_job(id);
  memory.trim();
  for (int d = 0; d < 4; ++d) {
    const DeviceMemoryStats s = memory.device_stats(d);
    EXPECT_EQ(s.mapped, 0u) << "device " << d;
    EXPECT_EQ(s.lent, 0u) << "device " << d;
    EXPECT_EQ(s.reserved, 0u) << "device " << d;
  }
  EXPECT_EQ(memory.stats().host_spill_bytes, 0u);
}

}  // namespace
}  // namespace salus::testing
