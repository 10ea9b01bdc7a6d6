// _salus_torch: libsalus_torch for Python (salus.torch wraps it).
#include <dlfcn.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "salus/torch.hpp"
#if defined(SALUS_TORCH_HAS_CUDA_ALLOCATOR)
#include "salus/torch_cuda.hpp"
#endif

namespace py = pybind11;

namespace {

std::shared_ptr<salus::Runtime> runtime_of(const py::capsule& capsule) {
  if (std::string(capsule.name() ? capsule.name() : "") != "salus.Runtime") {
    throw py::type_error("expected a salus.Runtime capsule");
  }
  return *static_cast<std::shared_ptr<salus::Runtime>*>(capsule.get_pointer());
}

// Runs an allocator's runtime call without the GIL when this thread holds it. PyTorch allocates
// holding the GIL in places (torch.tensor(data), unpickling, tensor deleters...), and the call
// may wait: for memory another job's iteration holds (its loop, a Python thread, then needs the
// GIL to finish), for a spill; and a policy written in Python takes the GIL while it holds the
// scheduler's lock, which any call may need.
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
        [enable](const py::capsule& runtime, bool python_policy) {
          // Always around the calls that may block; around all of them under a Python policy.
          salus::torch::set_around(&without_gil, python_policy
                                                     ? salus::torch::AroundCalls::all
                                                     : salus::torch::AroundCalls::blocking);
          enable(runtime_of(runtime));
        },
        py::arg("runtime"), py::arg("python_policy"));
  }
  m.def("disable", [] {
    py::gil_scoped_release release;
    salus::torch::disable();
  });
  m.def("enabled", &salus::torch::enabled);
  m.def("raise_last_error", [] {
    if (std::exception_ptr e = salus::torch::take_last_error()) std::rethrow_exception(e);
  });
  m.def("counters", [] {
    const salus::torch::Counters c = salus::torch::counters();
    return py::dict(py::arg("allocations") = c.allocations, py::arg("frees") = c.frees,
                    py::arg("failed_frees") = c.failed_frees);
  });
#if defined(SALUS_TORCH_HAS_CUDA_ALLOCATOR)
  // Salus's CUDA allocator object (record_stream, statistics, empty_cache, graphs refused) as
  // PyTorch's, once per process.
  m.def("install_cuda_allocator", [] { salus::torch::install_cuda_allocator(); });
#endif
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
