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
};

}  // namespace salus
