// Randomized stress of stream-ordered memory under pressure, through the runtime: jobs in threads
// on four simulated GPUs loop iterations, queue slow "kernels" (tests/support/stream_work.hpp)
// that stamp and check every page of their blocks, free blocks on the host while that work is
// queued, free and reallocate persistent blocks between iterations, leave and rejoin, and get
// cancelled from another thread at random. Memory is tight, so pages are reclaimed across streams,
// spilled to peers or the host, demoted, recalled and fetched all the time. Out-of-memory is
// allowed (counted); a queued kernel that finds foreign or stale bytes, a crash, or memory left
// over at the end is not.
//
// Short by default (it runs under ASan and TSan in CI on two cores). Environment:
//   SALUS_STRESS_SECONDS  wall-clock seconds per instance (default 0.6)
//   SALUS_STRESS_ITERATIONS  iterations per instance, all jobs together (default 5000); the run
//                            ends at whichever bound comes first
//   SALUS_STRESS_SEED     base seed (default: from the clock; printed either way)
//   SALUS_STRESS_LIMIT_MIB  memory Salus may hold per device (default 12: tight; 200 is generous)
//   SALUS_STRESS_PERSISTENT_FREES  0 turns off freeing persistent blocks between iterations (to
//                                  tell that hazard from the pressure-driven ones)
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "salus/runtime.hpp"
#include "salus/sim.hpp"
#include "support/stream_work.hpp"

namespace salus::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kDevices = 4;
constexpr int kJobThreads = 10;

double env_double(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtod(v, nullptr) : fallback;
}

std::uint64_t env_seed() {
  if (const char* v = std::getenv("SALUS_STRESS_SEED"); v != nullptr && *v != '\0') {
    return std::strtoull(v, nullptr, 0);
  }
  return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

struct Tally {
  std::atomic<std::uint64_t> iterations{0};
  std::atomic<std::uint64_t> queued_frees{0};  // frees while some of the job's kernels were queued
  std::atomic<std::uint64_t> persistent_frees{0};
  std::atomic<std::uint64_t> cancels{0};
  std::atomic<std::uint64_t> leaves{0};
  std::atomic<std::uint64_t> ooms{0};
  std::atomic<std::uint64_t> cancel_races{0};  // odd errors of a job already cancelled
};

// One job thread's current job. The chaos thread cancels it under `mu`; the job thread checks
// `cancelled` under `mu` before it enqueues work, so no work is queued on memory a cancel freed.
struct Slot {
  std::mutex mu;
  std::optional<Job> job;
  bool cancelled = false;
};

struct Held {
  DevicePtr ptr = 0;
  std::size_t bytes = 0;
  std::optional<std::uint64_t> key;  // the last stamp queued on it (persistent blocks)
};

using Param = std::tuple<SpillPolicy, std::string>;

class StreamSafetyStress : public ::testing::TestWithParam<Param> {};

TEST_P(StreamSafetyStress, QueuedWorkNeverSeesItsMemoryReusedOrMoved) {
  const auto [spill, policy] = GetParam();
  const std::uint64_t base_seed = env_seed();
  // Each instance its own seed, so one failing instance reproduces alone.
  const std::uint64_t seed = base_seed ^
                             (static_cast<std::uint64_t>(spill) * 0x9E3779B97F4A7C15ull) ^
                             std::hash<std::string>{}(policy);
  SCOPED_TRACE(::testing::Message()
               << "SALUS_STRESS_SEED=" << base_seed << " (instance seed " << seed << ")");
  // Printed up front: a SIGSEGV prints no summary.
  std::printf("  [%s, %s] SALUS_STRESS_SEED=%llu\n", to_string(spill), policy.c_str(),
              static_cast<unsigned long long>(base_seed));
  std::fflush(stdout);
  const double seconds = env_double("SALUS_STRESS_SECONDS", 0.6);
  const auto max_iterations =
      static_cast<std::uint64_t>(env_double("SALUS_STRESS_ITERATIONS", 5000));
  const auto limit = static_cast<std::size_t>(env_double("SALUS_STRESS_LIMIT_MIB", 12)) * MiB;
  const bool persistent_frees = env_double("SALUS_STRESS_PERSISTENT_FREES", 1) != 0;

  SimConfig config = SimConfig::nvlink_mesh(kDevices, 256 * MiB, 2.0);
  // Moves take about a millisecond a page: long enough to overlap a kernel that did not wait.
  config.throttle_copies = true;
  config.host_link_bandwidth_gbps = 2.0;
  auto backend = make_sim_backend(std::move(config));
  RuntimeOptions options;
  options.policy = policy;
  options.memory.device_limits.assign(kDevices, std::min(limit, 256 * MiB));
  options.memory.harvest.spill = spill;
  options.memory.harvest.host_limit_bytes = 64 * MiB;
  options.memory.harvest.recall_wait = 20ms;
  Runtime runtime(backend, options);

  Tally tally;
  // Each job thread's kernels (their tallies outlive the runtime's streams).
  std::vector<StreamWork> works(kJobThreads);
  std::atomic<std::uint64_t> next_key{1};
  std::atomic<bool> stop{false};
  std::vector<Slot> slots(kJobThreads);
  std::mutex streams_mu;
  std::set<std::uint64_t> lane_streams;  // every lane stream a job was handed
  std::mutex errors_mu;
  std::vector<std::string> errors;
  std::string first_race;                 // the first odd error of a cancelled job, for the summary
  std::atomic<int> running{kJobThreads};  // job threads not yet done

  auto job_thread = [&](int index) {
    std::mt19937_64 rng(seed + static_cast<std::uint64_t>(index) * 7919);
    auto pick = [&](std::uint64_t n) { return rng() % n; };
    auto block_size = [&] {
      // Half sub-page (they share pages across jobs on a lane), half multi-page.
      return pick(2) == 0 ? 512 + pick(1 * MiB) : 1 * MiB + pick(4 * MiB);
    };
    Slot& slot = slots[static_cast<std::size_t>(index)];
    StreamWork& work = works[static_cast<std::size_t>(index)];
    const int device = index % kDevices;
    for (int incarnation = 0; !stop.load(); ++incarnation) {
      JobSpec spec;
      spec.name = "j" + std::to_string(index) + "." + std::to_string(incarnation);
      spec.device = device;
      spec.hints = {
          .persistent_bytes = 2 * MiB, .ephemeral_peak_bytes = 4 * MiB, .iteration_seconds = 0.002};
      {
        std::lock_guard lock(slot.mu);
        slot.job.emplace(runtime.add_job(spec));
        slot.cancelled = false;
      }
      Job& job = *slot.job;  // only this thread replaces it
      // Runs `enqueue` unless the job was cancelled (then its memory is gone).
      auto enqueue = [&](auto&& fn) {
        std::lock_guard lock(slot.mu);
        if (slot.cancelled) throw JobCancelled(spec.name);
        fn();
      };
      // Frees go through the same gate: the runtime checks a block's owner and then frees it, so
      // a cancel landing in between could let this thread free a block that the cancel freed and
      // another job got since (a runtime race of its own, not what this test is after).
      auto free_block = [&](DevicePtr ptr) { enqueue([&] { job.deallocate(ptr); }); };
      auto queued = [&] { return !work.all_finished(); };
      std::vector<Held> persistent;
      auto add_persistent = [&] {
        try {
          const std::size_t bytes = block_size();
          persistent.push_back({job.allocate(bytes), bytes, std::nullopt});
        } catch (const OutOfMemory&) {
          tally.ooms.fetch_add(1);
        }
      };
      // A lane may change between iterations: the job orders its next iteration after its last,
      // as a framework would with an event.
      std::optional<Event> last_end;
      StreamHandle last_stream{};
      try {
        for (int i = 1 + static_cast<int>(pick(2)); i > 0; --i) add_persistent();
        const int life = 2 + static_cast<int>(pick(8));
        for (int it_no = 0; it_no < life && !stop.load(); ++it_no) {
          StreamHandle s{};
          {
            auto it = job.iteration();
            s = it.stream();
            {
              std::lock_guard lock(streams_mu);
              lane_streams.insert(s.value);
            }
            if (last_end && last_stream != s)
              backend->stream_wait_event(s, last_end->handle(), device);
            std::vector<Held> ephemeral;
            for (int phase = 1 + static_cast<int>(pick(3)); phase > 0; --phase) {
              for (int n = 1 + static_cast<int>(pick(3)); n > 0; --n) {
                try {
                  const std::size_t bytes = block_size();
                  ephemeral.push_back({job.allocate(bytes), bytes, std::nullopt});
                } catch (const OutOfMemory&) {
                  tally.ooms.fetch_add(1);
                  break;
                }
              }
              const auto delay = std::chrono::microseconds(pick(2000));
              enqueue([&] {
                std::vector<Region> regions;
                for (const Held& h : ephemeral) regions.push_back({h.ptr, h.bytes});
                if (!regions.empty()) {
                  work.touch(*backend, s, std::move(regions),
                             stamp_once(next_key.fetch_add(1), delay));
                }
                // Persistent blocks: what the last iteration stamped must still be there.
                for (Held& h : persistent) {
                  const std::uint64_t key = next_key.fetch_add(1);
                  TouchOptions o = stamp_once(key, delay / 4);
                  o.expect_before = h.key;
                  work.touch(*backend, s, {{h.ptr, h.bytes}}, o);
                  h.key = key;
                }
              });
              // Free about half of the phase's blocks now, while the work on them is queued.
              std::vector<Held> kept;
              for (const Held& h : ephemeral) {
                if (pick(2) == 0) {
                  if (queued()) tally.queued_frees.fetch_add(1);
                  free_block(h.ptr);
                } else {
                  kept.push_back(h);
                }
              }
              ephemeral = std::move(kept);
            }
            for (const Held& h : ephemeral) {
              if (queued()) tally.queued_frees.fetch_add(1);
              free_block(h.ptr);
            }
            enqueue([&] {
              if (!last_end) last_end.emplace(backend, device);
              last_end->record(s);
            });
            last_stream = s;
          }  // the iteration ends; its work may still be queued
          if (tally.iterations.fetch_add(1) + 1 >= max_iterations) stop.store(true);
          // Between iterations, sometimes replace a persistent block while the last iteration's
          // work on it is still queued on the lane.
          if (!persistent.empty() && pick(4) == 0 && persistent_frees) {
            const std::size_t victim = pick(persistent.size());
            if (queued()) tally.queued_frees.fetch_add(1);
            tally.persistent_frees.fetch_add(1);
            free_block(persistent[victim].ptr);
            persistent.erase(persistent.begin() + static_cast<std::ptrdiff_t>(victim));
            add_persistent();
          }
        }
        job.leave();  // with work often still queued
        tally.leaves.fetch_add(1);
      } catch (const JobCancelled&) {
        // Its memory went with the cancel; rejoin as a new job.
      } catch (const std::exception& e) {
        bool cancelled = false;
        {
          std::lock_guard lock(slot.mu);
          cancelled = slot.cancelled;
        }
        // An allocation racing with the cancel that freed its new block reports InvalidArgument
        // instead of JobCancelled (another runtime race, not what this test is after): counted.
        if (cancelled) {
          if (tally.cancel_races.fetch_add(1) == 0) {
            std::lock_guard lock(errors_mu);
            first_race = spec.name + ": " + e.what();
          }
        } else {
          std::lock_guard lock(errors_mu);
          errors.push_back(spec.name + ": " + e.what());
        }
      }
      std::lock_guard lock(slot.mu);
      slot.job.reset();  // leaves, if it has not yet
    }
    running.fetch_sub(1);
  };

  auto cancel_one = [&](Slot& slot) {
    std::lock_guard lock(slot.mu);
    if (!slot.job || slot.cancelled) return false;
    slot.cancelled = true;
    try {
      slot.job->cancel();
    } catch (const std::exception& e) {
      std::lock_guard errors_lock(errors_mu);
      errors.push_back(std::string("cancel: ") + e.what());
    }
    return true;
  };

  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(seconds));
  std::vector<std::thread> threads;
  for (int i = 0; i < kJobThreads; ++i) threads.emplace_back(job_thread, i);
  std::thread chaos([&] {
    std::mt19937_64 rng(seed ^ 0xC4A05);
    while (!stop.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5 + rng() % 30));
      if (cancel_one(slots[rng() % slots.size()])) tally.cancels.fetch_add(1);
    }
  });
  chaos.join();
  stop.store(true);
  // Jobs finish the iteration they are in and leave; one that waits for a turn that cannot come
  // (memory-packed lanes) is cancelled after a grace period.
  const auto grace = std::chrono::steady_clock::now() + 3s;
  while (running.load() > 0) {
    std::this_thread::sleep_for(5ms);
    if (std::chrono::steady_clock::now() > grace) {
      for (Slot& slot : slots) {
        if (cancel_one(slot)) tally.cancels.fetch_add(1);
      }
    }
  }
  for (std::thread& t : threads) t.join();
  for (std::uint64_t stream : lane_streams) backend->synchronize_stream(StreamHandle{stream});
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::uint64_t kernels = 0, finished = 0, mismatches = 0, stale = 0;
  DevicePtr first_bad = 0;
  for (const StreamWork& w : works) {
    kernels += w.enqueued();
    finished += w.finished();
    mismatches += w.mismatches();
    stale += w.stale();
    if (first_bad == 0) first_bad = w.first_bad();
  }
  std::printf(
      "  [%s, %s] %llu iterations, %llu kernels, %llu frees with queued work (%llu "
      "persistent), %llu cancels (%llu racing errors), %llu leaves, %llu OOMs, %llu mismatches "
      "(%llu stale), %.2f s\n",
      to_string(spill), policy.c_str(), static_cast<unsigned long long>(tally.iterations.load()),
      static_cast<unsigned long long>(kernels),
      static_cast<unsigned long long>(tally.queued_frees.load()),
      static_cast<unsigned long long>(tally.persistent_frees.load()),
      static_cast<unsigned long long>(tally.cancels.load()),
      static_cast<unsigned long long>(tally.cancel_races.load()),
      static_cast<unsigned long long>(tally.leaves.load()),
      static_cast<unsigned long long>(tally.ooms.load()),
      static_cast<unsigned long long>(mismatches), static_cast<unsigned long long>(stale), elapsed);

  // How often memory changed hands behind queued work, and how often an allocation waited.
  std::uint64_t allocations = 0, deferred = 0, waits = 0;
  for (const DeviceMemoryStats& d : runtime.memory().stats().devices) {
    allocations += d.allocations;
    deferred += d.deferred_unmaps;
    waits += d.allocation_waits;
  }
  std::printf("    %llu allocations, %llu pages handed over behind queued work, %llu allocations "
              "waited on the host\n",
              static_cast<unsigned long long>(allocations),
              static_cast<unsigned long long>(deferred), static_cast<unsigned long long>(waits));
  if (!first_race.empty()) std::printf("    first racing error: %s\n", first_race.c_str());
  for (const std::string& e : errors) ADD_FAILURE() << e;
  EXPECT_EQ(finished, kernels) << "kernels never ran";
  EXPECT_EQ(mismatches, 0u) << "queued work found foreign or stale bytes, first in block "
                            << std::hex << first_bad;
  EXPECT_GT(tally.iterations.load(), 0u);
  const MemoryStats stats = runtime.memory().stats();
  for (const JobMemoryStats& j : stats.jobs) {
    if (j.job != kUnattributedJob) {
      EXPECT_FALSE(j.alive) << "job '" << j.name << "' not released";
    }
  }
  expect_balanced(runtime.memory());
}

INSTANTIATE_TEST_SUITE_P(
    Mix, StreamSafetyStress,
    ::testing::Combine(::testing::Values(SpillPolicy::none, SpillPolicy::peer_then_host,
                                         SpillPolicy::host_only),
                       ::testing::Values(std::string("fair"), std::string("pack"))),
    [](const ::testing::TestParamInfo<Param>& info) {
      return std::string(to_string(std::get<0>(info.param))) + "_" + std::get<1>(info.param);
    });

}  // namespace
}  // namespace salus::testing
