// What a layer above the scheduler puts into a runtime besides its options (RuntimeAccess::make),
// fixed for the runtime's life: each device scheduler is built with them, none is switched later.
#pragma once

#include <memory>

#include "iteration_sched/turn_gate.hpp"

namespace salus {

// Where the jobs' memory profiles (persistent bytes, ephemeral peak, the curve the policies plan
// with) come from.
enum class MemoryProfiles {
  measured,  // this runtime carves the jobs' blocks and measures them itself
  // Where the jobs run (salusd's: in their processes), reported at each iteration's end
  // (RuntimeAccess::report_memory): the runtime's own measurements (none) do not count, and a
  // job with no hints runs alone until its first report.
  reported,
};

struct RuntimeParts {
  // Taken before the scheduler's own turn and given back after it (a runtime connected to
  // salusd: GatedTurns); null: the scheduler's turns alone (LocalTurns).
  std::shared_ptr<TurnGate> gate;
  MemoryProfiles memory_profiles = MemoryProfiles::measured;
};

}  // namespace salus
