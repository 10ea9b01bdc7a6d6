// The parts a device's turn queue shares with its facade (TurnParts), on one simulated device of
// 64 MiB, for the tests of the queue and its parts without a DeviceScheduler.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "iteration_sched/iteration_clock.hpp"
#include "iteration_sched/job_profiles.hpp"
#include "iteration_sched/lane_streams.hpp"
#include "iteration_sched/memory_waits.hpp"
#include "iteration_sched/stream_bindings.hpp"
#include "iteration_sched/turn_parts.hpp"
#include "salus/scheduler.hpp"
#include "salus/sim.hpp"

namespace salus::test {

struct TurnPartsOnSim : ::testing::Test {
  std::shared_ptr<DeviceBackend> backend =
      make_sim_backend(SimConfig::uniform(1, 64 * (std::size_t{1} << 20)));
  std::shared_ptr<MemoryManager> memory = std::make_shared<MemoryManager>(backend);
  std::unique_ptr<Policy> policy = PolicyRegistry::with_builtins().make("fair");
  IterationClock clock{backend, 0, make_site_choice(false)};
  StreamBindings streams;
  MemoryWaits waits;
  LaneStreams lanes{backend, 0, false};
  JobProfiles profiles;

  TurnParts parts() {
    return {.clock = clock, .streams = streams, .waits = waits, .lanes = lanes,
            .profiles = profiles};
  }

  ~TurnPartsOnSim() override {
    // As DeviceScheduler does: the lanes' heaps retire before their streams go.
    for (const StreamHandle lane : lanes.all()) memory->retire_stream(0, lane);
    lanes.clear();
  }
};

}  // namespace salus::test
