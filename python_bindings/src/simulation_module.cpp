// _salus.simulate: the cluster simulator for Python (salus.bench's "simulate" mode). Jobs come in
// as plain dicts and results go out as plain dicts and lists, so the Python side needs no classes.
// The GIL is released while simulating: a study of thousands of jobs takes seconds.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "gil.hpp"
#include "salus/contention.hpp"
#include "salus/error.hpp"
#include "salus/simulation.hpp"

namespace py = pybind11;

namespace salus::python {
namespace {

using sched::SimJob;
using sched::SimResult;

// The keys a job dict may have; any other is a typo, refused rather than ignored.
constexpr std::string_view kJobKeys[] = {"name",
                                         "kind",
                                         "priority",
                                         "arrival",
                                         "iterations",
                                         "iteration_seconds",
                                         "persistent_bytes",
                                         "ephemeral_peak_bytes",
                                         "forward_fraction",
                                         "think_seconds",
                                         "occupancy",
                                         "device"};

// Reads one job dict, naming the job (by index) and the key in every error.
class JobReader {
 public:
  JobReader(py::handle job, std::size_t index) : index_(index) {
    if (!py::isinstance<py::dict>(job)) {
      throw InvalidArgument("simulate: jobs[" + std::to_string(index) + "] must be a dict, got " +
                            std::string(py::str(py::type::handle_of(job).attr("__name__"))));
    }
    dict_ = py::reinterpret_borrow<py::dict>(job);
    for (const auto& item : dict_) {
      const bool is_str = py::isinstance<py::str>(item.first);
      const std::string key =
          is_str ? item.first.cast<std::string>() : std::string(py::repr(item.first));
      bool known = false;
      for (const std::string_view k : kJobKeys) known = known || (is_str && key == k);
      if (!known)
        fail(key,
             "is not a job key (known: name, kind, priority, arrival, iterations, "
             "iteration_seconds, persistent_bytes, ephemeral_peak_bytes, "
             "forward_fraction, think_seconds, occupancy, device)");
    }
  }

  std::string text(const char* key) {
    const py::handle value = required(key);
    if (!py::isinstance<py::str>(value)) fail(key, "must be a str");
    return value.cast<std::string>();
  }

  double number(const char* key, std::optional<double> fallback = std::nullopt) {
    const py::handle value = fallback ? optional(key) : required(key);
    if (!value) return *fallback;
    if (py::isinstance<py::bool_>(value) ||
        !(py::isinstance<py::float_>(value) || py::isinstance<py::int_>(value))) {
      fail(key, "must be a number");
    }
    return value.cast<double>();
  }

  long long integer(const char* key, std::optional<long long> fallback = std::nullopt) {
    const py::handle value = fallback ? optional(key) : required(key);
    if (!value) return *fallback;
    if (py::isinstance<py::bool_>(value) || !py::isinstance<py::int_>(value)) {
      fail(key, "must be an int");
    }
    const long long out = PyLong_AsLongLong(value.ptr());
    if (out == -1 && PyErr_Occurred() != nullptr) {
      PyErr_Clear();
      fail(key, "is out of range");
    }
    return out;
  }

  // An int that fits a C int (priority, device).
  int small_integer(const char* key, std::optional<int> fallback = std::nullopt) {
    const long long value = integer(key, fallback);
    if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
      fail(key, "is out of range");
    }
    return static_cast<int>(value);
  }

  // A count or a size: an int >= 0.
  unsigned long long count(const char* key) {
    const long long value = integer(key);
    if (value < 0) fail(key, "must be >= 0, got " + std::to_string(value));
    return static_cast<unsigned long long>(value);
  }

  [[noreturn]] void fail(const std::string& key, const std::string& problem) const {
    throw InvalidArgument("simulate: jobs[" + std::to_string(index_) + "]: '" + key + "' " +
                          problem);
  }

 private:
  py::handle required(const char* key) {
    const py::handle value = optional(key);
    if (!value) fail(key, "is missing");
    return value;
  }
  // A borrowed reference (the dict keeps it alive), or a null handle when the key is absent.
  py::handle optional(const char* key) { return PyDict_GetItemString(dict_.ptr(), key); }

  py::dict dict_;
  std::size_t index_;
};

JobKind kind_of(JobReader& reader) {
  const std::string kind = reader.text("kind");
  if (kind == "training") return JobKind::training;
  if (kind == "inference") return JobKind::inference;
  reader.fail("kind", "must be \"training\" or \"inference\", got \"" + kind + "\"");
}

SimJob read_job(py::handle dict, std::size_t index) {
  JobReader r(dict, index);
  SimJob job;
  job.name = r.text("name");
  job.kind = kind_of(r);
  job.priority = r.small_integer("priority");
  job.arrival_seconds = r.number("arrival");
  job.iterations = r.count("iterations");
  job.iteration_seconds = r.number("iteration_seconds");
  job.persistent_bytes = r.count("persistent_bytes");
  const auto peak = static_cast<std::size_t>(r.count("ephemeral_peak_bytes"));
  const double forward = r.number("forward_fraction", 0.6);
  job.think_seconds = r.number("think_seconds", 0.0);
  job.occupancy = r.number("occupancy", 1.0);
  job.device = r.small_integer("device", -1);
  // The rest (times, occupancy, device range, memory) the simulator checks, naming the job; the
  // curve needs these two first.
  if (!(job.iteration_seconds > 0.0) || !std::isfinite(job.iteration_seconds)) {
    r.fail("iteration_seconds",
           "must be finite and > 0, got " + std::to_string(job.iteration_seconds));
  }
  if (!(forward > 0.0 && forward < 1.0)) {
    r.fail("forward_fraction", "must be in (0, 1), got " + std::to_string(forward));
  }
  if (peak > 0) job.curve = sched::training_curve(job.iteration_seconds, peak, 20, forward);
  return job;
}

py::dict job_result(const sched::SimJobResult& j) {
  return py::dict(py::arg("name") = j.name, py::arg("device") = j.device,
                  py::arg("arrival") = j.arrival_seconds,
                  py::arg("first_start") = j.first_start_seconds,
                  py::arg("finish") = j.finish_seconds, py::arg("attained") = j.attained_seconds,
                  py::arg("work") = j.work_seconds, py::arg("waiting") = j.waiting_seconds,
                  py::arg("max_wait") = j.max_wait_seconds, py::arg("iterations") = j.iterations);
}

py::dict device_result(const sched::SimDeviceResult& d) {
  return py::dict(py::arg("busy") = d.busy_seconds, py::arg("utilization") = d.utilization_seconds,
                  py::arg("work") = d.work_seconds,
                  py::arg("peak_combined") = d.peak_combined_bytes,
                  py::arg("peak_committed") = d.peak_committed_bytes,
                  py::arg("over_budget") = d.over_budget_seconds, py::arg("jobs") = d.jobs);
}

py::dict to_python(const SimResult& result) {
  py::list jobs, devices, iterations, timelines;
  for (const sched::SimJobResult& j : result.jobs) jobs.append(job_result(j));
  for (const sched::SimDeviceResult& d : result.devices) devices.append(device_result(d));
  for (const sched::SimIteration& it : result.iterations) {
    iterations.append(py::make_tuple(it.job, it.device, it.lane, it.asked, it.start, it.end));
  }
  for (const sched::SimTimeline& t : result.timelines) {
    timelines.append(py::dict(py::arg("device") = t.device, py::arg("time") = t.time,
                              py::arg("utilization") = t.utilization,
                              py::arg("running") = t.running, py::arg("memory") = t.memory_bytes,
                              py::arg("waiting") = t.waiting));
  }
  return py::dict(py::arg("makespan") = result.makespan_seconds,
                  py::arg("throughput") = result.throughput, py::arg("jobs") = jobs,
                  py::arg("devices") = devices, py::arg("iterations") = iterations,
                  py::arg("timelines") = timelines);
}

py::dict simulate(const py::list& jobs, const std::string& policy, int machines,
                  int gpus_per_machine, long long device_memory, const std::string& placement,
                  const std::string& contention, bool record_iterations, double timeline_step) {
  std::vector<SimJob> parsed;
  parsed.reserve(jobs.size());
  for (std::size_t i = 0; i < jobs.size(); ++i) parsed.push_back(read_job(jobs[i], i));
  if (device_memory <= 0) {
    throw InvalidArgument("simulate: device_memory must be > 0 bytes, got " +
                          std::to_string(device_memory));
  }
  sched::ClusterSpec cluster;
  cluster.machines = machines;
  cluster.gpus_per_machine = gpus_per_machine;
  cluster.device_budget_bytes = static_cast<std::size_t>(device_memory);
  cluster.placement = placement;
  cluster.contention = make_contention_model(contention);
  sched::SimOptions options;
  options.record_iterations = record_iterations;
  options.timeline_step_seconds = timeline_step;
  SimResult result;
  {
    ReleaseGil release;
    const sched::Simulation simulation(policy, std::move(cluster), options);
    result = simulation.run(parsed);
  }
  return to_python(result);
}

}  // namespace

void bind_simulation(py::module_& m) {
  m.def("simulate", &simulate, py::arg("jobs"), py::arg("policy"), py::kw_only(),
        py::arg("machines") = 1, py::arg("gpus_per_machine") = 1, py::arg("device_memory"),
        py::arg("placement") = "least_loaded", py::arg("contention") = "processor_sharing",
        py::arg("record_iterations") = true, py::arg("timeline_step") = 0.0,
        "Simulates `jobs` (dicts) under `policy` on machines x gpus_per_machine devices of "
        "device_memory bytes each, on a virtual clock; returns the results as dicts.");
}

}  // namespace salus::python
