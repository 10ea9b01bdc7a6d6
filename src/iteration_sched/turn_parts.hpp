// The parts a device's turn queue (LocalTurns) shares with its facade (DeviceScheduler), which
// owns them. Lock rule: each takes a lock of its own and calls nothing back (a leaf), so the
// queue and its decisions call them with the queue's lock held.
#pragma once

#include "iteration_sched/iteration_clock.hpp"
#include "iteration_sched/job_profiles.hpp"
#include "iteration_sched/lane_streams.hpp"
#include "iteration_sched/memory_waits.hpp"
#include "iteration_sched/stream_bindings.hpp"

namespace salus {

struct TurnParts {
  IterationClock& clock;    // timers, pending timings, host compute
  StreamBindings& streams;  // whose stream an allocation is on
  MemoryWaits& waits;       // allocations waiting for memory; holds on new starts
  LaneStreams& lanes;       // the lanes' streams and slots
  JobProfiles& profiles;    // what the device learns of its jobs
};

}  // namespace salus
