// How a layer above the scheduler builds a runtime with parts the public constructor does not
// take (runtime_parts.hpp: salusd's turn gate in a connected process; reported memory profiles in
// salusd itself).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>

#include "iteration_sched/trace.hpp"
#include "iteration_sched/runtime_parts.hpp"
#include "salus/runtime.hpp"

namespace salus {

struct RuntimeAccess {
  // A runtime over `backend` built with `parts`. A gate outlives everything else in the runtime.
  static std::shared_ptr<Runtime> make(std::shared_ptr<DeviceBackend> backend,
                                       RuntimeOptions options, RuntimeParts parts);
  // The runtime's timeline, for a layer above that adds to it (salusd's page grants).
  static std::shared_ptr<TraceRecorder> trace(Runtime& runtime);
  // `job`'s memory as its process measured it, for its scheduler's plans; call before the
  // job's end_iteration, whose decisions then see it.
  static void report_memory(Job& job, const MeasuredMemory& measured);
  // `job`'s GPU time as its process measured it (timing events on its stream): charged instead
  // of the host time between its begin and end, from this call on. Before its end_iteration.
  static void report_gpu_time(Job& job, GpuTime gpu);

  // Waits with no thread in them (salusd's turn loop): the loop asks for a job's turn with
  // try_begin_iteration(0), which leaves the job waiting in its place when the turn is not
  // there yet, and is told by `on_wake` when the job's wait may have changed (its turn was
  // granted, it was cancelled or left, or a recheck asks waiters to look), then asks again.
  // `on_wake` runs on the thread that decided, possibly under the scheduler's lock: it only takes
  // note. Set once, before the job's first begin.
  static void on_wake(Job& job, std::function<void()> on_wake);
  // end_iteration of a runtime without a gate, with `between` called once the next job is in
  // and before this iteration's bookkeeping (LocalTurns::end).
  static void end_iteration(Job& job, const std::function<void()>& between);
  // The rechecks the runtime's plans asked for whose time has come (see LocalTurns::recheck);
  // returns when the next one is due, nullopt when none is asked for.
  static std::optional<std::chrono::steady_clock::time_point> recheck(Runtime& runtime);
  // When the waiting job's turn is expected (LocalTurns::expected_turn), for a waiter in
  // another process to watch for it then.
  static std::optional<std::chrono::steady_clock::time_point> expected_turn(Job& job);
};

}  // namespace salus
