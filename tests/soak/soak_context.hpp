// What the soak's actors share: the runtime, the watchdog, the counters, the log of unexplained
// events, the holder (frees from other threads), and the rules for judging what a job's thread
// hears after another thread ended its job.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "salus/runtime.hpp"
#include "soak/watchdog.hpp"

namespace salus::soak {

class Holder;

// A block as the soak's actors hold it.
struct Block {
  DevicePtr ptr = 0;
  std::size_t bytes = 0;
  std::uint64_t tag = 0;  // what its stamps were made from (stamps.hpp)
  int device = 0;
  // Where it lives: a framework stream bound to its job (runtime.allocate on that stream), or
  // {} for the job's lane (Job::allocate). Readers are enqueued on the job's other stream.
  StreamHandle home{};
};

// How a job ended, when a thread other than its own ended it.
enum class EndedBy : std::uint8_t { none, cancel, leave };

// Everything counted; read by the sampler while the threads run.
struct Counters {
  std::atomic<std::uint64_t> arrived{0};
  std::atomic<std::uint64_t> left_normally{0};
  std::atomic<std::uint64_t> left_mid_iteration{0};     // leave() inside an iteration
  std::atomic<std::uint64_t> dropped_mid_iteration{0};  // the Job handle destroyed inside one
  std::atomic<std::uint64_t> cancelled{0};              // by the canceller
  std::atomic<std::uint64_t> left_by_other{0};          // leave() from the canceller's thread
  std::atomic<std::uint64_t> cancelled_at_shutdown{0};  // stragglers after the grace period
  std::atomic<std::uint64_t> iterations{0};
  std::atomic<std::uint64_t> allocations{0};
  std::atomic<std::uint64_t> out_of_memory{0};
  std::atomic<std::uint64_t> kernels{0};
  std::atomic<std::uint64_t> blocks_checked{0};
  std::atomic<std::uint64_t> mismatches{0};          // a block's bytes were not what was written
  std::atomic<std::uint64_t> stream_reads{0};        // readers run on a job's second stream
  std::atomic<std::uint64_t> stream_mismatches{0};   // ... that found foreign bytes
  std::atomic<std::int64_t> readers_pending{0};      // enqueued, not yet run
  std::atomic<std::uint64_t> held_frees{0};          // blocks freed by the holder's thread
  std::atomic<std::uint64_t> held_frees_refused{0};  // release mode: the job's end freed it first
  // What a job's thread heard after another thread ended its job.
  std::atomic<std::uint64_t> answers_cancelled{0};    // JobCancelled, as it should
  std::atomic<std::uint64_t> answers_unknown_job{0};  // UnknownJob to a cancelled job: a bug
  std::atomic<std::uint64_t> answers_after_leave{0};  // InvalidArgument or UnknownJob
  std::atomic<std::uint64_t> race_rounds{0};          // jobs that racing threads allocated on
  std::atomic<std::uint64_t> race_allocations{0};     // ... allocations they got
  std::atomic<std::uint64_t> race_lost{0};            // ... allocations answered by the job's end
  std::atomic<std::uint64_t> cancel_races{0};         // an odd error of a job already ended
  std::atomic<std::uint64_t> errors{0};               // an error nothing explains
};

// The first few unexplained events, for the report.
class ErrorLog {
 public:
  void note(const std::string& text);
  [[nodiscard]] std::vector<std::string> messages();

 private:
  static constexpr std::size_t kMaxMessages = 12;
  std::mutex mu_;
  std::vector<std::string> messages_;
};

struct SoakShared {
  Runtime& runtime;
  Watchdog& watchdog;
  Counters& counters;
  ErrorLog& log;
  Holder& holder;
  bool blocks_outlive_job = false;

  void error(const std::string& text) {
    counters.errors.fetch_add(1);
    log.note("error: " + text);
  }
};

// Counts what a job's thread heard (`e`, in `where`) after another thread ended its job: a
// cancelled job must hear JobCancelled until it leaves (UnknownJob is counted as a failure), a
// job left by another thread InvalidArgument or UnknownJob. With `how` none, nothing explains it.
void count_answer(SoakShared& shared, EndedBy how, const std::exception& e,
                  const std::string& where);

// Enqueues on `stream` of `block.device` a simulated kernel of `seconds` (so that the reader is
// really still queued when a cancel or a free comes), then a host function that checks the
// block's stamps when the stream reaches it. `pending` counts the caller's readers not yet run.
void enqueue_reader(SoakShared& shared, StreamHandle stream, const Block& block, double seconds,
                    const std::string& job_name, std::atomic<int>& pending);

}  // namespace salus::soak
