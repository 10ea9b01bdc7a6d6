// salus_soak: jobs arrive, run, get cancelled, leave (by themselves or from another thread) and
// free their memory from other threads, at random, for a while, on a simulated 4-GPU NVLink mesh
// small enough that pages really move when spilling is on. It runs one combination, or several
// in turn (--combos): JobSpec::blocks_outlive_job on or off, a policy, spilling on or off. Each
// gets a fresh runtime, a watchdog over every thread (watchdog.hpp), and at its end the checks of
// soak_report.hpp. It samples resident memory and reserved bytes into a CSV and judges "flat
// after warm-up" (flatness.hpp). Exit codes: 0 all good; 1 a check failed; 2 bad command line;
// 3 the watchdog found a stuck thread (stacks on stderr). A fault (a reader whose page was
// unmapped) kills the process.
//
//   salus_soak --seconds 40 [--seed N] [--csv PATH] [--stuck-seconds 30] [--warmup-seconds W]
//              [--mode release|outlive] [--policy fair] [--spill on|off]
//              [--combos all|MODE.POLICY.SPILL,...]   (--seconds is then for all of them)
//              [--slots 16] [--racers 6] [--max-iterations-per-job 24] [--cancel-interval-ms 400]
//              [--device-limit-mib 24] [--host-limit-mib 256] [--sample-ms 1000]
//              [--rss-tolerance-mib 8] [--no-rss-verdict] [--no-kernels] [--no-stream-readers]
//              [--device-compute]
//              [--simulate-hang S]
#include <execinfo.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "salus/runtime.hpp"
#include "salus/sim.hpp"
#include "soak/holder.hpp"
#include "soak/racers.hpp"
#include "soak/soak_jobs.hpp"
#include "soak/soak_options.hpp"
#include "soak/soak_report.hpp"
#include "soak/watchdog.hpp"

namespace salus::soak {
namespace {

constexpr int kDevices = 4;
// A combination shorter than this cannot judge reserved bytes after warm-up, nor count on every
// kind of lending and borrowing having happened.
constexpr double kLongCombo = 20.0;

using Clock = std::chrono::steady_clock;

// The combination running, for the fault report (written before its actors start).
char g_combo[96] = "";

// A fault (a reader on a second stream, or a host access, touching a page Salus unmapped or
// handed on) kills the process; this says where first. Async-signal-safe calls only.
void report_fault(int signal, siginfo_t* info, void* /*context*/) {
  char text[256];
  char thread[17] = "";
  (void)::prctl(PR_GET_NAME, thread);
  const int length = std::snprintf(
      text, sizeof text,
      "\nsalus_soak: FATAL signal %d at address %p in thread '%s' (streams are named after the "
      "thread that made them), combination %s: a block's page was unmapped or handed on under "
      "its user\n",
      signal, info->si_addr, thread, g_combo);
  if (length > 0) (void)!::write(STDERR_FILENO, text, static_cast<std::size_t>(length));
  void* frames[48];
  ::backtrace_symbols_fd(frames, ::backtrace(frames, 48), STDERR_FILENO);
  ::raise(signal);  // SA_RESETHAND: the default action now (the process dies with the signal)
}

void install_fault_report() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return;  // the sanitizer's own report of the fault says more
#endif
  void* frames[4];
  (void)::backtrace(frames, 4);  // loads the unwinder now, not in the handler
  struct sigaction action {};
  action.sa_sigaction = report_fault;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_SIGINFO | SA_RESETHAND;
  for (const int signal : {SIGSEGV, SIGBUS}) (void)::sigaction(signal, &action, nullptr);
}

// Small devices, so that pages move when spilling is on (peer first, then host).
RuntimeOptions runtime_options(const Options& o, const Combo& combo) {
  RuntimeOptions options;
  options.policy = combo.policy;
  // The soak's jobs write and read their blocks on the host as soon as they have them, as
  // PyTorch's CPU tensors over a simulated GPU do: they are CPU consumers (unless
  // --device-compute, which keeps host accesses inside the jobs' own iterations).
  options.host_compute = o.host_compute;
  options.memory.device_limits.assign(kDevices, o.device_limit_mib * MiB);
  options.memory.harvest.spill = combo.spill ? SpillPolicy::peer_then_host : SpillPolicy::none;
  options.memory.harvest.host_limit_bytes = o.host_limit_mib * MiB;
  options.memory.harvest.recall_wait = std::chrono::milliseconds(200);
  // One page kept back from lending (the default is an eighth of the device): quiet devices lend.
  options.memory.harvest.lend_reserve_bytes = 2 * MiB;
  return options;
}

PopulationConfig population_config(const Options& o, std::uint64_t seed) {
  PopulationConfig config;
  config.slots = o.slots;
  config.devices = kDevices;
  config.seed = seed;
  config.kernels = o.kernels;
  config.stream_readers = o.stream_readers;
  config.max_iterations_per_job = o.max_iterations_per_job;
  config.cancel_interval_max = std::chrono::milliseconds(o.cancel_interval_ms);
  config.simulate_hang_after = o.simulate_hang_after;
  return config;
}

// The process's sampling: one CSV and one RSS series over every combination.
struct Sampling {
  Clock::time_point start = Clock::now();
  std::FILE* csv = nullptr;
  std::vector<Sample> samples;
  [[nodiscard]] double now() const {
    return std::chrono::duration<double>(Clock::now() - start).count();
  }
};

// Runs the actors of one combination for `seconds`, sampling; returns its samples.
std::vector<Sample> run_and_sample(const Options& o, const Combo& combo, double seconds,
                                   SoakShared& shared, Population& population, Heartbeat& main_beat,
                                   HarvestMaxima& harvest, Sampling& sampling) {
  std::vector<Sample> samples;
  const auto start = Clock::now();
  const auto end =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  const auto period = std::chrono::milliseconds(o.sample_ms);
  auto next_sample = start + period;
  population.start();
  // Lending and borrowing come and go within a second: their maxima are watched every 100 ms.
  for (auto tick = start;;) {
    tick += std::chrono::milliseconds(100);
    std::this_thread::sleep_until(std::min({tick, next_sample, end}));
    main_beat.beat(Phase::working);
    harvest.observe(shared.runtime);
    const auto now = Clock::now();
    if (now >= next_sample || now >= end) {
      next_sample += period;
      samples.push_back(take_sample(combo.name(), sampling.now(), shared.runtime, shared.counters,
                                    population.live_jobs()));
      sampling.samples.push_back(samples.back());
      if (sampling.csv != nullptr) write_csv_row(sampling.csv, samples.back());
    }
    if (now >= end) break;
  }
  return samples;
}

// One combination, start to end, in a fresh runtime under its own watchdog.
void run_combo(const Options& o, const Combo& combo, std::uint64_t seed, double seconds,
               Sampling& sampling, Report& report) {
  std::printf(
      "\n=== %s: seed %llu, %.1f s (replay: salus_soak --combos %s --seconds %.1f --seed "
      "%llu)\n",
      combo.name().c_str(), static_cast<unsigned long long>(seed), seconds, combo.name().c_str(),
      seconds, static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  report.prefix = o.combos.size() > 1 ? combo.name() : "";
  std::snprintf(g_combo, sizeof g_combo, "%s (seed %llu)", combo.name().c_str(),
                static_cast<unsigned long long>(seed));
  WatchdogOptions watch;
  watch.stuck = std::chrono::milliseconds(static_cast<std::int64_t>(o.stuck_seconds * 1000));
  watch.devices = kDevices;
  Watchdog watchdog(watch);
  Heartbeat& main_beat = watchdog.enroll("soak-main");
  watchdog.start();
  {
    auto backend = make_sim_backend(SimConfig::nvlink_mesh(kDevices, 256 * MiB));
    Runtime runtime(backend, runtime_options(o, combo));
    Counters counters;
    ErrorLog log;
    Holder holder(runtime, counters, log);
    SoakShared shared{runtime, watchdog, counters, log, holder, combo.blocks_outlive_job};
    Population population(shared, population_config(o, seed));
    AllocationRace race(shared, {o.racers, kDevices, seed, std::chrono::milliseconds(30)});
    HarvestMaxima harvest;
    holder.start(watchdog);
    race.start();
    const std::vector<Sample> samples =
        run_and_sample(o, combo, seconds, shared, population, main_beat, harvest, sampling);
    watchdog.expect_system_progress(false);  // from here on, jobs only leave
    main_beat.beat(Phase::working);
    // Jobs finish the iteration they are in; those that wait for a turn longer are cancelled.
    population.stop(std::chrono::milliseconds(
        static_cast<std::int64_t>(1000 * std::clamp(seconds / 5.0, 1.0, 10.0))));
    race.stop();
    holder.stop();
    population.retire_streams();
    race.retire_streams();
    main_beat.beat(Phase::working);
    print_counters(counters);
    const bool long_combo = seconds >= kLongCombo;
    // Pages of jobs that compute on the host never move (only new pages spill), so only a long
    // run with device compute must show every kind of harvesting.
    check_counters(counters, log, harvest, samples.back().pages_moved, combo.spill,
                   combo.spill && long_combo, !o.host_compute, report);
    if (o.combos.size() == 1) {
      const double warmup = o.warmup_seconds.value_or(std::max(10.0, seconds / 4.0));
      judge_series(samples,
                   {warmup, o.rss_tolerance_mib, o.judge_rss, long_combo,
                    (kDevices * o.device_limit_mib + o.host_limit_mib) * MiB},
                   true, report);
    }
    check_memory_returned(runtime, o.device_limit_mib * MiB, report);
    main_beat.beat(Phase::working);
  }  // the runtime and the backend are destroyed here (the watchdog still watches)
  main_beat.beat(Phase::done);
  watchdog.stop();
}

int run(const Options& o) {
  const std::uint64_t seed = o.seed.value_or(
      static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()));
  const double per_combo = o.seconds / static_cast<double>(o.combos.size());
  std::printf(
      "salus_soak: seed %llu, %.0f s over %zu combination(s), %d slots, %d racers, %zu MiB per "
      "device, host spill limit %zu MiB, stuck after %.0f s\n",
      static_cast<unsigned long long>(seed), o.seconds, o.combos.size(), o.slots, o.racers,
      o.device_limit_mib, o.host_limit_mib, o.stuck_seconds);
  Sampling sampling;
  if (!o.csv.empty()) {
    sampling.csv = std::fopen(o.csv.c_str(), "w");
    if (sampling.csv == nullptr) throw std::runtime_error("cannot write " + o.csv);
    write_csv_header(sampling.csv);
  }
  Report report;
  for (std::size_t i = 0; i < o.combos.size(); ++i) {
    run_combo(o, o.combos[i], seed + i, per_combo, sampling, report);
  }
  if (sampling.csv != nullptr) std::fclose(sampling.csv);
  if (o.combos.size() > 1) {
    // The process's own memory over every combination (each had its own runtime).
    report.prefix = "all combinations";
    const double warmup = o.warmup_seconds.value_or(std::max(10.0, o.seconds / 4.0));
    judge_series(sampling.samples, {warmup, o.rss_tolerance_mib, o.judge_rss, false, 0}, false,
                 report);
  }
  std::printf("\nsalus_soak: seed %llu: %s\n", static_cast<unsigned long long>(seed),
              report.failures.empty() ? "PASSED" : "FAILED");
  for (const std::string& f : report.failures) std::printf("  failed: %s\n", f.c_str());
  return report.failures.empty() ? 0 : 1;
}

}  // namespace
}  // namespace salus::soak

#if defined(__SANITIZE_ADDRESS__)
// Under AddressSanitizer freed memory waits in a quarantine (256 MiB by default) before reuse, so
// resident memory would climb for minutes whatever Salus does. A small quarantine keeps the RSS
// verdict about Salus; ASAN_OPTIONS=quarantine_size_mb=... still overrides it.
extern "C" const char* __asan_default_options() {
  return "quarantine_size_mb=16";
}
#endif

int main(int argc, char** argv) {
  salus::soak::Options options;
  try {
    options = salus::soak::parse_options(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "salus_soak: %s\n", e.what());
    return 2;
  }
  salus::soak::install_fault_report();
  try {
    return salus::soak::run(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "salus_soak: %s\n", e.what());
    return 1;
  }
}
