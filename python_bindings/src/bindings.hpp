// Parts of the _salus module that live in source files of their own; the PYBIND11_MODULE in
// module.cpp calls each of them once.
#pragma once

#include <pybind11/pybind11.h>

namespace salus::python {

// _salus.simulate: the discrete-event cluster simulator (salus/simulation.hpp).
void bind_simulation(pybind11::module_& m);

}  // namespace salus::python
