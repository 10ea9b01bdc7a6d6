// MemoryManager::Impl::place: where a charged request's pages come from.
//
// The stream heap tries first, with what it has: its own free space and cached pages, the
// device's pool, pages already gathered into the stash, and fresh chunks when it may make them
// (StreamHeap::allocate). When it comes up short, the steps in kSteps below run in order until one
// says what to do next: try the stream heap again, or give up (out of memory). Every try after
// the first is one attempt; the steps read the attempt number where their retries are bounded.
#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "memory/memory_manager_impl.hpp"

namespace salus {

namespace {

using memory::DeviceHeap;
using memory::StreamHeap;

// Pages held by other streams' free blocks are taken only when the pool has none; a second try
// covers pages that another thread took between our reclaim and our retry.
constexpr int kAttempts = 3;
// Each harvesting round makes progress (pages recalled, demoted or borrowed, or a safe point
// passed); the cap only guards against other threads taking that progress forever.
constexpr int kHarvestAttempts = 64;

// What a step says once it has run.
enum class Next {
  retry,            // try the stream heap again: one more attempt
  retry_uncounted,  // try the stream heap again, not counted as an attempt
  next_step,        // nothing for this step to do: the next step in kSteps runs
  give_up,          // nothing more can be done: out of memory
};

// One placement in progress: what its steps share.
struct Placement {
  memory::Tiers& tiers;
  memory::Harvester& harvester;
  DeviceHeap& device;
  StreamHeap& heap;  // the requesting stream's
  JobId job;
  std::vector<memory::Page>& stash;  // pages gathered from other tiers for the next try
  int attempt = 0;
  std::size_t short_by = 0;  // pages the last try lacked
  // Other streams' spare pages come before fresh chunks (see StreamHeap::allocate): with one
  // stream there are none to ask for, and the first try may make fresh chunks.
  bool fresh_chunks = false;
  // Harvesting's bound on waiting for a safe point: set when the first round starts, one bound
  // for the whole placement.
  std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt;
  std::uint64_t safe_points_seen = 0;  // the safe-point count when this round started
};

// Other streams' spare pages (StreamHeap::Take::spare) go to the pool: once, before the first
// fresh chunk. The try before ran without fresh chunks; every try after this one may make them.
// Not an attempt of its own: it only lets the next try go as far as fresh chunks.
Next spare_pages_of_other_streams(Placement& p) {
  if (std::exchange(p.fresh_chunks, true)) return Next::next_step;
  (void)p.device.spare_from_others(&p.heap, p.short_by);
  return Next::retry_uncounted;
}

// Pages of other streams' free blocks go to the pool. They are reclaimed after every short try,
// but what they give earns a retry only while attempt < kAttempts. Past that, the steps below
// run even when pages were reclaimed: without spilling the device is then out of memory, and
// with spilling a harvesting round runs (and its retry tries the reclaimed pages too).
Next free_blocks_of_other_streams(Placement& p) {
  if (p.device.reclaim_from_others(&p.heap, p.short_by) > 0 && p.attempt < kAttempts) {
    return Next::retry;
  }
  return Next::next_step;
}

// Without spilling there is no tier below the device and nothing to harvest. A second try always
// follows the first (attempt 0), whatever the reclaim gave: pages another thread freed
// meanwhile may fit (the device's only retry before tiers existed). After that, out of memory.
Next without_tiers_one_more_try(Placement& p) {
  if (p.tiers.spills()) return Next::next_step;
  return p.attempt == 0 ? Next::retry : Next::give_up;
}

// Harvesting, one round per attempt from here on (memory/harvester.hpp). Recall: the device's
// pages lent to quiescent borrowers come back (the borrowers' pages move to their own memory if
// it has room, else to the host). A round starts here: the deadline is set at the first, and the
// safe-point count is read before anything moves, so that one passed during the round counts.
Next recall_lent_pages(Placement& p) {
  if (!p.deadline) {
    p.deadline = std::chrono::steady_clock::now() + p.tiers.options().recall_wait;
  }
  p.safe_points_seen = p.tiers.safe_points();
  return p.harvester.recall(p.device, p.short_by) > 0 ? Next::retry : Next::next_step;
}

// Demote: pages of the device's quiescent jobs (other than the requester) go down a tier (peers,
// then host, by the spill policy).
Next demote_quiescent_jobs(Placement& p) {
  return p.harvester.demote_others(p.device, p.short_by, p.job) > 0 ? Next::retry : Next::next_step;
}

// Borrow: the allocation itself gets pages into the stash from the best lender with room, then
// the host; worth a try only once the stash covers what the last try lacked.
Next borrow_from_peers_or_host(Placement& p) {
  if (p.stash.size() < p.short_by &&
      p.tiers.borrow(p.device.device(), p.short_by - p.stash.size(), p.stash) > 0 &&
      p.stash.size() >= p.short_by) {
    return Next::retry;
  }
  return Next::next_step;
}

// Wait: the device's pages are out with running borrowers; they come back at their next safe
// point. Waits (until the deadline) for a safe point passed since this round started.
Next wait_for_safe_point(Placement& p) {
  if (p.device.pool().lent_bytes() == 0) return Next::give_up;
  return p.tiers.wait_safe_point(*p.deadline, p.safe_points_seen) ? Next::retry : Next::give_up;
}

struct Step {
  const char* name;  // for the reader (and a debugger): what the step tries
  Next (*run)(Placement&);
};

// The order of the fallbacks after a try of the stream heap came up short. The first that does
// not answer next_step decides: try again, or give up.
constexpr Step kSteps[] = {
    {"spare pages of other streams", spare_pages_of_other_streams},
    {"free blocks of other streams", free_blocks_of_other_streams},
    {"without other tiers, one more try", without_tiers_one_more_try},
    {"recall lent pages", recall_lent_pages},
    {"demote quiescent jobs", demote_quiescent_jobs},
    {"borrow from peers or the host", borrow_from_peers_or_host},
    {"wait for a safe point", wait_for_safe_point},
};

Next after_short_try(Placement& p) {
  for (const Step& step : kSteps) {
    if (const Next next = step.run(p); next != Next::next_step) return next;
  }
  return Next::give_up;  // not reached: the last step never passes
}

}  // namespace

DevicePtr MemoryManager::Impl::place(DeviceHeap& device, StreamHeap& heap,
                                     const AllocationRequest& request, std::size_t bytes,
                                     std::string& why_not) {
  std::vector<memory::Page> stash;
  struct GiveBack {
    memory::Tiers& tiers;
    int device;
    std::vector<memory::Page>& pages;
    ~GiveBack() { tiers.give_back(device, pages); }
  } give_back{tiers_, device.device(), stash};
  Placement p{.tiers = tiers_,
              .harvester = *harvester_,
              .device = device,
              .heap = heap,
              .job = request.job,
              .stash = stash,
              .fresh_chunks = device.heap_count() < 2};
  for (p.attempt = 0; p.attempt < kHarvestAttempts; ++p.attempt) {
    const memory::CarveResult r =
        heap.allocate(bytes, request.bytes, request.job, request.lifetime, stash, p.fresh_chunks);
    if (r.ptr != 0) return r.ptr;
    if (r.job_gone) return 0;  // leaves `why_not` empty: the caller tells the job it is gone
    if (r.out_of_address_space) {
      why_not = fmt::format("no free range of {} bytes in the stream's address space", bytes);
      device.counters().out_of_memory.fetch_add(1, std::memory_order_relaxed);
      return 0;
    }
    p.short_by = r.pages_short;
    const Next next = after_short_try(p);
    if (next == Next::give_up) break;
    if (next == Next::retry_uncounted) --p.attempt;  // the loop's ++ takes it back
  }
  why_not = fmt::format("device memory exhausted: {} more pages of {} bytes needed{}", p.short_by,
                        device.granularity(),
                        tiers_.spills() ? ", and no peer or host memory could take them" : "");
  device.counters().out_of_memory.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

}  // namespace salus
