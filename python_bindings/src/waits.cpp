// Waits that Ctrl-C ends. A C++ wait with the GIL released cannot see a signal: CPython's handler
// only sets a flag, which the main thread acts on once it runs Python again. So a long wait runs
// in slices without the GIL, and between them PyErr_CheckSignals runs the handlers: a
// KeyboardInterrupt (or whatever a handler raises) is raised within one slice. Only the main
// thread runs handlers; other threads simply wait on.
#include <pybind11/pybind11.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>

#include "bindings.hpp"
#include "gil.hpp"
#include "salus/device.hpp"
#include "salus/runtime.hpp"

namespace py = pybind11;

namespace salus::python {
namespace {

// Short enough that Ctrl-C feels immediate, long enough that a waiting thread costs nothing.
constexpr auto kSlice = std::chrono::milliseconds(50);

// Runs the signal handlers (with the GIL, which the caller holds); true when one raised.
bool signal_raised() {
  return PyErr_CheckSignals() != 0;
}

}  // namespace

std::uintptr_t begin_iteration_interruptibly(Job& job) {
  for (;;) {
    std::optional<StreamHandle> stream;
    {
      ReleaseGil release;
      stream = job.try_begin_iteration(kSlice);
    }
    if (stream) return stream->value;
    if (signal_raised()) {
      // The wait ends with the exception: the job is idle again and queued nowhere (a turn
      // granted meanwhile goes back), so it may ask again later. The handler's exception is the
      // one that matters; a failure to withdraw (the job was cancelled meanwhile) adds nothing.
      try {
        ReleaseGil release;
        job.withdraw();
      } catch (const std::exception&) {
      }
      throw py::error_already_set();
    }
  }
}

void synchronize_interruptibly(DeviceBackend& backend, StreamHandle stream) {
  // A host function behind the work enqueued so far says when the stream has done it: the same
  // point synchronize_stream waits for, but a wait that can stop for a signal. If it is
  // abandoned, the host function still runs later and only sets the flag.
  struct Reached {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto reached = std::make_shared<Reached>();
  {
    ReleaseGil release;
    backend.launch_host_func(stream, [reached] {
      {
        std::lock_guard lock(reached->mu);
        reached->done = true;
      }
      reached->cv.notify_all();
    });
  }
  for (;;) {
    bool done = false;
    {
      ReleaseGil release;
      std::unique_lock lock(reached->mu);
      done = reached->cv.wait_for(lock, kSlice, [&] { return reached->done; });
      lock.unlock();
      // A CUDA stream that failed never runs its host functions; asking the stream reports the
      // failure (DeviceError) instead of waiting for ever. Idle means our work is done too.
      if (!done) done = backend.query_stream(stream, 0);
    }
    if (done) return;
    if (signal_raised()) throw py::error_already_set();
  }
}

}  // namespace salus::python
