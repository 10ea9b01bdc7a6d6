// What the C ABI door costs: an alloc/free pair through the C ABI beside the same pair through
// the C++ API, in one run, with attribution on (each block is charged to a job).
//
//  - BM_DoorPair/cpp_job:       Job::allocate / Job::deallocate (the C++ job handle).
//  - BM_DoorPair/c_explicit:    salus_allocate(job) / salus_deallocate (the job named).
//  - BM_DoorPair/cpp_stream:    Runtime::allocate on the job's iteration stream / deallocate.
//  - BM_DoorPair/c_stream:      salus_allocate(SALUS_JOB_AUTO) on the job's stream (the job found
//                               from its stream, as PyTorch's hook reaches it) / salus_deallocate.
//  - BM_DoorPair/c_malloc_hook: salus_malloc / salus_free on the default runtime, ditto.
// Each pair runs inside the job's iteration (ephemeral memory, the common case in a framework).
#include <benchmark/benchmark.h>

#include "capi/capi.hpp"
#include "iteration_sched/default_runtime.hpp"
#include "salus/c_api.h"
#include "salus/runtime.hpp"
#include "salus/sim.hpp"

namespace {

using salus::MiB;

enum class Door { cpp_job, c_explicit, cpp_stream, c_stream, c_malloc_hook };

void BM_DoorPair(benchmark::State& state, Door door) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0));
  salus_runtime_options options;
  salus_runtime_options_init(&options);
  options.backend = SALUS_BACKEND_SIM;
  options.sim_device_memory_bytes = 256 * MiB;
  if (salus_default_runtime_init(&options) != SALUS_OK) {
    state.SkipWithError(salus_last_error());
    return;
  }
  salus_runtime* c = salus_default_runtime();
  salus::Runtime& runtime = salus::Runtime::default_runtime();
  salus::JobSpec spec;
  spec.name = "bench";
  salus::Job job = runtime.add_job(spec);
  const salus::StreamHandle stream = job.begin_iteration();
  void* native = reinterpret_cast<void*>(static_cast<std::uintptr_t>(stream.value));
  const std::uint32_t id = job.id().value;
  for (auto _ : state) {
    switch (door) {
      case Door::cpp_job: {
        const salus::DevicePtr p = job.allocate(bytes);
        benchmark::DoNotOptimize(p);
        job.deallocate(p);
        break;
      }
      case Door::cpp_stream: {
        const salus::DevicePtr p = runtime.allocate(bytes, 0, stream);
        benchmark::DoNotOptimize(p);
        runtime.deallocate(p);
        break;
      }
      case Door::c_explicit:
      case Door::c_stream: {
        void* p = nullptr;
        const std::uint32_t who = door == Door::c_explicit ? id : SALUS_JOB_AUTO;
        if (salus_allocate(c, bytes, 0, native, who, SALUS_LIFETIME_AUTO, &p) != SALUS_OK ||
            salus_deallocate(c, p, bytes, 0) != SALUS_OK) {
          state.SkipWithError(salus_last_error());
        }
        break;
      }
      case Door::c_malloc_hook: {
        void* p = salus_malloc(static_cast<ssize_t>(bytes), 0, native);
        benchmark::DoNotOptimize(p);
        salus_free(p, static_cast<ssize_t>(bytes), 0, native);
        break;
      }
    }
  }
  if (job.stats().memory.in_use != 0) state.SkipWithError("a block was not charged back");
  job.end_iteration();
  job.leave();
  salus_default_runtime_shutdown();
}

void door_args(benchmark::internal::Benchmark* bench) {
  bench->Arg(4096)->Arg(4 * MiB);
}

BENCHMARK_CAPTURE(BM_DoorPair, cpp_job, Door::cpp_job)->Apply(door_args);
BENCHMARK_CAPTURE(BM_DoorPair, c_explicit, Door::c_explicit)->Apply(door_args);
BENCHMARK_CAPTURE(BM_DoorPair, cpp_stream, Door::cpp_stream)->Apply(door_args);
BENCHMARK_CAPTURE(BM_DoorPair, c_stream, Door::c_stream)->Apply(door_args);
BENCHMARK_CAPTURE(BM_DoorPair, c_malloc_hook, Door::c_malloc_hook)->Apply(door_args);

}  // namespace
