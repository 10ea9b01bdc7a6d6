// BM_SwitchLatency: how long the runtime takes to hand the GPU from one job to the next.
//
// One switch is the time from job A calling end_iteration to job B's begin_iteration returning,
// B having been blocked in it. Both sides enqueue no GPU work, so only the host-side switch path is
// timed (decision, wake-up, hand-over of the lane). The baseline is the least any blocking
// hand-over between two threads can cost: a mutex, a condition variable and a turn flag.
//
// Timing is manual: the benchmark thread (A) stamps just before it ends its turn, the other
// thread (B) stamps as soon as its wait returns, and only that interval is reported. Everything
// else (making sure B is really blocked before A lets go, handing the turn back) is untimed.
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "salus/runtime.hpp"
#include "salus/sim.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

salus::JobSpec job_named(const char* name) {
  salus::JobSpec spec;
  spec.name = name;
  return spec;
}

void BM_SwitchLatencySalus(benchmark::State& state) {
  salus::RuntimeOptions options;
  options.policy = "fair";
  salus::Runtime runtime(salus::make_sim_backend(salus::SimConfig::uniform(1, salus::GiB)),
                         std::move(options));
  salus::Job a = runtime.add_job(job_named("A"));
  salus::Job b = runtime.add_job(job_named("B"));

  // B asks for a turn only once A holds the lane (a_turns counts A's turns), so each of B's
  // begin_iteration calls is answered by a switch from A, never by a free lane.
  std::atomic<std::uint64_t> a_turns{0};
  std::atomic<bool> stop{false};
  Clock::time_point b_started;  // written by B before its end_iteration, read by A after its begin
  std::thread other([&] {
    for (std::uint64_t seen = 1;; ++seen) {
      a_turns.wait(seen - 1);
      if (stop.load()) return;
      (void)b.begin_iteration();
      b_started = Clock::now();
      b.end_iteration();
    }
  });

  (void)a.begin_iteration();
  a_turns.fetch_add(1);
  a_turns.notify_one();
  for (auto _ : state) {
    while (b.stats().state != salus::JobState::waiting) std::this_thread::yield();
    const Clock::time_point a_ended = Clock::now();
    a.end_iteration();
    (void)a.begin_iteration();  // returns once B has ended its turn
    state.SetIterationTime(seconds(a_ended, b_started));
    a_turns.fetch_add(1);
    a_turns.notify_one();
  }
  // B is (or is about to be) blocked in begin_iteration: let it finish that turn, then stop it.
  a.end_iteration();
  stop.store(true);
  a_turns.fetch_add(1);
  a_turns.notify_one();
  other.join();
}

void BM_SwitchLatencyCondvar(benchmark::State& state) {
  enum class Turn { a, b };
  std::mutex mu;
  std::condition_variable cv;
  Turn turn = Turn::a;
  bool b_waiting = false;
  bool stop = false;
  Clock::time_point b_started;

  std::thread other([&] {
    std::unique_lock lock(mu);
    while (true) {
      b_waiting = true;
      cv.wait(lock, [&] { return turn == Turn::b || stop; });
      b_waiting = false;
      if (stop) return;
      b_started = Clock::now();
      turn = Turn::a;
      cv.notify_one();
    }
  });

  for (auto _ : state) {
    while (true) {
      {
        std::lock_guard lock(mu);
        if (b_waiting) break;
      }
      std::this_thread::yield();
    }
    const Clock::time_point a_ended = Clock::now();
    {
      std::lock_guard lock(mu);
      turn = Turn::b;
    }
    cv.notify_one();
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return turn == Turn::a; });
    }
    state.SetIterationTime(seconds(a_ended, b_started));
  }
  {
    std::lock_guard lock(mu);
    stop = true;
  }
  cv.notify_all();
  other.join();
}

BENCHMARK(BM_SwitchLatencySalus)->Name("BM_SwitchLatency/salus")->UseManualTime();
BENCHMARK(BM_SwitchLatencyCondvar)->Name("BM_SwitchLatency/condvar")->UseManualTime();

}  // namespace
