// Stream-ordered reuse under memory pressure (issue 8): what it costs the host to hand memory from
// one stream to another while work enqueued before the free is still queued.
//
// One simulated GPU limited to 64 MiB, two streams a and b. Each iteration keeps stream a busy for
// `busy_us` (a host function standing in for a kernel), allocates 48 MiB on a and frees it on the
// host while that work is queued, then allocates 48 MiB on b, which must take a's pages, and frees
// it. Timed: the two allocations and frees on the host, the enqueue of the stand-in kernel
// included. Modes:
//   drained  - both streams are synchronized (untimed) after each iteration: every hand-off meets
//              a's work still queued, never a's next allocation.
//   pingpong - nothing is synchronized: a's next allocation wants back the pages b holds, at
//              addresses whose old pages may still be behind a's queued work.
// The ratio busy/idle (same mode, same run) says whether the host waited for the GPU: a blocking
// hand-off would add `busy_us` to every iteration. The counters say how often pages changed hands
// behind pending work (deferred_unmaps) and how often an allocation waited (allocation_waits).
#include <benchmark/benchmark.h>

#include <chrono>
#include <thread>

#include "salus/device.hpp"
#include "salus/memory.hpp"
#include "salus/sim.hpp"

namespace {

using salus::DevicePtr;
using salus::MemoryManager;
using salus::MiB;

// The stream-safety counters exist from issue 8 on; the benchmark also builds against the code
// before it, for a side-by-side run (scripts/bench_compare.sh), and then reports -1.
template <class Stats>
double deferred_unmaps(const Stats& s) {
  if constexpr (requires { s.deferred_unmaps; }) {
    return static_cast<double>(s.deferred_unmaps);
  } else {
    return -1.0;
  }
}

template <class Stats>
double allocation_waits(const Stats& s) {
  if constexpr (requires { s.allocation_waits; }) {
    return static_cast<double>(s.allocation_waits);
  } else {
    return -1.0;
  }
}

void BM_ReuseUnderPressure(benchmark::State& state) {
  const std::chrono::microseconds busy(state.range(0));
  const bool drained = state.range(1) == 0;
  auto backend = salus::make_sim_backend(salus::SimConfig::uniform(1, 64 * MiB));
  MemoryManager memory(backend, {.device_limits = {64 * MiB}});
  salus::Stream a(backend, 0);
  salus::Stream b(backend, 0);
  constexpr std::size_t kBlock = 48 * MiB;
  for (auto _ : state) {
    backend->launch_host_func(a.handle(), [busy] { std::this_thread::sleep_for(busy); });
    const DevicePtr p = memory.allocate({.bytes = kBlock, .device = 0, .stream = a.handle()});
    memory.deallocate(p);
    const DevicePtr q = memory.allocate({.bytes = kBlock, .device = 0, .stream = b.handle()});
    memory.deallocate(q);
    if (drained) {
      state.PauseTiming();
      a.synchronize();
      b.synchronize();
      state.ResumeTiming();
    }
  }
  a.synchronize();
  b.synchronize();
  const salus::DeviceMemoryStats s = memory.device_stats(0);
  const auto per_iteration = benchmark::Counter::kAvgIterations;
  state.counters["cross_stream_pages"] =
      benchmark::Counter(static_cast<double>(s.cross_stream_reuses), per_iteration);
  state.counters["deferred_unmaps"] = benchmark::Counter(deferred_unmaps(s), per_iteration);
  state.counters["allocation_waits"] = benchmark::Counter(allocation_waits(s), per_iteration);
}

}  // namespace

// Args: busy_us, mode (0 drained, 1 pingpong). A fixed iteration count bounds the queued work in
// pingpong mode (it grows by busy_us per iteration when the host outruns the stream).
BENCHMARK(BM_ReuseUnderPressure)
    ->ArgNames({"busy_us", "pingpong"})
    ->Args({0, 0})
    ->Args({2000, 0})
    ->Args({0, 1})
    ->Args({2000, 1})
    ->Iterations(300)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
