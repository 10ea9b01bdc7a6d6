// The blocks of one stream on one device. Blocks freed here are reused here at once (stream order
// makes that safe; blocks that other streams used wait for those on the GPU). Other streams get
// this heap's memory page by page (DeviceHeap::reclaim_from_others), fenced by the work enqueued
// here: they wait for it on the GPU, and the page stays mapped at its old address until that
// work has finished, so nothing queued here ever touches an unmapped page (PageTable::hand_off).
// Lock story: one mutex (mu_) guards the heap and the parts it is made of, which have no lock of
// their own: the arenas, the PageTable under them, the JobLedger, the QuietEpochs, and the
// PageMigrator's HeapView made per call. stream(), contains() and range_count() take no lock
// (AddressRanges is written under mu_ and read by anyone).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "memory/address_ranges.hpp"
#include "memory/arena.hpp"
#include "memory/job_ledger.hpp"
#include "memory/live_index.hpp"
#include "memory/page_migrator.hpp"
#include "memory/page_mover.hpp"
#include "memory/page_source.hpp"
#include "memory/page_table.hpp"
#include "memory/quiet_epochs.hpp"
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
  // Requests up to this size share pages in arenas of their own, so that small long-lived blocks
  // do not pin pages among large ones; except that one that would need a fresh chunk goes on
  // pages the large class has mapped and left free, if any (see place).
  static constexpr std::size_t kSmallRequest = 1 << 20;

  // `small_bytes` and `large_bytes`: the first address range of each class. A class whose ranges
  // have no room left for a request gets another range (see grow), so address space never
  // decides whether an allocation fits: only physical pages do (DESIGN.md, invariant 6).
  StreamHeap(DeviceHeap& device, StreamHandle stream, std::size_t small_bytes,
             std::size_t large_bytes);
  ~StreamHeap();
  StreamHeap(const StreamHeap&) = delete;
  StreamHeap& operator=(const StreamHeap&) = delete;

  // What stream() says once the heap is retired: no stream's handle, so lookups skip it, and
  // marks_now takes the retire fence for it instead of recording on a destroyed stream.
  static constexpr std::uint64_t kRetiredStream = ~std::uint64_t{0};

  // The device whose memory this heap carves.
  [[nodiscard]] int device() const;
  // Lock-free: a retired heap may be re-bound to a new stream (rebind).
  [[nodiscard]] StreamHandle stream() const {
    return StreamHandle{stream_.load(std::memory_order_acquire)};
  }
  // Lock-free: whether `p` lies in one of this heap's address ranges.
  [[nodiscard]] bool contains(DevicePtr p) const { return ranges_.contains(p); }
  // Address ranges reserved so far (both classes).
  [[nodiscard]] std::size_t range_count() const { return ranges_.count(); }

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
  enum class Take : std::uint8_t {
    any,   // every page wholly in free space (for another user, or memory is short)
    idle,  // only those that nothing may still touch
    // Spare pages, for a new block instead of a fresh chunk: only quiet ones (unmapped at once,
    // so no address is left retiring) and never from an address that gave its page that way
    // before (Arena::gave_spare).
    spare,
    // As spare, also pages that queued work may still touch: handed off behind a fence, their
    // old address kept mapped until it completes (PageTable::hand_off). For this heap's own new
    // blocks only.
    spare_fenced,
  };
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
  struct Tally {
    std::uint64_t allocations = 0;
    std::uint64_t frees = 0;
    std::size_t blocks[kLifetimeCount] = {};
    Tally& operator+=(const Tally& other);
  };
  [[nodiscard]] Tally tally();
  // Live bytes and blocks of `job` here, by class.
  using JobUsage = memory::JobUsage;
  [[nodiscard]] JobUsage job_usage(JobId job);

 private:
  enum SizeClass : std::size_t { kSmall = 0, kLarge = 1 };
  // The fewest pages a new block must lack before it takes spare pages that queued work may
  // still touch (Take::spare_fenced; see gather_pages). Measured on the traces of
  // benchmarks/traces with a GPU one iteration behind: 1 page made small CNN traces worse.
  static constexpr std::size_t kFencedMovePages = 8;
  static SizeClass class_of(std::size_t bytes) { return bytes <= kSmallRequest ? kSmall : kLarge; }
  Arena& arena_of(const Block& block) { return memory::arena_of(arenas_, block); }
  // This heap's state for its PageMigrator; mu_ must be held while it is used.
  HeapView view();
  // Every arena, large ones first (the order reclaiming takes pages in).
  template <class F>
  void for_each_arena(F&& visit) {
    for (SizeClass c : {kLarge, kSmall}) {
      for (const auto& arena : arenas_[c]) visit(*arena);
    }
  }
  // A new address range for `c`, large enough for `bytes`; nullptr when the backend refuses one
  // or the heap has AddressRanges::kMax already.
  Arena* grow(SizeClass c, std::size_t bytes);
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
  // Where a new block of `bytes` goes (`where` says which arena): carve's choice, unless it is
  // small, its page would come from a fresh chunk and the large class has free space on mapped
  // pages that holds it. nullptr when no address range can be had at all.
  Block* place(std::size_t bytes, Arena*& where);
  // A spot for a small block on the large class's mapped free pages; nullptr when none.
  Block* overflow(std::size_t bytes, Arena*& where);
  // A free block of `bytes` in an arena of its class (`where` says which), growing the class by a
  // range when none has room; nullptr when no address range can be had at all. `cost` gets what
  // it costs there (Arena::cost).
  Block* carve(std::size_t bytes, Arena*& where, std::size_t& cost);
  // A free block of `bytes` in `arena`, preferring addresses that need not wait for retiring
  // pages; nullptr when the arena has no room.
  Block* carve_in(Arena& arena, std::size_t bytes, std::size_t& cost);
  // A fence after this stream's work so far (null when it has none), made once per call site
  // that needs one.
  class OwnFence {
   public:
    explicit OwnFence(StreamHeap& heap) : heap_(heap) {}
    const FencePtr& get();

   private:
    StreamHeap& heap_;
    FencePtr fence_;  // null when the stream was idle
    bool asked_ = false;
  };
  std::size_t reclaim_locked(std::size_t wanted, std::vector<Page>& out, OwnFence& own, Take take);
  // An iteration's end (promote) ends the heap's epoch (quiet_epochs.hpp) with a fence after the
  // stream's work so far, and so does an allocation short of quiet spare pages.
  void end_epoch();
  // Whether `free_block` is quiet (any free space is, while the stream is idle).
  [[nodiscard]] bool quiet(const Block& free_block, OwnFence& own);
  // Pages for the `missing` unmapped pages of [first, last) of a block just carved: the pool's
  // kept pages; without `fresh_chunks`, nothing more. Else this heap's own spare pages rather
  // than fresh chunks, except for addresses whose page went that way before (those get fresh
  // ones: hysteresis, so that a steady state maps nothing); then fresh chunks; then, when the
  // device is full, any free page of this heap; then `stash`. Returns how many are still
  // missing (what it gathered stays in `pages`).
  std::size_t gather_pages(Arena& arena, std::size_t first, std::size_t last, std::size_t missing,
                           std::vector<Page>& pages, std::vector<Page>& stash, bool fresh_chunks);
  // Up to `wanted` of this heap's spare pages into `pages`, for a block that lacks `missing`.
  std::size_t take_spare(std::size_t wanted, std::size_t missing, std::vector<Page>& pages,
                         OwnFence& own);
  // table_.settle_retiring, then set-aside blocks whose addresses have settled go back.
  void settle_retiring(bool wait);
  // Pages [first, last) of a block just released into `merged` that live on other tiers and that
  // no live block touches go home, fenced by this stream's work so far.
  void return_remote_pages(Arena& arena, std::size_t first, std::size_t last, const Block& merged);
  // Pages of other tiers still in free space (their return after a free failed) go home.
  void return_stray_remote_pages(OwnFence& own);
  // Whether a live block touches page `index`; `from` is a block touching it.
  [[nodiscard]] bool live_touches(Arena& arena, std::size_t index, const Block& from) const;
  // Other streams that may use `block`: those recorded on it and the streams its job works on.
  void streams_using(const Block& block, std::vector<StreamHandle>& out) const;
  void release_block(Block* block);
  // A retired heap keeps no free pages: they go to the pool behind the retire fence.
  void drain_retired();

  DeviceHeap& device_;
  std::atomic<std::uint64_t> stream_;  // written under mu_ (retire, rebind)
  std::mutex mu_;                      // guards everything below
  bool retired_ = false;
  FencePtr retire_fence_;  // the retired stream's work up to retire()
  // The arenas of each class, oldest first; each is one reserved address range, kept until the
  // heap goes, and published in ranges_ for contains(), which takes no lock.
  ArenaSet arenas_;
  std::size_t first_bytes_[2];
  AddressRanges ranges_;
  Tally tally_;
  LiveIndex live_;                      // entries inline: no trip to malloc on the hot path
  PageTable table_;                     // the pages under arenas_
  JobLedger ledger_;                    // each job's live blocks here
  QuietEpochs epochs_;                  // which free space no queued work can touch
  std::uint64_t iterations_ended_ = 0;  // promote calls that found the job here
  // Blocks set aside because their addresses were still retiring (see carve); neither free nor
  // live until those pages settle.
  std::vector<std::pair<Arena*, Block*>> detours_;
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
