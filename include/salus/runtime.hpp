// The runtime: jobs share each GPU at iteration granularity.
//
// A job registers with a spec, then brackets each iteration with begin_iteration/end_iteration
// (or an Iteration guard). begin_iteration blocks until the device's policy admits the job and
// hands back the stream to enqueue on; end_iteration lets the next job in at once, while the GPU
// may still be draining (the next job's work is ordered behind it on the lane's stream).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "salus/device.hpp"
#include "salus/export.hpp"
#include "salus/memory.hpp"
#include "salus/scheduler.hpp"

namespace salus {

// Starting points for the profiler; measured values replace them as iterations run.
struct MemoryHints {
  std::size_t persistent_bytes = 0;
  std::size_t ephemeral_peak_bytes = 0;
  double iteration_seconds = 0.0;
};

struct JobSpec {
  std::string name;
  JobKind kind = JobKind::training;
  int priority = 0;  // larger is more urgent
  int device = 0;
  std::uint64_t expected_iterations = 0;  // 0 = unknown
  MemoryHints hints;
  JobMemoryLimits limits;
};

struct RuntimeOptions {
  std::string policy = "fair";
  MemoryOptions memory;
  PolicyRegistry policies = PolicyRegistry::with_builtins();
};

enum class JobState : std::uint8_t { idle, waiting, running, left, cancelled };
[[nodiscard]] SALUS_API const char* to_string(JobState state) noexcept;

struct JobStats {
  JobId id;
  std::string name;
  JobKind kind = JobKind::training;
  int device = 0;
  int lane = -1;  // -1 until admitted
  JobState state = JobState::idle;
  std::uint64_t iterations = 0;
  double attained_seconds = 0.0;  // GPU time received
  double waiting_seconds = 0.0;   // time spent blocked in begin_iteration
  double max_wait_seconds = 0.0;  // longest single wait
  double iteration_seconds = 0.0; // profiled estimate of one iteration's GPU time
  std::size_t persistent_bytes = 0;
  std::size_t ephemeral_peak_bytes = 0;
  MemoryCurve memory_curve;  // ephemeral bytes over the last profiled iteration
  JobMemoryStats memory;
};

class Runtime;
class DeviceScheduler;
struct JobRecordState;

// A handle on one registered job. Destroying it leaves the job (everything it holds is freed).
class SALUS_API Job {
 public:
  Job(Job&&) noexcept;
  Job& operator=(Job&&) noexcept;
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  ~Job();

  // Blocks until the policy admits this job; returns the stream its work must go on. Throws
  // JobCancelled when the job is cancelled while waiting, InvalidArgument when already inside an
  // iteration or after the job left.
  //
  // With harvesting on (MemoryOptions::harvest), the wait is the job's safe point: its pages may
  // move to another tier then (its pointers never change), and they come home before this
  // returns, as far as the device has room. The prefetcher starts on them as soon as the policy
  // makes this job the next in its lane.
  StreamHandle begin_iteration();
  // Throws InvalidArgument outside an iteration.
  void end_iteration();

  // RAII: begins on construction, ends on destruction.
  class SALUS_API Iteration {
   public:
    explicit Iteration(Job& job);
    Iteration(const Iteration&) = delete;
    Iteration& operator=(const Iteration&) = delete;
    ~Iteration();
    [[nodiscard]] StreamHandle stream() const { return stream_; }

   private:
    Job* job_;
    StreamHandle stream_;
  };
  [[nodiscard]] Iteration iteration() { return Iteration(*this); }

  // Memory owned by this job. Inside an iteration it is ephemeral unless asked otherwise;
  // outside, persistent. Ephemeral blocks that survive an iteration become persistent.
  [[nodiscard]] DevicePtr allocate(std::size_t bytes, std::optional<Lifetime> lifetime = {});
  void deallocate(DevicePtr ptr);

  // The job is done: frees everything it holds and lets others in. Idempotent.
  void leave();
  // From any thread, at any moment (mid-iteration too): frees everything the job holds and wakes
  // it if it waits; its later calls throw JobCancelled.
  void cancel();

  [[nodiscard]] JobId id() const;
  [[nodiscard]] const std::string& name() const;
  [[nodiscard]] StreamHandle stream() const;  // its lane's stream; {} before admission
  [[nodiscard]] JobStats stats() const;

 private:
  friend class Runtime;
  Job(std::shared_ptr<DeviceScheduler> scheduler, std::shared_ptr<JobRecordState> state);
  [[nodiscard]] DeviceScheduler& scheduler() const;  // throws when moved from
  std::shared_ptr<DeviceScheduler> scheduler_;
  std::shared_ptr<JobRecordState> state_;
};

class SALUS_API JobCancelled : public Error {
 public:
  explicit JobCancelled(const std::string& job_name);
};

class SALUS_API Runtime {
 public:
  // Throws InvalidArgument for an unknown policy name (the message lists the known ones).
  explicit Runtime(std::shared_ptr<DeviceBackend> backend, RuntimeOptions options = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // The process's default runtime, made on first use: the CUDA backend where a GPU is present,
  // else one simulated GPU; policy "fair".
  static Runtime& default_runtime();

  [[nodiscard]] Job add_job(JobSpec spec);

  // Allocation for code that does not hold a Job handle (framework hooks): charged to the job
  // running on `stream` when it is one of Salus's lane streams, else to the calling thread's
  // current job (the one inside an iteration on this thread), else unattributed. The block lives
  // on `stream` (its reuse waits for the work enqueued there); a job's block with no stream (0)
  // lives on the job's lane stream.
  [[nodiscard]] DevicePtr allocate(std::size_t bytes, int device, StreamHandle stream);
  void deallocate(DevicePtr ptr);

  [[nodiscard]] MemoryManager& memory();
  [[nodiscard]] DeviceBackend& backend();
  [[nodiscard]] std::string_view policy() const;
  [[nodiscard]] std::vector<JobStats> job_stats() const;
  // Chrome trace-event JSON (iterations per lane and job, page moves per device, memory and tier
  // counters); Perfetto opens it.
  [[nodiscard]] std::string trace_json() const;
  void write_trace(const std::string& path) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace salus
