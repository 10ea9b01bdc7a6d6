// How a layer above the scheduler builds a runtime with parts the public constructor does not
// take: a turn gate (a runtime connected to salusd).
#pragma once

#include <memory>

#include "iteration_sched/trace.hpp"
#include "iteration_sched/turn_gate.hpp"
#include "salus/runtime.hpp"

namespace salus {

struct RuntimeAccess {
  // A runtime over `backend` whose jobs take the gate's turn before their scheduler's. The gate
  // outlives everything else in the runtime.
  static std::shared_ptr<Runtime> make(std::shared_ptr<DeviceBackend> backend,
                                       RuntimeOptions options, std::shared_ptr<TurnGate> gate);
  // The runtime's timeline, for a layer above that adds to it (salusd's page grants).
  static std::shared_ptr<TraceRecorder> trace(Runtime& runtime);
  // The jobs' memory is measured where they run (salusd's: in their processes) and reported at
  // each iteration's end (report_memory); the runtime's own measurements (none) stop counting,
  // and a job unhinted runs alone until its first report. Before any job is added.
  static void measure_elsewhere(Runtime& runtime);
  // `job`'s memory as its process measured it, for its scheduler's plans; call before the
  // job's end_iteration, whose decisions then see it.
  static void report_memory(Job& job, const MeasuredMemory& measured);
  // `job`'s GPU time as its process measured it (timing events on its stream): charged instead
  // of the host time between its begin and end, from this call on. Before its end_iteration.
  static void report_gpu_time(Job& job, GpuTime gpu);
};

}  // namespace salus
