// Sharing costs nothing in the steady state (DESIGN.md, invariant 10): once a job's pages are held,
// its allocations and frees make no driver call, map no page and hand no work to another thread.
// Counted, not timed: a recorded PyTorch trace is replayed through the runtime twice (the first
// pass maps what the job needs), and the second pass is counted, on the fake CUDA driver (its
// calls) and on the simulated backend (the tasks its stream threads get).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <variant>

#include "../benchmarks/alloc_trace.hpp"
#include "cuda/cuda_backend.hpp"
#include "salus/runtime.hpp"
#include "salus/sim.hpp"
#include "support/fake_driver.hpp"

namespace salus::testing {
namespace {

namespace fs = std::filesystem;
using test::FakeCall;
using test::FakeDriver;
using test::FakeDriverConfig;

const alloc_trace::Trace& trace(const std::string& name) {
  static std::map<std::string, std::variant<alloc_trace::Trace, std::string>> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    const fs::path beside =
        fs::path(__FILE__).parent_path().parent_path() / "benchmarks" / "traces";
    it = cache.emplace(name, alloc_trace::load(alloc_trace::trace_dir(beside) / (name + ".trace")))
             .first;
  }
  if (const auto* error = std::get_if<std::string>(&it->second)) {
    ADD_FAILURE() << *error;
    static const alloc_trace::Trace empty;
    return empty;
  }
  return std::get<alloc_trace::Trace>(it->second);
}

class SteadyState : public ::testing::TestWithParam<std::string> {};

// On the fake CUDA driver, the job's iterations on its lane stream: not one driver call between
// an iteration's begin and end, wherever the allocation pattern goes (events come from a pool,
// fences on idle streams are skipped, the context is not asked for); and no page map in the
// whole second pass.
// Driver calls inside the steady iterations of `t` replayed twice on the fake driver, by name.
std::map<std::string, int> calls_inside_steady_iterations(const alloc_trace::Trace& t,
                                                          CaptureGuard guard,
                                                          std::uint64_t& steady_maps,
                                                          bool need_context = false) {
  FakeDriverConfig config = FakeDriverConfig::uniform(1, 8 * GiB);
  config.handle_calls_need_context = need_context;
  FakeDriver fake(config);
  auto backend = std::make_shared<cuda::CudaBackend>(fake.api());
  RuntimeOptions options{.policy = "fair"};
  options.memory.capture_guard = guard;
  Runtime runtime(backend, std::move(options));
  Job job = runtime.add_job(JobSpec{.name = "trace"});
  std::map<std::string, int> inside;  // driver calls between an iteration's begin and end
  std::size_t calls_before = 0;
  std::optional<std::uint64_t> maps_before;
  alloc_trace::replay_passes(
      t, job, 2,
      {.inside_begins =
           [&] {
             if (!maps_before) maps_before = runtime.memory().device_stats(0).page_maps;
             calls_before = fake.calls().size();
           },
       .inside_ends =
           [&] {
             const std::vector<FakeCall> calls = fake.calls();
             for (std::size_t i = calls_before; i < calls.size(); ++i) ++inside[calls[i].name];
           }});
  EXPECT_TRUE(maps_before.has_value()) << "the trace has no steady iteration";
  steady_maps = runtime.memory().device_stats(0).page_maps - maps_before.value_or(0);
  EXPECT_TRUE(fake.violations().empty()) << fake.violations().front();
  return inside;
}

std::string listed(const std::map<std::string, int>& calls) {
  std::string out;
  for (const auto& [name, n] : calls) out += name + " x" + std::to_string(n) + " ";
  return out;
}

// On the fake CUDA driver, as PyTorch's CUDA glue runs a job (its allocator refuses graph
// captures, so Salus need not ask): not one driver call between a steady iteration's begin and
// end, and no page mapped. Blocks live on the lane stream, events and queries name their own
// context (no cuCtxGetCurrent/cuCtxSetCurrent), and nothing asks about captures.
TEST_P(SteadyState, NoDriverCallInsideAnIterationOnCuda) {
  std::uint64_t maps = 0;
  const auto inside = calls_inside_steady_iterations(trace(GetParam()),
                                                     CaptureGuard::framework_refuses, maps);
  EXPECT_TRUE(inside.empty()) << "driver calls inside steady iterations: " << listed(inside);
  EXPECT_EQ(maps, 0u);
}

// Salus asking about captures itself (the default, for frameworks that do not refuse them) costs
// exactly one cuStreamIsCapturing per allocation, and nothing else.
TEST_P(SteadyState, AskingAboutCapturesIsOneCallPerAllocation) {
  std::uint64_t maps = 0;
  const auto inside =
      calls_inside_steady_iterations(trace(GetParam()), CaptureGuard::salus_asks, maps);
  ASSERT_EQ(inside.size(), 1u) << listed(inside);
  EXPECT_EQ(inside.begin()->first, "cuStreamIsCapturing");
  EXPECT_GT(inside.begin()->second, 0);
}

// A driver that wanted a context current for calls on stream and event handles would answer
// CUDA_ERROR_INVALID_CONTEXT on a thread with none: the backend binds its device's context and
// tries again, and the job goes on as before (the steady iterations still need no page).
TEST_P(SteadyState, ADriverThatWantsAContextGetsItBoundOnlyThen) {
  std::uint64_t maps = 0;
  const auto inside = calls_inside_steady_iterations(trace(GetParam()),
                                                     CaptureGuard::framework_refuses, maps, true);
  EXPECT_EQ(maps, 0u);
  EXPECT_TRUE(inside.empty()) << listed(inside);
}

// On the simulated backend with host compute (PyTorch's CPU mode), the steady iterations hand no
// task to a stream thread (so no thread is woken for them), and map no page.
TEST_P(SteadyState, NoStreamTaskInAHostComputeIteration) {
  const alloc_trace::Trace& t = trace(GetParam());
  auto backend = make_sim_backend(SimConfig::uniform(1, 8 * GiB));
  RuntimeOptions options{.policy = "fair"};
  options.host_compute = true;
  Runtime runtime(backend, std::move(options));
  Job job = runtime.add_job(JobSpec{.name = "trace"});
  std::optional<std::uint64_t> tasks_before;
  std::uint64_t maps_before = 0;
  alloc_trace::replay_passes(t, job, 2, {.inside_begins = [&] {
                                           if (tasks_before) return;
                                           tasks_before = sim_device_activity(*backend, 0).stream_tasks;
                                           maps_before = runtime.memory().device_stats(0).page_maps;
                                         }});
  ASSERT_TRUE(tasks_before.has_value()) << "the trace has no steady iteration";
  EXPECT_EQ(sim_device_activity(*backend, 0).stream_tasks, *tasks_before);
  EXPECT_EQ(runtime.memory().device_stats(0).page_maps, maps_before);
}

INSTANTIATE_TEST_SUITE_P(Traces, SteadyState, ::testing::Values("gpt2", "resnet18", "lstm"));

}  // namespace
}  // namespace salus::testing
