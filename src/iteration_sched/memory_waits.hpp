// Allocations of one device that wait for memory its other running iterations hold
// (DeviceScheduler::allocate_or_wait asks, and waits, here). An allocation the device refuses
// while other iterations run waits for them to free memory and end, and meanwhile no new
// iteration starts (a hold), so what they free goes to the waiter. Waiting cannot help when
// nothing else runs (the job does not fit beside the others' persistent memory), unless an
// allocation gave up lately: its job's memory may come back as its error unwinds (a grace). When
// every running iteration waits for memory, the waiter that held the most gives way (fails) and
// the others wait for what it frees.
//
// Lock rule: every public method takes mu_ and calls nothing outside this class, so mu_ is a
// leaf: the scheduler calls in with its own lock held or not. Three read or move atomics instead,
// being on every iteration's path: holding, gone, and iteration_gone while nobody sleeps. The one
// call that blocks, wait_for_change, the scheduler makes with its lock released.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>

#include "salus/runtime.hpp"

namespace salus {

class MemoryWaits {
 public:
  using Clock = std::chrono::steady_clock;
  // After an allocation gave up for lack of memory, how long others that find nothing else
  // running still wait: the failed job's tensors are freed as its error unwinds (or its script
  // ends), a moment after the failure.
  static constexpr std::chrono::seconds kGiveBackGrace{2};

  // A hold: while one lives, no new iteration starts on the device. `running`: its allocation
  // is inside an iteration (it cannot end while it waits).
  void hold(bool running);
  // Ends a hold; true when it was the last one (the scheduler then decides again).
  [[nodiscard]] bool release(bool running);
  // Whether a hold lives. Without the lock: the scheduler asks at every decision.
  [[nodiscard]] bool holding() const { return holds_.load(std::memory_order_acquire) > 0; }

  // `job`'s allocation waits, its job holding `bytes` when refused; until stop_waiting.
  void start_waiting(JobId job, std::size_t bytes);
  void stop_waiting(JobId job);
  // Whether waiting can help `job`, with `others` iterations running that another thread can end
  // (some of them may wait for memory too); `self_running`: the job's own allocation is inside
  // an iteration; `began`: when its wait started.
  [[nodiscard]] bool worth_waiting(JobId job, int others, bool self_running,
                                   Clock::time_point began) const;
  // `job`'s allocation gave up for lack of memory: the others' grace starts.
  void gave_up(JobId job);

  // An iteration ended, or a running job left: waiters try again. Takes no lock and wakes no
  // thread while nobody waits (every iteration's end tells it).
  void iteration_gone();
  // Iterations gone so far: what a waiter reads before it waits.
  [[nodiscard]] std::uint64_t gone() const;
  // Waits until an iteration is gone since `seen` was read (true), or `limit` passes (false:
  // others free memory in the middle of their iterations too, a backward pass its activations).
  bool wait_for_change(std::uint64_t seen, std::chrono::milliseconds limit);

 private:
  // With mu_ held: whether `job` is the waiter to give way (it held the most; the newest of
  // equals).
  [[nodiscard]] bool gives_way(JobId job) const;

  mutable std::mutex mu_;  // guards everything below but the atomics (written under it or not)
  std::atomic<int> holds_{0};
  int running_holders_ = 0;  // holds whose allocation is inside an iteration
  // Iterations that ended or left running, ever; and the threads in wait_for_change. Both are
  // sequentially consistent: an end that reads no waiter comes before the waiter's look at gone_
  // (which then sees it), so no wake-up is lost.
  std::atomic<std::uint64_t> gone_{0};
  std::atomic<int> sleepers_{0};
  std::condition_variable changed_;  // gone_ moved
  std::map<std::uint64_t, std::size_t> waiting_;  // job id -> bytes it held when refused
  Clock::time_point last_gave_up_{};
  JobId last_gave_up_job_{};
};

}  // namespace salus
