// _salus: the C++ runtime for Python. The Python package `salus` (python_bindings/salus) wraps
// these with argument checking, plain statistics objects and typed exceptions; users import that.
//
// The GIL: every call that may block or take a scheduler lock releases it; the long waits (a
// job's turn, a stream's work) also wake for signals, so Ctrl-C ends them (waits.cpp). A policy
// written in Python is called with the scheduler's lock held and takes the GIL then, so no thread
// may hold the GIL while it waits for that lock: hence no exception to the rule above.
#include <cmath>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "salus/cuda.hpp"
#include "salus/error.hpp"
#include "salus/log.hpp"
#include "salus/runtime.hpp"
#include "salus/remote.hpp"
#include "salus/sim.hpp"
#include "bindings.hpp"
#include "gil.hpp"

namespace py = pybind11;

namespace salus::python {
namespace {

using Release = py::call_guard<ReleaseGil>;

// --- errors: C++ exceptions become the classes of salus.errors, fields included ------------------

py::object error_class(const char* name) {
  return py::module_::import("salus.errors").attr(name);
}

void raise(const char* cls, const std::string& message, py::dict fields) {
  py::object instance = error_class(cls)(message, **fields);
  PyErr_SetObject(py::type::handle_of(instance).ptr(), instance.ptr());
}

void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const OutOfMemory& e) {
    const OutOfMemoryInfo& i = e.info();
    raise("OutOfMemory", e.what(),
          py::dict(py::arg("job") = i.job.value, py::arg("job_name") = i.job_name,
                   py::arg("device") = i.device, py::arg("requested") = i.requested_bytes,
                   py::arg("job_in_use") = i.job_in_use_bytes,
                   py::arg("job_limit") = i.job_limit_bytes,
                   py::arg("device_in_use") = i.device_in_use_bytes,
                   py::arg("device_limit") = i.device_limit_bytes, py::arg("reason") = i.reason,
                   py::arg("waited") = static_cast<double>(i.waited.count()) / 1000.0));
  } catch (const JobCancelled& e) {
    raise("JobCancelled", e.what(), py::dict());
  } catch (const UnknownJob& e) {
    raise("UnknownJob", e.what(), py::dict(py::arg("job") = e.job().value));
  } catch (const DeviceError& e) {
    raise("DeviceError", e.what(),
          py::dict(py::arg("call") = e.call(), py::arg("status") = e.status(),
                   py::arg("status_code") = e.status_code()));
  } catch (const InvalidArgument& e) {
    raise("InvalidArgument", e.what(), py::dict());
  } catch (const NotSupported& e) {
    raise("NotSupported", e.what(), py::dict());
  } catch (const Error& e) {
    raise("Error", e.what(), py::dict());
  }
}

// --- policies written in Python -----------------------------------------------------------------

py::dict job_view(const JobView& v) {
  return py::dict(py::arg("id") = v.id.value,
                  py::arg("kind") = std::string(to_string(v.kind)),
                  py::arg("priority") = v.priority,
                  py::arg("arrival") = v.arrival, py::arg("iterations_done") = v.iterations_done,
                  py::arg("expected_iterations") = v.expected_iterations,
                  py::arg("iteration_seconds") = v.iteration_seconds,
                  py::arg("attained_seconds") = v.attained_seconds,
                  py::arg("persistent_bytes") = v.persistent_bytes,
                  py::arg("ephemeral_peak_bytes") = v.ephemeral_peak_bytes,
                  py::arg("remaining_seconds") = v.remaining_seconds());
}

// Holds a Python policy object; everything constant is read once, with the GIL, when made.
class PythonPolicy final : public Policy {
 public:
  explicit PythonPolicy(py::object policy)
      : policy_(std::move(policy)),
        name_(py::str(policy_.attr("name"))),
        lanes_(plan(py::str(policy_.attr("lanes")))),
        exclusive_(py::bool_(policy_.attr("runs_to_completion"))),
        key_(policy_.attr("key")),
        view_(py::module_::import("salus.policies").attr("JobView")) {}

  ~PythonPolicy() override {
    py::gil_scoped_acquire gil;
    key_ = py::object();
    view_ = py::object();
    policy_ = py::object();
  }

  std::string_view name() const override { return name_; }
  LanePlan lanes() const override { return lanes_; }
  bool runs_to_completion() const override { return exclusive_; }

  SortKey key(const JobView& job) const override {
    py::gil_scoped_acquire gil;
    try {
      py::object k = key_(view_(**job_view(job)));
      if (py::isinstance<py::tuple>(k)) {
        auto t = k.cast<py::tuple>();
        if (t.size() == 2) return {t[0].cast<double>(), t[1].cast<double>()};
      } else {
        return {k.cast<double>(), 0.0};
      }
    } catch (const py::error_already_set& e) {
      // A policy that fails must not stop the scheduler: the job goes last, and the error shows.
      PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "salus: policy '%s' key() raised %s",
                       name_.c_str(), e.what());
      return {std::numeric_limits<double>::infinity(), 0.0};
    } catch (const py::cast_error&) {
    }
    PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                     "salus: policy '%s' key() must return a number or a pair of numbers",
                     name_.c_str());
    return {std::numeric_limits<double>::infinity(), 0.0};
  }

 private:
  static LanePlan plan(const std::string& lanes) {
    if (lanes == "single") return LanePlan::single;
    if (lanes == "packed") return LanePlan::packed;
    throw InvalidArgument("a Python policy's lanes must be 'single' or 'packed', not '" + lanes +
                          "' (memory_aware needs start_delay, which Python policies do not have)");
  }

  py::object policy_;
  std::string name_;
  LanePlan lanes_;
  bool exclusive_;
  py::object key_;
  py::object view_;
};

// --- runtime and jobs ---------------------------------------------------------------------------

struct RuntimeArgs {
  std::string backend;
  int devices = 1;
  std::size_t memory = GiB;
  std::string topology;
  std::string policy;
  std::string spill;
  std::optional<std::size_t> lend_reserve;
  std::optional<std::size_t> host_limit;
  std::vector<std::size_t> device_limits;
  std::vector<std::pair<std::string, py::object>> python_policies;
  std::string contention;  // simulated GPUs only
  // RuntimeOptions::allocation_wait_limit (0: none; not given: the runtime's default).
  std::optional<double> allocation_wait_seconds;
};

// One Python-visible runtime. Destroyed without the GIL: its stream threads may be waiting for it
// (a Python policy's key()).
class PyRuntime {
 public:
  explicit PyRuntime(RuntimeArgs args) {
    std::shared_ptr<DeviceBackend> backend;
    SimConfig sim = sim_config(args.devices, args.memory, args.topology);
    sim.contention = make_contention_model(args.contention);  // refuses unknown names
    if (args.backend == "cuda" && args.contention != "processor_sharing") {
      throw InvalidArgument("contention '" + args.contention +
                            "' needs simulated GPUs: the cuda backend runs real kernels");
    }
    if (args.backend == "auto") {
      backend = make_default_backend(sim);
    } else if (args.backend == "cuda") {
      backend = make_cuda_backend();
    } else if (args.backend == "sim") {
      backend = make_sim_backend(sim);
    } else {
      throw InvalidArgument("unknown backend '" + args.backend + "' (known: auto, cuda, sim)");
    }
    RuntimeOptions options;
    options.policy = args.policy;
    options.memory.device_limits = args.device_limits;
    options.memory.harvest.spill = spill_policy(args.spill);
    options.memory.harvest.lend_reserve_bytes = args.lend_reserve;
    if (args.host_limit) options.memory.harvest.host_limit_bytes = *args.host_limit;
    if (args.allocation_wait_seconds) {
      // Python checked it is finite and >= 0; beyond about 30 million years it is "no limit".
      const double wait_ms = std::ceil(*args.allocation_wait_seconds * 1000.0);
      options.allocation_wait_limit = std::chrono::milliseconds(
          wait_ms < 1e15 ? static_cast<std::int64_t>(wait_ms) : std::int64_t{0});
    }
    for (auto& [name, factory] : args.python_policies) {
      python_policy_ = python_policy_ || name == args.policy;
      auto shared = std::make_shared<py::object>(std::move(factory));
      auto holder = std::shared_ptr<py::object>(shared.get(), [shared](py::object*) mutable {
        py::gil_scoped_acquire gil;
        *shared = py::object();
        shared.reset();
      });
      options.policies.add(name, [holder]() -> std::unique_ptr<Policy> {
        py::gil_scoped_acquire gil;
        return std::make_unique<PythonPolicy>((*holder)());
      });
    }
    ReleaseGil release;
    runtime_ = std::make_shared<Runtime>(std::move(backend), std::move(options));
  }
  // Wraps a runtime made elsewhere (the process default, shared with the C ABI).
  explicit PyRuntime(std::shared_ptr<Runtime> runtime) : runtime_(std::move(runtime)) {}
  ~PyRuntime() { close(); }

  void close() {
    if (!runtime_) return;
    ReleaseGil release;
    runtime_.reset();
  }

  Runtime& get() const {
    if (!runtime_) throw InvalidArgument("the runtime is closed");
    return *runtime_;
  }
  const std::shared_ptr<Runtime>& shared() const {
    (void)get();
    return runtime_;
  }
  bool python_policy() const { return python_policy_; }
  bool closed() const { return !runtime_; }

 private:
  std::shared_ptr<Runtime> runtime_;
  bool python_policy_ = false;
};

class PyJob {
 public:
  PyJob(std::shared_ptr<Runtime> runtime, Job job)
      : runtime_(std::move(runtime)), job_(std::make_unique<Job>(std::move(job))) {}
  ~PyJob() {
    ReleaseGil release;
    job_.reset();  // leaves the job
    runtime_.reset();
  }
  Job& get() { return *job_; }

 private:
  std::shared_ptr<Runtime> runtime_;
  std::unique_ptr<Job> job_;
};

// Statistics come from their field lists (salus/stats_fields.h): every field reaches Python.
#define SALUS_STATS_ITEM(type, name, what) out[#name] = from.name;

py::dict class_bytes(const ClassBytes& from) {
  py::dict out;
  SALUS_CLASS_BYTES_FIELDS(SALUS_STATS_ITEM)
  return out;
}

py::dict job_memory(const JobMemoryStats& from) {
  py::dict out;
  SALUS_JOB_MEMORY_STATS_FIELDS(SALUS_STATS_ITEM)
  out["persistent"] = class_bytes(from.by_class[static_cast<int>(Lifetime::persistent)]);
  out["ephemeral"] = class_bytes(from.by_class[static_cast<int>(Lifetime::ephemeral)]);
  out["in_use_by_device"] = from.in_use_by_device;
  py::list tiers;
  for (std::size_t bytes : from.in_use_by_tier) tiers.append(bytes);
  out["in_use_by_tier"] = tiers;
  return out;
}

py::dict job_stats(const JobStats& from) {
  py::dict out(py::arg("id") = from.id.value, py::arg("name") = from.name,
               py::arg("kind") = std::string(to_string(from.kind)), py::arg("device") = from.device,
               py::arg("lane") = from.lane, py::arg("state") = std::string(to_string(from.state)));
  SALUS_JOB_TURN_STATS_FIELDS(SALUS_STATS_ITEM)
  SALUS_JOB_PROFILE_FIELDS(SALUS_STATS_ITEM)
  out["memory"] = job_memory(from.memory);
  return out;
}

py::dict device_stats(const DeviceMemoryStats& from) {
  py::dict out;
  SALUS_DEVICE_STATS_FIELDS(SALUS_STATS_ITEM)
  out["persistent"] = class_bytes(from.by_class[static_cast<int>(Lifetime::persistent)]);
  out["ephemeral"] = class_bytes(from.by_class[static_cast<int>(Lifetime::ephemeral)]);
  return out;
}
#undef SALUS_STATS_ITEM

// The field lists themselves, as (name, what it counts) pairs: the dataclasses are checked
// against them (tests/test_stats_fields.py).
#define SALUS_STATS_NAME(type, name, what) out.append(py::make_tuple(#name, what));
py::list device_stats_fields() {
  py::list out;
  SALUS_DEVICE_STATS_FIELDS(SALUS_STATS_NAME)
  return out;
}
py::list class_bytes_fields() {
  py::list out;
  SALUS_CLASS_BYTES_FIELDS(SALUS_STATS_NAME)
  return out;
}
py::list job_memory_stats_fields() {
  py::list out;
  SALUS_JOB_MEMORY_STATS_FIELDS(SALUS_STATS_NAME)
  return out;
}
py::list job_stats_fields() {  // the turns' list, then the profile's, as JobStats holds them
  py::list out;
  SALUS_JOB_TURN_STATS_FIELDS(SALUS_STATS_NAME)
  SALUS_JOB_PROFILE_FIELDS(SALUS_STATS_NAME)
  return out;
}
#undef SALUS_STATS_NAME

JobKind job_kind(const std::string& kind) {
  if (kind == "training") return JobKind::training;
  if (kind == "inference") return JobKind::inference;
  throw InvalidArgument("unknown job kind '" + kind + "' (known: training, inference)");
}

std::optional<Lifetime> lifetime_of(const std::optional<std::string>& lifetime) {
  if (!lifetime) return std::nullopt;
  if (*lifetime == "persistent") return Lifetime::persistent;
  if (*lifetime == "ephemeral") return Lifetime::ephemeral;
  throw InvalidArgument("unknown lifetime '" + *lifetime + "' (known: persistent, ephemeral)");
}

void bind_runtime(py::module_& m) {
  m.def(
      "connect",
      [](const std::string& path) {
        std::shared_ptr<Runtime> runtime;
        {
          ReleaseGil release;
          runtime = connect_runtime(path);
        }
        return std::make_unique<PyRuntime>(std::move(runtime));
      },
      py::arg("path"));

  py::class_<PyRuntime>(m, "Runtime")
      .def(py::init([](std::string backend, int devices, std::size_t memory, std::string topology,
                       std::string policy, std::string spill,
                       std::optional<std::size_t> lend_reserve,
                       std::optional<std::size_t> host_limit,
                       std::vector<std::size_t> device_limits,
                       std::vector<std::pair<std::string, py::object>> python_policies,
                       std::string contention, std::optional<double> allocation_wait) {
             return std::make_unique<PyRuntime>(RuntimeArgs{
                 std::move(backend), devices, memory, std::move(topology), std::move(policy),
                 std::move(spill), lend_reserve, host_limit, std::move(device_limits),
                 std::move(python_policies), std::move(contention), allocation_wait});
           }),
           py::arg("backend"), py::arg("devices"), py::arg("memory"), py::arg("topology"),
           py::arg("policy"), py::arg("spill"), py::arg("lend_reserve"), py::arg("host_limit"),
           py::arg("device_limits"), py::arg("python_policies"),
           py::arg("contention") = "processor_sharing", py::arg("allocation_wait") = std::nullopt)
      .def("close", &PyRuntime::close)
      .def_property_readonly("closed", &PyRuntime::closed)
      .def_property_readonly("python_policy", &PyRuntime::python_policy)
      .def_property_readonly("device_count",
                             [](const PyRuntime& r) { return r.get().device_count(); })
      .def_property_readonly(
          "backend_name", [](const PyRuntime& r) { return std::string(r.get().backend().name()); })
      .def_property_readonly("policy",
                             [](const PyRuntime& r) { return std::string(r.get().policy()); })
      .def(
          "add_job",
          [](PyRuntime& r, std::string name, const std::string& kind, int priority, int device,
             std::uint64_t expected_iterations, std::size_t hint_persistent,
             std::size_t hint_ephemeral, double hint_seconds, std::size_t limit_total,
             std::size_t limit_persistent, std::size_t limit_ephemeral, bool blocks_outlive_job) {
            JobSpec spec;
            spec.name = std::move(name);
            spec.kind = job_kind(kind);
            spec.priority = priority;
            spec.device = device;
            spec.expected_iterations = expected_iterations;
            spec.hints = {hint_persistent, hint_ephemeral, hint_seconds};
            spec.limits = {limit_total, limit_persistent, limit_ephemeral};
            spec.blocks_outlive_job = blocks_outlive_job;
            std::shared_ptr<Runtime> runtime = r.shared();
            std::optional<Job> job;
            {
              ReleaseGil release;
              job.emplace(runtime->add_job(std::move(spec)));
            }
            return std::make_unique<PyJob>(runtime, std::move(*job));
          },
          py::arg("name"), py::arg("kind"), py::arg("priority"), py::arg("device"),
          py::arg("expected_iterations"), py::arg("hint_persistent"), py::arg("hint_ephemeral"),
          py::arg("hint_seconds"), py::arg("limit_total"), py::arg("limit_persistent"),
          py::arg("limit_ephemeral"), py::arg("blocks_outlive_job"))
      .def(
          "job_stats",
          [](const PyRuntime& r) {
            std::vector<JobStats> all;
            {
              ReleaseGil release;
              all = r.get().job_stats();
            }
            py::list out;
            for (const JobStats& s : all) out.append(job_stats(s));
            return out;
          })
      .def("device_stats",
           [](const PyRuntime& r, int device) {
             DeviceMemoryStats d;
             {
               ReleaseGil release;
               if (device < 0 || device >= r.get().device_count()) {
                 throw InvalidArgument("device " + std::to_string(device) + " does not exist");
               }
               d = r.get().memory().device_stats(device);
             }
             return device_stats(d);
           })
      .def("trace_json", [](const PyRuntime& r) {
             ReleaseGil release;
             return r.get().trace_json();
           })
      .def("write_trace", [](const PyRuntime& r, const std::string& path) {
             ReleaseGil release;
             r.get().write_trace(path);
           })
      .def("trim", [](const PyRuntime& r) {
             ReleaseGil release;
             return r.get().memory().trim();
           })
      .def(
          "sim_kernel",
          [](const PyRuntime& r, std::uintptr_t stream, double seconds, double occupancy,
             int device) {
            ReleaseGil release;
            launch_sim_kernel(r.get().backend(), StreamHandle{stream}, device, seconds, occupancy);
          },
          py::arg("stream"), py::arg("seconds"), py::arg("occupancy") = 1.0, py::arg("device") = 0)
      .def(
          "synchronize",
          [](const PyRuntime& r, std::uintptr_t stream) {
            synchronize_interruptibly(r.get().backend(), StreamHandle{stream});
          },
          py::arg("stream"))
      .def(
          "device_activity",
          [](const PyRuntime& r, int device) {
            SimDeviceActivity a;
            {
              ReleaseGil release;
              a = sim_device_activity(r.get().backend(), device);
            }
            return py::dict(py::arg("busy_seconds") = a.busy_seconds,
                            py::arg("utilization_seconds") = a.utilization_seconds,
                            py::arg("work_seconds") = a.work_seconds,
                            py::arg("kernels") = a.kernels);
          },
          py::arg("device") = 0)
      .def("set_current_job", [](const PyRuntime& r, std::uint32_t job) {
             r.get().set_current_job(JobId{job});
           })
      .def("current_job", [](const PyRuntime& r) { return r.get().current_job().value; })
      .def(
          "allocate",
          [](const PyRuntime& r, std::size_t bytes, int device, std::uintptr_t stream,
             std::uint32_t job, std::optional<std::string> lifetime) {
            const std::optional<Lifetime> life = lifetime_of(lifetime);
            ReleaseGil release;
            return r.get().allocate(bytes, device, StreamHandle{stream}, JobId{job}, life);
          },
          py::arg("bytes"), py::arg("device"), py::arg("stream"), py::arg("job"),
          py::arg("lifetime"))
      .def(
          "deallocate",
          [](const PyRuntime& r, DevicePtr ptr, std::size_t bytes, int device) {
            ReleaseGil release;
            r.get().deallocate(ptr, bytes, device);
          },
          py::arg("ptr"), py::arg("bytes"), py::arg("device"))
      .def("_capsule", [](const PyRuntime& r) {
        // For salus.torch: a new reference to the runtime, freed with the capsule.
        auto* held = new std::shared_ptr<Runtime>(r.shared());
        return py::capsule(held, "salus.Runtime", [](void* p) {
          delete static_cast<std::shared_ptr<Runtime>*>(p);
        });
      });
}

// Python's `with job:` and `with job.iteration():` (salus._runtime): Runtime::JobScope, closed
// by __exit__ on the thread that opened it (the thread's current job is per thread).
class PyJobScope {
 public:
  PyJobScope(const PyRuntime& runtime, std::uint32_t job, int device)
      : scope_(std::in_place, runtime.get(), JobId{job}, device) {}
  void close() { scope_.reset(); }

 private:
  std::optional<Runtime::JobScope> scope_;
};

void bind_job(py::module_& m) {
  py::class_<PyJobScope>(m, "JobScope")
      .def(py::init<const PyRuntime&, std::uint32_t, int>(), py::arg("runtime"), py::arg("job"),
           py::arg("device"))
      .def("close", &PyJobScope::close);
  py::class_<PyJob>(m, "Job")
      .def_property_readonly("id", [](PyJob& j) { return j.get().id().value; })
      .def_property_readonly("name", [](PyJob& j) { return j.get().name(); })
      .def_property_readonly("stream", [](PyJob& j) { return j.get().stream().value; })
      .def("begin_iteration", [](PyJob& j) { return begin_iteration_interruptibly(j.get()); })
      .def("end_iteration", [](PyJob& j) { j.get().end_iteration(); }, Release())
      .def("cancel", [](PyJob& j) { j.get().cancel(); }, Release())
      .def("leave", [](PyJob& j) { j.get().leave(); }, Release())
      .def("stats",
           [](PyJob& j) {
             JobStats s;
             {
               ReleaseGil release;
               s = j.get().stats();
             }
             return job_stats(s);
           })
      .def(
          "allocate",
          [](PyJob& j, std::size_t bytes, std::optional<std::string> lifetime) {
            const std::optional<Lifetime> life = lifetime_of(lifetime);
            ReleaseGil release;
            return j.get().allocate(bytes, life);
          },
          py::arg("bytes"), py::arg("lifetime"))
      .def("deallocate", [](PyJob& j, DevicePtr ptr) { j.get().deallocate(ptr); }, Release());
}

}  // namespace
}  // namespace salus::python

PYBIND11_MODULE(_salus, m) {
  m.doc() = "Salus runtime bindings (use the salus package, not this module)";
  py::register_exception_translator(&salus::python::translate);
  salus::python::bind_runtime(m);
  salus::python::bind_job(m);
  salus::python::bind_simulation(m);
  m.def("cuda_available", [] { return salus::cuda_available(); });
  m.def("device_stats_fields", &salus::python::device_stats_fields);
  m.def("class_bytes_fields", &salus::python::class_bytes_fields);
  m.def("job_memory_stats_fields", &salus::python::job_memory_stats_fields);
  m.def("job_stats_fields", &salus::python::job_stats_fields);
  m.attr("MAX_SIM_DEVICES") = salus::kMaxSimDevices;
  // No sink here: see salus/_logging.py for why Python gets no callback.
  m.def("set_log_level", [](const std::string& level) {
    const std::optional<salus::LogLevel> parsed = salus::parse_log_level(level);
    if (!parsed) {
      throw salus::InvalidArgument("set_log_level: level '" + level +
                                   "' is no log level (trace, debug, info, warn, error, "
                                   "critical or off)");
    }
    salus::set_log_level(*parsed);
  });
  m.def("log_level", [] { return std::string(salus::to_string(salus::log_level())); });
  m.def("default_runtime", [] {
    std::shared_ptr<salus::Runtime> runtime;
    {
      salus::python::ReleaseGil release;  // making it may take a while (driver, simulated GPU)
      runtime = salus::Runtime::shared_default();
    }
    return std::make_unique<salus::python::PyRuntime>(std::move(runtime));
  });
}
