// The soak's population: job slots, each a thread that runs one job after another (random spec,
// random device, persistent memory, random iterations that allocate, stamp, check and free
// ephemeral blocks and enqueue simulated kernels, then leave normally or mid-iteration), and a
// canceller thread that cancels, or leaves, a random slot's job at random moments.
//
// Every job also has a framework stream bound to it (Runtime::bind_stream), and uses some of its
// blocks on its second stream: a block that lives on the lane is read on the bound stream, one
// that lives on the bound stream is read on the lane, each reader queued behind a simulated
// kernel. Those blocks are freed while their readers are still queued: by the job, by the holder
// (another thread) while the job lives, and, with blocks_outlive_job, after the job was cancelled
// or left. A reader that finds foreign bytes is a mismatch; one whose page was unmapped faults.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "salus/runtime.hpp"
#include "salus/sim.hpp"  // MiB
#include "soak/soak_context.hpp"
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
  bool stream_readers = true;  // blocks read on the job's second stream
  // Between two moves of the canceller (a cancel, or a leave one time in three): uniform in
  // [1, max].
  std::chrono::milliseconds cancel_interval_max{400};
  // Test only: after this many seconds, slot 0's thread wedges (the watchdog must fire).
  std::optional<double> simulate_hang_after;
};

class Population {
 public:
  Population(SoakShared shared, PopulationConfig config);
  ~Population();
  Population(const Population&) = delete;
  Population& operator=(const Population&) = delete;

  void start();
  // Jobs finish the iteration they are in and leave; those still present after `grace` are
  // cancelled. Joins every thread, waits for every queued reader, then retires and destroys the
  // slots' framework streams.
  void stop(std::chrono::milliseconds grace);
  // After the holder freed what it held: the slots' framework streams go (retire_stream first).
  void retire_streams();

  [[nodiscard]] int live_jobs();

 private:
  struct Slot {
    std::mutex mu;  // guards job and ended_by; in release mode it also gates memory accesses
    std::optional<Job> job;
    EndedBy ended_by = EndedBy::none;  // by the canceller
    bool left = false;                 // by its own thread
    // Set before anyone ends the job: the holder's refusals are expected from then on.
    std::shared_ptr<std::atomic<bool>> ended;
    JobId id;
    int device = 0;
    std::vector<StreamHandle> streams;  // per device, made on first use: bound to the slot's job
    std::atomic<int> readers{0};        // its readers not yet run
    const char* step = "";  // the call its thread is in (for error messages); that thread's only
  };
  // The blocks a job's thread holds. Persistent ones are restamped at each iteration's end;
  // shared ones are stamped once and read on the second stream (never written again).
  struct Held {
    std::vector<Block> persistent;
    std::vector<Block> shared;
    std::vector<Block> ephemeral;
  };
  enum class Fate : std::uint8_t { leave, leave_mid_iteration, drop_mid_iteration };
  // Thrown by the release mode's gate when another thread ended the job (not Salus's answer).
  struct Ended {};

  void worker(int index);
  void run_job(int index, std::mt19937_64& rng, Heartbeat& beat);
  void join_job(Slot& slot, const JobSpec& spec);
  void live(Slot& slot, const std::string& name, std::mt19937_64& rng, Heartbeat& beat, Held& held);
  // One iteration; false when the job ended inside it (its fate).
  bool run_iteration(Slot& slot, const std::string& name, std::mt19937_64& rng, Heartbeat& beat,
                     Held& held, bool end_inside, Fate fate);
  void use_on_second_stream(Slot& slot, const std::string& name, std::mt19937_64& rng,
                            StreamHandle lane, Held& held);
  void free_ephemeral(Slot& slot, const std::string& name, std::mt19937_64& rng, Held& held,
                      bool all);
  void leave_by_itself(Slot& slot, bool drop);
  // After the job ended: with blocks_outlive_job its blocks are still valid and still held, and
  // are freed here or by the holder; otherwise the end freed them.
  void let_go(Slot& slot, const std::string& name, std::mt19937_64& rng, Held& held);
  void canceller();
  bool end_slot(Slot& slot, EndedBy how, std::atomic<std::uint64_t>& tally);
  [[nodiscard]] JobSpec random_spec(const std::string& name, std::mt19937_64& rng) const;
  [[nodiscard]] StreamHandle framework_stream(Slot& slot, int device);
  // Allocates (on the lane, or on the bound stream when `on_bound`) and stamps a block; nullopt
  // on OutOfMemory (counted).
  std::optional<Block> allocate_block(Slot& slot, std::size_t bytes, bool on_bound);
  void check_block(const Block& block, const std::string& job_name);
  // Runs fn now; in release mode under the slot's mutex, unless the job was ended by another
  // thread (then its memory may be another job's: throws Ended).
  template <class Fn>
  void gated(Slot& slot, Fn&& fn);
  // Runs fn under the slot's mutex unless another thread ended the job (throws Ended): in both
  // modes a reader is enqueued only while the job's end cannot pass it.
  template <class Fn>
  void while_alive(Slot& slot, Fn&& fn);
  // Test only (--simulate-hang): sleeps forever while claiming to work. Not inlined, so the
  // watchdog's stack dump names it.
  [[noreturn, gnu::noinline]] void wedge(Heartbeat& beat);

  SoakShared shared_;
  const PopulationConfig config_;
  std::vector<Slot> slots_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> next_tag_{1};
  std::int64_t started_ns_ = 0;
};

}  // namespace salus::soak
