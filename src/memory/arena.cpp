#include "memory/arena.hpp"

#include <cassert>

namespace salus::memory {

Arena::Arena(DevicePtr base, std::size_t bytes, std::size_t page_bytes)
    : base_(base), bytes_(bytes), page_bytes_(page_bytes), pages_(bytes / page_bytes) {
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

Block* Arena::carve(std::size_t size) {
  Block probe;
  probe.size = size;
  probe.addr = 0;
  auto it = free_.lower_bound(&probe);
  if (it == free_.end()) return nullptr;
  Block* block = *it;
  free_.erase(it);
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
    free_.insert(rest);
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
  if (Block* next = block->next; next && next->free) {
    free_.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (block->next) block->next->prev = block;
    recycle(next);
  }
  if (Block* prev = block->prev; prev && prev->free) {
    free_.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (prev->next) prev->next->prev = prev;
    recycle(block);
    block = prev;
  }
  free_.insert(block);
  return block;
}

std::pair<std::size_t, std::size_t> Arena::pages_touched(const Block& block) const {
  const std::size_t first = (block.addr - base_) / page_bytes_;
  const std::size_t last = (block.end() - base_ + page_bytes_ - 1) / page_bytes_;
  return {first, last};
}

std::pair<std::size_t, std::size_t> Arena::pages_inside(const Block& block) const {
  const std::size_t first = (block.addr - base_ + page_bytes_ - 1) / page_bytes_;
  const std::size_t last = (block.end() - base_) / page_bytes_;
  return {first, last > first ? last : first};
}

}  // namespace salus::memory
