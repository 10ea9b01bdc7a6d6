// The streams one device's iterations run on: one per lane of the plan, made on first use at the
// priority of its first user's kind (the most urgent for inference). Under memory-aware plans,
// whose overlapping iterations share one budget but not one stream (the GPU would serialize
// them), each running iteration takes a free slot: a lane stream no other running one uses.
//
// Lock rule: every public method takes mu_ and calls nothing outside this class but the backend,
// to make a stream; so mu_ is a leaf, which the turn queue (LocalTurns) calls with its own lock
// held (a stream's creation is the one backend call made under the queue's lock).
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "salus/device.hpp"
#include "salus/runtime.hpp"

namespace salus {

class LaneStreams {
 public:
  // `slots`: iterations take free slots (memory-aware plans), not the lane they were given.
  LaneStreams(std::shared_ptr<DeviceBackend> backend, int device, bool slots);

  // The stream of the lane an iteration starts in: `lane` as the plan gave it, or under slots
  // a free slot (then taken until release). Sets `lane` to what it took.
  StreamHandle take(int& lane, JobKind first_user);
  // The iteration on `lane` ended or left: under slots its slot is free again.
  void release(int lane);
  // `lane`'s stream, if it was made.
  [[nodiscard]] std::optional<StreamHandle> stream_of(int lane) const;
  // Every stream made so far.
  [[nodiscard]] std::vector<StreamHandle> all() const;
  // Drains and destroys the streams (Stream's destructor).
  void clear();

 private:
  const std::shared_ptr<DeviceBackend> backend_;
  const int device_;
  const bool slots_;
  mutable std::mutex mu_;  // guards the two below
  std::vector<std::optional<Stream>> streams_;
  std::vector<bool> busy_;  // slots: which lane streams run an iteration
};

}  // namespace salus
