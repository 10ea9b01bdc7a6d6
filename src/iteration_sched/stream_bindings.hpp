// Which job a stream's allocations belong to, on one device: the job whose iteration runs on a
// lane stream, else the job a framework's own stream is bound to (bind) until it is unbound or
// the job finishes.
//
// Lock rule: every public method takes mu_ and calls nothing outside this class. So mu_ is a
// leaf: the turn queue (LocalTurns) updates the bindings with its own lock held, and an
// allocation asks whose stream it is (job_on) without taking the queue's lock at all.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "salus/device.hpp"
#include "salus/runtime.hpp"

namespace salus {

struct JobRecordState;

class StreamBindings {
 public:
  // `job`'s iteration runs on the lane stream `lane` from now on, until stop(lane).
  void run(StreamHandle lane, std::shared_ptr<JobRecordState> job);
  void stop(StreamHandle lane);
  // A framework's stream: its allocations are `job`'s (another binding of it is replaced).
  void bind(StreamHandle stream, std::shared_ptr<JobRecordState> job);
  // False when the stream was bound to no job.
  [[nodiscard]] bool unbind(StreamHandle stream);
  // The job is gone: its bindings end, and so does the run of its iteration.
  void forget(JobId job);

  // The job whose iteration runs on `stream` now, else the job `stream` is bound to; nullptr for
  // neither. The default stream is nobody's until a framework binds it, and costs no lock then.
  [[nodiscard]] std::shared_ptr<JobRecordState> job_on(StreamHandle stream) const;
  // The job whose iteration runs on the lane stream `lane`, if any.
  [[nodiscard]] std::shared_ptr<JobRecordState> running_on(StreamHandle lane) const;

 private:
  using ByStream = std::unordered_map<std::uint64_t, std::shared_ptr<JobRecordState>>;

  mutable std::mutex mu_;  // guards the two maps
  ByStream running_;       // lane stream -> the job whose iteration runs on it
  ByStream bound_;         // a framework's stream -> the job it is bound to
  std::atomic<bool> default_bound_{false};  // the default stream (0) was ever bound
};

}  // namespace salus
