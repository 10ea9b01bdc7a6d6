#include "iteration_sched/memory_waits.hpp"

#include "waits/blocking.hpp"

namespace salus {

void MemoryWaits::hold(bool running) {
  std::lock_guard lock(mu_);
  holds_.fetch_add(1, std::memory_order_acq_rel);
  if (running) ++running_holders_;
}

bool MemoryWaits::release(bool running) {
  std::lock_guard lock(mu_);
  if (running) --running_holders_;
  return holds_.fetch_sub(1, std::memory_order_acq_rel) == 1;
}

void MemoryWaits::start_waiting(JobId job, std::size_t bytes) {
  std::lock_guard lock(mu_);
  waiting_[job.value] = std::max<std::size_t>(1, bytes);
}

void MemoryWaits::stop_waiting(JobId job) {
  std::lock_guard lock(mu_);
  waiting_.erase(job.value);
}

bool MemoryWaits::worth_waiting(JobId job, int others, bool self_running,
                                Clock::time_point began) const {
  std::lock_guard lock(mu_);
  const int other_holders = running_holders_ - (self_running ? 1 : 0);
  if (others - other_holders > 0) return true;  // something runs that is not short of memory
  // Nothing runs that is not short of memory too. A job that gave up lately may still give its
  // memory back; and where other running iterations wait too, only one gives way. At most two
  // graces a wait: others failing again and again must not hold it (and, through its hold,
  // every new iteration on the device) for ever.
  const auto now = Clock::now();
  const bool grace = last_gave_up_job_ != job && now - last_gave_up_ < kGiveBackGrace &&
                     now - began < 2 * kGiveBackGrace;
  return grace || (other_holders > 0 && !gives_way(job));
}

bool MemoryWaits::gives_way(JobId job) const {
  const auto mine = waiting_.find(job.value);
  const std::size_t bytes = mine != waiting_.end() ? mine->second : 0;
  for (const auto& [id, held] : waiting_) {
    if (id == job.value) continue;
    if (held > bytes || (held == bytes && id > job.value)) return false;
  }
  return true;
}

void MemoryWaits::gave_up(JobId job) {
  std::lock_guard lock(mu_);
  last_gave_up_ = Clock::now();
  last_gave_up_job_ = job;
}

void MemoryWaits::iteration_gone() {
  gone_.fetch_add(1);
  if (sleepers_.load() == 0) return;
  // A sleeper may be between its look at gone_ and its sleep: taking mu_ waits until it sleeps.
  { std::lock_guard lock(mu_); }
  changed_.notify_all();
}

std::uint64_t MemoryWaits::gone() const { return gone_.load(); }

bool MemoryWaits::wait_for_change(std::uint64_t seen, std::chrono::milliseconds limit) {
  std::unique_lock lock(mu_);
  waits::before_blocking();
  sleepers_.fetch_add(1);
  const bool changed = changed_.wait_for(lock, limit, [&] { return gone_.load() != seen; });
  sleepers_.fetch_sub(1);
  return changed;
}

}  // namespace salus
