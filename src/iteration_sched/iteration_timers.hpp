// Pairs of timing events that measure the GPU time of iterations on one device.
//
// An iteration's GPU time is what its stream spends on its work between two points: a start
// event recorded when the job is let in and an end event recorded when it ends. Host-side clocks
// cannot give that: on a shared lane stream the previous job's work may still drain when the next
// job begins, and a job's stream may sit idle (host work, waits for other streams) inside its
// iteration. The backends define what the two events measure (DeviceBackend::elapsed_seconds).
//
// Events are reused: a pair goes back to the pool once its time was read, so a device needs about
// as many pairs as iterations that are in flight or not yet read.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "salus/device.hpp"

namespace salus {

class IterationTimers {
 public:
  struct Pair {
    EventHandle start;
    EventHandle end;
  };

  IterationTimers(std::shared_ptr<DeviceBackend> backend, int device);
  ~IterationTimers();  // destroys every event it made
  IterationTimers(const IterationTimers&) = delete;
  IterationTimers& operator=(const IterationTimers&) = delete;

  // A pair out of the pool (made when the pool is empty) whose start is recorded on `stream`.
  // Throws what the backend throws; the pair is then back in the pool.
  Pair start(StreamHandle stream);
  // Records the pair's end on `stream`.
  void stop(const Pair& pair, StreamHandle stream);
  // The device seconds between the pair's start and end, or nullopt while the end (or the start)
  // has not completed. Other backend errors propagate.
  [[nodiscard]] std::optional<double> elapsed(const Pair& pair);
  // Back to the pool. Re-recording a pooled pair supersedes its earlier records, so a pair whose
  // records are still pending may come back too.
  void release(const Pair& pair);

 private:
  const std::shared_ptr<DeviceBackend> backend_;
  const int device_;
  std::mutex mu_;  // guards the two vectors; never held across a backend call
  std::vector<Pair> free_;
  std::vector<Pair> all_;  // every pair made, for the destructor
};

}  // namespace salus
