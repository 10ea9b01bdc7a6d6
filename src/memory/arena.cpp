#include "memory/arena.hpp"

#include <bit>
#include <cassert>

namespace salus::memory {

Arena::Arena(DevicePtr base, std::size_t bytes, std::size_t page_bytes)
    : base_(base),
      bytes_(bytes),
      page_bytes_(page_bytes),
      page_shift_(std::has_single_bit(page_bytes) ? std::countr_zero(page_bytes) : -1),
      pages_(bytes / page_bytes) {
  head_ = new_block();
  head_->addr = base;
  head_->size = bytes;
  free_.insert(head_);
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

Block* Arena::carve(std::size_t size) {
  Block probe;
  probe.size = size;
  probe.addr = 0;
  auto it = free_.lower_bound(&probe);
  if (it == free_.end()) return nullptr;
  Block* block = *it;
  spare_node_ = free_.extract(it);
  if (block->size > size) {
    // The remainder stays free right after the carved block.
    Block* rest = new_block();
    rest->addr = block->addr + size;
    rest->size = block->size - size;
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

Block* Arena::release(Block* block) {
  assert(!block->free);
  block->free = true;
  block->other_streams.clear();
  block->fence.reset();
  block->job_prev = block->job_next = nullptr;
  block->owner = nullptr;
  if (Block* next = block->next; next && next->free) {
    erase_free(next);
    block->size += next->size;
    block->next = next->next;
    if (block->next) block->next->prev = block;
    recycle(next);
  }
  if (Block* prev = block->prev; prev && prev->free) {
    erase_free(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (prev->next) prev->next->prev = prev;
    recycle(block);
    block = prev;
  }
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

}  // namespace salus::memory
