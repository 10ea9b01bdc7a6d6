#include "waits/spin_near_due.hpp"

#include <algorithm>

#include "waits/blocking.hpp"
#include "waits/cpu_relax.hpp"
#include "waits/cpus.hpp"

namespace salus::waits {

SpinNearDue::SpinNearDue(std::chrono::microseconds window)
    : window_(usable_cpus() > 1 ? std::max(window, std::chrono::microseconds::zero())
                                : std::chrono::microseconds::zero()) {}

SpinNearDue::Step SpinNearDue::wait(const std::atomic<std::uint32_t>& signal,
                                    std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                                    Clock::time_point due,
                                    std::optional<Clock::time_point> until) const {
  const auto now = Clock::now();
  const auto spin_from = due - window_;
  if (now < spin_from) {
    if (until && spin_from >= *until) return Step::none;
    // Sleep until the signal is near (a notify still wakes it before).
    before_blocking();
    cv.wait_until(lock, spin_from);
    return Step::slept;
  }
  const auto stop = std::max(due, now) + window_;
  spin(signal, signal.load(std::memory_order_acquire), lock, until ? std::min(stop, *until) : stop);
  return Step::spun;
}

void SpinNearDue::spin(const std::atomic<std::uint32_t>& signal, std::uint32_t seen,
                       std::unique_lock<std::mutex>& lock, Clock::time_point until) {
  lock.unlock();
  for (unsigned i = 1; signal.load(std::memory_order_acquire) == seen; ++i) {
    cpu_relax();
    if (i % 64 == 0 && Clock::now() >= until) break;
  }
  for (unsigned i = 0; !lock.try_lock(); ++i) {
    if (i == 4096) {
      lock.lock();
      break;
    }
    cpu_relax();
  }
}

}  // namespace salus::waits
