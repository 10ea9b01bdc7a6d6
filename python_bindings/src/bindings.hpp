// Parts of the _salus module that live in source files of their own; the PYBIND11_MODULE in
// module.cpp calls each of them once.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

#include "salus/device.hpp"
#include "salus/runtime.hpp"

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

}  // namespace salus::python
