// Harvesting under a randomized, seeded mix of operations on simulated NVLink topologies (the
// focused scenarios are in test_harvest_scenarios.cpp). The randomized test keeps its own model of
// every live block (bytes, owner, pattern seed) and of which jobs are quiescent, and checks after
// every operation:
//  - every live block keeps its pointer and its bytes, and find() still reports it;
//  - every mapped page under a live block grants its device and every device that can reach the
//    page's memory read-write (and no other device any access), and the sim agrees with the borrowed / lent / in_use_by_tier accounting page by page;
//  - pages move only as the operation allows: never under an active job (except its own
//    activation or an explicit remap), only down a tier on demote, only home on activation;
//  - at the end, with every job released and trim() done, no chunk is left anywhere.
//
// Soundness with prefetch: prefetch returns before its pages move, and the prefetcher moves pages
// of quiescent jobs from its own thread, also later, on any free or set_job_quiescent, for as long
// as the job stays a target. The randomized test therefore prefetches only a quiescent job whose
// movable pages all have room at home, waits until its prefetched_bytes shows the round done, and
// then activates it (what the runtime does next), which drops the target: from then on the
// prefetcher is idle until the next prefetch.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "memory/safe_points.hpp"
#include "support/harvest_fixture.hpp"
#include "support/memory_fixture.hpp"

namespace salus::testing {
namespace {

using namespace std::chrono_literals;
using namespace harvest;

// ------------------------------------------------------------------------------------------------
// Randomized
// ------------------------------------------------------------------------------------------------

struct Scenario {
  const char* name;
  SimConfig (*config)();
  std::vector<std::size_t> limits;
  SpillPolicy spill;
  std::uint64_t seed;
};

void PrintTo(const Scenario& s, std::ostream* os) {
  *os << s.name;
}

struct LiveBlock {
  std::size_t bytes;  // block size (request rounded to the block alignment)
  std::size_t requested;
  std::uint64_t seed;  // 0: never written (allocated while its job was quiescent)
  JobId job;
  int device;
  StreamHandle stream;
  Lifetime lifetime;
};

struct JobModel {
  JobId id;
  bool quiescent = false;
};

// A mapped page under live blocks, as the sim backend sees it.
struct PageView {
  Location where;
  int device = 0;                     // whose address range holds it
  std::vector<std::uint32_t> owners;  // jobs of the live blocks touching it
  std::vector<DevicePtr> blocks;
};
using PageMap = std::map<DevicePtr, PageView>;

// What an operation may do to pages that were mapped under live blocks before it.
struct MoveRule {
  enum Kind { none, quiescent_only, home_or_down, demote, remap } kind = none;
  std::uint32_t job = 0;  // home_or_down, demote: the job; remap: unused
  int device = 0;         // demote
  DevicePtr block = 0;    // remap
  Location where{};       // remap
};

class HarvestPropertyRandom : public SimMemoryTest, public ::testing::WithParamInterface<Scenario> {
 protected:
  void SetUp() override {
    const Scenario& s = GetParam();
    MemoryOptions options = harvesting(s.limits, s.spill, std::nullopt, 32 * MiB);
    build(s.config(), options);
    devices = memory->device_count();
    for (int d = 0; d < devices; ++d) {
      for (int k = 0; k < 2 + d % 2; ++k) streams.emplace_back(backend, d);
    }
  }

  std::size_t draw_size(std::mt19937_64& rng) {
    const int u = std::uniform_int_distribution<int>(0, 99)(rng);
    if (u < 12) return std::uniform_int_distribution<std::size_t>(1 * MiB, 6 * MiB)(rng);
    if (u < 35) return std::uniform_int_distribution<std::size_t>(64 * KiB, 1 * MiB)(rng);
    return std::uniform_int_distribution<std::size_t>(512, 64 * KiB)(rng);
  }

  JobModel* model_of(JobId id) {
    for (JobModel& j : jobs) {
      if (j.id == id) return &j;
    }
    return nullptr;
  }
  bool quiescent(std::uint32_t job) {
    const JobModel* j = model_of(JobId{job});
    return j != nullptr && j->quiescent;
  }

  PageMap pages_now() {
    PageMap out;
    for (const auto& [ptr, b] : live) {
      for (DevicePtr page = ptr / kPage * kPage; page < ptr + b.bytes; page += kPage) {
        auto [it, fresh] = out.try_emplace(page);
        if (fresh) {
          const std::optional<Location> where = backend->location_of(page);
          EXPECT_TRUE(where.has_value())
              << "page " << std::hex << page << " of a live block is unmapped";
          it->second.where = where.value_or(Location::host(99));
          it->second.device = b.device;
        }
        it->second.owners.push_back(b.job.value);
        it->second.blocks.push_back(ptr);
      }
    }
    return out;
  }

  void fill(DevicePtr ptr, LiveBlock& b) {
    b.seed = next_seed++;
    fill_pattern(ptr, b.bytes, b.seed);
  }

  void expect_bytes(DevicePtr ptr, const LiveBlock& b, const char* when) {
    if (b.seed == 0) return;
    ASSERT_TRUE(check_pattern(ptr, b.bytes, b.seed))
        << "block " << std::hex << ptr << std::dec << " of job " << b.job.value << " on device "
        << b.device << " lost its bytes (" << when << ", op " << op << ")";
  }

  // Pages that changed location between two snapshots, checked against what the operation allows.
  // Returns the moved pages.
  std::vector<DevicePtr> check_moves(const PageMap& before, const PageMap& after,
                                     const MoveRule& rule) {
    std::vector<DevicePtr> moved;
    for (const auto& [page, was] : before) {
      auto it = after.find(page);
      if (it == after.end() || it->second.where == was.where) continue;
      moved.push_back(page);
      const Location now = it->second.where;
      const Location home = Location::gpu(was.device);
      std::ostringstream what;
      what << "op " << op << ": page " << std::hex << page << std::dec << " of device "
           << was.device << " moved " << to_string(was.where) << " -> " << to_string(now);
      switch (rule.kind) {
        case MoveRule::none:
          ADD_FAILURE() << what.str() << " during an operation that moves nothing";
          break;
        case MoveRule::quiescent_only:
          for (std::uint32_t owner : was.owners) {
            EXPECT_TRUE(quiescent(owner)) << what.str() << " but job " << owner << " is running";
          }
          break;
        case MoveRule::home_or_down: {
          const bool mine =
              std::find(was.owners.begin(), was.owners.end(), rule.job) != was.owners.end();
          for (std::uint32_t owner : was.owners) {
            EXPECT_TRUE(owner == rule.job || quiescent(owner))
                << what.str() << " but job " << owner << " is running";
          }
          if (mine) {
            EXPECT_TRUE(was.where != home && now == home)
                << what.str() << ": the activated job's pages only come home";
          } else {
            EXPECT_TRUE(was.where == home && now != home)
                << what.str() << ": others' pages only go down to make room";
          }
          break;
        }
        case MoveRule::demote:
          EXPECT_EQ(was.device, rule.device) << what.str() << " (demote of another device)";
          EXPECT_NE(std::find(was.owners.begin(), was.owners.end(), rule.job), was.owners.end())
              << what.str() << " (not a page of the demoted job)";
          for (std::uint32_t owner : was.owners) {
            EXPECT_TRUE(quiescent(owner)) << what.str() << " but job " << owner << " is running";
          }
          EXPECT_TRUE(was.where == home && now != home) << what.str() << " (demote goes down)";
          break;
        case MoveRule::remap:
          EXPECT_NE(std::find(was.blocks.begin(), was.blocks.end(), rule.block), was.blocks.end())
              << what.str() << " (not a page of the remapped block)";
          EXPECT_EQ(now, rule.where) << what.str();
          break;
      }
    }
    return moved;
  }

  // Everything the stats claim, checked against the sim backend and the model.
  void check_state(const PageMap& pages) {
    std::vector<std::size_t> peer(devices), host(devices), local(devices), lent(devices);
    for (const auto& [page, v] : pages) {
      for (int d = 0; d < devices; ++d) {
        // The owner, and every device that can reach where the page lives (issue 20: peers
        // are granted on every map and every move, as PyTorch's expandable segments do).
        const bool reaches = v.where.is_host() || d == v.where.index ||
                             backend->peer_link(d, v.where.index).can_access;
        const Access want = d == v.device || reaches ? Access::read_write : Access::none;
        ASSERT_EQ(backend->access_of(page, d), want)
            << "op " << op << ": page " << std::hex << page << std::dec << " of device " << v.device
            << " at " << to_string(v.where) << ", access of device " << d;
      }
      const Tier t = tier_of(v.where, v.device);
      const auto dev = static_cast<std::size_t>(v.device);
      if (t == Tier::local) ++local[dev];
      if (t == Tier::peer) {
        ++peer[dev];
        ++lent[static_cast<std::size_t>(v.where.index)];
      }
      if (t == Tier::host) ++host[dev];
    }
    const MemoryStats s = memory->stats();
    std::size_t sum_lent = 0, sum_peer = 0, sum_host = 0, sum_mapped = 0;
    std::vector<std::size_t> allocated(devices);
    for (const auto& [ptr, b] : live) allocated[static_cast<std::size_t>(b.device)] += b.bytes;
    for (int d = 0; d < devices; ++d) {
      const DeviceMemoryStats& ds = s.devices[static_cast<std::size_t>(d)];
      const auto i = static_cast<std::size_t>(d);
      SCOPED_TRACE(::testing::Message() << "op " << op << ", device " << d);
      // Remote pages never sit in free space: freed ones go home at once.
      EXPECT_EQ(ds.borrowed_peer, peer[i] * kPage);
      EXPECT_EQ(ds.borrowed_host, host[i] * kPage);
      EXPECT_EQ(ds.lent, lent[i] * kPage);
      EXPECT_GE(ds.mapped, ds.borrowed_peer + ds.borrowed_host);
      const std::size_t local_mapped = ds.mapped - ds.borrowed_peer - ds.borrowed_host;
      EXPECT_GE(local_mapped, local[i] * kPage);
      EXPECT_LE(local_mapped + ds.lent, ds.reserved);
      EXPECT_LE(ds.reserved, ds.limit);
      EXPECT_EQ(backend->chunk_bytes(Location::gpu(d)), ds.reserved);
      EXPECT_EQ(ds.allocated, allocated[i]);
      sum_lent += ds.lent;
      sum_peer += ds.borrowed_peer;
      sum_host += ds.borrowed_host;
      // Old addresses of handed-off pages stay mapped until their work has finished.
      sum_mapped += ds.mapped + ds.retiring;
    }
    EXPECT_EQ(sum_lent, sum_peer) << "op " << op;
    EXPECT_LE(sum_host, s.host_spill_bytes) << "op " << op;
    EXPECT_LE(s.host_spill_bytes, 32 * MiB) << "op " << op;
    EXPECT_EQ(backend->chunk_bytes(Location::host()), s.host_spill_bytes) << "op " << op;
    EXPECT_EQ(backend->mapped_bytes(), sum_mapped)
        << "op " << op << ": a staging page left mapped?";

    // Per job: bytes, classes, devices and tiers, from the model and the sim.
    std::map<std::uint32_t, JobMemoryStats> expected;
    for (const JobModel& j : jobs) {
      JobMemoryStats& e = expected[j.id.value];
      e.in_use_by_device.assign(static_cast<std::size_t>(devices), 0);
    }
    for (const auto& [ptr, b] : live) {
      JobMemoryStats& e = expected[b.job.value];
      e.in_use += b.bytes;
      e.by_class[static_cast<std::size_t>(b.lifetime)].in_use += b.bytes;
      ++e.by_class[static_cast<std::size_t>(b.lifetime)].blocks;
      e.in_use_by_device[static_cast<std::size_t>(b.device)] += b.bytes;
      for (DevicePtr page = ptr / kPage * kPage; page < ptr + b.bytes; page += kPage) {
        const DevicePtr lo = std::max(ptr, page);
        const DevicePtr hi = std::min(ptr + b.bytes, page + kPage);
        const Tier t = tier_of(pages.at(page).where, b.device);
        e.in_use_by_tier[tier(t)] += hi - lo;
      }
    }
    for (const JobModel& j : jobs) {
      const JobMemoryStats got = memory->job_stats(j.id);
      const JobMemoryStats& e = expected[j.id.value];
      SCOPED_TRACE(::testing::Message() << "op " << op << ", job " << j.id.value);
      EXPECT_EQ(got.in_use, e.in_use);
      for (std::size_t c = 0; c < kLifetimeCount; ++c) {
        EXPECT_EQ(got.by_class[c].in_use, e.by_class[c].in_use);
        EXPECT_EQ(got.by_class[c].blocks, e.by_class[c].blocks);
      }
      EXPECT_EQ(got.in_use_by_device, e.in_use_by_device);
      std::size_t tiers = 0;
      for (std::size_t t = 0; t < kTierCount; ++t) {
        EXPECT_EQ(got.in_use_by_tier[t], e.in_use_by_tier[t]) << to_string(static_cast<Tier>(t));
        tiers += got.in_use_by_tier[t];
      }
      EXPECT_EQ(tiers, got.in_use);
      EXPECT_EQ(got.quiescent, j.quiescent);
    }
  }

  void check_find(DevicePtr ptr, const LiveBlock& b) {
    const std::optional<BlockInfo> info = memory->find(ptr);
    ASSERT_TRUE(info.has_value()) << "op " << op << ": find lost " << std::hex << ptr;
    EXPECT_EQ(info->ptr, ptr);
    EXPECT_EQ(info->bytes, b.bytes);
    EXPECT_EQ(info->requested, b.requested);
    EXPECT_EQ(info->device, b.device);
    EXPECT_EQ(info->stream, b.stream);
    EXPECT_EQ(info->job, b.job);
    EXPECT_EQ(info->lifetime, b.lifetime);
  }

  // Pointers, sizes and owners of every live block (and their bytes when `when` is given).
  void check_all_blocks(const char* when) {
    DevicePtr end = 0;
    for (const auto& [ptr, b] : live) {
      ASSERT_GE(ptr, end) << "op " << op << ": live blocks overlap at " << std::hex << ptr;
      end = ptr + b.bytes;
      check_find(ptr, b);
      if (when != nullptr) expect_bytes(ptr, b, when);
    }
  }

  std::uint64_t pages_moved_total() {
    std::uint64_t total = 0;
    for (int d = 0; d < devices; ++d) total += memory->device_stats(d).pages_moved;
    return total;
  }

  // How many pages of `job` a prefetch would bring home, or nullopt when the test could not tell
  // when the prefetcher is done: a device without room for them makes the prefetcher reclaim and
  // evict in the background. Pages shared with a running job's block cannot move and are left out
  // (the prefetcher only counts pages whose owners may move now).
  std::optional<std::size_t> prefetchable(std::uint32_t job, const PageMap& pages) {
    std::vector<std::size_t> movable(static_cast<std::size_t>(devices));
    std::size_t total = 0;
    for (const auto& [page, v] : pages) {
      if (std::find(v.owners.begin(), v.owners.end(), job) == v.owners.end()) continue;
      if (v.where == Location::gpu(v.device)) continue;
      const bool stuck = std::any_of(v.owners.begin(), v.owners.end(),
                                     [&](std::uint32_t owner) { return !quiescent(owner); });
      if (stuck) continue;
      ++movable[static_cast<std::size_t>(v.device)];
      ++total;
    }
    for (int d = 0; d < devices; ++d) {
      const DeviceMemoryStats ds = memory->device_stats(d);
      const std::size_t used = ds.mapped - ds.borrowed_peer - ds.borrowed_host + ds.lent;
      const std::size_t room = (ds.limit - used) / kPage;
      if (movable[static_cast<std::size_t>(d)] > room) return std::nullopt;
    }
    return total;
  }

  int devices = 0;
  std::vector<Stream> streams;
  std::map<DevicePtr, LiveBlock> live;
  std::vector<JobModel> jobs;
  std::uint64_t next_seed = 1;
  int op = 0;
};

TEST_P(HarvestPropertyRandom, MixedOperationsKeepBytesPointersAccessAndAccounting) {
  const Scenario& scenario = GetParam();
  std::mt19937_64 rng(scenario.seed);
  const JobMemoryLimits budget{.total = 40 * MiB};
  for (int j = 0; j < 5; ++j) {
    jobs.push_back({memory->register_job("job" + std::to_string(j), budget), false});
  }
  const int operations = 10'500;
  std::map<std::string, std::size_t> counts;
  std::size_t capacity = 32 * MiB;  // the host's share
  for (std::size_t limit : scenario.limits) capacity += limit;
  const std::size_t crowded_bytes = capacity * 9 / 10;
  std::size_t moved_pages = 0;
  std::uint64_t counted_before = 0;
  std::atomic<std::uint64_t> observed_pages{0};
  memory->set_move_observer([&](const MoveRecord& m) {
    EXPECT_GT(m.pages, 0u);
    EXPECT_EQ(m.bytes, m.pages * kPage);
    EXPECT_NE(m.from, m.to);
    observed_pages.fetch_add(m.pages);
  });
  std::size_t max_live = 0;

  PageMap before = pages_now();
  for (op = 0; op < operations; ++op) {
    const int dice = std::uniform_int_distribution<int>(0, 999)(rng);
    MoveRule rule;
    std::size_t live_bytes = 0;
    for (const auto& [ptr, b] : live) live_bytes += b.bytes;
    const bool crowded = live_bytes > crowded_bytes;
    auto pick_block = [&]() {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      return it;
    };
    std::string label;
    // Checks after the operation that need its own context.
    std::function<void(const PageMap&, const std::vector<DevicePtr>&)> after_op;

    // Phases of filling up and draining: pressure (refusals, recalls, evictions) while filling,
    // room to bring pages home while draining.
    const bool filling = op / 400 % 2 == 0;
    max_live = std::max(max_live, live_bytes);
    if (live.empty() || (dice < (filling ? 500 : 260) && !crowded)) {
      JobModel& job = jobs[rng() % jobs.size()];
      const Stream& stream = streams[rng() % streams.size()];
      const std::size_t bytes = draw_size(rng);
      const Lifetime lifetime = rng() % 3 == 0 ? Lifetime::ephemeral : Lifetime::persistent;
      rule.kind = MoveRule::quiescent_only;
      try {
        const DevicePtr ptr =
            memory->allocate({bytes, stream.device(), stream.handle(), job.id, lifetime});
        ASSERT_EQ(ptr % MemoryManager::kBlockAlignment, 0u);
        auto next = live.lower_bound(ptr);
        if (next != live.end()) {
          ASSERT_GE(next->first, ptr + round_up(bytes)) << "overlap";
        }
        if (next != live.begin()) {
          auto prev = std::prev(next);
          ASSERT_LE(prev->first + prev->second.bytes, ptr) << "overlap";
        }
        LiveBlock& b = live[ptr] = {round_up(bytes), bytes,           0,       job.id,
                                    stream.device(), stream.handle(), lifetime};
        // A quiescent job enqueues nothing: its new block is written once it is active.
        if (!job.quiescent) fill(ptr, b);
        label = job.quiescent ? "allocate (quiescent job)" : "allocate";
        ++counts[label];
      } catch (const OutOfMemory&) {
        label = "allocate refused";
        ++counts[label];
      }
    } else if (dice < 650 || crowded) {
      auto it = pick_block();
      expect_bytes(it->first, it->second, "before free");
      memory->deallocate(it->first);
      live.erase(it);
      label = "free";
      ++counts[label];
    } else if (dice < 700) {
      JobModel& job = jobs[rng() % jobs.size()];
      memory::set_job_quiescent(*memory, job.id);
      job.quiescent = true;
      label = "quiescent";
      ++counts[label];
    } else if (dice < 760) {
      JobModel& job = jobs[rng() % jobs.size()];
      rule = {MoveRule::home_or_down, job.id.value};
      const bool was_quiescent = job.quiescent;
      const JobMemoryStats stats_before = memory->job_stats(job.id);
      const std::size_t fetched = memory::activate_job(*memory, job.id);
      job.quiescent = false;
      after_op = [&, was_quiescent, fetched, stats_before, id = job.id](
                     const PageMap& pages, const std::vector<DevicePtr>& moved) {
        std::size_t mine = 0;
        for (DevicePtr page : moved) {
          const auto& owners = pages.at(page).owners;
          mine += std::find(owners.begin(), owners.end(), id.value) != owners.end() ? 1 : 0;
        }
        EXPECT_EQ(fetched, mine * kPage) << "op " << op << ": activate_job's answer";
        const JobMemoryStats s = memory->job_stats(id);
        EXPECT_EQ(s.activations, stats_before.activations + (was_quiescent ? 1 : 0));
        EXPECT_EQ(s.fetched_bytes, stats_before.fetched_bytes + fetched);
        EXPECT_EQ(s.activations_waited, stats_before.activations_waited + (fetched > 0 ? 1 : 0));
        if (!was_quiescent) {
          EXPECT_EQ(fetched, 0u) << "an active job has nothing to fetch";
        }
        // Blocks it allocated while quiescent get their first bytes now.
        for (auto& [ptr, b] : live) {
          if (b.job == id && b.seed == 0) fill(ptr, b);
        }
      };
      label = was_quiescent ? "activate" : "activate (active)";
      ++counts[label];
    } else if (dice < 810) {
      JobModel& job = jobs[rng() % jobs.size()];
      const int device = static_cast<int>(rng() % static_cast<std::size_t>(devices));
      rule = {MoveRule::demote, job.id.value, device};
      const std::size_t moved = memory::demote(*memory, job.id, device);
      if (!job.quiescent) {
        EXPECT_EQ(moved, 0u) << "op " << op << ": demoted a running job";
      }
      after_op = [&, moved](const PageMap&, const std::vector<DevicePtr>& pages) {
        EXPECT_EQ(moved, pages.size() * kPage) << "op " << op << ": demote's answer";
      };
      label = job.quiescent ? "demote" : "demote (active)";
      ++counts[label];
    } else if (dice < 835) {
      // A quiescent job, when there is one (the runtime prefetches only waiting jobs).
      std::vector<JobModel*> waiting;
      for (JobModel& j : jobs) {
        if (j.quiescent) waiting.push_back(&j);
      }
      JobModel& job =
          waiting.empty() ? jobs[rng() % jobs.size()] : *waiting[rng() % waiting.size()];
      std::optional<std::size_t> away =
          job.quiescent ? prefetchable(job.id.value, before) : std::nullopt;
      if (!away && job.quiescent && rng() % 2 == 0) {
        // Cached pages count as room only once reclaimed: trim, then ask again.
        memory->trim();
        away = prefetchable(job.id.value, before);
      }
      if (!away) {
        label = job.quiescent ? "prefetch skipped (no room)" : "prefetch skipped (none waiting)";
        ++counts[label];
      } else {
        rule = {MoveRule::home_or_down, job.id.value};
        const std::uint64_t prefetched = memory->job_stats(job.id).prefetched_bytes;
        memory::prefetch(*memory, job.id);
        const std::uint64_t want = prefetched + *away * kPage;
        ASSERT_TRUE(eventually([&] { return memory->job_stats(job.id).prefetched_bytes >= want; }))
            << "op " << op << ": a prefetch with room for its " << *away
            << " movable pages did not finish";
        EXPECT_EQ(memory->job_stats(job.id).prefetched_bytes, want);
        // The job runs next. Activated, it stops being a prefetch target; left quiescent, a later
        // demote or allocation of it could make the prefetcher move pages behind the test's back
        // (the target is dropped only once the prefetcher finds nothing away).
        const JobMemoryStats ready = memory->job_stats(job.id);
        EXPECT_EQ(memory::activate_job(*memory, job.id), 0u)
            << "op " << op << ": prefetch left movable pages away";
        job.quiescent = false;
        const JobMemoryStats ran = memory->job_stats(job.id);
        EXPECT_EQ(ran.activations_waited, ready.activations_waited);
        EXPECT_EQ(ran.activations, ready.activations + 1);
        EXPECT_LE(ran.activations_after_move, ready.activations_after_move + 1);
        for (auto& [ptr, b] : live) {
          if (b.job == job.id && b.seed == 0) fill(ptr, b);
        }
        after_op = [&, n = *away](const PageMap&, const std::vector<DevicePtr>& moved) {
          EXPECT_EQ(moved.size(), n) << "op " << op << ": prefetch moved other pages too";
        };
        label = *away > 0 ? "prefetch" : "prefetch (nothing movable)";
        ++counts[label];
      }
    } else if (dice < 875) {
      auto it = pick_block();
      const int choice = static_cast<int>(rng() % static_cast<std::size_t>(devices + 1));
      const Location where = choice == devices ? Location::host() : Location::gpu(choice);
      rule = {MoveRule::remap, 0, 0, it->first, where};
      try {
        memory->remap(it->first, where);
        label = "remap";
        ++counts[label];
        for (DevicePtr p = it->first / kPage * kPage; p < it->first + it->second.bytes;
             p += kPage) {
          EXPECT_EQ(backend->location_of(p), where) << "op " << op << ": remap left a page behind";
        }
      } catch (const OutOfMemory&) {
        rule.kind = MoveRule::none;  // refused before anything moved
        label = "remap refused";
        ++counts[label];
      }
    } else if (dice < 925) {
      // The program writes new values into a running job's block.
      std::vector<DevicePtr> candidates;
      for (const auto& [ptr, b] : live) {
        if (!quiescent(b.job.value)) candidates.push_back(ptr);
      }
      if (!candidates.empty()) {
        const DevicePtr ptr = candidates[rng() % candidates.size()];
        expect_bytes(ptr, live.at(ptr), "before rewrite");
        fill(ptr, live.at(ptr));
        label = "rewrite";
        ++counts[label];
      }
    } else if (dice < 945) {
      JobModel& job = jobs[rng() % jobs.size()];
      memory->promote_ephemeral(job.id);
      for (auto& [ptr, b] : live) {
        if (b.job == job.id) b.lifetime = Lifetime::persistent;
      }
      label = "promote";
      ++counts[label];
    } else if (dice < 960) {
      JobModel& job = jobs[rng() % jobs.size()];
      for (const auto& [ptr, b] : live) {
        if (b.job == job.id) expect_bytes(ptr, b, "before release");
      }
      memory->release_job(job.id);
      std::erase_if(live, [&](const auto& entry) { return entry.second.job == job.id; });
      EXPECT_EQ(memory->job_stats(job.id).in_use, 0u);
      EXPECT_THROW(memory::activate_job(*memory, job.id), UnknownJob);
      job = {memory->register_job("job@" + std::to_string(op), budget), false};
      label = "release";
      ++counts[label];
    } else {
      memory->trim();
      label = "trim";
      ++counts[label];
      after_op = [&](const PageMap& pages, const std::vector<DevicePtr>&) {
        // Only pages under live blocks (and lent ones) stay; the host keeps only mapped pages.
        std::vector<std::size_t> local(static_cast<std::size_t>(devices));
        std::size_t host = 0;
        for (const auto& [page, v] : pages) {
          if (v.where == Location::gpu(v.device)) ++local[static_cast<std::size_t>(v.device)];
          if (v.where.is_host()) ++host;
        }
        for (int d = 0; d < devices; ++d) {
          const DeviceMemoryStats ds = memory->device_stats(d);
          EXPECT_EQ(ds.mapped - ds.borrowed_peer - ds.borrowed_host,
                    local[static_cast<std::size_t>(d)] * kPage)
              << "op " << op << ": device " << d << " kept cached pages through trim";
          EXPECT_EQ(ds.reserved, local[static_cast<std::size_t>(d)] * kPage + ds.lent)
              << "op " << op << ": device " << d;
        }
        EXPECT_EQ(memory->stats().host_spill_bytes, host * kPage) << "op " << op;
      };
    }

    SCOPED_TRACE(::testing::Message() << "op " << op << " was: " << label);
    const PageMap after = pages_now();
    const std::vector<DevicePtr> moved = check_moves(before, after, rule);
    moved_pages += moved.size();
    check_state(after);
    if (after_op) after_op(after, moved);
    // Every page that changed place was counted as moved, and reported to the observer (a page
    // may move more than once in one operation: down, then back by a recall).
    const std::uint64_t counted = pages_moved_total();
    EXPECT_GE(counted - counted_before, moved.size()) << "op " << op;
    EXPECT_EQ(observed_pages.load(), counted) << "op " << op;
    counted_before = counted;
    // The bytes of every block on a page that moved, and of everything now and then.
    if (op % 97 == 0) {
      check_all_blocks("periodic check");
    } else {
      check_all_blocks(nullptr);
      std::set<DevicePtr> touched;
      for (DevicePtr page : moved) {
        for (DevicePtr b : after.at(page).blocks) touched.insert(b);
      }
      for (DevicePtr b : touched) expect_bytes(b, live.at(b), "after its page moved");
    }
    if (::testing::Test::HasFatalFailure() || ::testing::Test::HasNonfatalFailure()) {
      FAIL() << "stopping at op " << op;
    }
    before = after;
  }
  check_all_blocks("at the end");

  for (const auto& [what, n] : counts) std::printf("  %-26s %zu\n", what.c_str(), n);
  std::printf("  %-26s %zu\n", "pages moved", moved_pages);
  std::printf("  %-26s %zu MiB of %zu\n", "most live", max_live / MiB, capacity / MiB);
  // The run exercised what it claims to.
  EXPECT_GT(counts["allocate"], 2000u);
  // Pressure: the devices and the host ran close to full. (Refusals are rare and depend on
  // timing since address space stopped refusing requests that physical pages could serve.)
  EXPECT_GT(max_live, capacity * 3 / 5) << "no pressure";
  EXPECT_GT(counts["activate"], 100u);
  EXPECT_GT(counts["demote"], 50u);
  EXPECT_GT(counts["prefetch"], 5u);
  EXPECT_GT(counts["remap"], 50u);
  EXPECT_GT(counts["release"], 10u);
  EXPECT_GT(moved_pages, 500u);
  std::uint64_t recalled = 0;
  for (int d = 0; d < devices; ++d) {
    recalled += memory->device_stats(d).recalled_pages;
  }
  if (scenario.spill == SpillPolicy::peer_then_host) {
    EXPECT_GT(recalled, 0u) << "no lender ever took its pages back";
  }

  memory->set_move_observer(nullptr);  // it refers to this function's locals
  // Everything goes: no chunk left anywhere.
  for (JobModel& job : jobs) memory->release_job(job.id);
  live.clear();
  memory->trim();
  const MemoryStats s = memory->stats();
  for (const DeviceMemoryStats& d : s.devices) {
    EXPECT_EQ(d.allocated, 0u);
    EXPECT_EQ(d.mapped, 0u) << "device " << d.device;
    EXPECT_EQ(d.reserved, 0u) << "device " << d.device;
    EXPECT_EQ(d.lent, 0u) << "device " << d.device;
    EXPECT_EQ(d.borrowed_peer + d.borrowed_host, 0u) << "device " << d.device;
    EXPECT_EQ(backend->chunk_bytes(Location::gpu(d.device)), 0u) << "device " << d.device;
  }
  EXPECT_EQ(s.host_spill_bytes, 0u);
  EXPECT_EQ(backend->chunk_bytes(Location::host()), 0u);
  EXPECT_EQ(backend->mapped_bytes(), 0u);
}

SimConfig mesh4() {
  return SimConfig::nvlink_mesh(4, 64 * MiB);
}
SimConfig islands2x2() {
  return SimConfig::two_islands(2, 64 * MiB);
}

INSTANTIATE_TEST_SUITE_P(HarvestProperty, HarvestPropertyRandom,
                         ::testing::Values(Scenario{"MeshPeerThenHost",
                                                    mesh4,
                                                    {16 * MiB, 16 * MiB, 24 * MiB, 16 * MiB},
                                                    SpillPolicy::peer_then_host,
                                                    20260101},
                                           Scenario{"MeshHostOnly",
                                                    mesh4,
                                                    {16 * MiB, 24 * MiB, 16 * MiB, 24 * MiB},
                                                    SpillPolicy::host_only,
                                                    20260202},
                                           Scenario{"TwoIslandsPeerThenHost",
                                                    islands2x2,
                                                    {16 * MiB, 16 * MiB, 24 * MiB, 16 * MiB},
                                                    SpillPolicy::peer_then_host,
                                                    20260303}),
                         [](const ::testing::TestParamInfo<Scenario>& info) {
                           return std::string(info.param.name);
                         });

// ------------------------------------------------------------------------------------------------
// Focused scenarios
// ------------------------------------------------------------------------------------------------

}  // namespace
}  // namespace salus::testing
