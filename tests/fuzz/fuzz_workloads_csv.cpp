// Fuzz target: salus::sched::jobs_from_workloads_csv (the salus_workloads.csv parser). For any
// input it must return jobs or throw salus::InvalidArgument, never crash, hang or throw anything
// else, and every job it returns must pass the simulator's own checks: the first few are run, in
// fewer longer steps, through a small simulation that validates them before it starts.
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_input.hpp"
#include "salus/error.hpp"
#include "salus/simulation.hpp"

namespace {

void simulate(const std::vector<salus::sched::SimJob>& parsed) {
  std::vector<salus::sched::SimJob> jobs;
  for (const auto& job : parsed) {
    if (jobs.size() == 4) break;
    jobs.push_back(salus::sched::coarsened(job, 3));
  }
  if (jobs.empty()) return;
  salus::sched::SimOptions options;
  options.record_iterations = false;
  options.max_events = 10'000;
  // A budget any parsed job fits alone: the parser's job is a well-formed job, not a small one.
  const salus::sched::Simulation sim("fair", SIZE_MAX / 4, options);
  try {
    const salus::sched::SimResult result = sim.run(jobs);
    FUZZ_CHECK(result.jobs.size() == jobs.size(), "a result per job");
  } catch (const salus::InvalidArgument& e) {
    salus::fuzz::fail(std::string("the parser returned a job the simulator refuses: ") + e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  salus::fuzz::FuzzInput in(data, size);
  // The first byte: the iteration cap (0: none), as salus-bench passes it.
  static constexpr std::uint64_t kCaps[] = {0, 0, 1, 3, 1000};
  const std::uint64_t cap = size > 0 ? kCaps[in.below(5)] : 0;
  const std::string text(reinterpret_cast<const char*>(data) + (size > 0 ? 1 : 0),
                         size > 0 ? size - 1 : 0);
  std::istringstream stream(text);
  std::vector<salus::sched::SimJob> jobs;
  try {
    jobs = salus::sched::jobs_from_workloads_csv(stream, cap, "fuzz.csv");
  } catch (const salus::InvalidArgument& e) {
    FUZZ_CHECK(std::string(e.what()).find("fuzz.csv") != std::string::npos,
               std::string("the message names the source: ") + e.what());
    return 0;
  }
  for (const auto& job : jobs) {
    FUZZ_CHECK(job.iterations > 0 && (cap == 0 || job.iterations <= cap), job.name);
  }
  simulate(jobs);
  return 0;
}
