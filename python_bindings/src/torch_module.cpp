// _salus_torch: libsalus_torch for Python (salus.torch wraps it).
#include <dlfcn.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "salus/torch.hpp"

namespace py = pybind11;

namespace {

std::shared_ptr<salus::Runtime> runtime_of(const py::capsule& capsule) {
  if (std::string(capsule.name() ? capsule.name() : "") != "salus.Runtime") {
    throw py::type_error("expected a salus.Runtime capsule");
  }
  return *static_cast<std::shared_ptr<salus::Runtime>*>(capsule.get_pointer());
}

// Runs an allocator's runtime call without the GIL when this thread holds it: a policy written
// in Python takes the GIL while it holds the scheduler's lock, which the call may need.
void without_gil(void (*call)(void*), void* arg) {
  if (PyGILState_Check() == 0) {
    call(arg);
    return;
  }
  PyThreadState* saved = PyEval_SaveThread();
  try {
    call(arg);
  } catch (...) {
    PyEval_RestoreThread(saved);
    throw;
  }
  PyEval_RestoreThread(saved);
}

}  // namespace

PYBIND11_MODULE(_salus_torch, m) {
  m.doc() = "libsalus_torch bindings (use salus.torch, not this module)";
  // enable_cpu (simulated backend) and enable_cuda: the GIL hook first, then the glue.
  using Enable = void (*)(std::shared_ptr<salus::Runtime>);
  const std::pair<const char*, Enable> enablers[] = {{"enable_cpu", &salus::torch::enable_cpu},
                                                     {"enable_cuda", &salus::torch::enable_cuda}};
  for (const auto& [name, enable] : enablers) {
    m.def(
        name,
        [enable](const py::capsule& runtime, bool release_gil) {
          salus::torch::set_around(release_gil ? &without_gil : nullptr);
          enable(runtime_of(runtime));
        },
        py::arg("runtime"), py::arg("release_gil"));
  }
  m.def("disable", [] {
    py::gil_scoped_release release;
    salus::torch::disable();
  });
  m.def("enabled", &salus::torch::enabled);
  m.def("set_thread_job", [](std::uint32_t job, int device) {
    salus::torch::set_thread_job(salus::JobId{job}, device);
  });
  m.def("thread_job", [] { return salus::torch::thread_job().value; });
  m.def("raise_last_error", [] {
    if (std::exception_ptr e = salus::torch::take_last_error()) std::rethrow_exception(e);
  });
  m.def("counters", [] {
    const salus::torch::Counters c = salus::torch::counters();
    return py::dict(py::arg("allocations") = c.allocations, py::arg("frees") = c.frees,
                    py::arg("failed_frees") = c.failed_frees);
  });
  m.def("library_path", [] {
    // For torch.cuda.memory.CUDAPluggableAllocator, which opens the library by path.
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&salus_torch_cuda_malloc), &info) == 0 ||
        info.dli_fname == nullptr) {
      throw std::runtime_error("cannot find libsalus_torch's path");
    }
    return std::string(info.dli_fname);
  });
}
