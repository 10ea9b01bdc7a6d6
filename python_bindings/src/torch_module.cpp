// _salus_torch: libsalus_torch for Python (salus.torch wraps it).
#include <dlfcn.h>
#include <pybind11/pybind11.h>

#include "gil.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#include "salus/blocking.hpp"
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

// The GIL only when the call blocks. An allocator call made holding the GIL keeps it while it
// runs (the steady state's allocations and frees take microseconds and never wait): letting go
// of it and taking it back around each would hand it to another Python thread at every
// allocation. Where the call is about to block (salus/blocking.hpp: memory another job's
// iteration holds, the GPU, the daemon), Salus runs release_before_blocking, which lets go of it;
// it is taken back once the call has returned, outside Salus's locks.
struct GilScope {
  PyThreadState* saved = nullptr;  // set once the GIL was let go
};
thread_local GilScope* t_scope = nullptr;

void release_before_blocking() noexcept {
  GilScope* scope = t_scope;
  if (scope != nullptr && scope->saved == nullptr) scope->saved = PyEval_SaveThread();
}

void gil_until_blocking(void (*call)(void*), void* arg) {
  if (PyGILState_Check() == 0) {
    call(arg);
    return;
  }
  GilScope scope;
  GilScope* const outer = std::exchange(t_scope, &scope);
  const auto restore = [&] {
    t_scope = outer;
    if (scope.saved != nullptr) PyEval_RestoreThread(scope.saved);
  };
  try {
    call(arg);
  } catch (...) {
    restore();
    throw;
  }
  restore();
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
          // A policy written in Python takes the GIL while it holds the scheduler's lock, which
          // any call may need: then every call runs without the GIL. Else the calls that may
          // block keep it until they do (gil_until_blocking).
          if (python_policy) {
            salus::torch::set_around(&without_gil, salus::torch::AroundCalls::all);
          } else {
            (void)salus::set_before_blocking(&release_before_blocking);
            salus::torch::set_around(&gil_until_blocking, salus::torch::AroundCalls::blocking);
          }
          enable(runtime_of(runtime));
        },
        py::arg("runtime"), py::arg("python_policy"));
  }
  m.def("disable", [] {
    salus::python::ReleaseGil release;
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
