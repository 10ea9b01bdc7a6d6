// Jobs through the C ABI: add with a spec, begin/end iteration, cancel, leave, statistics.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <iterator>
#include <optional>

#include "capi/capi.hpp"

using salus::capi::guarded;
using salus::capi::require;

namespace {

salus::JobSpec job_spec(const salus_job_spec& s) {
  salus::capi::require_struct_size(s.struct_size, sizeof(salus_job_spec), "salus_job_spec",
                                   "salus_job_add");
  require(s.name, "salus_job_add: spec->name");
  const int kind = salus::capi::enum_value(s.kind);
  if (kind != SALUS_JOB_TRAINING && kind != SALUS_JOB_INFERENCE) {
    throw salus::InvalidArgument(
        fmt::format("salus_job_add: kind {} is not a salus_job_kind", kind));
  }
  if (s.hint_iteration_seconds < 0.0 || !(s.hint_iteration_seconds == s.hint_iteration_seconds)) {
    throw salus::InvalidArgument("salus_job_add: hint_iteration_seconds must be >= 0");
  }
  const auto limit = [](std::size_t bytes) { return bytes == 0 ? salus::kUnlimited : bytes; };
  salus::JobSpec spec;
  spec.name = s.name;
  spec.kind = kind == SALUS_JOB_INFERENCE ? salus::JobKind::inference : salus::JobKind::training;
  spec.priority = s.priority;
  spec.device = s.device;
  spec.expected_iterations = s.expected_iterations;
  spec.hints = {s.hint_persistent_bytes, s.hint_ephemeral_peak_bytes, s.hint_iteration_seconds};
  spec.limits = {limit(s.limit_total_bytes), limit(s.limit_persistent_bytes),
                 limit(s.limit_ephemeral_bytes)};
  spec.blocks_outlive_job = s.blocks_outlive_job != 0;
  return spec;
}

salus_job_state state_of(salus::JobState state) {
  switch (state) {
    case salus::JobState::idle: return SALUS_JOB_IDLE;
    case salus::JobState::waiting: return SALUS_JOB_WAITING;
    case salus::JobState::running: return SALUS_JOB_RUNNING;
    case salus::JobState::left: return SALUS_JOB_LEFT;
    case salus::JobState::cancelled: return SALUS_JOB_CANCELLED;
  }
  return SALUS_JOB_LEFT;
}

// 1.1's salus_job_stats (and 1.0's) ended where 1.2 appended `memory`, and 1.2-1.4's where 1.5
// appended `turns`.
constexpr std::size_t kJobStatsSize11 = offsetof(salus_job_stats, memory);
constexpr std::size_t kJobStatsSize14 = offsetof(salus_job_stats, turns);

// The fields 1.0 had, where it had them.
void fill_1_0(const salus::JobStats& s, salus_job_stats& out) {
  const auto& per = s.memory.by_class[static_cast<std::size_t>(salus::Lifetime::persistent)];
  const auto& eph = s.memory.by_class[static_cast<std::size_t>(salus::Lifetime::ephemeral)];
  out.job = s.id.value;
  out.device = s.device;
  out.lane = s.lane;
  out.state = state_of(s.state);
  out.iterations = s.iterations;
  out.attained_seconds = s.attained_seconds;
  out.waiting_seconds = s.waiting_seconds;
  out.max_wait_seconds = s.max_wait_seconds;
  out.iteration_seconds = s.iteration_seconds;
  out.persistent_in_use = per.in_use;
  out.ephemeral_in_use = eph.in_use;
  out.persistent_peak = per.peak;
  out.ephemeral_peak = eph.peak;
  out.persistent_blocks = per.blocks;
  out.ephemeral_blocks = eph.blocks;
  out.in_use = s.memory.in_use;
  out.peak = s.memory.peak;
  out.promoted_bytes = s.memory.promoted_bytes;
  out.profile_persistent_bytes = s.persistent_bytes;
  out.profile_ephemeral_peak_bytes = s.ephemeral_peak_bytes;
  out.quiescent = s.memory.quiescent;
  out.on_peer_bytes = s.memory.in_use_by_tier[static_cast<std::size_t>(salus::Tier::peer)];
  out.on_host_bytes = s.memory.in_use_by_tier[static_cast<std::size_t>(salus::Tier::host)];
}

// 1.2's: the job's memory, from its field list, by class and by tier.
void fill_memory(const salus::JobMemoryStats& m, salus_job_stats& out) {
#define SALUS_STATS_COPY(type, name, what) out.memory.name = m.name;
  SALUS_JOB_MEMORY_STATS_FIELDS(SALUS_STATS_COPY)
#undef SALUS_STATS_COPY
  out.persistent =
      salus::capi::class_bytes(m.by_class[static_cast<std::size_t>(salus::Lifetime::persistent)]);
  out.ephemeral =
      salus::capi::class_bytes(m.by_class[static_cast<std::size_t>(salus::Lifetime::ephemeral)]);
  static_assert(SALUS_TIER_COUNT == salus::kTierCount);
  std::copy(std::begin(m.in_use_by_tier), std::end(m.in_use_by_tier), out.in_use_by_tier);
}

// 1.5's: the job's turns and profile, from their field lists.
void fill_turns(const salus::JobStats& s, salus_job_stats& out) {
#define SALUS_STATS_COPY(type, name, what) out.turns.name = s.name;
  SALUS_JOB_TURN_STATS_FIELDS(SALUS_STATS_COPY)
  SALUS_JOB_PROFILE_FIELDS(SALUS_STATS_COPY)
#undef SALUS_STATS_COPY
}

}  // namespace

extern "C" {

void salus_job_spec_init(salus_job_spec* spec) {
  if (spec == nullptr) return;
  *spec = salus_job_spec{};
  spec->struct_size = sizeof(salus_job_spec);
  spec->kind = SALUS_JOB_TRAINING;
}

salus_status salus_job_add(salus_runtime* runtime, const salus_job_spec* spec, uint32_t* job) {
  return guarded([&] {
    require(runtime, "salus_job_add: runtime");
    require(spec, "salus_job_add: spec");
    require(job, "salus_job_add: job");
    auto handle = std::make_shared<salus::Job>(runtime->runtime->add_job(job_spec(*spec)));
    const std::uint32_t id = handle->id().value;
    std::lock_guard lock(runtime->jobs_mu);
    runtime->jobs.emplace(id, std::move(handle));
    *job = id;
  });
}

salus_status salus_job_begin_iteration(salus_runtime* runtime, uint32_t job, void** stream) {
  return guarded([&] {
    require(runtime, "salus_job_begin_iteration: runtime");
    // The handle is held, not the table's lock, while this blocks.
    const salus::StreamHandle s = runtime->job(job)->begin_iteration();
    if (stream != nullptr) *stream = reinterpret_cast<void*>(static_cast<std::uintptr_t>(s.value));
  });
}

salus_status salus_job_try_begin_iteration(salus_runtime* runtime, uint32_t job,
                                           double timeout_seconds, void** stream, int* begun) {
  return guarded([&] {
    require(runtime, "salus_job_try_begin_iteration: runtime");
    require(begun, "salus_job_try_begin_iteration: begun");
    // Also refuses NaN. Past a year the wait is as long as salus_job_begin_iteration's.
    if (!(timeout_seconds >= 0.0)) {
      throw salus::InvalidArgument(
          fmt::format("salus_job_try_begin_iteration: timeout_seconds is {}; it must be >= 0",
                      timeout_seconds));
    }
    constexpr double kYear = 365.0 * 24 * 3600;
    const auto timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double>(std::min(timeout_seconds, kYear)));
    // The handle is held, not the table's lock, while this blocks.
    const std::optional<salus::StreamHandle> s = runtime->job(job)->try_begin_iteration(timeout);
    *begun = s ? 1 : 0;
    if (stream != nullptr) {
      *stream = s ? reinterpret_cast<void*>(static_cast<std::uintptr_t>(s->value)) : nullptr;
    }
  });
}

salus_status salus_job_withdraw(salus_runtime* runtime, uint32_t job) {
  return guarded([&] {
    require(runtime, "salus_job_withdraw: runtime");
    runtime->job(job)->withdraw();
  });
}

salus_status salus_job_end_iteration(salus_runtime* runtime, uint32_t job) {
  return guarded([&] {
    require(runtime, "salus_job_end_iteration: runtime");
    runtime->job(job)->end_iteration();
  });
}

salus_status salus_job_cancel(salus_runtime* runtime, uint32_t job) {
  return guarded([&] {
    require(runtime, "salus_job_cancel: runtime");
    runtime->job(job)->cancel();
  });
}

salus_status salus_job_leave(salus_runtime* runtime, uint32_t job) {
  return guarded([&] {
    require(runtime, "salus_job_leave: runtime");
    std::shared_ptr<salus::Job> handle;
    {
      std::lock_guard lock(runtime->jobs_mu);
      auto it = runtime->jobs.find(job);
      if (it == runtime->jobs.end()) throw salus::UnknownJob(salus::JobId{job});
      handle = std::move(it->second);
      runtime->jobs.erase(it);
    }
    handle->leave();  // outside the lock: it frees the job's memory
  });
}

salus_status salus_job_get_stats(salus_runtime* runtime, uint32_t job, salus_job_stats* out) {
  return guarded([&] {
    require(runtime, "salus_job_get_stats: runtime");
    require(out, "salus_job_get_stats: out");
    const std::size_t size = out->struct_size;
    salus::capi::require_struct_size(size, sizeof(salus_job_stats), "salus_job_stats",
                                     "salus_job_get_stats", {kJobStatsSize11, kJobStatsSize14});
    const salus::JobStats stats = runtime->job(job)->stats();
    salus_job_stats filled{};
    filled.struct_size = size;
    fill_1_0(stats, filled);
    fill_memory(stats.memory, filled);
    fill_turns(stats, filled);
    std::memcpy(out, &filled, size);  // an older caller's struct ends before `memory` or `turns`
  });
}

}  // extern "C"
