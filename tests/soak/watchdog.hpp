// The soak's watchdog: every thread that must make progress publishes a heartbeat; a thread that
// stops making progress is reported with the stacks of every thread in the process, and the
// process exits with kWatchdogExitCode.
//
// What "stuck" means. A heartbeat carries a time and a phase:
//   working       the thread does its own work (allocating, writing and checking bytes, freeing,
//                 leaving, cancelling, sampling, shutting down). Nothing in those steps waits for
//                 another job for long (an allocation waits at most the harvester's recall_wait for
//                 borrowed pages), so a beat older than `stuck` means the thread is wedged.
//   waiting_turn  the thread is blocked in Job::begin_iteration: waiting while other jobs hold the
//                 GPU is legitimate, so its own age alone proves nothing. It is stuck when its
//                 device made no progress either (no iteration ended and no job finished there for
//                 `stuck`: a deadlock), or when it has waited `starvation_factor` x `stuck` while
//                 its device made progress (starvation: every policy here admits a waiting job
//                 eventually, and the canceller keeps the population changing).
//   idle, done    not judged.
// Besides, while the soak expects system progress (before shutdown), no iteration ending and no
// job finishing anywhere for `stuck` is a stall of the whole system, even if every thread says it
// waits for a turn.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace salus::soak {

inline constexpr int kWatchdogExitCode = 3;

enum class Phase : int { working = 0, waiting_turn = 1, idle = 2, done = 3 };
[[nodiscard]] const char* to_string(Phase phase) noexcept;

// Monotonic nanoseconds (steady_clock), the clock of every heartbeat and progress stamp.
[[nodiscard]] std::int64_t now_ns() noexcept;

// One registered thread's heartbeat. Written by its thread, read by the watchdog.
struct Heartbeat {
  std::string name;
  pid_t tid = 0;
  std::atomic<std::int64_t> beat_ns{0};
  std::atomic<int> phase{static_cast<int>(Phase::idle)};
  std::atomic<int> device{-1};  // whose progress excuses a wait for a turn

  void beat(Phase now_phase) noexcept {
    beat_ns.store(now_ns(), std::memory_order_relaxed);
    phase.store(static_cast<int>(now_phase), std::memory_order_relaxed);
  }
};

struct WatchdogOptions {
  std::chrono::milliseconds stuck{30'000};
  double starvation_factor = 4.0;
  int devices = 1;
  std::chrono::milliseconds poll{250};
};

class Watchdog {
 public:
  explicit Watchdog(WatchdogOptions options);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Registers the calling thread (names it for /proc too); the heartbeat lives as long as the
  // watchdog. Its phase starts as working.
  Heartbeat& enroll(const std::string& name);
  // An iteration ended or a job finished on `device`.
  void progress(int device) noexcept;
  // Before shutdown the whole system must progress; during it jobs only leave.
  void expect_system_progress(bool expect) noexcept { expect_system_.store(expect); }

  void start();
  void stop();

 private:
  void run();
  [[nodiscard]] std::optional<std::string> find_stuck(std::int64_t now) const;
  [[noreturn]] void fire(const std::string& why) const;

  WatchdogOptions options_;
  mutable std::mutex mu_;  // guards beats_ (enrolment) and the stop flag
  std::vector<std::unique_ptr<Heartbeat>> beats_;
  std::unique_ptr<std::atomic<std::int64_t>[]> device_progress_ns_;
  std::atomic<std::int64_t> system_progress_ns_;
  std::atomic<bool> expect_system_{true};
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace salus::soak
