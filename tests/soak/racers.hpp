// Allocations racing a job's end: several threads allocate, stamp, check and free on one job
// (half through Job::allocate, half through Runtime::allocate on a stream bound to the job) while
// a coordinator cancels or leaves it at a random moment; then the next job. An allocation that
// loses the race must answer JobCancelled (or, after a leave, InvalidArgument or UnknownJob) and
// leave nothing allocated: what it leaked shows in the end-of-run check (allocated == 0).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <random>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "salus/runtime.hpp"
#include "soak/soak_context.hpp"

namespace salus::soak {

struct RaceConfig {
  int threads = 6;
  int devices = 4;
  std::uint64_t seed = 1;
  std::chrono::milliseconds max_round{30};  // a job's end comes uniform in [1, max] ms
};

class AllocationRace {
 public:
  AllocationRace(SoakShared shared, RaceConfig config);
  ~AllocationRace();
  AllocationRace(const AllocationRace&) = delete;
  AllocationRace& operator=(const AllocationRace&) = delete;

  void start();
  // Finishes the round in progress and joins every thread.
  void stop();
  // After the holder freed what it held: the bound streams go (retire_stream first).
  void retire_streams();

 private:
  void coordinator();
  void run_round(std::uint64_t number, std::mt19937_64& rng, Heartbeat& beat);
  void racer(int index);
  void race(std::mt19937_64& rng, Heartbeat& beat);
  // Stamps a new block; false in release mode when the job ended meanwhile (the end freed it).
  bool stamp(const Block& block);
  // Checks a block's stamps (release mode: unless the job ended; then false).
  bool check(const Block& block);

  SoakShared shared_;
  const RaceConfig config_;
  std::mutex mu_;  // guards round_, racing_, job_ and stopping_'s wake-up
  std::condition_variable changed_;
  std::uint64_t round_ = 0;  // the round the racers should run
  int racing_ = 0;           // racers still in it
  std::optional<Job> job_;   // set before a round starts, reset after its racers are done
  JobId id_;
  int device_ = 0;
  StreamHandle stream_{};
  // Release mode: racers' host accesses (shared) and the job's end (exclusive) exclude each other.
  std::shared_mutex gate_;
  std::atomic<EndedBy> ended_by_{EndedBy::none};
  std::vector<StreamHandle> streams_;  // per device, made on first use
  std::vector<std::thread> threads_;
  bool stopping_ = false;
  std::atomic<std::uint64_t> next_tag_{std::uint64_t{1} << 62};  // apart from the slots' tags
};

}  // namespace salus::soak
