// salus_steady_counts: what a steady training iteration costs the system, counted rather than
// timed. A recorded PyTorch trace (benchmarks/traces) is replayed through a job twice (the first
// pass maps what the job needs; alloc_trace::replay_passes) and the steady iterations of the
// second pass are counted:
//   - on the CUDA backend over the fake driver (tests/support): the driver calls made between an
//     iteration's begin and end (its allocations and frees), by name, and at its boundaries (its
//     timing events), and the pages mapped;
//   - on the simulated backend with host compute (PyTorch's CPU mode): the tasks handed to stream
//     threads (each a thread hand-over) and the pages mapped.
// Prints one JSON object per trace. Also builds against an older tree (scripts/bench.sh --base),
// where it counts what that tree's API offers.
//
//   salus_steady_counts [TRACE...]      (default: gpt2 resnet18)
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "../alloc_trace.hpp"
#include "cuda/cuda_backend.hpp"
#include "salus/runtime.hpp"
#include "salus/sim.hpp"
#include "support/fake_driver.hpp"

namespace {

namespace fs = std::filesystem;
namespace trace_io = salus::alloc_trace;

// As salus.torch runs a CUDA job: where the tree knows CaptureGuard, the glue's setting.
template <class Options>
void as_the_torch_glue(Options& options) {
  if constexpr (requires { options.memory.capture_guard; }) {
    options.memory.capture_guard = decltype(options.memory.capture_guard)(1);  // framework_refuses
  }
}

template <class Activity>
std::optional<std::uint64_t> stream_tasks(const Activity& a) {
  if constexpr (requires { a.stream_tasks; }) {
    return a.stream_tasks;
  } else {
    return std::nullopt;
  }
}

struct Counts {
  std::size_t iterations = 0;
  std::map<std::string, std::uint64_t> inside;    // driver calls inside steady iterations
  std::map<std::string, std::uint64_t> boundary;  // at their begins and ends
  std::uint64_t maps = 0;
};

Counts on_fake_cuda(const trace_io::Trace& trace) {
  salus::test::FakeDriver fake(salus::test::FakeDriverConfig::uniform(1, 8 * salus::GiB));
  auto backend = std::make_shared<salus::cuda::CudaBackend>(fake.api());
  salus::RuntimeOptions options;
  as_the_torch_glue(options);
  salus::Runtime runtime(backend, std::move(options));
  salus::JobSpec spec;
  spec.name = "trace";
  salus::Job job = runtime.add_job(spec);
  Counts counts;
  std::size_t mark = 0;
  std::optional<std::uint64_t> maps_before;
  std::optional<std::size_t> first_boundary;
  trace_io::replay_passes(
      trace, job, 2,
      {.inside_begins =
           [&] {
             if (!maps_before) maps_before = runtime.memory().device_stats(0).page_maps;
             const auto calls = fake.calls();
             if (first_boundary) {
               for (std::size_t i = mark; i < calls.size(); ++i) ++counts.boundary[calls[i].name];
             }
             mark = calls.size();
           },
       .inside_ends =
           [&] {
             const auto calls = fake.calls();
             for (std::size_t i = mark; i < calls.size(); ++i) ++counts.inside[calls[i].name];
             mark = calls.size();
             first_boundary = mark;
             ++counts.iterations;
           }});
  counts.maps = runtime.memory().device_stats(0).page_maps - maps_before.value_or(0);
  return counts;
}

struct SimCounts {
  std::size_t iterations = 0;
  std::optional<std::uint64_t> tasks;
  std::uint64_t maps = 0;
};

SimCounts on_sim_host_compute(const trace_io::Trace& trace) {
  auto backend = salus::make_sim_backend(salus::SimConfig::uniform(1, 8 * salus::GiB));
  salus::RuntimeOptions options;
  options.host_compute = true;
  salus::Runtime runtime(backend, std::move(options));
  salus::JobSpec spec;
  spec.name = "trace";
  salus::Job job = runtime.add_job(spec);
  SimCounts counts;
  std::optional<std::uint64_t> tasks_before;
  std::uint64_t maps_before = 0;
  trace_io::replay_passes(trace, job, 2,
                          {.inside_begins =
                               [&] {
                                 if (counts.iterations > 0 || tasks_before) return;
                                 tasks_before =
                                     stream_tasks(salus::sim_device_activity(*backend, 0));
                                 maps_before = runtime.memory().device_stats(0).page_maps;
                               },
                           .inside_ends = [&] { ++counts.iterations; }});
  // Every task of the steady iterations, their boundaries included.
  if (const auto now = stream_tasks(salus::sim_device_activity(*backend, 0)); now && tasks_before) {
    counts.tasks = *now - *tasks_before;
  }
  counts.maps = runtime.memory().device_stats(0).page_maps - maps_before;
  return counts;
}

std::string json(const std::map<std::string, std::uint64_t>& calls, std::size_t per) {
  std::string out = "{";
  for (const auto& [name, n] : calls) {
    if (out.size() > 1) out += ", ";
    char value[64];
    std::snprintf(value, sizeof value, "%.2f", static_cast<double>(n) / static_cast<double>(per));
    out += "\"" + name + "\": " + value;
  }
  return out + "}";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> names;
  for (int i = 1; i < argc; ++i) names.emplace_back(argv[i]);
  if (names.empty()) names = {"gpt2", "resnet18"};
  const fs::path beside = fs::path(__FILE__).parent_path().parent_path() / "traces";
  for (const std::string& name : names) {
    auto loaded = trace_io::load(trace_io::trace_dir(beside) / (name + ".trace"));
    if (const auto* error = std::get_if<std::string>(&loaded)) {
      std::fprintf(stderr, "%s\n", error->c_str());
      return 2;
    }
    const trace_io::Trace& trace = std::get<trace_io::Trace>(loaded);
    const Counts cuda = on_fake_cuda(trace);
    const SimCounts sim = on_sim_host_compute(trace);
    const std::size_t per = std::max<std::size_t>(cuda.iterations, 1);
    std::uint64_t inside_total = 0;
    for (const auto& [n, c] : cuda.inside) inside_total += c;
    std::printf(
        "{\"trace\": \"%s\", \"allocations_per_iteration\": %.1f, \"steady_iterations\": %zu, "
        "\"cuda_calls_inside_per_iteration\": %.2f, \"cuda_inside\": %s, "
        "\"cuda_boundary_per_iteration\": %s, \"cuda_page_maps\": %llu, "
        "\"sim_stream_tasks_per_iteration\": %s, \"sim_page_maps\": %llu}\n",
        name.c_str(),
        static_cast<double>(trace.allocations) / static_cast<double>(trace.iterations + 1),
        cuda.iterations, static_cast<double>(inside_total) / static_cast<double>(per),
        json(cuda.inside, per).c_str(), json(cuda.boundary, per).c_str(),
        static_cast<unsigned long long>(cuda.maps),
        sim.tasks ? std::to_string(static_cast<double>(*sim.tasks) /
                                   static_cast<double>(std::max<std::size_t>(sim.iterations, 1)))
                        .c_str()
                  : "null",
        static_cast<unsigned long long>(sim.maps));
  }
  return 0;
}
