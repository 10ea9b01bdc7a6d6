// The contract suites' third backend: a process connected to salusd. The daemon (its Coordinator
// and Server, as salusd's main makes them) runs on a thread of the test over a simulated GPU of
// its own; the backend under test is a RemoteBackend over this process's own simulated GPU, which
// imports the daemon's pages as they are granted. Every contract then holds across the socket:
// pages come in batches, go back in batches or behind a fence, and are imported as a client
// imports them.
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "contract/backend_fixture.hpp"
#include "daemon/coordinator.hpp"
#include "daemon/server.hpp"
#include "remote/daemon_link.hpp"
#include "remote/remote_backend.hpp"

namespace salus::testing::contract {
namespace {

// salusd in this process: a coordinator and its server on a private socket, served by a thread.
class InProcessDaemon {
 public:
  InProcessDaemon(int devices, std::size_t bytes)
      : folder_(make_folder()),
        coordinator_(make_sim(SimConfig::uniform(devices, bytes)), options()),
        server_(coordinator_, {.socket_path = folder_ + "/salusd.sock", .group = std::nullopt}),
        serving_([this] { server_.run(); }) {}
  ~InProcessDaemon() {
    server_.stop();
    serving_.join();
    std::filesystem::remove_all(folder_);
  }
  InProcessDaemon(const InProcessDaemon&) = delete;
  InProcessDaemon& operator=(const InProcessDaemon&) = delete;

  [[nodiscard]] std::string socket() const { return folder_ + "/salusd.sock"; }

 private:
  static std::string make_folder() {
    char tmpl[] = "/tmp/salus-contract-XXXXXX";
    const char* made = ::mkdtemp(tmpl);
    if (made == nullptr) throw std::runtime_error("mkdtemp failed for the in-process salusd");
    return made;
  }
  static daemon::CoordinatorOptions options() {
    daemon::CoordinatorOptions o;
    // A short request fails at once when nobody can give pages back (a contract's out of
    // memory), and a page nobody took stays made (what a test holds is what it asked for).
    o.reclaim_wait = std::chrono::milliseconds(0);
    o.idle_release = std::chrono::milliseconds(0);
    return o;
  }

  std::string folder_;
  daemon::Coordinator coordinator_;
  daemon::Server server_;
  std::thread serving_;
};

// This process's own simulated GPU, as connect_runtime makes it from the daemon's welcome.
std::shared_ptr<sim::SimBackend> local_sim(const remote::Welcome& welcome) {
  SimConfig config = SimConfig::uniform(static_cast<int>(welcome.device_count));
  for (std::size_t d = 0; d < config.devices.size(); ++d) {
    config.devices[d].memory_bytes = welcome.device_bytes[d];
    config.devices[d].granularity = welcome.page_bytes;
  }
  return make_sim(std::move(config));
}

std::shared_ptr<remote::RemoteBackend> connect(const std::string& socket,
                                               std::shared_ptr<sim::SimBackend>* local) {
  auto link = std::make_shared<remote::DaemonLink>(socket);
  *local = local_sim(link->welcome());
  return std::make_shared<remote::RemoteBackend>(*local, std::move(link));
}

class RemoteHarness final : public SimMemoryHarness {
 public:
  RemoteHarness(std::unique_ptr<InProcessDaemon> daemon, std::shared_ptr<sim::SimBackend> local,
                std::shared_ptr<remote::RemoteBackend> remote)
      : SimMemoryHarness(std::move(local)),
        daemon_(std::move(daemon)),
        remote_(std::move(remote)) {}
  ~RemoteHarness() override {
    remote_.reset();  // its session closes, its pages go back, before the daemon stops
  }

  [[nodiscard]] std::shared_ptr<DeviceBackend> backend() const override { return remote_; }
  // Another process's connection to the same daemon, with a simulated GPU of its own.
  [[nodiscard]] std::shared_ptr<DeviceBackend> peer_backend() const override {
    std::shared_ptr<sim::SimBackend> local;
    return connect(daemon_->socket(), &local);
  }
  // The daemon's pages this process uses (not those cached in its batches), and its own host
  // memory.
  [[nodiscard]] std::size_t chunk_bytes(Location where) const override {
    if (where.is_host()) return sim_->chunk_bytes(where);
    return remote_->pages_in_use(where.index) * remote_->granularity(where);
  }
  [[nodiscard]] bool one_page_chunks() const override { return true; }

 private:
  std::unique_ptr<InProcessDaemon> daemon_;
  std::shared_ptr<remote::RemoteBackend> remote_;
};

}  // namespace

std::unique_ptr<BackendHarness> make_remote_harness(int devices, std::size_t bytes) {
  auto daemon = std::make_unique<InProcessDaemon>(devices, bytes);
  std::shared_ptr<sim::SimBackend> local;
  auto remote = connect(daemon->socket(), &local);
  return std::make_unique<RemoteHarness>(std::move(daemon), std::move(local), std::move(remote));
}

}  // namespace salus::testing::contract
