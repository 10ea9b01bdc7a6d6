// The GIL around a blocking call: released for the call, taken back after, as
// py::gil_scoped_release does, except that its destructor may let an unwind pass. A thread that
// takes the GIL back while the interpreter is exiting is ended by Python with pthread_exit, a
// forced unwind; through py::gil_scoped_release's destructor, which is noexcept, the C++ runtime
// answered it with std::terminate, and a Python program that exited while a daemon thread was
// inside Salus died of SIGABRT (issue 34, item 5; test_exit.py). Here the unwind goes on, up
// through pybind11's dispatcher (which rethrows abi::__forced_unwind), and the thread ends as
// Python meant.
#pragma once

#include <Python.h>

namespace salus::python {

class ReleaseGil {
 public:
  ReleaseGil() : state_(PyEval_SaveThread()) {}
  // noexcept(false): pthread_exit's forced unwind may start in PyEval_RestoreThread.
  ~ReleaseGil() noexcept(false) { PyEval_RestoreThread(state_); }
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

 private:
  PyThreadState* state_;
};

}  // namespace salus::python
