#include "memory/arena.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cassert>

#include "salus/error.hpp"

namespace salus::memory {

Arena::Arena(DevicePtr base, std::size_t bytes, std::size_t page_bytes)
    : base_(base),
      bytes_(bytes),
      page_bytes_(page_bytes),
      page_shift_(std::has_single_bit(page_bytes) ? std::countr_zero(page_bytes) : -1),
      pages_(bytes / page_bytes),
      gave_spare_(bytes / page_bytes, false) {
  Block* all = new_block();
  all->addr = base;
  all->size = bytes;
  free_.insert(all);
}

Block* Arena::new_block() {
  if (!spare_.empty()) {
    Block* b = spare_.back();
    spare_.pop_back();
    return b;
  }
  return &storage_.emplace_back();
}

void Arena::recycle(Block* block) {
  *block = Block{};
  spare_.push_back(block);
}

void Arena::insert_free(Block* block) {
  if (spare_node_.empty()) {
    free_.insert(block);
    return;
  }
  spare_node_.value() = block;
  free_.insert(std::move(spare_node_));  // leaves spare_node_ empty
}

void Arena::erase_free(Block* block) {
  // The key is looked up with the block's current size: callers erase before resizing.
  spare_node_ = free_.extract(block);
}

std::size_t Arena::unmapped_pages(DevicePtr addr, std::size_t size) const {
  const std::size_t first = pages_in(addr - base_);
  const std::size_t last = pages_in(addr + size - base_ + page_bytes_ - 1);
  std::size_t unmapped = 0;
  for (std::size_t i = first; i < last; ++i) {
    if (!pages_[i].owned()) ++unmapped;
  }
  return unmapped;
}

namespace {
// The cost of a page still retiring: mapped for work queued before its page went to another
// address, it can be mapped again only once that work has finished, so an allocation there
// would wait on the host. Any other spot is better.
constexpr std::size_t kRetiring = std::size_t{1} << 32;
}  // namespace

std::size_t Arena::cost(DevicePtr addr, std::size_t size, std::size_t stop) const {
  const std::size_t first = pages_in(addr - base_);
  const std::size_t last = pages_in(addr + size - base_ + page_bytes_ - 1);
  std::size_t cost = 0;
  for (std::size_t i = first; i < last && cost < stop; ++i) {
    if (pages_[i].retiring) {
      cost += kRetiring;
    } else if (!pages_[i].mapped) {
      ++cost;
    }
  }
  return cost;
}

Arena::Spot Arena::spot_in(Block* free_block, std::size_t size, std::size_t stop) const {
  Spot spot{free_block, free_block->addr, cost(free_block->addr, size, stop), {}};
  // Addresses are plentiful, waiting is not: past the retiring pages, if the block reaches.
  while (spot.cost >= kRetiring) {
    const std::size_t first = pages_in(spot.addr - base_);
    std::size_t after = pages_in(spot.addr + size - base_ + page_bytes_ - 1);
    while (after > first && !pages_[after - 1].retiring) --after;
    const DevicePtr next = page_addr(after);
    if (next + size > free_block->end()) break;
    spot.addr = next;
    spot.cost = cost(next, size, stop);
  }
  return spot;
}

Arena::Spot Arena::cheapest(std::size_t size, bool mapped_only) const {
  Block probe;
  probe.size = size;
  probe.addr = 0;
  const auto it = free_.lower_bound(&probe);
  if (it == free_.end()) return {};
  // The steady state: the best fit's front lies on pages this arena owns.
  const DevicePtr addr = (*it)->addr;
  const std::size_t first = pages_in(addr - base_);
  const std::size_t last = pages_in(addr + size - base_ + page_bytes_ - 1);
  std::size_t i = first;
  while (i < last && pages_[i].owned()) ++i;
  if (i == last) return {*it, addr, 0, it};
  return cheaper(it, size, mapped_only);
}

Arena::Spot Arena::cheaper(FreeSet::const_iterator it, std::size_t size, bool mapped_only) const {
  Spot best = spot_in(*it, size);
  best.at = it;
  // The best fit would map pages. Another free block may hold `size` bytes on pages already
  // mapped (freed blocks of other sizes), or on fewer new ones: a training loop's steady state
  // then maps nothing, and pages mapped once are not left idle while others are mapped. The
  // scan costs little next to the driver calls it saves.
  for (++it; it != free_.end() && best.cost > 0; ++it) {
    if (Spot spot = spot_in(*it, size, best.cost); spot.cost < best.cost) {
      best = spot;
      best.at = it;
    }
  }
  if (mapped_only && best.cost > 0) return {};
  return best;
}

Block* Arena::carve(std::size_t size, std::size_t* cost) {
  const Spot spot = cheapest(size);
  if (spot.block == nullptr) return nullptr;
  if (cost != nullptr) *cost = spot.cost;
  return carve_from(spot, size);
}

Block* Arena::carve_from(const Spot& spot, std::size_t size) {
  assert(spot.block->free && spot.addr + size <= spot.block->end() && *spot.at == spot.block);
  spare_node_ = free_.extract(spot.at);
  return cut_at(spot, size);
}

Block* Arena::cut_at(const Spot& spot, std::size_t size) {
  Block* block = spot.block;
  if (spot.addr > block->addr) {
    // The part before the spot stays free.
    Block* front = new_block();
    front->addr = block->addr;
    front->size = spot.addr - block->addr;
    front->freed_epoch = block->freed_epoch;
    front->prev = block->prev;
    if (front->prev) front->prev->next = front;
    front->next = block;
    block->prev = front;
    block->addr = spot.addr;
    block->size -= front->size;
    insert_free(front);
  }
  return cut(block, size);
}

Block* Arena::cut(Block* block, std::size_t size) {
  if (block->size > size) {
    // The remainder stays free right after the carved block.
    Block* rest = new_block();
    rest->addr = block->addr + size;
    rest->size = block->size - size;
    rest->freed_epoch = block->freed_epoch;
    rest->prev = block;
    rest->next = block->next;
    if (rest->next) rest->next->prev = rest;
    block->next = rest;
    block->size = size;
    insert_free(rest);
  }
  block->free = false;
  return block;
}

Block* Arena::release(Block* block, bool used) {
  assert(!block->free);
  block->free = true;
  block->other_streams.clear();
  block->fence.reset();
  block->job_prev = block->job_next = nullptr;
  block->owner = nullptr;
  if (Block* next = block->next; next && next->free) {
    erase_free(next);
    block->freed_epoch = std::max(block->freed_epoch, next->freed_epoch);
    block->size += next->size;
    block->next = next->next;
    if (block->next) block->next->prev = block;
    recycle(next);
  }
  if (Block* prev = block->prev; prev && prev->free) {
    erase_free(prev);
    prev->freed_epoch = std::max(prev->freed_epoch, block->freed_epoch);
    prev->size += block->size;
    prev->next = block->next;
    if (prev->next) prev->next->prev = prev;
    recycle(block);
    block = prev;
  }
  if (used) block->freed_epoch = epoch_;
  insert_free(block);
  return block;
}

std::pair<std::size_t, std::size_t> Arena::pages_touched(const Block& block) const {
  const std::size_t first = pages_in(block.addr - base_);
  const std::size_t last = pages_in(block.end() - base_ + page_bytes_ - 1);
  return {first, last};
}

std::pair<std::size_t, std::size_t> Arena::pages_inside(const Block& block) const {
  const std::size_t first = pages_in(block.addr - base_ + page_bytes_ - 1);
  const std::size_t last = pages_in(block.end() - base_);
  return {first, last > first ? last : first};
}

void throw_no_arena(const Block& block) {
  throw InvalidArgument(fmt::format("{:#x} lies in no address range of its heap", block.addr));
}

}  // namespace salus::memory
