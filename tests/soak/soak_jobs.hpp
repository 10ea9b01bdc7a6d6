// The soak's population: job slots, each a thread that runs one job after another (random spec,
// random device, persistent memory, random iterations that allocate, stamp, check and free
// ephemeral blocks and enqueue simulated kernels, then leave normally or mid-iteration), and a
// canceller thread that cancels a random slot's job at random moments.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "salus/runtime.hpp"
#include "salus/sim.hpp"  // MiB
#include "soak/watchdog.hpp"

namespace salus::soak {

struct PopulationConfig {
  int slots = 16;
  int devices = 4;
  std::uint64_t seed = 1;
  int max_iterations_per_job = 24;
  std::size_t max_persistent_block = 6 * MiB;
  std::size_t max_ephemeral_block = 4 * MiB;
  bool kernels = true;
  std::chrono::milliseconds cancel_interval_max{500};  // between two cancels: uniform in [1, max]
  // Test only: after this many seconds, slot 0's thread wedges (the watchdog must fire).
  std::optional<double> simulate_hang_after;
};

// Everything counted; read by the sampler while the threads run.
struct Counters {
  std::atomic<std::uint64_t> arrived{0};
  std::atomic<std::uint64_t> left_normally{0};
  std::atomic<std::uint64_t> left_mid_iteration{0};     // leave() inside an iteration
  std::atomic<std::uint64_t> dropped_mid_iteration{0};  // the Job handle destroyed inside one
  std::atomic<std::uint64_t> cancelled{0};              // by the canceller
  std::atomic<std::uint64_t> cancelled_at_shutdown{0};  // stragglers after the grace period
  std::atomic<std::uint64_t> iterations{0};
  std::atomic<std::uint64_t> allocations{0};
  std::atomic<std::uint64_t> out_of_memory{0};
  std::atomic<std::uint64_t> kernels{0};
  std::atomic<std::uint64_t> blocks_checked{0};
  std::atomic<std::uint64_t> mismatches{0};    // a block's bytes were not what was written
  std::atomic<std::uint64_t> cancel_races{0};  // an odd error of a job already cancelled
  std::atomic<std::uint64_t> errors{0};        // an error nothing explains
};

class Population {
 public:
  Population(Runtime& runtime, Watchdog& watchdog, PopulationConfig config);
  ~Population();
  Population(const Population&) = delete;
  Population& operator=(const Population&) = delete;

  void start();
  // Jobs finish the iteration they are in and leave; those still present after `grace` are
  // cancelled. Joins every thread.
  void stop(std::chrono::milliseconds grace);

  [[nodiscard]] const Counters& counters() const { return counters_; }
  [[nodiscard]] int live_jobs();
  // The first few unexplained errors (and the first cancel race), for the report.
  [[nodiscard]] std::vector<std::string> messages();

 private:
  struct Slot {
    std::mutex mu;  // a cancel and this slot's accesses to its job's memory exclude each other
    std::optional<Job> job;
    bool cancelled = false;
    int device = 0;
    const char* step = "";  // the call its thread is in (for error messages); that thread's only
  };
  struct Block {
    DevicePtr ptr = 0;
    std::size_t bytes = 0;
    std::uint64_t tag = 0;
  };
  enum class Fate : std::uint8_t { leave, leave_mid_iteration, drop_mid_iteration };

  void worker(int index);
  void run_job(int index, std::mt19937_64& rng, Heartbeat& beat);
  void live(Slot& slot, const std::string& name, std::mt19937_64& rng, Heartbeat& beat);
  // One iteration; false when the job ended inside it (its fate).
  bool run_iteration(Slot& slot, const std::string& name, std::mt19937_64& rng, Heartbeat& beat,
                     std::vector<Block>& persistent, bool end_inside, Fate fate);
  void canceller();
  bool cancel_slot(Slot& slot, std::atomic<std::uint64_t>& tally);
  [[nodiscard]] JobSpec random_spec(const std::string& name, std::mt19937_64& rng) const;
  // Under slot.mu: allocates and stamps a block; nullopt on OutOfMemory (counted).
  std::optional<Block> allocate_block(Job& job, std::size_t bytes,
                                      std::optional<Lifetime> lifetime);
  void check_block(const Block& block, const std::string& job_name);
  void note_error(const std::string& text, bool cancel_race);
  // Test only (--simulate-hang): sleeps forever while claiming to work. Not inlined, so the
  // watchdog's stack dump names it.
  [[noreturn, gnu::noinline]] void wedge(Heartbeat& beat);

  Runtime& runtime_;
  Watchdog& watchdog_;
  const PopulationConfig config_;
  Counters counters_;
  std::vector<Slot> slots_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> next_tag_{1};
  std::int64_t started_ns_ = 0;
  std::mutex messages_mu_;
  std::vector<std::string> messages_;
};

}  // namespace salus::soak
