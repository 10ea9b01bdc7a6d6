// The pages under a stream heap's free space, as a supply: where a block just carved gets the
// pages it lacks (gather), which free pages go to another user (reclaim), pages of other tiers
// going home once no live block touches them, and the heap's epochs of quiet free space. It owns
// the QuietEpochs, the count of iterations ended, and the blocks set aside because their
// addresses were still retiring (detours); the arenas, the page table and the live blocks are
// its heap's, which it is given by reference.
//
// Lock story: no lock of its own; its heap's mutex guards every call. It calls no other part
// that locks but the device's page pool and tiers (leaf locks, as the heap did).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "memory/arena.hpp"
#include "memory/heap_arenas.hpp"
#include "memory/heap_stream.hpp"
#include "memory/live_index.hpp"
#include "memory/page_pool.hpp"
#include "memory/page_table.hpp"
#include "memory/quiet_epochs.hpp"
#include "memory/tiers.hpp"

namespace salus::memory {

// What a supply uses of its heap and device: each part outlives it.
struct PageSupplyParts {
  HeapArenas& arenas;
  PageTable& table;
  const LiveIndex& live;
  const HeapStream& stream;
  PagePool& pool;  // PagePool, not PageSource: no virtual call on the allocation path
  Tiers& tiers;
  int device;
};

class PageSupply {
 public:
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
  // The fewest pages a new block must lack before it takes spare pages that queued work may
  // still touch (Take::spare_fenced; see take_spare). Measured on the traces of
  // benchmarks/traces with a GPU one iteration behind: 1 page made small CNN traces worse.
  static constexpr std::size_t kFencedMovePages = 8;

  explicit PageSupply(const PageSupplyParts& parts) : p_(parts) {}
  PageSupply(const PageSupply&) = delete;
  PageSupply& operator=(const PageSupply&) = delete;

  // The epoch frees belong to now (QuietEpochs::current).
  [[nodiscard]] std::uint64_t epoch() const { return epochs_.current(); }
  // Pages for the `missing` unmapped pages of [first, last) of a block just carved: the pool's
  // kept pages; without `fresh_chunks`, nothing more. Else this heap's own spare pages rather
  // than fresh chunks, except for addresses whose page went that way before (those get fresh
  // ones: hysteresis, so that a steady state maps nothing); then fresh chunks; then, when the
  // device is full, any free page of this heap; then `stash`. Returns how many are still
  // missing (what it gathered stays in `pages`).
  std::size_t gather(Arena& arena, std::size_t first, std::size_t last, std::size_t missing,
                     std::vector<Page>& pages, std::vector<Page>& stash, bool fresh_chunks);
  // Takes up to `wanted` pages lying wholly inside free blocks into `out`, handed off behind
  // `own` (or unmapped at once: Take::spare). `take` says which pages qualify. Returns how many.
  std::size_t reclaim(std::size_t wanted, std::vector<Page>& out, OwnFence& own, Take take);
  // Pages of other tiers still in free space (their return after a free failed) go home.
  void return_stray_remote_pages(OwnFence& own);
  // An iteration's end (StreamHeap::promote) ends the epoch (quiet_epochs.hpp) with a fence after
  // the stream's work so far, and so does an allocation short of quiet spare pages.
  void end_iteration();
  void end_epoch();

  // A free block of `bytes` in `arena`, preferring addresses that need not wait for retiring
  // pages (others are set aside: detours); nullptr when the arena has no room.
  Block* carve_in(Arena& arena, std::size_t bytes);
  // Whether some block is set aside.
  [[nodiscard]] bool has_detours() const { return !detours_.empty(); }
  // PageTable::settle_retiring, then set-aside blocks whose addresses have settled go back.
  void settle_retiring(bool wait);
  // At shutdown, once the stream's work is done: waits out the addresses still retiring and each
  // page's fence, unmaps every page and gives them back to their tiers.
  void unmap_all();
  // A block (live, or carved and never used) goes back to the free set; pages of other tiers
  // under it that no live block touches go home, fenced by this stream's work so far. Inline:
  // every free comes here, and while no page is borrowed that is all it does.
  void release_block(Block* block) {
    Arena& arena = p_.arenas.arena_of(*block);
    if (p_.table.remote_pages() == 0) {
      arena.release(block);
      return;
    }
    release_with_remote_pages(arena, block);
  }

 private:
  // Up to `wanted` of this heap's spare pages into `pages`, for a block that lacks `missing`.
  std::size_t take_spare(std::size_t wanted, std::size_t missing, std::vector<Page>& pages,
                         OwnFence& own);
  // Whether `free_block` is quiet (any free space is, while the stream is idle).
  [[nodiscard]] bool quiet(const Block& free_block, OwnFence& own);
  // release_block while some mapped page lives on another tier.
  void release_with_remote_pages(Arena& arena, Block* block);
  // Pages [first, last) of a block just released into `merged` that live on other tiers and that
  // no live block touches go home, fenced by this stream's work so far.
  void return_remote_pages(Arena& arena, std::size_t first, std::size_t last, const Block& merged);
  // Whether a live block touches page `index`; `from` is a block touching it.
  [[nodiscard]] bool live_touches(Arena& arena, std::size_t index, const Block& from) const;

  PageSupplyParts p_;
  QuietEpochs epochs_;                  // which free space no queued work can touch
  std::uint64_t iterations_ended_ = 0;  // end_iteration calls
  // Blocks set aside because their addresses were still retiring (see carve_in); neither free
  // nor live until those pages settle.
  std::vector<std::pair<Arena*, Block*>> detours_;
};

}  // namespace salus::memory
