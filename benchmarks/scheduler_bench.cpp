// The scheduler's decision cost per iteration boundary, as the number of registered jobs grows.
// One boundary is what the runtime does when an iteration ends: decide() starts the next
// iteration, finish() ends it, update() records the attained time, wait() queues the job again.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "iteration_sched/decision.hpp"
#include "salus/scheduler.hpp"

namespace {

using salus::JobView;
using salus::MemoryCurve;
using salus::sched::DecisionCore;

constexpr double kIterationSeconds = 0.001;

// `jobs` waiting jobs on one device; every boundary moves one of them through an iteration.
void run_boundaries(benchmark::State& state, const char* policy_name, std::size_t budget,
                    const MemoryCurve* curve) {
  const auto jobs = static_cast<std::uint32_t>(state.range(0));
  const auto policy = salus::PolicyRegistry::with_builtins().make(policy_name);
  DecisionCore core(*policy, budget);
  std::vector<JobView> views(jobs);
  for (std::uint32_t id = 0; id < jobs; ++id) {
    JobView& view = views[id];
    view.id = salus::JobId{id};
    view.arrival = id;
    view.iteration_seconds = kIterationSeconds;
    view.persistent_bytes = 1;
    view.ephemeral_peak_bytes = 1000;
    view.curve = curve;
    core.add(view);
    core.wait(salus::JobId{id});
  }
  double now = 0.0;
  std::int64_t boundaries = 0;
  for (auto _ : state) {
    const salus::sched::Decision decision = core.decide(now);
    now += kIterationSeconds;
    for (const salus::sched::Start& start : decision.starts) {
      core.finish(start.job, now);
      JobView& view = views[start.job.value];
      view.attained_seconds += kIterationSeconds;
      ++view.iterations_done;
      core.update(view);
      core.wait(start.job);
      ++boundaries;
    }
  }
  state.SetItemsProcessed(boundaries);  // items/s: boundaries per second
  state.counters["starts_per_decide"] =
      benchmark::Counter(static_cast<double>(boundaries) / static_cast<double>(state.iterations()));
}

// Single lane, least attained time first: the decision the target is about.
void BM_SchedulerDecision(benchmark::State& state) {
  // Room for every job's persistent byte plus one ephemeral peak: all admitted, one lane.
  run_boundaries(state, "fair", 1'000'000, nullptr);
}
BENCHMARK(BM_SchedulerDecision)->Arg(10)->Arg(100)->Arg(1000);

// Memory-aware: the lane rule's turns, then the start-offset search for up to 8 waiting jobs as
// extras. The budget opens six lanes (the rest of the jobs join them), so each decide starts six
// turns and searches beside six running curves and the quotas held after them.
void BM_SchedulerDecisionMemoryAware(benchmark::State& state) {
  static const MemoryCurve rising{kIterationSeconds, {100, 300, 600, 1000, 700, 400, 200, 100}};
  run_boundaries(state, "memory_aware", 5'000 + 2'000, &rising);
}
BENCHMARK(BM_SchedulerDecisionMemoryAware)->Arg(10)->Arg(100)->Arg(1000);

}  // namespace
