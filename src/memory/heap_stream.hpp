// The stream a stream heap serves, and fences after that stream's work so far. A heap outlives
// its stream: retire() marks it as serving none (lookups skip it, and its work so far is the
// retire fence from then on, so nothing records on a destroyed stream), and bind() gives a
// retired heap a new stream.
//
// Lock story: no lock of its own; its heap's mutex guards every call but stream(), which any
// thread may make without a lock (written under that mutex with release, read with acquire).
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <utility>

#include "memory/event_pool.hpp"
#include "memory/fence.hpp"
#include "salus/device.hpp"

namespace salus::memory {

class HeapStream {
 public:
  // What stream() says once retired: no stream's handle.
  static constexpr std::uint64_t kRetired = ~std::uint64_t{0};

  // `backend` and `events`: the device's; both outlive the heap.
  HeapStream(DeviceBackend& backend, EventPool& events, int device, StreamHandle stream)
      : backend_(backend), events_(events), device_(device), stream_(stream.value) {}
  HeapStream(const HeapStream&) = delete;
  HeapStream& operator=(const HeapStream&) = delete;

  // Lock-free.
  [[nodiscard]] StreamHandle stream() const {
    return StreamHandle{stream_.load(std::memory_order_acquire)};
  }
  [[nodiscard]] bool retired() const { return retired_; }
  // The retired stream's work up to retire() (null while bound, or when it was idle).
  [[nodiscard]] const FencePtr& retire_fence() const { return retire_fence_; }
  // The stream is about to be destroyed; `fence`: its work so far (taken while it was alive).
  void retire(FencePtr fence) {
    retire_fence_ = std::move(fence);
    retired_ = true;
    stream_.store(kRetired, std::memory_order_release);
  }
  // A retired heap serves `stream` from now on.
  void bind(StreamHandle stream) {
    retired_ = false;
    retire_fence_.reset();
    stream_.store(stream.value, std::memory_order_release);
  }

  // A fence after the stream's work so far (null when it has none), made at most once: the first
  // get() asks the driver, later ones return the same. Make one per call site that needs one;
  // it is valid while its HeapStream is, and the heap's mutex is held.
  class OwnFence {
   public:
    explicit OwnFence(const HeapStream& stream) : stream_(stream) {}
    const FencePtr& get();

   private:
    const HeapStream& stream_;
    FencePtr fence_;  // null when the stream was idle
    bool asked_ = false;
  };

 private:
  DeviceBackend& backend_;
  EventPool& events_;
  int device_;
  std::atomic<std::uint64_t> stream_;  // see stream()
  bool retired_ = false;
  FencePtr retire_fence_;
};

inline const FencePtr& HeapStream::OwnFence::get() {
  if (!asked_) {
    // A retired stream may be gone: its work is what the retire fence caught.
    if (stream_.retired_) {
      fence_ = settled(stream_.retire_fence_) ? nullptr : stream_.retire_fence_;
      asked_ = true;
      return fence_;
    }
    // An idle stream has nothing queued that could touch the page: no fence, and the page is
    // unmapped at once. (Work enqueued from now on only touches live blocks.)
    const StreamHandle stream = stream_.stream();
    if (!stream_.backend_.query_stream(stream, stream_.device_)) {
      fence_ = Fence::after(stream_.events_, std::span(&stream, 1));
    }
    asked_ = true;
  }
  return fence_;
}

using OwnFence = HeapStream::OwnFence;

}  // namespace salus::memory
