// salusd's sockets: one listening socket, one reader thread per session connection (a process's
// session of the coordinator). A job's turn connection is attached on its first record and then
// served by the turn loop (turn_loop.hpp). A peer that is not the daemon's user (or group, with
// --group) is refused with a reason before either.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "daemon/coordinator.hpp"
#include "daemon/turn_loop.hpp"
#include "remote/channel.hpp"

namespace salus::daemon {

struct ServerOptions {
  std::string socket_path;
  std::optional<gid_t> group;  // also serve this group's members (the socket is then 0660)
  // How long before and after a turn's end is due the turn loop watches for it (TurnLoop).
  std::chrono::microseconds turn_spin{50};
};

class Server {
 public:
  // Takes `socket_path`.lock (a second daemon on the same socket stops here, with a message that
  // names the first one's pid), then binds the socket. Throws DeviceError naming what failed.
  Server(Coordinator& coordinator, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Accepts connections until stop().
  void run();
  // Ends run() and every connection (their sessions close). Safe from any thread.
  void stop();

 private:
  void serve(std::shared_ptr<remote::Channel> channel);
  // A job's turn connection (its first record was `attach`): answered with its shared memory,
  // then handed to the turn loop.
  void serve_turns(const std::shared_ptr<remote::Channel>& channel,
                   const remote::PeerCredentials& peer, const remote::Record& attach);
  [[nodiscard]] std::optional<std::string> refusal(const remote::PeerCredentials& peer) const;
  // A peer refused (`why`): told at its first record. A first record that broke the protocol
  // (`e`): told, and hung up.
  static void refuse(remote::Channel& channel, const std::string& why);
  static void drop_at_first(remote::Channel& channel, const std::exception& e);

  Coordinator& coordinator_;
  const ServerOptions options_;
  TurnLoop turns_;
  remote::UniqueFd lock_file_;
  remote::UniqueFd listener_;
  remote::UniqueFd wake_;  // an eventfd: stop() writes it, run() polls it

  struct Connection {
    std::shared_ptr<remote::Channel> channel;
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;  // its thread has returned: join it
  };
  void reap_finished();  // with mu_ held

  std::mutex mu_;  // guards the two below
  std::vector<Connection> connections_;
  bool stopping_ = false;
};

}  // namespace salus::daemon
