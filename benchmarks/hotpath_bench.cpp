// Issue 12's hot path: the attributed alloc/free pair (each block charged to a job) beside glibc
// malloc/free, on the DL size mix and on a small-size mix, in one binary and one run.
//
//   BM_HotPair/manager/<mix>  MemoryManager::allocate with an explicit job (ephemeral, as inside
//                             an iteration) and MemoryManager::deallocate: the allocator's
//                             attributed path, the one the targets are about. With two
//                             threads, each thread is its own job on its own stream.
//   BM_HotPair/runtime/<mix>  salus::Job::allocate / Job::deallocate through a Runtime: the same
//                             call plus the scheduler's bookkeeping (the job's state, its stream,
//                             the free's owner check). Outside an iteration, so blocks are
//                             persistent and no memory-curve sample is recorded.
//   BM_HotPair/capi/<mix>     salus_allocate with an explicit job / salus_deallocate with the size
//                             and device: the C ABI door over the Runtime path.
//   BM_HotPair/glibc/<mix>    malloc / free on the same sizes.
//
// Each thread makes one untimed pass over the sequence first, so the timings are the steady
// state (no page is mapped while timing on the small mix, and almost none on the DL mix).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "salus/c_api.h"
#include "salus/memory.hpp"
#include "salus/runtime.hpp"
#include "salus/sim.hpp"
#include "workloads.hpp"

namespace {

using salus::DevicePtr;
using salus::GiB;
using salus::JobId;
using salus::MemoryManager;
using salus::StreamHandle;
using namespace salus::bench;

constexpr std::size_t kSequenceLength = 1 << 14;  // a power of two: the index wraps with a mask
constexpr std::uint64_t kDlSeed = 0x5a105;        // the same sequence as BM_AllocFreePair
constexpr std::uint64_t kSmallSeed = 0x5a11;
constexpr std::size_t kDeviceBytes = 16 * GiB;

enum class Mix { dl, small };

const std::vector<std::size_t>& sizes(Mix mix) {
  static const std::vector<std::size_t> dl = dl_size_mix(kSequenceLength, kDlSeed);
  static const std::vector<std::size_t> small = small_size_mix(kSequenceLength, kSmallSeed);
  return mix == Mix::dl ? dl : small;
}

// Two threads start half a sequence apart, so they do not ask for the same sizes in lockstep.
std::size_t start_index(const benchmark::State& state) {
  return static_cast<std::size_t>(state.thread_index()) * (kSequenceLength / 2);
}

// Runs the pair loop: `allocate(bytes)` then `release(ptr, bytes)`, after one untimed pass.
template <class Allocate, class Release>
void run_pairs(benchmark::State& state, Mix mix, Allocate allocate, Release release) {
  const std::vector<std::size_t>& seq = sizes(mix);
  for (std::size_t bytes : seq) release(allocate(bytes), bytes);
  std::size_t i = start_index(state);
  for (auto _ : state) {
    const std::size_t bytes = seq[i];
    auto ptr = allocate(bytes);
    benchmark::DoNotOptimize(ptr);
    release(ptr, bytes);
    i = (i + 1) & (kSequenceLength - 1);
  }
  state.SetItemsProcessed(state.iterations());
}

// One simulated 16 GiB GPU, a memory manager, and per benchmark thread a job and a stream (thread
// 0 the default stream, thread 1 a stream of its own), as two jobs of a framework would have.
class ManagerRig {
 public:
  static constexpr int kThreads = 2;
  ManagerRig()
      : backend_(salus::make_sim_backend(salus::SimConfig::uniform(1, kDeviceBytes))),
        manager_(std::make_unique<MemoryManager>(backend_)) {
    streams_.emplace_back();  // the default stream: handle 0, nothing to own
    for (int t = 0; t < kThreads; ++t) {
      if (t > 0) streams_.emplace_back(backend_, 0);
      jobs_.push_back(manager_->register_job("hotpath-" + std::to_string(t)));
    }
  }
  MemoryManager& manager() { return *manager_; }
  [[nodiscard]] StreamHandle stream(int thread) const {
    return streams_[static_cast<std::size_t>(thread)].handle();
  }
  [[nodiscard]] JobId job(int thread) const { return jobs_[static_cast<std::size_t>(thread)]; }

 private:
  std::shared_ptr<salus::DeviceBackend> backend_;
  std::unique_ptr<MemoryManager> manager_;
  std::vector<salus::Stream> streams_;  // destroyed before the manager and the backend
  std::vector<JobId> jobs_;
};

// One rig per mix, shared by the 1- and 2-thread runs (built by whichever thread comes first).
ManagerRig& manager_rig(Mix mix) {
  static ManagerRig dl;
  static ManagerRig small;
  return mix == Mix::dl ? dl : small;
}

void BM_HotPair_manager(benchmark::State& state, Mix mix) {
  ManagerRig& rig = manager_rig(mix);
  const int t = state.thread_index();
  const salus::AllocationRequest base{.device = 0,
                                      .stream = rig.stream(t),
                                      .job = rig.job(t),
                                      .lifetime = salus::Lifetime::ephemeral};
  run_pairs(
      state, mix,
      [&](std::size_t bytes) {
        salus::AllocationRequest request = base;
        request.bytes = bytes;
        return rig.manager().allocate(request);
      },
      [&](DevicePtr ptr, std::size_t) { rig.manager().deallocate(ptr); });
  if (state.thread_index() == 0 &&
      rig.manager().job_stats(rig.job(0)).in_use != 0) {
    state.SkipWithError("a block was not charged back");
  }
}

void BM_HotPair_runtime(benchmark::State& state, Mix mix) {
  salus::Runtime runtime(salus::make_sim_backend(salus::SimConfig::uniform(1, kDeviceBytes)));
  salus::JobSpec spec;
  spec.name = "hotpath";
  salus::Job job = runtime.add_job(spec);
  run_pairs(
      state, mix, [&](std::size_t bytes) { return job.allocate(bytes); },
      [&](DevicePtr ptr, std::size_t) { job.deallocate(ptr); });
  if (job.stats().memory.in_use != 0) state.SkipWithError("a block was not charged back");
  job.leave();
}

void BM_HotPair_capi(benchmark::State& state, Mix mix) {
  salus_runtime* runtime = nullptr;
  if (salus_runtime_create_sim(1, kDeviceBytes, &runtime) != SALUS_OK) {
    state.SkipWithError(salus_last_error());
    return;
  }
  salus_job_spec spec;
  salus_job_spec_init(&spec);
  spec.name = "hotpath";
  std::uint32_t job = 0;
  if (salus_job_add(runtime, &spec, &job) != SALUS_OK) {
    state.SkipWithError(salus_last_error());
    salus_runtime_destroy(runtime);
    return;
  }
  bool failed = false;
  run_pairs(
      state, mix,
      [&](std::size_t bytes) {
        void* ptr = nullptr;
        failed |= salus_allocate(runtime, bytes, 0, nullptr, job, SALUS_PERSISTENT, &ptr) !=
                  SALUS_OK;
        return ptr;
      },
      [&](void* ptr, std::size_t bytes) {
        failed |= salus_deallocate(runtime, ptr, bytes, 0) != SALUS_OK;
      });
  if (failed) state.SkipWithError("a C ABI call failed");
  (void)salus_job_leave(runtime, job);
  salus_runtime_destroy(runtime);
}

void BM_HotPair_glibc(benchmark::State& state, Mix mix) {
  run_pairs(
      state, mix, [](std::size_t bytes) { return std::malloc(bytes); },
      [](void* ptr, std::size_t) { std::free(ptr); });
}

}  // namespace

BENCHMARK_CAPTURE(BM_HotPair_manager, dl, Mix::dl)
    ->Name("BM_HotPair/manager/dl")->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_HotPair_manager, small, Mix::small)
    ->Name("BM_HotPair/manager/small")->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_HotPair_runtime, dl, Mix::dl)->Name("BM_HotPair/runtime/dl")->UseRealTime();
BENCHMARK_CAPTURE(BM_HotPair_runtime, small, Mix::small)
    ->Name("BM_HotPair/runtime/small")->UseRealTime();
BENCHMARK_CAPTURE(BM_HotPair_capi, dl, Mix::dl)->Name("BM_HotPair/capi/dl")->UseRealTime();
BENCHMARK_CAPTURE(BM_HotPair_capi, small, Mix::small)->Name("BM_HotPair/capi/small")->UseRealTime();
BENCHMARK_CAPTURE(BM_HotPair_glibc, dl, Mix::dl)
    ->Name("BM_HotPair/glibc/dl")->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_HotPair_glibc, small, Mix::small)
    ->Name("BM_HotPair/glibc/small")->Threads(1)->Threads(2)->UseRealTime();
