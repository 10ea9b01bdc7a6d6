// Replays allocation traces recorded from PyTorch training loops (issues 10 and 19) through Salus
// on one simulated GPU, and through glibc malloc/free as a speed baseline.
//
// The traces are written by benchmarks/traces/record_alloc_trace.py (see its docstring for the
// format) and read by alloc_trace.hpp. They are CPU allocator traces of PyTorch models, replayed
// here as if they were one job's GPU allocations.
//
// BM_PyTorchTraceReplay/<model>/salus: through a MemoryManager, one job, the default stream.
// BM_PyTorchTraceReplay/<model>/lagging: as salus, on a stream whose work runs one iteration
// behind the host (alloc_trace::LaggingStream), as a training loop's GPU does.
// BM_PyTorchTraceReplay/<model>/runtime: through a Runtime as a framework does it (the C ABI is
// the same calls): one job, the setup outside any iteration, one Salus iteration per step.
// Their counters:
//   peak_live_MiB       the most requested bytes live at once (from the trace alone)
//   peak_allocated_MiB  DeviceMemoryStats::peak_allocated (blocks, requests rounded to 512 B)
//   peak_reserved_MiB   DeviceMemoryStats::peak_reserved (physical pages held, 2 MiB each)
//   reserved_over_live  peak_reserved / peak_live: the figure issues 10 and 19 ask to keep <= 1.10
//   page_floor          ceil(peak_live / 2 MiB) pages / peak_live: the best any 2 MiB-page
//                       allocator can do
//   steady_maps, steady_unmaps, steady_creates, steady_releases: the most page maps, page unmaps,
//                       chunk creates and chunk releases of any iteration of the steady state
//                       (the last half of the iterations: 4 of 8)
//   allocs_per_second   allocations replayed per second (frees replayed too, not counted)
// BM_PyTorchTraceReplay/<model>/malloc replays the same events through malloc/free (time only).
//
// The trace directory is $SALUS_TRACE_DIR if set, else benchmarks/traces next to this file (found
// from __FILE__ at compile time), else ./benchmarks/traces. A missing or unreadable trace makes
// the benchmark fail with SkipWithError.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <variant>
#include <vector>

#include "alloc_trace.hpp"
#include "salus/device.hpp"
#include "salus/memory.hpp"
#include "salus/runtime.hpp"
#include "salus/sim.hpp"

namespace {

namespace fs = std::filesystem;
namespace trace_io = salus::alloc_trace;

using salus::MemoryManager;
using salus::MiB;
using ReplayTrace = trace_io::Trace;
using ReplayOp = trace_io::Op;

constexpr std::string_view kThisFile = __FILE__;

fs::path trace_dir() {
  return trace_io::trace_dir(fs::path(kThisFile).parent_path() / "traces");
}

// Loaded once per model and kept for every run.
const std::variant<ReplayTrace, std::string>& cached_trace(const std::string& model) {
  static std::map<std::string, std::variant<ReplayTrace, std::string>> cache;
  auto it = cache.find(model);
  if (it == cache.end()) {
    it = cache.emplace(model, trace_io::load(trace_dir() / (model + ".trace"))).first;
  }
  return it->second;
}

const ReplayTrace* trace_or_skip(benchmark::State& state, const std::string& model) {
  const auto& loaded = cached_trace(model);
  if (const auto* error = std::get_if<std::string>(&loaded)) {
    state.SkipWithError(error->c_str());
    return nullptr;
  }
  return &std::get<ReplayTrace>(loaded);
}

void set_counters(benchmark::State& state, const ReplayTrace& trace,
                  const trace_io::Report& report) {
  const double peak_live = static_cast<double>(trace.peak_live);
  const trace_io::DriverCalls steady = report.steady_state_max();
  state.counters["events"] = static_cast<double>(trace.allocations + trace.frees);
  state.counters["iterations_in_trace"] = static_cast<double>(trace.iterations);
  state.counters["peak_live_MiB"] = peak_live / MiB;
  state.counters["peak_allocated_MiB"] = static_cast<double>(report.peak_allocated) / MiB;
  state.counters["peak_reserved_MiB"] = static_cast<double>(report.peak_reserved) / MiB;
  state.counters["reserved_over_live"] = report.reserved_over_live();
  state.counters["page_floor"] = report.page_floor();
  state.counters["allocated_over_live"] = static_cast<double>(report.peak_allocated) / peak_live;
  state.counters["steady_maps"] = static_cast<double>(steady.maps);
  state.counters["steady_unmaps"] = static_cast<double>(steady.unmaps);
  state.counters["steady_creates"] = static_cast<double>(steady.creates);
  state.counters["steady_releases"] = static_cast<double>(steady.releases);
  state.counters["allocs_per_second"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * static_cast<double>(trace.allocations),
      benchmark::Counter::kIsRate);
}

// A fresh manager per run, so each run's peak includes building up the heap: on the default
// stream, or with `lagging` on a stream of its own that runs one iteration behind the host.
void BM_PyTorchTraceReplay_manager(benchmark::State& state, const std::string& model,
                                   bool lagging) {
  const ReplayTrace* trace = trace_or_skip(state, model);
  if (trace == nullptr) return;
  auto backend = salus::make_sim_backend(salus::SimConfig::uniform(1, 4 * salus::GiB));
  const salus::StreamHandle stream = lagging ? backend->create_stream(0, 0) : salus::StreamHandle{};
  trace_io::Report report;
  for (auto _ : state) {
    state.PauseTiming();
    auto manager = std::make_unique<MemoryManager>(backend);
    const salus::JobId job = manager->register_job("pytorch_" + model);
    std::unique_ptr<trace_io::LaggingStream> lag;
    if (lagging) lag = std::make_unique<trace_io::LaggingStream>(*backend, stream);
    state.ResumeTiming();
    report = trace_io::replay_with_manager(*trace, *manager, job, stream, lag.get());
    state.PauseTiming();
    lag.reset();
    manager->release_job(job);  // what lives to the end of the trace
    manager.reset();
    state.ResumeTiming();
  }
  if (lagging) backend->destroy_stream(stream);
  set_counters(state, *trace, report);
}

// A fresh runtime per run; its job leaves (freeing what is left) untimed.
void BM_PyTorchTraceReplay_runtime(benchmark::State& state, const std::string& model) {
  const ReplayTrace* trace = trace_or_skip(state, model);
  if (trace == nullptr) return;
  auto backend = salus::make_sim_backend(salus::SimConfig::uniform(1, 4 * salus::GiB));
  trace_io::Report report;
  for (auto _ : state) {
    state.PauseTiming();
    auto runtime = std::make_unique<salus::Runtime>(backend);
    salus::JobSpec spec;
    spec.name = "pytorch_" + model;
    auto job = std::make_unique<salus::Job>(runtime->add_job(spec));
    state.ResumeTiming();
    report = trace_io::replay_with_runtime(*trace, *runtime, *job);
    state.PauseTiming();
    job.reset();
    runtime.reset();
    state.ResumeTiming();
  }
  set_counters(state, *trace, report);
}

// The same events through glibc malloc/free; what is still live at the end is freed untimed.
void BM_PyTorchTraceReplay_malloc(benchmark::State& state, const std::string& model) {
  const ReplayTrace* trace = trace_or_skip(state, model);
  if (trace == nullptr) return;
  std::vector<void*> ptrs(trace->ids, nullptr);
  for (auto _ : state) {
    for (const ReplayOp& op : trace->ops) {
      switch (op.kind) {
        case ReplayOp::Kind::allocate:
          ptrs[op.id] = std::malloc(op.bytes);
          benchmark::DoNotOptimize(ptrs[op.id]);
          break;
        case ReplayOp::Kind::free:
          std::free(ptrs[op.id]);
          ptrs[op.id] = nullptr;
          break;
        case ReplayOp::Kind::end_setup:
        case ReplayOp::Kind::end_iteration:
          break;
      }
    }
    state.PauseTiming();
    for (void*& ptr : ptrs) {
      std::free(ptr);
      ptr = nullptr;
    }
    state.ResumeTiming();
  }
  state.counters["allocs_per_second"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * static_cast<double>(trace->allocations),
      benchmark::Counter::kIsRate);
}

// The four traces the recorder writes by default, then any other <name>.trace in the directory
// (e.g. larger batches: record_alloc_trace.py --batch 256 --output traces/cnn_b256.trace).
std::vector<std::string> trace_names() {
  std::vector<std::string> names = {"cnn", "transformer", "lstm", "mlp"};
  std::vector<std::string> extra;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(trace_dir(), error)) {
    if (entry.path().extension() != ".trace") continue;
    std::string stem = entry.path().stem().string();
    if (std::find(names.begin(), names.end(), stem) == names.end()) extra.push_back(stem);
  }
  std::sort(extra.begin(), extra.end());
  names.insert(names.end(), extra.begin(), extra.end());
  return names;
}

// Registered at static initialisation (BENCHMARK_MAIN is in microbench.cpp).
[[maybe_unused]] const bool kRegistered = [] {
  for (const std::string& model : trace_names()) {
    const std::string name = "BM_PyTorchTraceReplay/" + model;
    benchmark::RegisterBenchmark((name + "/salus").c_str(), BM_PyTorchTraceReplay_manager, model,
                                 false)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark((name + "/lagging").c_str(), BM_PyTorchTraceReplay_manager, model,
                                 true)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark((name + "/runtime").c_str(), BM_PyTorchTraceReplay_runtime, model)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark((name + "/malloc").c_str(), BM_PyTorchTraceReplay_malloc, model)
        ->Unit(benchmark::kMicrosecond);
  }
  return true;
}();

}  // namespace
