// Which of a stream heap's free space is quiet: no work queued on its stream can still touch it,
// so its pages may move without keeping their old address mapped.
//
// The heap's frees belong to epochs (Block::freed_epoch, Arena::set_epoch). An epoch ends with a
// fence after the stream's work so far (an iteration's end, or an allocation short of quiet spare
// pages). Space whose last free came in an epoch whose fence has completed is quiet, and so is
// everything freed before an epoch that ended with nothing queued.
//
// A value with no lock: its heap guards it. Nothing here records or waits on the GPU: the heap
// makes the fences, this only asks them whether they are done.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>

#include "memory/fence.hpp"

namespace salus::memory {

class QuietEpochs {
 public:
  // Fences of ended epochs not yet seen complete, at most: an epoch that would exceed it goes on
  // instead (its frees wait for a later fence).
  static constexpr std::size_t kMaxFences = 8;
  // The epoch a new QuietEpochs starts in (and a new Arena's frees belong to).
  static constexpr std::uint64_t kFirst = 1;

  // The epoch frees belong to now.
  [[nodiscard]] std::uint64_t current() const { return epoch_; }
  // Ends the current epoch behind `fence`, the stream's work so far; null: nothing is queued, so
  // whatever was freed so far is quiet already. False when the epoch goes on instead (kMaxFences
  // are pending); then current() is unchanged.
  bool end(FencePtr fence);
  // Takes note of the pending fences that have completed, oldest first. Throws what Fence::done
  // throws (the driver's error); what was noted before stays.
  void poll();
  // Whether space last freed in `freed_epoch` is quiet, as of the last poll.
  [[nodiscard]] bool quiet(std::uint64_t freed_epoch) const { return freed_epoch <= quiet_through_; }
  [[nodiscard]] std::size_t pending() const { return fences_.size(); }

 private:
  std::uint64_t epoch_ = kFirst;     // frees now belong to it (Block::freed_epoch)
  std::uint64_t quiet_through_ = 0;  // free space of epochs up to this one is quiet
  std::deque<std::pair<std::uint64_t, FencePtr>> fences_;  // oldest first
};

inline bool QuietEpochs::end(FencePtr fence) {
  if (fence == nullptr) {
    fences_.clear();
    quiet_through_ = epoch_;
  } else if (fences_.size() < kMaxFences) {
    fences_.emplace_back(epoch_, std::move(fence));
  } else {
    return false;
  }
  ++epoch_;
  return true;
}

inline void QuietEpochs::poll() {
  while (!fences_.empty() && fences_.front().second->done()) {
    quiet_through_ = fences_.front().first;
    fences_.pop_front();
  }
}

}  // namespace salus::memory
