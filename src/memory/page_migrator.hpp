// Moving pages between tiers behind fixed addresses (remap, demote, recall, fetch, prefetch) and
// the per-tier view of a job's blocks, for one stream heap. Lock story: no lock of its own. A
// PageMigrator is made for one call on a StreamHeap's state (HeapView) while the caller holds
// that heap's mutex, and keeps nothing between calls.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "memory/arena.hpp"
#include "memory/job_ledger.hpp"
#include "memory/live_index.hpp"
#include "memory/page_mover.hpp"
#include "memory/tiers.hpp"
#include "salus/device.hpp"
#include "salus/memory.hpp"

namespace salus::memory {

class JobTable;
struct DeviceCounters;

// What a migrator uses of its device, for one call: each part is the DeviceHeap's.
struct MigratorDevice {
  const std::shared_ptr<DeviceBackend>& backend;
  DeviceCounters& counters;
  Tiers& tiers;
  JobTable& jobs;  // the streams each job uses
  PageMover& mover;
  const AccessGrants& grants;
  int device;
  std::size_t page_bytes;
  std::size_t limit_bytes;
};

// Which pages a move takes: those living where `from` says, under live blocks (of `job` only,
// when set) whose every owner `gate` lets move.
struct MoveSpec {
  MoveReason reason = MoveReason::demote;
  std::function<bool(Location)> from;
  std::optional<JobId> job;
};

// A stream heap's state as its migrator sees it; valid while the heap's mutex is held.
struct HeapView {
  MigratorDevice device;
  StreamHandle stream;           // the heap's stream (StreamHeap::kRetiredStream once retired)
  const FencePtr& retire_fence;  // the retired stream's work up to retire()
  const ArenaSet& arenas;
  const LiveIndex& live;
  const JobLedger& ledger;
  std::size_t& remote_pages;  // mapped pages that live on another tier
};

class PageMigrator {
 public:
  explicit PageMigrator(const HeapView& heap) : heap_(heap) {}

  // Moves the pages of the live block `block` that are not at `where` there; `streams`: every
  // stream that may use the block, its heap's own included.
  void remap(const Block& block, Location where, std::span<const StreamHandle> streams);
  // Moves up to destinations.size() pages onto `destinations`, used in the order given (callers
  // put the best first; what is left over stays theirs); the old pages go home through the tiers.
  // Returns how many moved; `owners`, when given, gets the jobs whose pages moved.
  std::size_t move_pages(const MoveSpec& spec, std::vector<Page>& destinations, JobGate& gate,
                         std::vector<JobId>* owners);
  // Pages `move_pages(spec)` would consider: whatever the gate says when `gate` is null, else only
  // those whose owners the gate lets move now.
  std::size_t count_pages(const MoveSpec& spec, JobGate* gate);
  // Live bytes of `job` by the tier of the pages under them.
  void add_tier_usage(JobId job, std::size_t (&bytes)[kTierCount]);

 private:
  // Runs `moves` on the device's mover after `after`, then settles counters, reports the round
  // and sends the old pages home. Moves that failed give their new pages back; rethrows.
  void run_moves(MoveReason reason, std::vector<PageMove>& moves,
                 std::span<const std::shared_ptr<const Event>> after);
  // Events after the work so far on `streams`.
  std::vector<std::shared_ptr<const Event>> marks_now(std::span<const StreamHandle> streams);
  // Visits the pages under live blocks (of one job, or all): visit(arena, index, block). A page
  // shared by two blocks may be visited twice.
  template <class F>
  void for_each_live_page(std::optional<JobId> job, F&& visit);
  // True when `gate` lets the owner of every live block touching page `index` of `arena` move.
  // With `hold`, holds each owner it lets through (listed in `held`); without, only asks.
  // `touches_free`, when given, is set when free space shares the page.
  bool owners_allow(Arena& arena, std::size_t index, const Block& start, JobGate& gate, bool hold,
                    std::vector<JobId>& held, bool* touches_free = nullptr);
  // What a move of `moves` (pages of the `held` jobs) must wait for: see move_pages.
  std::vector<std::shared_ptr<const Event>> move_marks(const std::vector<PageMove>& moves,
                                                       const std::vector<JobId>& held,
                                                       JobGate& gate, bool touches_free);

  HeapView heap_;
};

}  // namespace salus::memory
