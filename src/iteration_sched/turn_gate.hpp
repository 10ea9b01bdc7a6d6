// Turns decided elsewhere: a runtime connected to salusd asks the daemon for each turn before its
// own scheduler's, so that jobs of every process on the node take turns under one policy. An
// in-process runtime has no gate.
//
// Order: a job takes the gate's turn first and its scheduler's second, and gives them back in the
// other order, so that no thread waits for the daemon while it holds a local turn.
#pragma once

#include <chrono>
#include <optional>

#include "salus/runtime.hpp"

namespace salus {

// What a job's own process measured of its memory over its iterations so far (its profile), for
// a keeper that plans turns with it: salusd's scheduler measures nothing itself, since each
// process carves its own blocks.
struct MeasuredMemory {
  std::size_t persistent_bytes = 0;
  std::size_t ephemeral_peak_bytes = 0;
  MemoryCurve curve;  // ephemeral bytes over the last iteration
};

// GPU time a job's process measured with timing events: that of its iterations whose work has
// finished since its previous report, and how many they were (0: none measured since).
struct GpuTime {
  double seconds = 0.0;
  std::uint32_t iterations = 0;
};

class TurnGate {
 public:
  virtual ~TurnGate() = default;
  // A new job: the gate may refuse it (the error is the caller's).
  virtual void add(JobId job, const JobSpec& spec) = 0;
  // Waits for the job's turn; false when `deadline` passed first (the job stays queued there, as
  // in-process). A job already holding its turn returns true at once. Throws Error(cancelled)
  // when the job was cancelled, DeviceError when the gate's keeper is gone.
  virtual bool acquire(JobId job, std::optional<std::chrono::steady_clock::time_point> deadline) = 0;
  // The job's local turn began on `stream`, after acquire: the work it queues there must follow
  // the GPU work of the turn's previous holder (another process's). Throws what the backend
  // throws.
  virtual void order_after(JobId job, StreamHandle stream) = 0;
  // The iteration ended (with what the job measured of its memory, when it measured any, and the
  // GPU time of its iterations measured since its last release, when they are timed on the GPU)
  // or never started here after acquire (nulls): the turn goes back.
  virtual void release(JobId job, const MeasuredMemory* measured, const GpuTime* gpu) = 0;
  // Stops waiting (after an acquire that timed out); a held turn goes back.
  virtual void withdraw(JobId job) = 0;
  // The job left or was cancelled: the keeper forgets it. Never throws.
  virtual void finish(JobId job, bool cancelled) noexcept = 0;
};

}  // namespace salus
