// DeviceScheduler: allocations that wait for memory held by the device's other running
// iterations (see device_scheduler.hpp, allocate_or_wait).
#include <algorithm>
#include <thread>
#include <utility>

#include "iteration_sched/device_scheduler.hpp"
#include "log/log.hpp"
#include "waits/blocking.hpp"

namespace salus {

namespace {

// How often a waiting allocation tries again while the iterations it waits for still run: they
// free memory in the middle too (a backward pass frees its activations).
constexpr auto kRetryEvery = std::chrono::milliseconds(20);
// After an allocation failed for lack of memory, how long the others that find nothing else
// running still wait: the failed job's tensors are freed as its error unwinds (or its script
// ends), a moment after the failure.
constexpr auto kGiveBackGrace = std::chrono::seconds(2);

}  // namespace

// While it lives, no new iteration starts on the device; its end lets the held ones start.
class DeviceScheduler::StartHold {
 public:
  StartHold(DeviceScheduler& scheduler, bool running) : scheduler_(scheduler), running_(running) {
    ++scheduler_.holds_;
    if (running_) ++scheduler_.running_holders_;
  }
  StartHold(const StartHold&) = delete;
  StartHold& operator=(const StartHold&) = delete;
  ~StartHold() {
    std::vector<std::shared_ptr<JobRecordState>> to_wake;
    {
      std::lock_guard lock(scheduler_.mu_);
      if (running_) --scheduler_.running_holders_;
      if (--scheduler_.holds_ > 0) return;
      try {
        to_wake = scheduler_.run_decisions();
      } catch (const Error& e) {
        // The next iteration end decides again; a failing stream must not unwind a destructor.
        log::error("device {}: deciding after a memory wait failed: {}", scheduler_.device_,
                   e.what());
      }
    }
    wake(to_wake);
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
  // Called with mu_ held (the catch's lock): the others waiting learn that this one gave up.
  const auto fail = [&](const OutOfMemory& e) -> OutOfMemory {
    last_gave_way_ = SteadyClock::now();
    last_gave_way_job_ = job.id;
    memory_back_.notify_all();
    OutOfMemoryInfo info = e.info();
    if (waited) {
      info.waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - *began);
    }
    return OutOfMemory(std::move(info));
  };
  // Once it waits, the job is one of the device's memory waiters until this returns or throws.
  struct Waiting {
    DeviceScheduler* scheduler = nullptr;
    JobRecordState* job = nullptr;
    Waiting() = default;
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;
    ~Waiting() {
      if (scheduler == nullptr) return;
      std::lock_guard lock(scheduler->mu_);
      job->memory_wait_bytes = 0;
    }
  } waiting;
  for (;;) {
    try {
      return memory_->allocate(request);
    } catch (const OutOfMemory& e) {
      if (e.info().job_limit_bytes != 0) throw;  // its own budget: others ending changes nothing
      std::unique_lock lock(mu_);
      check_usable(job, "allocate");  // cancelled meanwhile: that says more
      job.memory_wait_bytes = std::max<std::size_t>(1, e.info().job_in_use_bytes);
      // Set in place, with mu_ held: a temporary Waiting's destructor would take mu_ again.
      waiting.job = &job;
      waiting.scheduler = this;
      if (!hold) hold.emplace(*this, job.state == JobState::running);
      if (!began) began = SteadyClock::now();
      if (allocation_wait_limit_.count() > 0 &&
          SteadyClock::now() >= *began + allocation_wait_limit_) {
        log::warn(
            "device {}: job {}'s allocation of {} bytes waited {} ms for other "
            "iterations to end (RuntimeOptions::allocation_wait_limit) and fails",
            device_, job.id.value, request.bytes, allocation_wait_limit_.count());
        throw fail(e);
      }
      if (wait_for_memory(job, lock, *began)) {
        waited = true;
        continue;
      }
      if (std::exchange(settled, true)) throw fail(e);
      // Nothing left to wait for, but what an iteration that just ended freed on its stream may
      // still be behind that stream's work (its reuse elsewhere waits for it): settle it once,
      // waiting for that work (trim), and try again before saying out of memory.
      lock.unlock();
      (void)memory_->trim(device_);
    }
  }
}

bool DeviceScheduler::wait_for_memory(JobRecordState& job, std::unique_lock<std::mutex>& lock,
                                      SteadyClock::time_point began) {
  const int self = job.state == JobState::running ? 1 : 0;
  // Other iterations that run or are about to, that another thread may end. One that this thread
  // began cannot end while this thread waits here (a program that drives two jobs from one
  // thread, their iterations overlapping; found by fuzz_c_api, whose wait never ended). Nor do
  // running iterations that wait for memory too. Nothing running at all means the device is as
  // empty as it gets.
  const auto me = std::this_thread::get_id();
  int others = 0;
  for (const auto& [id, other] : jobs_) {
    if (other.get() == &job) continue;
    const bool running = other->state == JobState::running && other->began_by != me;
    const bool starting = other->state == JobState::waiting && other->started;  // its own thread
    if (running || starting) ++others;
  }
  if (others - (running_holders_ - self) <= 0) {
    // Nothing runs that is not short of memory too. A job that gave up lately may still give
    // its memory back; and where other running iterations wait too, only one gives way.
    const bool others_wait = running_holders_ - self > 0;
    // At most two graces a wait: others failing again and again must not hold it (and, through
    // its hold, every new iteration on the device) for ever.
    const auto now = SteadyClock::now();
    const bool grace = last_gave_way_job_ != job.id && now - last_gave_way_ < kGiveBackGrace &&
                       now - began < 2 * kGiveBackGrace;
    if (!grace && !(others_wait && !gives_way(job))) return false;
  }
  const std::uint64_t seen = iterations_gone_;
  waits::before_blocking();
  memory_back_.wait_for(lock, kRetryEvery, [&] {
    return iterations_gone_ != seen || job.state == JobState::cancelled ||
           job.state == JobState::left;
  });
  check_usable(job, "allocate");
  return true;
}

bool DeviceScheduler::gives_way(const JobRecordState& job) const {
  for (const auto& [id, other] : jobs_) {
    if (other.get() == &job || other->memory_wait_bytes == 0) continue;
    if (other->memory_wait_bytes > job.memory_wait_bytes ||
        (other->memory_wait_bytes == job.memory_wait_bytes && other->id.value > job.id.value)) {
      return false;
    }
  }
  return true;
}

void DeviceScheduler::note_iteration_gone() {
  ++iterations_gone_;
  memory_back_.notify_all();
}

}  // namespace salus
