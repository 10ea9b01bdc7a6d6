// Scheduling policies: pure decisions over a snapshot of the scheduler's state.
//
// A policy never locks, sleeps or reads a clock. The mechanism (the per-device scheduler, or the
// discrete-event simulator) keeps the waiting jobs of each lane ordered by the policy's key and
// asks the policy only the questions below, so one policy drives a real GPU, simulated GPUs and a
// virtual-clock simulation alike.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "salus/export.hpp"
#include "salus/job_id.hpp"

namespace salus {

enum class JobKind : std::uint8_t { training, inference };
[[nodiscard]] SALUS_API const char* to_string(JobKind kind) noexcept;

// Ephemeral bytes over one iteration, sampled at evenly spaced points of its duration
// (bytes[i] covers [i, i+1) / bytes.size() of it). Empty when unknown.
struct MemoryCurve {
  double duration_seconds = 0.0;
  std::vector<std::size_t> bytes;

  [[nodiscard]] bool known() const { return duration_seconds > 0.0 && !bytes.empty(); }
  // Bytes at `t` seconds after the iteration started; 0 outside the iteration.
  [[nodiscard]] SALUS_API std::size_t at(double t) const;
  [[nodiscard]] SALUS_API std::size_t peak() const;
};

// What a policy may know about one job.
struct JobView {
  JobId id;
  JobKind kind = JobKind::training;
  int priority = 0;                  // larger is more urgent
  std::uint64_t arrival = 0;         // registration order on the device
  std::uint64_t iterations_done = 0;
  std::uint64_t expected_iterations = 0;  // 0 = unknown
  double iteration_seconds = 0.0;    // current estimate of one iteration's GPU time; 0 = unknown
  double attained_seconds = 0.0;     // GPU time received so far
  std::size_t persistent_bytes = 0;  // resident between iterations
  std::size_t ephemeral_peak_bytes = 0;
  const MemoryCurve* curve = nullptr;  // may be null or unknown
  // Whether the two byte counts above say anything (hinted, or measured by an iteration). A job
  // whose memory is not known yet runs its iterations alone until one has measured it: beside
  // others it could take memory they were promised (DESIGN.md, invariant 6).
  bool memory_known = true;
  // Its persistent bytes are on the device whether or not it is admitted (the runtime: a job
  // builds its weights before its first turn, and keeps them while it waits to be re-admitted).
  // Admission and the memory-aware plan then count them as taken while it waits for a lane; the
  // simulator's jobs allocate nothing before admission and leave this false.
  bool memory_resident = false;

  [[nodiscard]] bool latency_critical() const { return kind == JobKind::inference; }
  // Expected GPU time still to go; +infinity when the job's length is unknown.
  [[nodiscard]] SALUS_API double remaining_seconds() const;
};

// Waiting jobs are served in increasing key order; ties go to the least recently served job, then
// to the earliest arrival, so that equal keys take turns and never starve (DESIGN.md, invariant 7).
struct SortKey {
  double primary = 0.0;
  double secondary = 0.0;
  friend constexpr auto operator<=>(const SortKey&, const SortKey&) = default;
};

// An iteration in flight, as seen at decision time.
struct RunningIteration {
  const JobView* job = nullptr;
  double elapsed_seconds = 0.0;  // since it started
};

// Bytes held for good from `from_seconds` after now on: under LanePlan::memory_aware, the
// ephemeral quota a lane keeps for its next turn once the iteration it runs now is predicted to
// end.
struct HeldFrom {
  double from_seconds = 0.0;
  std::size_t bytes = 0;
};

struct DeviceView {
  std::size_t budget_bytes = 0;            // what the device may hold for all jobs
  std::size_t persistent_bytes = 0;        // of every admitted job (resident throughout)
  std::span<const RunningIteration> running;
  std::span<const HeldFrom> held;  // besides `running` (empty outside memory_aware)
};

// How a policy uses lanes (DESIGN.md: a lane is an ephemeral budget plus a stream; jobs in a lane
// take turns, lanes run concurrently).
enum class LanePlan : std::uint8_t {
  single,        // one lane: every job takes turns (time sharing)
  packed,        // Salus lane rule: as many lanes as memory allows, each sized to its peak
  memory_aware,  // no fixed lanes: iterations overlap whenever predicted memory fits
};

class SALUS_API Policy {
 public:
  virtual ~Policy() = default;
  [[nodiscard]] virtual std::string_view name() const = 0;
  // Order among waiting jobs; computed when a job starts waiting.
  [[nodiscard]] virtual SortKey key(const JobView& job) const = 0;
  [[nodiscard]] virtual LanePlan lanes() const { return LanePlan::single; }
  // True: a job that started keeps its lane until it leaves (exclusive, run to completion).
  [[nodiscard]] virtual bool runs_to_completion() const { return false; }
  // For LanePlan::memory_aware: the least delay (seconds from now) after which `candidate` may
  // start beside `device.running` and `device.held` so that the predicted total stays within the
  // budget at every instant; nullopt when it cannot start before one of the running iterations
  // ends. The scheduler asks it for each waiting job that might start beside the lanes' turns
  // (an extra) and starts the job when the answer is 0, or asks again after a positive answer.
  // The default allows overlap only when every peak fits at once; "memory_aware" runs the
  // Zico-style offset search over the curves.
  [[nodiscard]] virtual std::optional<double> start_delay(const DeviceView& device,
                                                          const JobView& candidate) const;
};

using PolicyFactory = std::function<std::unique_ptr<Policy>()>;

// Policies by name: a plain value (each Runtime holds one), so registering a policy touches no
// global state.
class SALUS_API PolicyRegistry {
 public:
  PolicyRegistry();  // empty
  // "fifo", "srtf", "fair", "pack", "priority" and "memory_aware".
  static PolicyRegistry with_builtins();
  // Throws InvalidArgument if the name is empty or taken, or the factory is empty.
  void add(std::string name, PolicyFactory factory);
  // Throws InvalidArgument naming the known policies when `name` is not one of them.
  [[nodiscard]] std::unique_ptr<Policy> make(std::string_view name) const;
  [[nodiscard]] std::vector<std::string> names() const;

 private:
  std::vector<std::pair<std::string, PolicyFactory>> entries_;
};

}  // namespace salus
