// salus_microbench: Salus's allocator against glibc malloc on the same request streams, plus a
// training-trace replay that measures how much physical memory Salus holds beyond what is live.
//
// Salus runs on simulated GPUs. The benchmarks never touch the memory they get, and the sim
// backend's memory is a sparse memfd, so what is timed is the allocator's own bookkeeping (plus
// the occasional map of fresh pages), which is what a real GPU's allocator pays on the host too.
// glibc likewise hands out untouched memory. Workloads are generated once from fixed seeds; see
// workloads.hpp for the size mix and the trace.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "salus/device.hpp"
#include "salus/memory.hpp"
#include "salus/sim.hpp"
#include "workloads.hpp"

namespace {

using salus::AllocationRequest;
using salus::DevicePtr;
using salus::GiB;
using salus::MemoryManager;
using salus::MiB;
using salus::StreamHandle;
using namespace salus::bench;

// A power of two, so the sequence index wraps with a mask; long enough that the size pattern does
// not fit a branch predictor's history.
constexpr std::size_t kSequenceLength = 1 << 14;
constexpr std::uint64_t kSizeSeed = 0x5a105;
constexpr std::uint64_t kRandomSeed = 0xc0ffee;
constexpr std::size_t kRandomOps = 1 << 16;
constexpr std::size_t kRandomWindow = 1000;

const std::vector<std::size_t>& size_sequence() {
  static const std::vector<std::size_t> sizes = dl_size_mix(kSequenceLength, kSizeSeed);
  return sizes;
}

const RandomWorkload& random_ops() {
  static const RandomWorkload workload = random_workload(kRandomOps, kRandomWindow, kRandomSeed);
  return workload;
}

// One simulated 16 GiB GPU and a memory manager over it, plus one stream per benchmark thread:
// thread 0 uses the default stream, the others streams of their own, as separate jobs would.
class SalusRig {
 public:
  explicit SalusRig(int threads)
      : backend_(salus::make_sim_backend(salus::SimConfig::uniform(1, 16 * GiB))),
        manager_(std::make_unique<MemoryManager>(backend_)) {
    streams_.emplace_back();  // default stream: handle 0, nothing to own
    for (int t = 1; t < threads; ++t) streams_.emplace_back(backend_, 0);
  }

  MemoryManager& manager() { return *manager_; }
  [[nodiscard]] StreamHandle stream(int thread) const {
    return streams_[static_cast<std::size_t>(thread)].handle();
  }

  DevicePtr allocate(std::size_t bytes, StreamHandle stream) {
    return manager_->allocate(AllocationRequest{.bytes = bytes, .device = 0, .stream = stream});
  }

 private:
  std::shared_ptr<salus::DeviceBackend> backend_;
  std::unique_ptr<MemoryManager> manager_;
  std::vector<salus::Stream> streams_;  // destroyed before the manager and the backend
};

// Built on first use by whichever benchmark thread gets there first (a function-local static is
// initialized exactly once), shared by all threads of every run of the benchmark.
SalusRig& pair_rig() {
  static SalusRig rig(2);
  return rig;
}

// Each thread starts at its own offset so two threads do not ask for the same sizes in lockstep.
std::size_t start_index(const benchmark::State& state) {
  return static_cast<std::size_t>(state.thread_index()) * (kSequenceLength / 2);
}

void BM_AllocFreePair_salus(benchmark::State& state) {
  SalusRig& rig = pair_rig();
  const StreamHandle stream = rig.stream(state.thread_index());
  const auto& sizes = size_sequence();
  // Warm-up (untimed): one pass maps the pages the steady state needs.
  for (std::size_t size : sizes) rig.manager().deallocate(rig.allocate(size, stream));
  std::size_t i = start_index(state);
  for (auto _ : state) {
    const DevicePtr ptr = rig.allocate(sizes[i], stream);
    benchmark::DoNotOptimize(ptr);
    rig.manager().deallocate(ptr);
    i = (i + 1) & (kSequenceLength - 1);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_AllocFreePair_glibc(benchmark::State& state) {
  const auto& sizes = size_sequence();
  for (std::size_t size : sizes) std::free(std::malloc(size));
  std::size_t i = start_index(state);
  for (auto _ : state) {
    void* ptr = std::malloc(sizes[i]);
    benchmark::DoNotOptimize(ptr);
    std::free(ptr);
    i = (i + 1) & (kSequenceLength - 1);
  }
  state.SetItemsProcessed(state.iterations());
}

// Replays the random workload with `allocate`/`release` (one op per benchmark iteration) and
// frees what is left at the end.
template <class Allocate, class Release>
void run_random(benchmark::State& state, Allocate allocate, Release release) {
  const RandomWorkload& workload = random_ops();
  using Ptr = decltype(allocate(std::size_t{}));
  std::vector<Ptr> live;
  live.reserve(kRandomWindow);
  for (std::size_t size : workload.prefill) live.push_back(allocate(size));
  const std::size_t n = workload.ops.size();
  std::size_t i = 0;
  for (auto _ : state) {
    const RandomOp& op = workload.ops[i];
    if (op.allocate) {
      live.push_back(allocate(op.size));
      benchmark::DoNotOptimize(live.back());
    } else {
      release(live[op.victim]);
      live[op.victim] = live.back();
      live.pop_back();
    }
    if (++i == n) i = 0;
  }
  for (Ptr ptr : live) release(ptr);
  state.SetItemsProcessed(state.iterations());
}

void BM_RandomAllocations_salus(benchmark::State& state) {
  static SalusRig rig(1);
  run_random(
      state, [&](std::size_t bytes) { return rig.allocate(bytes, StreamHandle{}); },
      [&](DevicePtr ptr) { rig.manager().deallocate(ptr); });
}

void BM_RandomAllocations_glibc(benchmark::State& state) {
  run_random(
      state, [](std::size_t bytes) { return std::malloc(bytes); },
      [](void* ptr) { std::free(ptr); });
}

// Replays a training trace through a fresh manager each time (so the peak includes the first
// iteration, when the heap is built up), registered as one job with persistent weights and
// ephemeral activations; promote_ephemeral at each iteration end keeps the momentum buffers
// accounted as persistent, as the scheduler will.
void trace_replay(benchmark::State& state, Model model, int batch, int iterations) {
  const Trace trace = training_trace(model, batch, iterations);
  std::vector<DevicePtr> slots(trace.slots, 0);
  std::vector<std::size_t> slot_bytes(trace.slots, 0);
  auto backend = salus::make_sim_backend(salus::SimConfig::uniform(1, 16 * GiB));
  std::size_t peak_live = 0;
  salus::DeviceMemoryStats device{};

  for (auto _ : state) {
    state.PauseTiming();
    auto manager = std::make_unique<MemoryManager>(backend);
    const salus::JobId job = manager->register_job("synthetic_training");
    std::size_t live = 0;
    peak_live = 0;
    state.ResumeTiming();

    for (const TraceOp& op : trace.ops) {
      switch (op.kind) {
        case TraceOp::Kind::allocate:
          slots[op.slot] =
              manager->allocate({.bytes = op.bytes,
                                 .job = job,
                                 .lifetime = op.persistent ? salus::Lifetime::persistent
                                                           : salus::Lifetime::ephemeral});
          slot_bytes[op.slot] = op.bytes;
          live += op.bytes;
          peak_live = std::max(peak_live, live);
          break;
        case TraceOp::Kind::free:
          manager->deallocate(slots[op.slot]);
          live -= slot_bytes[op.slot];
          break;
        case TraceOp::Kind::end_iteration:
          manager->promote_ephemeral(job);
          break;
      }
    }

    state.PauseTiming();
    device = manager->device_stats(0);
    manager.reset();
    state.ResumeTiming();
  }
  state.counters["peak_live_MiB"] = static_cast<double>(peak_live) / MiB;
  state.counters["peak_reserved_MiB"] = static_cast<double>(device.peak_reserved) / MiB;
  state.counters["reserved_over_live"] =
      static_cast<double>(device.peak_reserved) / static_cast<double>(peak_live);
  state.counters["ops"] = static_cast<double>(trace.ops.size());
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(trace.ops.size()));
}

void BM_TraceReplay_training(benchmark::State& state) {
  trace_replay(state, Model::resnet50, /*batch=*/32, /*iterations=*/5);
}

void BM_TraceReplay_vgg16(benchmark::State& state) {
  trace_replay(state, Model::vgg16, /*batch=*/32, /*iterations=*/5);
}

}  // namespace

BENCHMARK(BM_AllocFreePair_salus)
    ->Name("BM_AllocFreePair/salus")
    ->Threads(1)
    ->Threads(2)
    ->UseRealTime();
BENCHMARK(BM_AllocFreePair_glibc)
    ->Name("BM_AllocFreePair/glibc")
    ->Threads(1)
    ->Threads(2)
    ->UseRealTime();
BENCHMARK(BM_RandomAllocations_salus)->Name("BM_RandomAllocations/salus");
BENCHMARK(BM_RandomAllocations_glibc)->Name("BM_RandomAllocations/glibc");
BENCHMARK(BM_TraceReplay_training)
    ->Name("BM_TraceReplay/synthetic_training")
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TraceReplay_vgg16)
    ->Name("BM_TraceReplay/synthetic_training_vgg16")
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
