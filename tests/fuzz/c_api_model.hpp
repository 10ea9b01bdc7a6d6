// The fuzz_c_api target's own model of a runtime (live blocks, jobs, streams) and the checks it
// runs after every C ABI call: statuses and the last error, no two live blocks overlapping, the
// bytes of every live block reading back, and the statistics balancing against the model.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fuzz_input.hpp"
#include "salus/c_api.h"

namespace salus::fuzz {

inline constexpr std::size_t kMiB = std::size_t{1} << 20;
inline constexpr std::size_t kBlockAlignment = 512;  // salus::MemoryManager::kBlockAlignment
// Far above anything a fuzzed runtime holds (at most a few hundred MiB): a statistic above this
// has wrapped below zero.
inline constexpr std::size_t kSane = std::size_t{1} << 40;

inline std::size_t saturating_add(std::size_t a, std::size_t b) {
  return b > SIZE_MAX - a ? SIZE_MAX : a + b;
}

struct Block {
  std::uintptr_t ptr = 0;
  std::size_t requested = 0;
  std::size_t bytes = 0;  // requested, rounded up to the block alignment
  int device = 0;
  std::uint32_t job = 0;   // 0: unattributed (also after its job left with blocks_outlive_job)
  std::uint64_t seed = 0;  // 0: never written (its job was waiting: its pages may move meanwhile)
};

// waiting: inside salus_job_begin_iteration on a Waiter's thread, behind the device's running job.
enum class JobState { idle, waiting, running, cancelled };

struct JobModel {
  std::uint32_t id = 0;
  int device = 0;
  bool outlive = false;
  JobState state = JobState::idle;
  void* iteration_stream = nullptr;
};

struct StreamModel {
  void* handle = nullptr;
  int device = 0;
  std::uint32_t bound_job = 0;
};

// The pattern of a block: 64-bit words derived from its seed and index.
inline std::uint64_t pattern_word(std::uint64_t seed, std::size_t index) {
  std::uint64_t x = seed ^ (index * 0x9E3779B97F4A7C15ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 29);
}

// Words of a block that are written and read: all of a small block, and in a large one the first
// and last word of every 64 KiB (every 2 MiB page is touched many times, so a page mapped wrong or
// moved without its bytes is seen) without the cost of a full pass after every call (the checks
// are most of the target's time).
template <class F>
void for_each_checked_word(const Block& b, F&& f) {
  const std::size_t words = b.requested / 8;
  const std::size_t stride = words <= 1024 ? 1 : 8192;
  for (std::size_t i = 0; i < words; i += stride) {
    f(i);
    if (stride > 1 && i + stride - 1 < words) f(i + stride - 1);
  }
  if (words > 0) f(words - 1);
}

inline void write_pattern(const Block& b) {
  if (b.seed == 0) return;
  auto* words = reinterpret_cast<std::uint64_t*>(b.ptr);
  for_each_checked_word(b, [&](std::size_t i) { words[i] = pattern_word(b.seed, i); });
  // A tail shorter than a word: one byte pattern.
  auto* bytes = reinterpret_cast<std::uint8_t*>(b.ptr);
  for (std::size_t i = b.requested / 8 * 8; i < b.requested; ++i) {
    bytes[i] = static_cast<std::uint8_t>(b.seed + i);
  }
}

inline void check_pattern(const Block& b, const char* after) {
  if (b.seed == 0) return;
  const auto* words = reinterpret_cast<const std::uint64_t*>(b.ptr);
  for_each_checked_word(b, [&](std::size_t i) {
    if (words[i] != pattern_word(b.seed, i)) {
      fail("after " + std::string(after) + ": block " + std::to_string(b.ptr) + " (" +
           std::to_string(b.requested) + " bytes, device " + std::to_string(b.device) + ", job " +
           std::to_string(b.job) + ") lost its bytes at word " + std::to_string(i));
    }
  });
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(b.ptr);
  for (std::size_t i = b.requested / 8 * 8; i < b.requested; ++i) {
    FUZZ_CHECK(bytes[i] == static_cast<std::uint8_t>(b.seed + i), after);
  }
}

// A job waiting in salus_job_begin_iteration on a thread of its own (the program's one other
// thread), until the job running on its device ends, is cancelled or leaves. Joined by the main
// thread right after that call, so the model never reads what the thread writes while it runs.
struct Waiter {
  std::uint32_t job = 0;
  salus_status status = SALUS_OK;
  void* stream = nullptr;
  std::string error;
  std::thread thread;

  Waiter(salus_runtime* runtime, std::uint32_t id) : job(id) {
    thread = std::thread([this, runtime] {
      status = salus_job_begin_iteration(runtime, job, &stream);
      error = salus_last_error();
    });
  }
  void join() {
    if (thread.joinable()) thread.join();
  }
  ~Waiter() { join(); }
};

// What the runtime said about every device and job, to see that a failed call changed nothing.
struct Snapshot {
  std::vector<std::size_t> device_allocated;
  std::vector<std::size_t> job_in_use;
  bool operator==(const Snapshot&) const = default;
};

struct Model {
  salus_runtime* runtime = nullptr;
  int devices = 0;
  std::size_t budget = 0;  // what each device's scheduler admits against (see admits_at_once)
  std::map<std::uintptr_t, Block> blocks;
  std::vector<JobModel> jobs;            // added and not left
  std::vector<std::uint32_t> left_jobs;  // ids retired by leave
  std::vector<StreamModel> streams;      // made with salus_stream_create, not destroyed
  std::vector<void*> destroyed_streams;  // handles no longer valid
  std::vector<std::uintptr_t> freed;     // pointers freed (for double frees)
  std::uint64_t next_seed = 1;

  // A job id: mostly one the model knows, sometimes one that left or was never made.
  std::uint32_t pick_job_id(FuzzInput& in) {
    const std::size_t k = in.below(8);
    if (k == 0 && !left_jobs.empty()) return left_jobs[in.below(left_jobs.size())];
    if (k == 1) return 100000 + in.byte();
    if (jobs.empty()) return 100000;
    return jobs[in.below(jobs.size())].id;
  }

  // A device index: mostly valid.
  int pick_device(FuzzInput& in, bool& valid) {
    const std::size_t k = in.below(16);
    valid = k != 0;
    if (k == 0) return in.chance(50) ? -1 : devices + static_cast<int>(in.below(3));
    return static_cast<int>(in.below(static_cast<std::size_t>(devices)));
  }

  // A valid stream of `device`: the default, one made by salus_stream_create, or the iteration
  // stream of one of its jobs.
  void* pick_stream(FuzzInput& in, int device) {
    std::vector<void*> options{nullptr};
    for (const StreamModel& s : streams) {
      if (s.device == device) options.push_back(s.handle);
    }
    for (const JobModel& j : jobs) {
      if (j.device == device && j.iteration_stream != nullptr)
        options.push_back(j.iteration_stream);
    }
    return options[in.below(options.size())];
  }

  void* invalid_stream(FuzzInput& in) {
    if (!destroyed_streams.empty() && in.chance(50)) {
      return destroyed_streams[in.below(destroyed_streams.size())];
    }
    return reinterpret_cast<void*>(std::uintptr_t{0x5a1e5});  // no stream of any backend
  }

  // The status every job call gives a job that cannot take it: gone or cancelled.
  salus_status gone_status(std::uint32_t id) {
    const JobModel* j = job(id);
    if (j == nullptr) return SALUS_ERROR_UNKNOWN_JOB;
    return j->state == JobState::cancelled ? SALUS_ERROR_CANCELLED : SALUS_OK;
  }

  JobModel* job(std::uint32_t id) {
    for (JobModel& j : jobs) {
      if (j.id == id) return &j;
    }
    return nullptr;
  }
  const JobModel* job(std::uint32_t id) const { return const_cast<Model*>(this)->job(id); }

  salus_job_stats job_stats(std::uint32_t id, const char* after) const {
    salus_job_stats s{};
    s.struct_size = sizeof s;
    const salus_status st = salus_job_get_stats(runtime, id, &s);
    if (st != SALUS_OK) {
      fail(std::string("after ") + after + ": stats of job " + std::to_string(id) + ": " +
           salus_status_name(st) + " " + salus_last_error());
    }
    return s;
  }

  salus_device_stats device_stats(int device, const char* after) const {
    salus_device_stats s{};
    s.struct_size = sizeof s;
    const salus_status st = salus_get_device_stats(runtime, device, &s);
    if (st != SALUS_OK) {
      fail(std::string("after ") + after + ": stats of device " + std::to_string(device) + ": " +
           salus_last_error());
    }
    return s;
  }

  Snapshot snapshot(const char* after) const {
    Snapshot s;
    for (int d = 0; d < devices; ++d)
      s.device_allocated.push_back(device_stats(d, after).allocated);
    for (const JobModel& j : jobs) s.job_in_use.push_back(job_stats(j.id, after).in_use);
    return s;
  }

  std::size_t model_bytes_of_job(std::uint32_t id) const {
    std::size_t sum = 0;
    for (const auto& [ptr, b] : blocks) sum += b.job == id ? b.bytes : 0;
    return sum;
  }

  // Single-lane policies (fair, srtf, priority) start a waiting job at once when it is admitted and
  // no iteration runs on its device. Admission (DecisionCore, LanePlan::single) holds every job of
  // the device whose persistent bytes plus the largest ephemeral peak fit the budget; when the sum
  // of every job's persistent + peak fits, all are admitted whatever the order. The profile is what
  // the stats report (hints first, then what the job used).
  bool admits_at_once(const JobModel& candidate, const char* after) const {
    return candidate.state == JobState::idle && running_on(candidate.device) == nullptr &&
           all_admitted(candidate.device, 0, after);
  }

  const JobModel* running_on(int device) const {
    for (const JobModel& j : jobs) {
      if (j.device == device && j.state == JobState::running) return &j;
    }
    return nullptr;
  }

  // Whether the persistent + peak of every job of `device` fits its budget, so that all are
  // admitted. With `ending` (a running job), as they will be once it ends its iteration: its
  // profile is then what it holds (all persistent after promotion) and at most its largest
  // ephemeral peak so far.
  bool all_admitted(int device, std::uint32_t ending, const char* after) const {
    std::size_t committed = 0;
    for (const JobModel& j : jobs) {
      if (j.device != device || j.state == JobState::cancelled) continue;
      const salus_job_stats s = job_stats(j.id, after);
      std::size_t persistent = s.profile_persistent_bytes;
      std::size_t peak = s.profile_ephemeral_peak_bytes;
      if (j.id == ending) {
        persistent = s.in_use;
        peak = std::max(peak, s.ephemeral_peak);
      }
      committed = saturating_add(committed, saturating_add(persistent, peak));
    }
    return committed <= budget;
  }

  // Everything the model knows, against the runtime: run after every call.
  void check_all(const char* after) const {
    // No two live blocks overlap, and every one keeps its bytes.
    // A job waiting in begin_iteration on the waiter's thread is quiescent: that thread may be
    // moving its pages (prefetch) right now, so its bytes are read once the thread is joined.
    // (Reading them meanwhile raced with the move: a SEGV found by fuzz_c_api in CI.)
    std::uintptr_t end = 0;
    for (const auto& [ptr, b] : blocks) {
      FUZZ_CHECK(ptr >= end,
                 std::string("after ") + after + ": blocks overlap at " + std::to_string(ptr));
      end = ptr + b.bytes;
      const JobModel* owner = b.job == 0 ? nullptr : job(b.job);
      if (owner == nullptr || owner->state != JobState::waiting) check_pattern(b, after);
    }
    std::vector<std::size_t> per_device(static_cast<std::size_t>(devices), 0);
    for (const auto& [ptr, b] : blocks) per_device[static_cast<std::size_t>(b.device)] += b.bytes;
    for (int d = 0; d < devices; ++d) {
      const salus_device_stats s = device_stats(d, after);
      const std::string where = std::string("after ") + after + ", device " + std::to_string(d);
      FUZZ_CHECK(s.allocated == per_device[static_cast<std::size_t>(d)],
                 where + ": allocated " + std::to_string(s.allocated) + ", model " +
                     std::to_string(per_device[static_cast<std::size_t>(d)]));
      FUZZ_CHECK(s.persistent.in_use + s.ephemeral.in_use == s.allocated, where);
      FUZZ_CHECK(s.allocated <= s.peak_allocated && s.reserved <= s.peak_reserved, where);
      for (std::size_t v : {s.allocated, s.reserved, s.mapped, s.cached, s.lent, s.borrowed_peer,
                            s.borrowed_host, s.retiring, s.persistent.in_use, s.ephemeral.in_use}) {
        FUZZ_CHECK(v < kSane, where + ": a statistic wrapped: " + std::to_string(v));
      }
    }
    for (const JobModel& j : jobs) {
      const salus_job_stats s = job_stats(j.id, after);
      const std::string where = std::string("after ") + after + ", job " + std::to_string(j.id);
      const std::size_t expected = model_bytes_of_job(j.id);
      FUZZ_CHECK(s.in_use == expected, where + ": in_use " + std::to_string(s.in_use) + ", model " +
                                           std::to_string(expected));
      FUZZ_CHECK(s.persistent_in_use + s.ephemeral_in_use == s.in_use, where);
      FUZZ_CHECK(s.on_peer_bytes + s.on_host_bytes <= s.in_use, where);
      // Peaks: at least what is in use. (A failed allocation no longer raises them: that is
      // tested in MemoryBasic.DeviceExhaustionIsTypedAndLeavesStateIntact; the model keeps no
      // history to bound them from above.)
      FUZZ_CHECK(s.peak >= s.in_use && s.persistent_peak >= s.persistent_in_use &&
                     s.ephemeral_peak >= s.ephemeral_in_use,
                 where);
      FUZZ_CHECK(s.in_use < kSane && s.on_peer_bytes < kSane && s.on_host_bytes < kSane, where);
      const salus_job_state want = j.state == JobState::running     ? SALUS_JOB_RUNNING
                                   : j.state == JobState::waiting   ? SALUS_JOB_WAITING
                                   : j.state == JobState::cancelled ? SALUS_JOB_CANCELLED
                                                                    : SALUS_JOB_IDLE;
      FUZZ_CHECK(s.state == want, where + ": state " + std::to_string(s.state));
    }
  }

  // The status of a call against what the model expects; a failure leaves a message and changes
  // nothing the statistics show.
  void expect(salus_status got, std::initializer_list<salus_status> allowed, const char* call,
              const Snapshot& before) const {
    bool ok = false;
    for (salus_status a : allowed) ok = ok || a == got;
    if (!ok) {
      std::string want;
      for (salus_status a : allowed)
        want += std::string(want.empty() ? "" : " or ") + salus_status_name(a);
      fail(std::string(call) + " returned " + salus_status_name(got) + " (\"" + salus_last_error() +
           "\"), expected " + want);
    }
    const char* message = salus_last_error();
    if (got == SALUS_OK) {
      FUZZ_CHECK(message[0] == '\0',
                 std::string(call) + " succeeded but left an error: " + message);
      return;
    }
    FUZZ_CHECK(message[0] != '\0', std::string(call) + " failed without a message");
    FUZZ_CHECK(snapshot(call) == before,
               std::string(call) + " failed (" + message + ") but changed the statistics");
  }
};

}  // namespace salus::fuzz
