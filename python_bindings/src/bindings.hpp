// Parts of the _salus module that live in source files of their own; the PYBIND11_MODULE in
// module.cpp calls each of them once.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "salus/device.hpp"
#include "salus/runtime.hpp"
#include "salus/sim.hpp"

namespace salus::python {

// waits.cpp: blocking calls that Ctrl-C interrupts (called with the GIL held; they release it).
// Waits for the job's turn; a signal handler's exception (KeyboardInterrupt) ends the wait and
// withdraws it (Job::withdraw), so the job is idle and may ask again. Returns the stream.
std::uintptr_t begin_iteration_interruptibly(Job& job);
// Waits for the work enqueued on `stream` so far (device 0's default stream for 0); a signal
// handler's exception ends the wait (the work goes on).
void synchronize_interruptibly(DeviceBackend& backend, StreamHandle stream);

// _salus.simulate: the discrete-event cluster simulator (salus/simulation.hpp).
void bind_simulation(pybind11::module_& m);

// The simulated GPUs of `topology` (runtime_config.cpp); InvalidArgument naming what is wrong.
SimConfig sim_config(int devices, std::size_t memory, const std::string& topology);
// The spill policy named `spill`; InvalidArgument listing the known ones.
SpillPolicy spill_policy(const std::string& spill);

}  // namespace salus::python
