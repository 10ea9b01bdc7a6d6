// BM_TorchAllocator: a PyTorch training trace's allocations and frees through c10's CPU allocator
// interface, as PyTorch makes them: with PyTorch's own allocator (the baseline), and with Salus's
// glue enabled (salus::torch::enable_cpu, as `import salus.torch` does on the simulated backend:
// every block a Salus block of the thread's job, each training step one iteration). The memory is
// not touched, so the figure is the allocators' own work (PyTorch's includes glibc's mmap and
// munmap of large blocks; the page faults a training step then takes on them are not counted).
//
//   salus_torch_microbench --benchmark_filter=BM_TorchAllocator
#include <benchmark/benchmark.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "../alloc_trace.hpp"
#include "salus/runtime.hpp"
#include "salus/sim.hpp"
#include "salus/torch.hpp"

namespace {

namespace fs = std::filesystem;
namespace trace_io = salus::alloc_trace;

const trace_io::Trace* trace_or_skip(benchmark::State& state, const std::string& model) {
  static std::map<std::string, std::variant<trace_io::Trace, std::string>> cache;
  auto it = cache.find(model);
  if (it == cache.end()) {
    const fs::path beside = fs::path(__FILE__).parent_path().parent_path() / "traces";
    it = cache.emplace(model, trace_io::load(trace_io::trace_dir(beside) / (model + ".trace")))
             .first;
  }
  if (const auto* error = std::get_if<std::string>(&it->second)) {
    state.SkipWithError(error->c_str());
    return nullptr;
  }
  return &std::get<trace_io::Trace>(it->second);
}

// Replays `trace` through c10's current CPU allocator. `iteration` brackets each training step
// (a Salus iteration of the job, or nothing).
template <class Step>
void replay(const trace_io::Trace& trace, std::vector<c10::DataPtr>& live, Step&& iteration) {
  c10::Allocator* allocator = c10::GetCPUAllocator();
  bool inside = false;
  for (const trace_io::Op& op : trace.ops) {
    switch (op.kind) {
      case trace_io::Op::Kind::allocate:
        if (!inside) inside = iteration(true);
        live[op.id] = allocator->allocate(op.bytes);
        benchmark::DoNotOptimize(live[op.id].get());
        break;
      case trace_io::Op::Kind::free:
        live[op.id].clear();
        break;
      case trace_io::Op::Kind::end_setup:
        break;
      case trace_io::Op::Kind::end_iteration:
        if (inside) inside = iteration(false);
        break;
    }
  }
}

void BM_TorchAllocatorPyTorch(benchmark::State& state, const std::string& model) {
  const trace_io::Trace* trace = trace_or_skip(state, model);
  if (trace == nullptr) return;
  std::vector<c10::DataPtr> live(trace->ids);
  for (auto _ : state) {
    replay(*trace, live, [](bool begin) { return begin; });
    state.PauseTiming();
    for (auto& p : live) p.clear();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(trace->allocations));
}

void BM_TorchAllocatorSalus(benchmark::State& state, const std::string& model) {
  const trace_io::Trace* trace = trace_or_skip(state, model);
  if (trace == nullptr) return;
  auto runtime = std::make_shared<salus::Runtime>(
      salus::make_sim_backend(salus::SimConfig::uniform(1, 4 * salus::GiB)));
  salus::torch::enable_cpu(runtime);
  std::optional<salus::Job> job(runtime->add_job(salus::JobSpec{.name = "pytorch_" + model}));
  std::vector<c10::DataPtr> live(trace->ids);
  {
    salus::torch::JobScope scope(job->id(), 0);
    const auto step = [&](bool begin) {
      if (begin) {
        (void)job->begin_iteration();
      } else {
        job->end_iteration();
      }
      return begin;
    };
    replay(*trace, live, step);  // warm-up: the job's pages are mapped once
    for (auto& p : live) p.clear();
    for (auto _ : state) {
      replay(*trace, live, step);
      state.PauseTiming();
      for (auto& p : live) p.clear();
      state.ResumeTiming();
    }
  }
  job.reset();
  salus::torch::disable();
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(trace->allocations));
}

}  // namespace

BENCHMARK_CAPTURE(BM_TorchAllocatorPyTorch, gpt2, std::string("gpt2"))
    ->Name("BM_TorchAllocator/pytorch/gpt2")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_TorchAllocatorSalus, gpt2, std::string("gpt2"))
    ->Name("BM_TorchAllocator/salus/gpt2")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_TorchAllocatorPyTorch, resnet18, std::string("resnet18"))
    ->Name("BM_TorchAllocator/pytorch/resnet18")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_TorchAllocatorSalus, resnet18, std::string("resnet18"))
    ->Name("BM_TorchAllocator/salus/resnet18")->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
