// The live blocks of one stream heap by start address: an open-addressing hash table (linear
// probing, backward-shift deletion) that stores its entries inline. A free looks its block up
// here on every call, so the table allocates only when it grows, never per block, and a lookup
// is one multiply and, almost always, one cache line. Not thread-safe: the heap's lock guards it.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "salus/device.hpp"

namespace salus::memory {

struct Block;

class LiveIndex {
 public:
  using Entry = std::pair<DevicePtr, Block*>;  // addr 0: an empty slot (no block starts at 0)

  LiveIndex() : slots_(kInitialSlots), shift_(64 - std::countr_zero(kInitialSlots)) {}

  [[nodiscard]] bool empty() const { return size_ == 0; }
  [[nodiscard]] std::size_t size() const { return size_; }

  // The block starting at `addr`, or nullptr.
  [[nodiscard]] Block* find(DevicePtr addr) const {
    for (std::size_t i = home(addr);; i = next(i)) {
      const Entry& e = slots_[i];
      if (e.first == addr) return e.second;
      if (e.first == 0) return nullptr;
    }
  }
  [[nodiscard]] bool contains(DevicePtr addr) const { return find(addr) != nullptr; }

  // `addr` must not be present (a block is linked once) and must not be 0.
  void insert(DevicePtr addr, Block* block) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    place(addr, block);
    ++size_;
  }

  // Removes `addr` if present; returns whether it was.
  bool erase(DevicePtr addr) {
    std::size_t hole = home(addr);
    for (;; hole = next(hole)) {
      if (slots_[hole].first == addr) break;
      if (slots_[hole].first == 0) return false;
    }
    // Backward shift: later entries of the same probe run move into the hole when their home
    // does not lie (cyclically) between the hole and their slot, so no tombstone is left.
    for (std::size_t i = next(hole);; i = next(i)) {
      const Entry& e = slots_[i];
      if (e.first == 0) break;
      const std::size_t h = home(e.first);
      const bool stays = hole <= i ? (hole < h && h <= i) : (hole < h || h <= i);
      if (stays) continue;
      slots_[hole] = e;
      hole = i;
    }
    slots_[hole] = Entry{};
    --size_;
    return true;
  }

  // Visits every entry as `Entry&` (the block pointer may be used, not the address changed).
  class iterator {
   public:
    iterator(Entry* at, Entry* end) : at_(at), end_(end) { skip(); }
    Entry& operator*() const { return *at_; }
    iterator& operator++() {
      ++at_;
      skip();
      return *this;
    }
    bool operator!=(const iterator& other) const { return at_ != other.at_; }

   private:
    void skip() {
      while (at_ != end_ && at_->first == 0) ++at_;
    }
    Entry* at_;
    Entry* end_;
  };
  iterator begin() { return {slots_.data(), slots_.data() + slots_.size()}; }
  iterator end() { return {slots_.data() + slots_.size(), slots_.data() + slots_.size()}; }

 private:
  static constexpr std::size_t kInitialSlots = 64;

  // Blocks start at multiples of 512 B: the low bits carry nothing. Fibonacci hashing spreads
  // the rest over the table's top bits.
  [[nodiscard]] std::size_t home(DevicePtr addr) const {
    return static_cast<std::size_t>(((addr >> 9) * 0x9e3779b97f4a7c15ULL) >> shift_);
  }
  [[nodiscard]] std::size_t next(std::size_t i) const { return (i + 1) & (slots_.size() - 1); }

  void place(DevicePtr addr, Block* block) {
    std::size_t i = home(addr);
    while (slots_[i].first != 0) i = next(i);
    slots_[i] = Entry{addr, block};
  }

  void grow() {
    std::vector<Entry> old(slots_.size() * 2);
    old.swap(slots_);
    --shift_;
    for (const Entry& e : old) {
      if (e.first != 0) place(e.first, e.second);
    }
  }

  std::vector<Entry> slots_;
  int shift_;
  std::size_t size_ = 0;
};

}  // namespace salus::memory
