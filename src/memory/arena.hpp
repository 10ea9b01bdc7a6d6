// One reserved virtual range carved into blocks, best-fit with coalescing, plus the page table
// that says which of its pages are backed by physical memory. No locking and no device calls:
// the owning StreamHeap does both.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <memory_resource>
#include <set>
#include <utility>
#include <vector>

#include "memory/fence.hpp"
#include "salus/device.hpp"
#include "salus/memory.hpp"

namespace salus::memory {

struct JobBlocks;  // a stream heap's per-job lists (job_ledger.hpp)

struct Block {
  DevicePtr addr = 0;
  std::size_t size = 0;
  Block* prev = nullptr;  // address-order neighbours within the arena, free or live
  Block* next = nullptr;
  bool free = true;
  // Meaningful while free: the heap's epoch (PageSupply::end_epoch) of the newest free merged
  // into it. Work enqueued before the end of that epoch may still touch it.
  std::uint64_t freed_epoch = 0;

  // Meaningful while live.
  std::size_t requested = 0;
  JobId job{};
  Lifetime lifetime = Lifetime::persistent;
  Block* job_prev = nullptr;  // the owner's intrusive list of its live blocks of one class
  Block* job_next = nullptr;
  JobBlocks* owner = nullptr;  // the lists job_prev/job_next belong to
  std::vector<StreamHandle> other_streams;  // record_stream_use
  // Work of streams retired while the block was live (streams recorded on it, or its job's): on
  // free, its reuse waits for this instead of recording on a destroyed stream.
  FencePtr fence;

  [[nodiscard]] DevicePtr end() const { return addr + size; }
};

// A physical page as mapped into an arena.
struct PageSlot {
  ChunkHandle chunk{};
  Location where{};
  bool mapped = false;
  // Mapped, but no longer this arena's: the page went to a new user while work enqueued here may
  // still touch it, so the address keeps it until `fence` completes and is unmapped then.
  bool retiring = false;
  // Work that may still touch the page besides this stream's own (blocks freed here that other
  // streams used; or, when retiring, everything the page waits for): whoever reuses, moves or
  // hands off the page orders itself after it.
  FencePtr fence;

  [[nodiscard]] bool owned() const { return mapped && !retiring; }
};

class Arena {
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->addr < b->addr;
    }
  };
  using FreeSet = std::pmr::set<Block*, BySizeThenAddress>;

 public:
  Arena(DevicePtr base, std::size_t bytes, std::size_t page_bytes);
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  [[nodiscard]] DevicePtr base() const { return base_; }
  [[nodiscard]] std::size_t bytes() const { return bytes_; }
  [[nodiscard]] std::size_t page_bytes() const { return page_bytes_; }
  [[nodiscard]] bool contains(DevicePtr p) const { return p >= base_ && p < base_ + bytes_; }

  // Where in a free block to cut `size` bytes from, and what they cost there (see cost()).
  struct Spot {
    Block* block = nullptr;  // free; nullptr when no free block is large enough
    DevicePtr addr = 0;      // within `block`: its start unless that would touch retiring pages
    std::size_t cost = 0;
    FreeSet::const_iterator at;  // `block` in the free set, valid until the arena changes
  };
  // Where `size` bytes go. Pages, not addresses, are what a block costs: the best fit (smallest
  // free block, then lowest address) when its front needs no page, which is the steady state
  // and costs one lookup; else the free block whose front costs least (the best fit among
  // those). With `mapped_only`, only a spot that maps nothing (else block is nullptr).
  [[nodiscard]] Spot cheapest(std::size_t size, bool mapped_only = false) const;
  // Cuts `size` bytes at `spot` (from cheapest, the arena unchanged since) out of its free
  // block and marks them live.
  Block* carve_from(const Spot& spot, std::size_t size);
  // carve_from(cheapest(size)); nullptr when no free block is large enough. `cost`, when given,
  // gets the spot's cost.
  Block* carve(std::size_t size, std::size_t* cost = nullptr);
  // Marks a live block free and merges it with free neighbours; returns the merged block, whose
  // freed_epoch is the current epoch, or with `used` false (a block carved and given back before
  // anything used it) the newest of its parts'.
  Block* release(Block* block, bool used = true);
  // The epoch that frees from now on belong to (see Block::freed_epoch).
  void set_epoch(std::uint64_t epoch) { epoch_ = epoch; }

  // Pages [first, last) that `block` touches, and those entirely inside it.
  [[nodiscard]] std::pair<std::size_t, std::size_t> pages_touched(const Block& block) const;
  [[nodiscard]] std::pair<std::size_t, std::size_t> pages_inside(const Block& block) const;
  [[nodiscard]] DevicePtr page_addr(std::size_t index) const { return base_ + index * page_bytes_; }
  [[nodiscard]] PageSlot& page(std::size_t index) { return pages_[index]; }
  [[nodiscard]] std::size_t page_count() const { return pages_.size(); }
  // Pages in [addr, addr + size) that are not owned (a block there would map them).
  [[nodiscard]] std::size_t unmapped_pages(DevicePtr addr, std::size_t size) const;
  // What a block at [addr, addr + size) costs: a unit per page to map, and far more per page
  // still retiring (mapping it waits on the host); counted up to `stop` at most.
  [[nodiscard]] std::size_t cost(DevicePtr addr, std::size_t size,
                                 std::size_t stop = std::numeric_limits<std::size_t>::max()) const;
  // Whether page `index` once gave its page to another address of its own heap instead of a
  // fresh chunk being made (PageSupply::gather). Such an address is never stripped that way
  // again, and gets a fresh page when it needs one: an address that keeps needing its page back
  // would otherwise trade it back and forth every iteration.
  [[nodiscard]] bool gave_spare(std::size_t index) const { return gave_spare_[index]; }
  // One past the highest page ever mapped here (a high-water mark): no page at or above it is
  // mapped, so a walk for mapped pages stops there instead of crossing the (generous) unused
  // address space. PageTable notes every page it maps (a page move remaps a mapped page).
  void note_mapped(std::size_t index) { mapped_high_ = std::max(mapped_high_, index + 1); }
  [[nodiscard]] std::size_t mapped_high() const { return mapped_high_; }
  void mark_gave_spare(std::size_t index) { gave_spare_[index] = true; }

  // Free blocks that may hold a whole page (a page long or more), largest first, for reclaiming
  // their pages; `visit` returns false to stop. The many small free blocks of a heap are never
  // visited: the walk ends at the first one shorter than a page.
  template <class F>
  void for_each_free_holding_pages(F&& visit) const {
    for (auto it = free_.rbegin(); it != free_.rend() && (*it)->size >= page_bytes_; ++it) {
      if (!visit(**it)) return;
    }
  }

 private:
  // cheapest() when the best fit at `it` would map pages: the scan for a cheaper spot.
  [[gnu::noinline]] Spot cheaper(FreeSet::const_iterator it, std::size_t size,
                                 bool mapped_only) const;
  // The cheapest place for `size` bytes in `free_block`, counting cost up to `stop`.
  [[nodiscard]] Spot spot_in(Block* free_block, std::size_t size,
                             std::size_t stop = std::numeric_limits<std::size_t>::max()) const;
  // Marks `size` bytes at `spot` live (its block out of the free set); the rest stays free.
  Block* cut_at(const Spot& spot, std::size_t size);
  // Marks the first `size` bytes of `block` (out of the free set) live; the rest stays free.
  Block* cut(Block* block, std::size_t size);
  Block* new_block();
  void recycle(Block* block);
  // The free set's insert and erase recycle one tree node through `spare_node_`, so that the
  // steady state of carve and release makes no call to the node allocator.
  void insert_free(Block* block);
  void erase_free(Block* block);

  DevicePtr base_;
  std::size_t bytes_;
  std::size_t page_bytes_;
  // log2(page_bytes_) when it is a power of two (it is on every GPU so far), else -1: page
  // indices on the hot path are then shifts, not 64-bit divisions.
  int page_shift_;
  [[nodiscard]] std::size_t pages_in(std::size_t bytes) const {
    return page_shift_ >= 0 ? bytes >> page_shift_ : bytes / page_bytes_;
  }
  std::deque<Block> storage_;  // owns every Block; a deque never moves its elements
  std::vector<Block*> spare_;  // recycled storage
  std::pmr::unsynchronized_pool_resource node_pool_;  // tree nodes, recycled without malloc
  FreeSet free_{&node_pool_};
  FreeSet::node_type spare_node_;  // see insert_free
  std::vector<PageSlot> pages_;
  std::vector<bool> gave_spare_;  // by page, see gave_spare()
  std::size_t mapped_high_ = 0;   // see mapped_high()
  std::uint64_t epoch_ = 1;       // see set_epoch
};

// A stream heap's arenas by size class (small, large), each class oldest first.
using ArenaSet = std::array<std::vector<std::unique_ptr<Arena>>, 2>;

[[noreturn]] void throw_no_arena(const Block& block);

// The arena of `arenas` that holds `block`; throws InvalidArgument when none does. Inline: the
// free path asks it.
inline Arena& arena_of(const ArenaSet& arenas, const Block& block) {
  for (const auto& list : arenas) {
    for (const auto& arena : list) {
      if (arena->contains(block.addr)) return *arena;
    }
  }
  throw_no_arena(block);
}

}  // namespace salus::memory
