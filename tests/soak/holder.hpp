// The holder: frees blocks from a thread that is not their job's, at a later moment, as Python's
// garbage collector frees the tensors of a job that left or was cancelled (blocks_outlive_job),
// or as a framework's helper thread frees a live job's blocks.
//
// With blocks_outlive_job a block stays valid until its holder frees it, whatever happened to
// its job: the holder checks its stamps, then frees it by address, size and device. Without it
// (release mode) the job's end frees the block, and the address may already be another job's:
// the free names the job, so that Salus refuses a block that is no longer the job's; a refusal
// is counted as expected once the job has ended, and as an error while it lives.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "soak/soak_context.hpp"

namespace salus::soak {

struct HeldBlock {
  Block block;
  std::string job_name;
  std::optional<JobId> job;                        // release mode: whose block it must still be
  std::shared_ptr<const std::atomic<bool>> ended;  // release mode: set before the job's end
};

class Holder {
 public:
  Holder(Runtime& runtime, Counters& counters, ErrorLog& log);
  ~Holder();
  Holder(const Holder&) = delete;
  Holder& operator=(const Holder&) = delete;

  void start(Watchdog& watchdog);
  // Frees `held` from the holder's thread after `delay`.
  void hold(HeldBlock held, std::chrono::microseconds delay);
  // Frees `held` now, on the calling thread, with the same checks.
  void free_now(const HeldBlock& held);
  // Frees everything still held (at once), then joins the thread.
  void stop();
  [[nodiscard]] std::size_t held();

 private:
  void run(Heartbeat& beat);

  Runtime& runtime_;
  Counters& counters_;
  ErrorLog& log_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::multimap<std::chrono::steady_clock::time_point, HeldBlock> queue_;  // by when due
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace salus::soak
