// A stream held busy on the simulated backend, as by a long kernel: its work waits at a gate the
// test opens, then runs a little longer and marks itself done.
#pragma once

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "salus/device.hpp"

namespace salus::test_support {

// Holds `stream` until the returned promise is set; its work then sets `done` (20 ms later: the
// "kernel" still runs after the gate opens). Host functions run in stream order on the simulated
// backend, so later work on the stream waits too.
inline std::promise<void> block_stream(DeviceBackend& backend, StreamHandle stream,
                                       std::atomic<bool>& done) {
  using namespace std::chrono_literals;
  std::promise<void> gate;
  auto opened = std::make_shared<std::shared_future<void>>(gate.get_future().share());
  backend.launch_host_func(stream, [opened, &done] {
    opened->wait();
    std::this_thread::sleep_for(20ms);
    done.store(true);
  });
  return gate;
}

}  // namespace salus::test_support
