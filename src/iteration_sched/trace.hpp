// The runtime's timeline: iteration spans per device, lane and job, and memory counters, written
// as Chrome trace-event JSON (chrome://tracing and Perfetto open it).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace salus {

class TraceRecorder {
 public:
  struct Span {
    std::string job;
    int device = 0;
    int lane = 0;
    double begin_us = 0.0;
    double end_us = 0.0;
    std::uint64_t iteration = 0;
    // When the job asked for this iteration's turn (at most begin_us): what it waited, and the
    // order of asks a policy's guarantees are stated in.
    double asked_us = 0.0;
  };
  // Pages that changed tier under one device's address ranges (one row per device).
  struct Move {
    std::string what;  // e.g. "prefetch gpu1 -> gpu0"
    int device = 0;
    double begin_us = 0.0;
    double end_us = 0.0;
    std::size_t pages = 0;
    std::size_t bytes = 0;
  };
  struct Counter {
    std::string name;  // e.g. "memory gpu0"
    int device = 0;
    double at_us = 0.0;
    std::vector<std::pair<std::string, double>> values;
  };

  // Bounded: it keeps the most recent `max_events`; older ones are dropped (and counted), so a
  // runtime that runs for weeks holds about ten megabytes of trace at most.
  explicit TraceRecorder(std::size_t max_events = 50'000)
      : epoch_(std::chrono::steady_clock::now()), max_events_(max_events) {}

  // Every timestamp of the trace counts from here.
  [[nodiscard]] std::chrono::steady_clock::time_point epoch() const { return epoch_; }
  [[nodiscard]] double micros(std::chrono::steady_clock::time_point t) const {
    return std::chrono::duration<double, std::micro>(t - epoch_).count();
  }

  void span(Span span);
  void move(Move move);
  void counter(Counter counter);
  [[nodiscard]] std::string json() const;
  [[nodiscard]] std::size_t dropped() const;

 private:
  // With mu_ held: makes room for one more event by dropping the oldest of the kind held most.
  void make_room();

  const std::chrono::steady_clock::time_point epoch_;
  mutable std::mutex mu_;
  std::size_t max_events_;
  std::deque<Span> spans_;
  std::deque<Move> moves_;
  std::deque<Counter> counters_;
  std::size_t dropped_ = 0;
};

}  // namespace salus
