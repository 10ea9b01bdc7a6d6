// DeviceScheduler: allocations that wait for memory held by the device's other running
// iterations (memory_waits.hpp says when waiting helps; this is the scheduler's side of it).
#include <algorithm>
#include <thread>
#include <utility>

#include "iteration_sched/device_scheduler.hpp"
#include "log/log.hpp"

namespace salus {

namespace {

// How often a waiting allocation tries again while the iterations it waits for still run: they
// free memory in the middle too (a backward pass frees its activations).
constexpr auto kRetryEvery = std::chrono::milliseconds(20);

// Once it waits, a job is one of the device's memory waiters until its allocation returns or
// throws.
struct MemoryWaiter {
  MemoryWaits& waits;
  const JobId job;
  bool on = false;
  ~MemoryWaiter() {
    if (on) waits.stop_waiting(job);
  }
};

}  // namespace

// While it lives, no new iteration starts on the device; its end lets the held ones start.
class DeviceScheduler::StartHold {
 public:
  StartHold(DeviceScheduler& scheduler, bool running) : scheduler_(scheduler), running_(running) {
    scheduler_.waits_.hold(running_);
  }
  StartHold(const StartHold&) = delete;
  StartHold& operator=(const StartHold&) = delete;
  ~StartHold() {
    if (!scheduler_.waits_.release(running_)) return;
    try {
      scheduler_.local_.decide();  // asks the waits again: a hold taken since starts nothing
    } catch (const Error& e) {
      // The next iteration end decides again; a failing stream must not unwind a destructor.
      log::error("device {}: deciding after a memory wait failed: {}", scheduler_.device_,
                 e.what());
    }
  }

 private:
  DeviceScheduler& scheduler_;
  const bool running_;
};

DevicePtr DeviceScheduler::allocate_or_wait(JobRecordState& job, const AllocationRequest& request) {
  std::optional<StartHold> hold;
  bool settled = false;
  std::optional<SteadyClock::time_point> began;  // the first refusal: the wait's start
  bool waited = false;
  // The error says how long the allocation waited before it gave up (OutOfMemoryInfo::waited);
  // one that had nothing to wait for failed at once.
  const auto fail = [&](const OutOfMemory& e) -> OutOfMemory {
    waits_.gave_up(job.id);
    OutOfMemoryInfo info = e.info();
    if (waited) {
      info.waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - *began);
    }
    return OutOfMemory(std::move(info));
  };
  MemoryWaiter waiting{waits_, job.id};
  for (;;) {
    try {
      return memory_->allocate(request);
    } catch (const OutOfMemory& e) {
      if (e.info().job_limit_bytes != 0) throw;  // its own budget: others ending changes nothing
      // Cancelled meanwhile: that says more.
      const bool running = local_.placement(job).running;
      waits_.start_waiting(job.id, e.info().job_in_use_bytes);
      waiting.on = true;
      if (!hold) hold.emplace(*this, running);
      if (!began) began = SteadyClock::now();
      if (allocation_wait_limit_.count() > 0 &&
          SteadyClock::now() >= *began + allocation_wait_limit_) {
        log::warn(
            "device {}: job {}'s allocation of {} bytes waited {} ms for other "
            "iterations to end (RuntimeOptions::allocation_wait_limit) and fails",
            device_, job.id.value, request.bytes, allocation_wait_limit_.count());
        throw fail(e);
      }
      if (wait_for_memory(job, *began)) {
        waited = true;
        continue;
      }
      if (std::exchange(settled, true)) throw fail(e);
      // Nothing left to wait for, but what an iteration that just ended freed on its stream may
      // still be behind that stream's work (its reuse elsewhere waits for it): settle it once,
      // waiting for that work (trim), and try again before saying out of memory.
      (void)memory_->trim(device_);
    }
  }
}

bool DeviceScheduler::wait_for_memory(JobRecordState& job, SteadyClock::time_point began) {
  // Other iterations that run or are about to, that another thread may end (counted after this
  // wait's hold is taken: none starts from then on). Nothing running at all means the device is
  // as empty as it gets.
  bool running = false;
  const int others = local_.others_running(job, running);
  if (!waits_.worth_waiting(job.id, others, running, began)) return false;
  const std::uint64_t seen = waits_.gone();
  // A cancel or a leave meanwhile is seen when the wait ends (at most kRetryEvery later).
  (void)waits_.wait_for_change(seen, kRetryEvery);
  local_.check_usable(job, "allocate");
  return true;
}

}  // namespace salus
