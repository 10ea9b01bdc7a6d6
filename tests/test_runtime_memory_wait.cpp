// Memory that is free must be usable, and no job may starve (DESIGN.md, invariants 6 and 7): jobs
// whose estimates are missing or wrong wait for concurrent iterations instead of failing, a job
// that can never fit is refused at once, and jobs with equal keys take turns.
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "salus/runtime.hpp"
#include "salus/sim.hpp"

namespace salus::testing {
namespace {

std::shared_ptr<DeviceBackend> sim(std::size_t bytes) {
  return make_sim_backend(SimConfig::uniform(1, bytes));
}

JobSpec hinted(std::string name, std::size_t persistent, std::size_t peak) {
  JobSpec spec{.name = std::move(name)};
  spec.hints = {.persistent_bytes = persistent, .ephemeral_peak_bytes = peak};
  return spec;
}

// Runs `iterations` iterations that each take `bytes` of ephemeral memory in two halves, with a
// short pause between (so that iterations of other lanes overlap); counts OutOfMemory.
void run_job(Job& job, int iterations, std::size_t bytes, std::atomic<int>& oom) {
  for (int i = 0; i < iterations; ++i) {
    auto it = job.iteration();
    try {
      const DevicePtr a = job.allocate(bytes / 2);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      const DevicePtr b = job.allocate(bytes / 2);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      job.deallocate(b);
      job.deallocate(a);
    } catch (const OutOfMemory&) {
      ++oom;
    }
  }
}

// Hints that understate the jobs' needs put them in lanes of their own; their iterations then
// meet on the device and one waits for the other's memory instead of failing.
TEST(RuntimeMemoryWait, AnIterationShortOfMemoryBecauseOfAnotherLaneWaits) {
  for (const char* policy : {"pack", "memory_aware"}) {
    SCOPED_TRACE(policy);
    Runtime runtime(sim(64 * MiB), {.policy = policy});
    Job a = runtime.add_job(hinted("a", 1 * MiB, 4 * MiB));
    Job b = runtime.add_job(hinted("b", 1 * MiB, 4 * MiB));
    std::atomic<int> oom{0};
    std::thread ta([&] { run_job(a, 10, 40 * MiB, oom); });
    std::thread tb([&] { run_job(b, 10, 40 * MiB, oom); });
    ta.join();
    tb.join();
    EXPECT_EQ(oom, 0);
    EXPECT_EQ(a.stats().iterations, 10u);
    EXPECT_EQ(b.stats().iterations, 10u);
  }
}

// A job that leaves while its blocks live on (Python's default mode) leaves bytes no job owns:
// jobs admitted after it are planned beside them, not in the memory they still take.
TEST(RuntimeMemoryWait, BlocksThatOutliveTheirJobCountAsTaken) {
  Runtime runtime(sim(64 * MiB), {.policy = "pack"});
  JobSpec spec{.name = "gone", .blocks_outlive_job = true};
  Job gone = runtime.add_job(spec);
  const DevicePtr weights = gone.allocate(36 * MiB);  // outside an iteration: persistent
  gone.leave();
  // Two lanes of 15 fit 64 MiB but not the 28 MiB the weights leave: one lane, taking turns.
  auto run_pair = [](Job& x, Job& y) {
    std::atomic<int> oom{0};
    std::thread tx([&] { run_job(x, 5, 12 * MiB, oom); });
    std::thread ty([&] { run_job(y, 5, 12 * MiB, oom); });
    tx.join();
    ty.join();
    EXPECT_EQ(oom, 0);
  };
  Job b = runtime.add_job(hinted("b", 1 * MiB, 14 * MiB));
  Job c = runtime.add_job(hinted("c", 1 * MiB, 14 * MiB));
  run_pair(b, c);
  EXPECT_EQ(b.stats().lane, c.stats().lane);
  // Once the holder frees them, jobs that come next get lanes of their own again.
  runtime.deallocate(weights);
  b.leave();
  c.leave();
  Job d = runtime.add_job(hinted("d", 1 * MiB, 14 * MiB));
  Job e = runtime.add_job(hinted("e", 1 * MiB, 14 * MiB));
  run_pair(d, e);
  EXPECT_NE(d.stats().lane, e.stats().lane);
}

// Two iterations that each hold half the device and ask for more wait on each other: one of them
// (the second to ask) fails instead of both waiting for good; the other completes.
TEST(RuntimeMemoryWait, TwoIterationsWaitingOnEachOtherFailOneNotBoth) {
  Runtime runtime(sim(64 * MiB), {.policy = "pack"});
  Job a = runtime.add_job(hinted("a", 1 * MiB, 2 * MiB));
  Job b = runtime.add_job(hinted("b", 1 * MiB, 2 * MiB));
  std::barrier both_hold(2);
  std::atomic<int> failed{0};
  auto body = [&](Job& job) {
    auto it = job.iteration();
    const DevicePtr half = job.allocate(30 * MiB);
    both_hold.arrive_and_wait();
    try {
      job.deallocate(job.allocate(30 * MiB));
    } catch (const OutOfMemory&) {
      ++failed;
    }
    job.deallocate(half);
  };
  std::thread ta([&] { body(a); });
  std::thread tb([&] { body(b); });
  ta.join();
  tb.join();
  EXPECT_EQ(failed, 1);
}

// Three iterations side by side hold 25, 20 and 10 MiB of a 64 MiB device and each asks for 10
// MiB more, the one holding the most first: all wait on each other. The one holding the most gives
// way (fails), whatever the order of the asks, and the others complete with what it frees. Before,
// the last to ask failed (here the smallest); the first, which cannot fit beside the others, went
// on.
TEST(RuntimeMemoryWait, WhenEveryIterationIsShortTheOneHoldingTheMostGivesWay) {
  Runtime runtime(sim(64 * MiB), {.policy = "pack"});
  struct Side {
    Side(Job j, std::size_t h) : job(std::move(j)), holds(h) {}
    Job job;
    std::size_t holds;
    std::atomic<bool> failed{false};
  };
  std::vector<std::unique_ptr<Side>> sides;
  sides.push_back(std::make_unique<Side>(runtime.add_job(hinted("c", 1 * MiB, 2 * MiB)), 25 * MiB));
  sides.push_back(std::make_unique<Side>(runtime.add_job(hinted("b", 1 * MiB, 2 * MiB)), 20 * MiB));
  sides.push_back(std::make_unique<Side>(runtime.add_job(hinted("a", 1 * MiB, 2 * MiB)), 10 * MiB));
  std::barrier all_hold(4);
  std::atomic<int> may_ask{0};
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < sides.size(); ++i) {
    threads.emplace_back([&, i] {
      Side& s = *sides[i];
      auto it = s.job.iteration();
      const DevicePtr held = s.job.allocate(s.holds);
      all_hold.arrive_and_wait();
      while (may_ask.load() <= static_cast<int>(i)) std::this_thread::yield();
      try {
        s.job.deallocate(s.job.allocate(10 * MiB));
      } catch (const OutOfMemory&) {
        s.failed = true;
      }
      s.job.deallocate(held);
    });
  }
  all_hold.arrive_and_wait();
  // c asks first, and is refused before the others ask.
  may_ask = 1;
  while (runtime.memory().device_stats(0).out_of_memory == 0) std::this_thread::yield();
  may_ask = 3;
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(sides[0]->failed) << "c, holding the most, did not give way";
  EXPECT_FALSE(sides[1]->failed);
  EXPECT_FALSE(sides[2]->failed);
}

// A job that runs alone on the device and cannot get memory fails at once: there is nothing
// to wait for.
TEST(RuntimeMemoryWait, AnIterationAloneOnTheDeviceFailsAtOnce) {
  Runtime runtime(sim(64 * MiB), {.policy = "pack"});
  Job a = runtime.add_job(hinted("a", 1 * MiB, 2 * MiB));
  auto it = a.iteration();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW((void)a.allocate(80 * MiB), OutOfMemory);  // larger than the device
  const DevicePtr most = a.allocate(60 * MiB);
  EXPECT_THROW((void)a.allocate(8 * MiB), OutOfMemory);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  a.deallocate(most);
}

// One thread drives two jobs whose iterations overlap (two lanes): an allocation of one that does
// not fit fails at once instead of waiting for the other's iteration, which only this very thread
// could end (found by fuzz_c_api: the wait never ended).
TEST(RuntimeMemoryWait, AnIterationThisThreadRunsIsNotWaitedFor) {
  Runtime runtime(sim(64 * MiB), {.policy = "pack"});
  Job a = runtime.add_job(hinted("a", 1 * MiB, 2 * MiB));
  Job b = runtime.add_job(hinted("b", 1 * MiB, 2 * MiB));
  auto ia = a.iteration();
  auto ib = b.iteration();
  ASSERT_NE(a.stats().lane, b.stats().lane) << "the two iterations must overlap";
  const DevicePtr held = a.allocate(40 * MiB);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW((void)b.allocate(40 * MiB), OutOfMemory);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  // Another thread's allocation does wait for it, and gets the memory once it is freed.
  std::atomic<bool> got{false};
  std::thread other([&] {
    const DevicePtr p = b.allocate(40 * MiB);
    got = true;
    b.deallocate(p);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(got) << "the allocation did not wait for a's memory";
  a.deallocate(held);
  other.join();
  EXPECT_TRUE(got);
}

// RuntimeOptions::allocation_wait_limit bounds the wait for another thread's iteration: the
// allocation fails with OutOfMemory once the limit has passed (here, while the iteration that
// holds the memory goes on), and with no limit it waits until that iteration frees the memory.
TEST(RuntimeMemoryWait, TheAllocationWaitLimitBoundsTheWaitForAnotherThreadsIteration) {
  for (const auto limit : {std::chrono::milliseconds(150), std::chrono::milliseconds(0)}) {
    SCOPED_TRACE(limit.count());
    Runtime runtime(sim(64 * MiB), {.policy = "pack", .allocation_wait_limit = limit});
    Job a = runtime.add_job(hinted("a", 1 * MiB, 2 * MiB));
    Job b = runtime.add_job(hinted("b", 1 * MiB, 2 * MiB));
    std::barrier holding(2);
    std::atomic<bool> release{false};
    std::thread holder([&] {
      auto it = a.iteration();
      const DevicePtr held = a.allocate(48 * MiB);
      holding.arrive_and_wait();
      while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      a.deallocate(held);
    });
    holding.arrive_and_wait();
    const auto start = std::chrono::steady_clock::now();
    if (limit.count() > 0) {
      std::chrono::milliseconds said{0};
      try {
        (void)b.allocate(32 * MiB);
        ADD_FAILURE() << "32 MiB fit beside a's 48 MiB on 64 MiB";
      } catch (const OutOfMemory& e) {
        said = e.info().waited;  // the error says it waited, and how long
        EXPECT_NE(std::string(e.what()).find("waited"), std::string::npos) << e.what();
      }
      const auto waited = std::chrono::steady_clock::now() - start;
      EXPECT_GE(waited, limit) << "it failed before the limit";
      EXPECT_LT(waited, std::chrono::seconds(5)) << "it did not stop at the limit";
      EXPECT_GE(said, limit);
      EXPECT_LE(said, waited);
      release = true;
    } else {
      std::thread releaser([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        release = true;
      });
      const DevicePtr p = b.allocate(32 * MiB);  // waits for a's iteration to free its memory
      EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300));
      b.deallocate(p);
      releaser.join();
    }
    holder.join();
  }
}

// Hints beyond what the device can ever give are refused with a typed error that says why, under
// every policy, instead of a begin_iteration that never returns.
TEST(RuntimeMemoryWait, HintsBeyondTheDeviceAreRefusedAtOnce) {
  for (const char* policy : {"fifo", "srtf", "fair", "pack", "priority", "memory_aware"}) {
    SCOPED_TRACE(policy);
    Runtime runtime(sim(64 * MiB), {.policy = policy});
    try {
      (void)runtime.add_job(hinted("huge", 80 * MiB, 0));
      ADD_FAILURE() << "admitted a job that can never fit";
    } catch (const OutOfMemory& e) {
      EXPECT_EQ(e.info().job_name, "huge");
      EXPECT_EQ(e.info().requested_bytes, 80 * MiB);
      EXPECT_EQ(e.info().device_limit_bytes, 64 * MiB);
      EXPECT_NE(e.info().reason.find("could never be admitted"), std::string::npos);
    }
    EXPECT_THROW((void)runtime.add_job(hinted("huge", 40 * MiB, 40 * MiB)), OutOfMemory);
    EXPECT_THROW((void)runtime.add_job(hinted("huge", kUnlimited, kUnlimited)), OutOfMemory);
    // Nothing was registered: the device is as before, and a job that fits runs.
    Job ok = runtime.add_job(hinted("ok", 32 * MiB, 32 * MiB));
    { auto it = ok.iteration(); }
    EXPECT_EQ(runtime.job_stats().size(), 1u);
  }
}

// Three equal jobs that compute on their own threads (host_compute): whatever the policy, each
// gets a turn within a bounded number of turns while all three are present (fair sees the host
// time as GPU time; pack and memory_aware take turns in their lane).
TEST(RuntimeMemoryWait, ThreeJobsTakeTurnsUntilTheEnd) {
  for (const char* policy : {"fair", "pack", "srtf", "priority", "memory_aware"}) {
    SCOPED_TRACE(policy);
    Runtime runtime(sim(64 * MiB), {.policy = policy, .host_compute = true});
    std::mutex mu;
    std::vector<int> order;
    std::vector<Job> jobs;
    // One lane under pack: 3 x 10 MiB persistent + a 30 MiB peak; two lanes would need 80.
    for (int j = 0; j < 3; ++j) {
      jobs.push_back(runtime.add_job(hinted("j" + std::to_string(j), 10 * MiB, 30 * MiB)));
    }
    constexpr int kTurns = 8;
    std::vector<std::thread> threads;
    for (int j = 0; j < 3; ++j) {
      threads.emplace_back([&, j] {
        for (int i = 0; i < kTurns; ++i) {
          auto it = jobs[static_cast<std::size_t>(j)].iteration();
          {
            std::lock_guard lock(mu);
            order.push_back(j);
          }
          // Long enough that a job whose turn ended asks again before the next two turns end,
          // even on a loaded machine or under a sanitizer.
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      });
    }
    for (auto& t : threads) t.join();
    ASSERT_EQ(order.size(), 3u * kTurns);
    // Up to the first job's last turn all three are present: no job waits more than 4 turns.
    std::size_t present_until = order.size();
    int done[3] = {};
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (++done[order[i]] == kTurns) {
        present_until = i;
        break;
      }
    }
    std::ptrdiff_t last[3] = {-1, -1, -1};
    for (std::size_t i = 0; i <= present_until; ++i) {
      const int j = order[i];
      EXPECT_LE(static_cast<std::ptrdiff_t>(i) - last[j], 5) << "job " << j << " at turn " << i;
      last[j] = static_cast<std::ptrdiff_t>(i);
    }
    for (int j = 0; j < 3; ++j) {
      EXPECT_LE(static_cast<std::ptrdiff_t>(present_until) - last[j], 5) << "job " << j;
    }
  }
}

}  // namespace
}  // namespace salus::testing
