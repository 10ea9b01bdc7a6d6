// salusd: one per node and user. Owns each GPU's physical pages and runs the iteration scheduler
// for the jobs of every connected process (see DESIGN.md, "Processes").
#include <grp.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <cstdlib>
#include <thread>

#include "daemon/coordinator.hpp"
#include "daemon/server.hpp"
#include "remote/channel.hpp"
#include "remote/daemon_link.hpp"
#include "salus/cuda.hpp"
#include "salus/sim.hpp"

namespace {

// The size grammar of every Salus door (Python's salus._checks.parse_size too): a number, then a
// unit in any case: none or B; KiB, MiB, GiB, TiB (or K, M, G, T), powers of 1024; KB, MB, GB,
// TB, powers of 1000. "8GiB", "512 mib", "1.5G", "2GB", "1048576". A bad one names its flag.
std::size_t parse_size(const std::string& text, const std::string& flag) {
  std::size_t used = 0;
  double number = 0;
  try {
    number = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  std::erase(unit, ' ');
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> kUnits = {
      {"", 1.0},         {"B", 1.0},
      {"K", 0x1p10},     {"KIB", 0x1p10}, {"M", 0x1p20}, {"MIB", 0x1p20},
      {"G", 0x1p30},     {"GIB", 0x1p30}, {"T", 0x1p40}, {"TIB", 0x1p40},
      {"KB", 1e3},       {"MB", 1e6},     {"GB", 1e9},   {"TB", 1e12}};
  const auto scale = kUnits.find(unit);
  if (used == 0 || scale == kUnits.end() || !(number >= 0) || !std::isfinite(number)) {
    throw CLI::ValidationError(
        flag, "cannot read '" + text + "' as a size (say 512MiB, 8GiB, 2GB)");
  }
  return static_cast<std::size_t>(number * scale->second);
}

std::shared_ptr<salus::DeviceBackend> make_backend(const std::string& kind, int devices,
                                                   std::size_t memory, const std::string& given) {
  salus::SimConfig sim = salus::SimConfig::uniform(devices, memory);
  // A simulated GPU is whole pages: a size between two (100MB) gets the pages it holds.
  for (salus::SimDeviceConfig& d : sim.devices) {
    const std::size_t whole = d.memory_bytes / d.granularity * d.granularity;
    if (whole == 0) {
      throw CLI::ValidationError(
          "--memory", "'" + given + "' is less than one page of a simulated GPU (" +
                          std::to_string(d.granularity >> 20) + "MiB)");
    }
    d.memory_bytes = whole;
  }
  if (kind == "sim") return salus::make_sim_backend(std::move(sim));
  if (kind == "cuda") return salus::make_cuda_backend();
  return salus::make_default_backend(std::move(sim));
}

// --reserve: a size, or auto. A simulated GPU is the daemon's alone; a real one has the clients'
// own contexts (about 0.5 GiB each), their lazily loaded kernels, and other programs on it: a
// tenth of it, at least 1 GiB (what vLLM leaves by default, gpu_memory_utilization 0.9).
std::size_t reserve_bytes(const std::string& text, const salus::DeviceBackend& backend) {
  if (text != "auto") return parse_size(text, "--reserve");
  if (backend.name() == "sim" || backend.device_count() == 0) return 0;
  return std::max<std::size_t>(salus::GiB, backend.properties(0).total_memory / 10);
}

// What the command line asked for.
struct Args {
  std::string socket_path = salus::remote::default_socket_path();
  std::string backend = "auto";
  int devices = 1;
  std::string memory;  // "": 8GiB for a simulated GPU, all of a real one
  std::string reserve = "auto";
  double idle_release_s = 30;
  double exit_wait_s = 10;
  double fence_wait_s = 10;
  double turn_spin_us = 50;
  std::string process_limit = "0";
  std::string spill = "none";
  std::string reclaim = "ask";
  std::string group;
  std::string trace;
  std::string log_level = "info";
  std::string own_log;
  bool status = false;
  salus::daemon::CoordinatorOptions options;
};

void add_options(CLI::App& app, Args& a) {
  app.add_option("--socket", a.socket_path, "Unix socket to serve ($SALUS_SOCKET or per-user default)");
  app.add_option("--backend", a.backend, "auto (CUDA when a GPU is present), cuda or sim")
      ->check(CLI::IsMember({"auto", "cuda", "sim"}));
  app.add_option("--devices", a.devices, "simulated GPUs (sim backend)")->check(CLI::Range(1, 16));
  app.add_option("--memory", a.memory,
                 "memory of each GPU the daemon hands out, e.g. 8GiB: a simulated GPU's size "
                 "(default 8GiB), or the most of each real GPU (default: what is free at start less "
                 "--reserve)");
  app.add_option("--reserve", a.reserve,
                 "memory of each GPU left to everything else (the clients' CUDA contexts, kernels, "
                 "other programs): the daemon hands out what is free at its start less this; "
                 "auto: a tenth of a real GPU, at least 1GiB, and nothing of a simulated one");
  app.add_option("--idle-release", a.idle_release_s,
                 "seconds a free page waits for a taker before it goes back to the driver "
                 "(0: kept; default 30)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--exit-wait", a.exit_wait_s,
                 "the pages of a process that hung up wait for its exit however long (while it "
                 "lives it may still reach them); for these seconds another process short of "
                 "pages waits for them, and after them the log names the process; default 10")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--fence-wait", a.fence_wait_s,
                 "seconds a page given back behind a process's GPU work waits for that work before "
                 "it goes to another process; a page whose work is not done by then is withheld "
                 "until it is (or that process exits); default 10")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--turn-spin", a.turn_spin_us,
                 "microseconds before and after a turn's end is due that the daemon watches for "
                 "it instead of sleeping (0: never; off where it may use one CPU only); default 50")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--policy", a.options.policy,
                 "iteration policy: fifo, srtf, fair, pack, priority, memory_aware");
  app.add_option("--process-limit", a.process_limit, "GPU bytes one process may hold (0: no limit)");
  app.add_option("--spill", a.spill,
                 "host: a waiting process's pages go to its host memory when another needs them")
      ->check(CLI::IsMember({"none", "host"}));
  app.add_option("--reclaim", a.reclaim,
                 "ask: a process short of pages asks the others for what they cache (default); "
                 "never: each keeps what it got until it exits, as without Salus (a baseline)")
      ->check(CLI::IsMember({"ask", "never"}));
  app.add_option("--group", a.group, "also serve members of this group (socket mode 0660)");
  app.add_option("--trace", a.trace, "write a Perfetto trace of every process's iterations here at exit");
  app.add_option("--log-level", a.log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  app.add_option("--own-log", a.own_log,
                 "the file this daemon's output goes to (salus run's PATH.log): removed when the "
                 "daemon stops cleanly, kept when it fails");
  app.add_flag("--status", a.status, "print the running daemon's processes, jobs and memory, and exit");
}

// salusd --status: asks the running daemon for its table.
int print_status(const std::string& socket_path) {
  try {
    salus::remote::DaemonLink link(socket_path);
    const auto reply = link.call(salus::remote::MessageType::status, std::span<const std::byte>{});
    const auto& body = reply.record.body;
    std::fwrite(body.data(), 1, body.size(), stdout);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "salusd --status: %s\n", e.what());
    return 1;
  }
}

salus::daemon::ServerOptions server_options(const Args& a) {
  salus::daemon::ServerOptions o{a.socket_path, std::nullopt,
                                 std::chrono::microseconds(static_cast<long>(a.turn_spin_us))};
  if (!a.group.empty()) {
    const struct group* g = ::getgrnam(a.group.c_str());
    if (g == nullptr) throw salus::InvalidArgument(fmt::format("--group: no group '{}'", a.group));
    o.group = g->gr_gid;
  }
  return o;
}

// Serves until SIGTERM or SIGINT, which `stop_signals` holds blocked in every thread: one thread
// takes them (sigwait), so that no other thread is interrupted by them.
int serve(Args a, const sigset_t& stop_signals) {
  a.options.process_limit_bytes = parse_size(a.process_limit, "--process-limit");
  a.options.spill = a.spill == "host" ? salus::remote::Spill::host : salus::remote::Spill::none;
  a.options.reclaim = a.reclaim == "ask";
  const std::size_t memory = a.memory.empty() ? 0 : parse_size(a.memory, "--memory");
  if (a.memory.empty() == false && memory == 0) {
    throw salus::InvalidArgument(fmt::format("--memory '{}': a daemon with no memory serves nobody",
                                             a.memory));
  }
  auto backend = make_backend(a.backend, a.devices, memory != 0 ? memory : 8 * salus::GiB,
                              a.memory);
  // On a real GPU --memory caps what the daemon hands out (a simulated one is that size already).
  if (backend->name() != "sim") a.options.device_limit_bytes = memory;
  a.options.reserve_bytes = reserve_bytes(a.reserve, *backend);
  a.options.exit_wait =
      std::chrono::milliseconds(static_cast<std::int64_t>(a.exit_wait_s * 1000.0));
  a.options.fence_wait =
      std::chrono::milliseconds(static_cast<std::int64_t>(a.fence_wait_s * 1000.0));
  a.options.idle_release = std::chrono::milliseconds(
      static_cast<std::int64_t>(a.idle_release_s * 1000.0));
  salus::daemon::Coordinator coordinator(std::move(backend), a.options);
  // The default socket's own folder is made here, and checked to be this user's alone.
  const std::string folder = salus::remote::private_socket_folder();
  if (a.socket_path.rfind(folder + "/", 0) == 0) salus::remote::make_private_folder(folder);
  salus::daemon::Server server(coordinator, server_options(a));
  std::thread signals([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    spdlog::info("signal {}: stopping", sig);
    server.stop();
  });
  spdlog::info("serving '{}': {} backend, {} device(s), policy {}, pid {}", a.socket_path,
               coordinator.runtime().backend().name(), coordinator.runtime().device_count(),
               coordinator.runtime().policy(), ::getpid());
  try {
    server.run();  // returns once the signal thread has called stop()
  } catch (...) {
    ::kill(::getpid(), SIGTERM);  // the signal thread must end before it is destroyed
    signals.join();
    throw;
  }
  signals.join();
  if (!a.trace.empty()) coordinator.runtime().write_trace(a.trace);
  spdlog::info("stopped");
  if (!a.own_log.empty()) ::unlink(a.own_log.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"salusd: the Salus coordinator; processes connected to it share this node's GPUs"};
  Args args;
  add_options(app, args);
  CLI11_PARSE(app, argc, argv);
  if (args.status) return print_status(args.socket_path);
  // The log goes to standard error; standard output is for what was asked (--status).
  spdlog::set_default_logger(spdlog::stderr_color_mt("salusd"));
  spdlog::set_level(spdlog::level::from_str(args.log_level));
  spdlog::set_pattern("[salusd %H:%M:%S.%e] %^%l%$ %v");
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);  // before any thread starts
  signal(SIGPIPE, SIG_IGN);
  try {
    return serve(std::move(args), stop_signals);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
