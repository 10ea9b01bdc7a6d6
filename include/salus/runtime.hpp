// The runtime: jobs share each GPU at iteration granularity.
//
// A job registers with a spec, then brackets each iteration with begin_iteration/end_iteration
// (or an Iteration guard). begin_iteration blocks until the device's policy admits the job and
// hands back the stream to enqueue on; end_iteration lets the next job in at once, while the GPU
// may still be draining (the next job's work is ordered behind it on the lane's stream).
#pragma once

#include <chrono>
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
  // The job's blocks are held by a framework's objects (PyTorch tensors), which free them when
  // they are destroyed, possibly after the job has left or was cancelled, and possibly while its
  // thread still computes on them (PyTorch on the CPU over simulated memory). Leaving or a cancel
  // then frees nothing: the job's live blocks stay valid, charged to nobody (unattributed), until
  // their holder frees them. An address is therefore never reused under a live tensor.
  bool blocks_outlive_job = false;
};

struct RuntimeOptions {
  std::string policy = "fair";
  MemoryOptions memory;
  PolicyRegistry policies = PolicyRegistry::with_builtins();
  // Jobs compute on their own threads, not on streams (PyTorch's CPU tensors over a simulated
  // GPU; salus::torch::enable_cpu sets it): an iteration's host time is its device time (what
  // `fair`, `srtf` and the statistics see), and a block is handed out with no work pending on any
  // stream, so the host may touch it at once (AllocationRequest::host_access).
  bool host_compute = false;
  // How long an allocation that the device refuses may wait for other iterations on its device
  // to end (what they free may make it fit) before it fails with OutOfMemory. A minute outlasts
  // any training iteration, and turns into an error what would otherwise wait for good: a wait
  // for an iteration that only the waiting thread would end (a thread that drives two jobs, or
  // PyTorch's autograd engine, which runs every job's backward on a device on one thread). Zero
  // waits as long as any other iteration runs.
  std::chrono::milliseconds allocation_wait_limit{std::chrono::minutes(1)};
  // How long a job whose turn is due spins for it before it sleeps. A job that waits for a turn
  // sleeps; when it is next in its lane, it wakes this long before the iteration ahead of it is
  // expected to end (its host time, measured) and watches for the turn, so that the switch is a
  // cache line changing hands instead of a sleeping thread woken through the kernel (20-40 us on
  // a VM, across CPUs). Off (as if zero) where jobs compute on the host, whose CPU is their
  // compute, and where the process may use one CPU only; zero turns it off everywhere. At most
  // this much CPU time per switch, on the waiting thread.
  std::chrono::microseconds turn_spin{50};
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
  // The fields of SALUS_JOB_TURN_STATS_FIELDS and SALUS_JOB_PROFILE_FIELDS (salus/stats_fields.h,
  // where each is described).
#define SALUS_STATS_MEMBER(type, name, what) type name = 0;
  SALUS_JOB_TURN_STATS_FIELDS(SALUS_STATS_MEMBER)
  SALUS_JOB_PROFILE_FIELDS(SALUS_STATS_MEMBER)
#undef SALUS_STATS_MEMBER
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
  // As begin_iteration, but waits at most `timeout` (>= 0; 0 only asks): nullopt when the time
  // ran out first. The job then keeps waiting in its place in the queue with no thread in the
  // wait: calling this (or begin_iteration) again goes on waiting, withdraw() stops. One thread
  // at a time may wait for a job's turn (InvalidArgument otherwise). For waits that must stay
  // responsive (the Python module waits in slices and handles Ctrl-C between them).
  [[nodiscard]] std::optional<StreamHandle> try_begin_iteration(std::chrono::nanoseconds timeout);
  // Ends the wait that a try_begin_iteration which ran out of time left pending: the job is idle
  // again and queued nowhere (it may ask for a turn later). If the policy granted its turn
  // meanwhile, the turn is handed back at once, unused (no iteration counts). Nothing happens
  // when the job is idle, left or was cancelled. Throws InvalidArgument inside an iteration
  // (end_iteration ends it) and while a thread waits for the turn (cancel() wakes that one).
  void withdraw();
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
  // After the job left or was cancelled, its blocks' holders may still free them here when they
  // outlive it (JobSpec::blocks_outlive_job); otherwise that throws as other calls do.
  void deallocate(DevicePtr ptr);

  // The job is done: frees everything it holds and lets others in. Idempotent. In a forked
  // child (the job was made in the parent) it does nothing: the parent's job is not this
  // process's to end.
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
  friend struct RuntimeAccess;  // salusd reports its jobs' memory (runtime_access.hpp)
  Job(std::shared_ptr<DeviceScheduler> scheduler, std::shared_ptr<JobRecordState> state);
  [[nodiscard]] DeviceScheduler& scheduler() const;  // throws when moved from
  std::shared_ptr<DeviceScheduler> scheduler_;
  std::shared_ptr<JobRecordState> state_;
};

class SALUS_API JobCancelled : public Error {
 public:
  explicit JobCancelled(const std::string& job_name);
};

// Who a thread works for, as Runtime::JobScope saves and restores it: a runtime (an opaque
// serial, 0 for none), a job of it, and the device the job runs on.
struct ThreadJob {
  std::uint64_t runtime = 0;
  JobId job = kUnattributedJob;
  int device = 0;
};

// fork(): a runtime belongs to the process that made it. In a forked child (which has only the
// thread that forked: no stream threads, no CUDA context) every call on a runtime made before
// fork(), and on its jobs, throws NotSupported saying so; destroying it there leaks it, as
// joining its threads or freeing its memory would hang or reach into the parent's. A runtime
// made in the child works. The default runtime in a child is a new one, made on first use.
class SALUS_API Runtime {
 public:
  // Throws InvalidArgument for an unknown policy name (the message lists the known ones).
  explicit Runtime(std::shared_ptr<DeviceBackend> backend, RuntimeOptions options = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // The process's one default runtime, shared with the C ABI (salus_default_runtime): made on
  // first use (the CUDA backend where a GPU is present, else one simulated GPU; policy "fair"),
  // or by init_default_runtime with a backend and options of the caller's choice. init throws
  // InvalidArgument when the default exists already.
  static Runtime& default_runtime();
  static Runtime& init_default_runtime(std::shared_ptr<DeviceBackend> backend,
                                       RuntimeOptions options = {});
  // The default runtime (made on first use as above), held: it stays alive while the pointer
  // does, even past salus_default_runtime_shutdown (for bindings that own their references).
  static std::shared_ptr<Runtime> shared_default();

  // A runtime connected to salusd is made by connect_runtime (salus/remote.hpp).

  [[nodiscard]] Job add_job(JobSpec spec);

  // Allocation for code that does not hold a Job handle (framework hooks, the C ABI). Charged to
  // `job` when it is not kUnattributedJob (it must run on `device`); else to the job `stream` is
  // bound to (a lane stream while a job's iteration runs on it, or bind_stream); else to the
  // calling thread's current job (set_current_job, or else the job inside an iteration on this
  // thread); else unattributed. A job's block is ephemeral inside its iteration and persistent
  // outside unless `lifetime` says otherwise. The block lives on `stream` (its reuse waits for
  // the work enqueued there); a job's block with no stream (0) lives on the job's lane stream.
  [[nodiscard]] DevicePtr allocate(std::size_t bytes, int device, StreamHandle stream,
                                   JobId job = kUnattributedJob,
                                   std::optional<Lifetime> lifetime = {});
  void deallocate(DevicePtr ptr);
  // As above, checking the caller's view of the block: its device, and its size when `bytes` is
  // not 0 (the size asked for, or the block's rounded size).
  void deallocate(DevicePtr ptr, std::size_t bytes, int device);
  // As above, checking whatever `check` names; with `check.job`, a block that belongs to another
  // job (its own was freed by a cancel and the address reused) is refused, not freed.
  void deallocate(DevicePtr ptr, const MemoryManager::FreeCheck& check);
  // The block at `ptr` is also used on `stream` (PyTorch's record_stream).
  void record_stream(DevicePtr ptr, StreamHandle stream);

  // Allocations on a framework's `stream` of `device` are charged to `job` until unbound or the
  // job leaves; the job's memory is ordered against the work enqueued on the stream.
  void bind_stream(int device, StreamHandle stream, JobId job);
  // Throws InvalidArgument when the stream is not bound.
  void unbind_stream(int device, StreamHandle stream);
  // The application is about to destroy `stream` of `device`: nothing of Salus names it any more
  // (MemoryManager::retire_stream, and a binding to a job ends). Its handle may then come back as
  // another stream without being mistaken for this one. Throws as MemoryManager::retire_stream.
  void retire_stream(int device, StreamHandle stream);
  // The calling thread's current job in this runtime (kUnattributedJob clears it). Throws
  // UnknownJob for a job that is not present.
  void set_current_job(JobId job);
  [[nodiscard]] JobId current_job() const;
  // The device the calling thread's current job runs on; -1 when it has none in this runtime.
  [[nodiscard]] int current_job_device() const;

  // RAII: while it lives, the calling thread's current job is `job` (of this runtime, on
  // `device`); after, the thread's previous current job (of whichever runtime) comes back. It
  // does not look the job up: an allocation charged to a job that has left or was cancelled
  // throws then (salus::torch's JobScope and Python's `with job:` are made of it).
  class SALUS_API JobScope {
   public:
    JobScope(const Runtime& runtime, JobId job, int device);
    ~JobScope();
    JobScope(const JobScope&) = delete;
    JobScope& operator=(const JobScope&) = delete;

   private:
    ThreadJob previous_;
  };

  // RuntimeOptions::host_compute, changed while the runtime runs (salus::torch's CPU mode turns
  // it on and off); iterations running now are timed by the clock they started with.
  void set_host_compute(bool on);
  [[nodiscard]] bool host_compute() const;

  [[nodiscard]] int device_count() const;
  [[nodiscard]] MemoryManager& memory();
  [[nodiscard]] DeviceBackend& backend();
  [[nodiscard]] std::string_view policy() const;
  // Every job present, and the last 256 per device that left (older ones are forgotten, so a
  // long-running process stays bounded).
  [[nodiscard]] std::vector<JobStats> job_stats() const;
  // Chrome trace-event JSON (iterations per lane and job, page moves per device, memory and tier
  // counters) of the last 50,000 events (older ones are dropped); Perfetto opens it.
  [[nodiscard]] std::string trace_json() const;
  void write_trace(const std::string& path) const;

 private:
  struct Impl;
  friend struct RuntimeAccess;  // builds connected runtimes (src/iteration_sched/runtime_access.hpp)
  explicit Runtime(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace salus
