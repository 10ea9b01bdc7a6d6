// A wait for a signal that another thread gives at a time the waiter can foresee (a turn that is
// due: RuntimeOptions::turn_spin). The waiter sleeps until the time is near, then spins on the
// signal's word for a short window, so that the hand-over is a cache line changing hands instead
// of a sleeping thread woken through the kernel. The giver moves the word, then notifies the
// condition variable.
//
// Lock rule: no lock of its own. Each call is made with the waiter's lock held, which it releases
// while it sleeps or spins and holds again when it returns.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>

namespace salus::waits {

class SpinNearDue {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Step { slept, spun, none };

  // `window`: how long it spins before and after the due time. Off (zero) on a process that may
  // use one CPU only: a thread that spins there keeps the one it waits for from running.
  explicit SpinNearDue(std::chrono::microseconds window);

  [[nodiscard]] bool on() const { return window_.count() > 0; }

  // One step of a wait for `signal` to move, expected at `due`: before the window it sleeps on
  // `cv` until the window opens (a notify wakes it sooner); in it, it spins until the signal
  // moves or the window closes. Never past `until` (a deadline, or a time the waiter must look
  // at the clock): when the window opens after it, it does nothing (Step::none).
  Step wait(const std::atomic<std::uint32_t>& signal, std::condition_variable& cv,
            std::unique_lock<std::mutex>& lock, Clock::time_point due,
            std::optional<Clock::time_point> until) const;

 private:
  // Spins with `lock` released until `signal` moves from `seen` or `until` passes, then takes
  // `lock` back spinning too: the thread that gave the signal may still hold it, and sleeping on
  // it would cost the wake-up the spin saves.
  static void spin(const std::atomic<std::uint32_t>& signal, std::uint32_t seen,
                   std::unique_lock<std::mutex>& lock, Clock::time_point until);

  const std::chrono::microseconds window_;  // 0: off
};

}  // namespace salus::waits
