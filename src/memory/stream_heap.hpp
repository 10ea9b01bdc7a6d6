// The blocks of one stream on one device. Blocks freed here are reused here at once (stream order
// makes that safe; blocks that other streams used wait for those on the GPU). Other streams get
// this heap's memory page by page (DeviceHeap::reclaim_from_others), fenced by the work enqueued
// here: they wait for it on the GPU, and the page stays mapped at its old address until that
// work has finished, so nothing queued here ever touches an unmapped page (PageTable::hand_off).
// Lock story: one mutex (mu_) guards the heap and the parts it is made of, which have no lock of
// their own: its HeapStream, HeapArenas, the PageTable under them, the PageSupply, the JobLedger,
// and the PageMigrator's HeapView made per call. stream(), contains() and range_count() take no
// lock (HeapStream and HeapArenas' AddressRanges are written under mu_ and read by anyone).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "memory/arena.hpp"
#include "memory/heap_arenas.hpp"
#include "memory/heap_stream.hpp"
#include "memory/heap_tally.hpp"
#include "memory/job_ledger.hpp"
#include "memory/live_index.hpp"
#include "memory/page_migrator.hpp"
#include "memory/page_mover.hpp"
#include "memory/page_source.hpp"
#include "memory/page_supply.hpp"
#include "memory/page_table.hpp"
#include "memory/tiers.hpp"
#include "salus/device.hpp"
#include "salus/memory.hpp"

namespace salus::memory {

class DeviceHeap;

struct JobRecord;

// What a free or release took back, for the job's accounting.
struct FreedBlock {
  JobId job;
  Lifetime lifetime;
  std::size_t bytes;
  JobRecord* record;  // the job's record in the JobTable (never null)
};

struct CarveResult {
  DevicePtr ptr = 0;            // non-zero on success
  std::size_t pages_short = 0;  // pages the device could not provide
  bool out_of_address_space = false;
  // The job was released or orphaned meanwhile: nothing was linked to it (nothing to roll back).
  bool job_gone = false;
};

class StreamHeap {
 public:
  // Requests up to this size share pages in arenas of their own (HeapArenas::place).
  static constexpr std::size_t kSmallRequest = HeapArenas::kSmallRequest;

  // `small_bytes` and `large_bytes`: the first address range of each class (HeapArenas).
  StreamHeap(DeviceHeap& device, StreamHandle stream, std::size_t small_bytes,
             std::size_t large_bytes);
  ~StreamHeap();
  StreamHeap(const StreamHeap&) = delete;
  StreamHeap& operator=(const StreamHeap&) = delete;

  // What stream() says once the heap is retired: no stream's handle, so lookups skip it, and
  // marks_now takes the retire fence for it instead of recording on a destroyed stream.
  static constexpr std::uint64_t kRetiredStream = HeapStream::kRetired;

  // The device whose memory this heap carves.
  [[nodiscard]] int device() const;
  // Lock-free: a retired heap may be re-bound to a new stream (rebind).
  [[nodiscard]] StreamHandle stream() const { return stream_.stream(); }
  // Lock-free: whether `p` lies in one of this heap's address ranges.
  [[nodiscard]] bool contains(DevicePtr p) const { return arenas_.contains(p); }
  // Address ranges reserved so far (both classes).
  [[nodiscard]] std::size_t range_count() const { return arenas_.count(); }

  // Pages come from the device pool, this heap's own free pages, then `stash` (pages the caller
  // gathered from other tiers); what is left of `stash` stays the caller's. Without
  // `fresh_chunks`, a block that would need a fresh chunk fails short instead (the caller first
  // takes other streams' spare pages).
  CarveResult allocate(std::size_t bytes, std::size_t requested, JobId job, Lifetime lifetime,
                       std::vector<Page>& stash, bool fresh_chunks = true);
  // Throws InvalidArgument when `ptr` is not a live block start, or its size disagrees.
  // With `job`, also throws when the block is not that job's.
  FreedBlock deallocate(DevicePtr ptr, std::optional<std::size_t> caller_bytes,
                        std::optional<JobId> job = std::nullopt);
  void record_stream_use(DevicePtr ptr, StreamHandle other);

  // The stream is about to be destroyed: fences its work so far, hands its free pages to the
  // pool behind that fence and marks the heap retired (live blocks stay; when freed, their pages
  // follow). Returns the fence (null when the stream was idle). A second call returns null.
  FencePtr retire();
  // Binds a retired heap with no live block and no page still retiring to `stream`; false when
  // it is not ready.
  bool rebind(StreamHandle stream);
  // `stream` is retired: live blocks that name it, or whose job worked on it (`jobs`), wait for
  // its fence (`fence()`, asked only when some block needs it) from now on instead.
  void forget_stream(StreamHandle stream, const std::function<const FencePtr&()>& fence,
                     std::span<const JobId> jobs);
  // The retire fence of a retired heap (null when live, or nothing is pending).
  [[nodiscard]] FencePtr retire_fence();
  // Frees every live block of `job`; reports each through `on_free`.
  template <class F>
  void release_job(JobId job, F&& on_free);
  // Hands the job's live blocks to the unattributed job as persistent blocks (they stay valid;
  // their holder frees them later); reports each block's old class and size through `on_move`.
  template <class F>
  void orphan_job(JobId job, F&& on_move);
  // Moves the job's live ephemeral blocks to persistent; returns {bytes, blocks}. An iteration of
  // the job ended: so does this heap's epoch, when the job has blocks here (see end_epoch).
  std::pair<std::size_t, std::size_t> promote(JobId job);
  [[nodiscard]] std::optional<BlockInfo> find(DevicePtr ptr);
  // Which free pages reclaiming takes.
  using Take = PageSupply::Take;
  // Takes up to `wanted` pages lying wholly inside free blocks and gives them to the pool, fenced
  // by an event after this stream's work so far: whoever takes them waits on the GPU, not here.
  // `take` says which pages qualify. Returns how many.
  std::size_t reclaim_pages(std::size_t wanted, Take take = Take::any);
  // Unmaps the old addresses of pages handed off earlier whose work has finished; with `wait`,
  // waits for that work first, so that none is left.
  void settle(bool wait);
  void remap(DevicePtr ptr, Location where);

  // Page moves: see PageMigrator, which does them under this heap's lock.
  using MoveSpec = memory::MoveSpec;
  std::size_t move_pages(const MoveSpec& spec, std::vector<Page>& destinations, JobGate& gate,
                         std::vector<JobId>* owners = nullptr);
  std::size_t count_pages(const MoveSpec& spec, JobGate* gate = nullptr);
  [[nodiscard]] bool has_job(JobId job);
  void add_tier_usage(JobId job, std::size_t (&bytes)[kTierCount]);
  // Operation and block counts, kept under this heap's lock.
  using Tally = HeapTally;
  [[nodiscard]] Tally tally();
  // Live bytes and blocks of `job` here, by class.
  using JobUsage = memory::JobUsage;
  [[nodiscard]] JobUsage job_usage(JobId job);

 private:
  // This heap's state for its PageMigrator; mu_ must be held while it is used.
  HeapView view();
  Block* live_block(DevicePtr ptr, const char* what);
  // Makes a live block the unattributed job's, persistent; returns its old class. The streams
  // its job worked on stay on the block: its free fences them as the job's own free would.
  Lifetime disown(Block* block);
  FreedBlock free_block(Block* block);
  // Gathers and maps the `missing` pages of a block just carved, [first, last) of `arena`.
  // Returns how many it could not get; then the block and the pages gathered (`pages`) go back.
  std::size_t map_missing(Arena& arena, Block* block, std::size_t first, std::size_t last,
                          std::size_t missing, std::vector<Page>& pages, std::vector<Page>& stash,
                          bool fresh_chunks);
  // allocate found `job` gone (released or orphaned meanwhile): the block goes back unlinked.
  CarveResult drop_for_gone_job(JobBlocks& owner, JobId job, Block* block);
  // Other streams that may use `block`: those recorded on it and the streams its job works on.
  void streams_using(const Block& block, std::vector<StreamHandle>& out) const;
  // A retired heap keeps no free pages: they go to the pool behind the retire fence.
  void drain_retired();

  DeviceHeap& device_;
  std::mutex mu_;      // guards everything below
  HeapStream stream_;  // the stream served, or retired; stream() reads it without mu_
  HeapArenas arenas_;  // the address ranges; contains() reads them without mu_
  Tally tally_;
  LiveIndex live_;    // entries inline: no trip to malloc on the hot path
  PageTable table_;   // the pages under arenas_
  JobLedger ledger_;  // each job's live blocks here
  PageSupply pages_;  // pages for new blocks, and free ones for others
};

template <class F>
void StreamHeap::release_job(JobId job, F&& on_free) {
  std::lock_guard lock(mu_);
  // Remote pages under each block go home.
  ledger_.drain_job(job, [&](Block* b) { on_free(free_block(b)); });
}

template <class F>
void StreamHeap::orphan_job(JobId job, F&& on_move) {
  // link() may add the unattributed job's node while drain_job walks this job's lists: a rehash
  // moves no node, so the lists it walks stay put.
  std::lock_guard lock(mu_);
  ledger_.drain_job(job, [&](Block* b) {
    const std::size_t bytes = b->size;
    on_move(disown(b), bytes);
  });
}

}  // namespace salus::memory
