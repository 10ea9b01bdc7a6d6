// connect_runtime (salus/remote.hpp): a runtime of this process whose turns and GPU pages come from salusd.
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "iteration_sched/runtime_access.hpp"
#include "memory/safe_points.hpp"
#include "remote/channel.hpp"
#include "remote/daemon_link.hpp"
#include "remote/device_identity.hpp"
#include "remote/remote_backend.hpp"
#include "remote/remote_turns.hpp"
#include "salus/cuda.hpp"
#include "salus/remote.hpp"
#include "salus/runtime.hpp"
#include "salus/sim.hpp"

namespace salus {
namespace {

// This process's own backend, of the daemon's kind: its GPU memory will be the daemon's pages.
std::shared_ptr<DeviceBackend> local_backend(const remote::Welcome& welcome) {
  if (welcome.device_count == 0 || welcome.device_count > remote::kMaxDevices) {
    throw DeviceError("salusd", "SALUSD_PROTOCOL", 0,
                      fmt::format("salusd reports {} devices", welcome.device_count));
  }
  if (welcome.backend == remote::BackendKind::cuda) return make_cuda_backend();
  SimConfig config = SimConfig::uniform(static_cast<int>(welcome.device_count));
  for (std::size_t d = 0; d < config.devices.size(); ++d) {
    config.devices[d].memory_bytes = welcome.device_bytes[d];
    config.devices[d].granularity = welcome.page_bytes;
  }
  return make_sim_backend(std::move(config));
}

// Another process is short of pages on `want.device`: this one gives back what it holds and
// does not use (cached and spare pages); with spilling on, and while that is not enough, the
// pages of its jobs that wait for a turn go to its host memory first (they come home when the
// job's turn comes, in its begin_iteration).
void give_back(Runtime& runtime, remote::RemoteBackend& backend, const remote::PageCount& want,
               bool spill) {
  if (want.device < 0 || want.device >= runtime.device_count()) return;
  (void)runtime.memory().trim(want.device);
  std::size_t given = backend.give_back(want.device);
  if (!spill || given >= want.count) return;
  if (memory::demote_quiescent(runtime.memory(), want.device, want.count - given) == 0) return;
  (void)runtime.memory().trim(want.device);
  (void)backend.give_back(want.device);
}

// Reclaims running now, in any runtime of the process. The last owner of a runtime may let go on
// the reclaim's thread, which then tears the runtime down there, waiting for pages it gave back
// behind queued work; an exit meanwhile would end that thread first, and the next process would
// wait for work whose process is gone. So exit waits for running reclaims (at most 5 s).
std::atomic<int> g_reclaims_running{0};

void wait_for_reclaims_at_exit() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (g_reclaims_running.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

std::shared_ptr<Runtime> connect_runtime(const std::string& socket_path) {
  static const bool registered = [] { return std::atexit(wait_for_reclaims_at_exit) == 0; }();
  (void)registered;
  auto link = std::make_shared<remote::DaemonLink>(
      socket_path.empty() ? remote::default_socket_path() : socket_path);
  const remote::Welcome& welcome = link->welcome();
  std::shared_ptr<DeviceBackend> local = local_backend(welcome);
  remote::check_same_devices(welcome, *local);
  auto backend = std::make_shared<remote::RemoteBackend>(std::move(local), link);
  RuntimeOptions options;
  // The daemon decides between processes; this process's own scheduler orders its own jobs
  // within the turns it is given, by the same policy.
  options.policy = remote::name_of(welcome.policy, "welcome policy");
  // What the daemon hands out of each device is this process's ceiling too (a simulated device
  // is that size already; a real one may be larger than the daemon's --memory).
  for (std::uint32_t d = 0; d < welcome.device_count; ++d) {
    options.memory.device_limits.push_back(welcome.device_bytes[d]);
  }
  const bool spill = welcome.spill == remote::Spill::host;
  if (spill) options.memory.harvest.spill = SpillPolicy::host_only;
  const std::chrono::microseconds spin = options.turn_spin;
  auto runtime = RuntimeAccess::make(
      backend, std::move(options),
      {.gate = std::make_shared<remote::RemoteTurns>(link, backend, &backend->fences(), spin)});
  // Weak references: the link's handler thread must not keep the runtime alive.
  link->on_reclaim([weak_runtime = std::weak_ptr<Runtime>(runtime),
                    weak_backend = std::weak_ptr<remote::RemoteBackend>(backend),
                    spill](const remote::PageCount& want) {
    g_reclaims_running.fetch_add(1);
    struct Done {
      ~Done() { g_reclaims_running.fetch_sub(1); }
    } done;
    auto runtime_now = weak_runtime.lock();
    auto backend_now = weak_backend.lock();
    if (runtime_now && backend_now) give_back(*runtime_now, *backend_now, want, spill);
  });
  return runtime;
}

}  // namespace salus
