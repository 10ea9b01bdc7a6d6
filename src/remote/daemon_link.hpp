// A client's connection to salusd: requests and their replies matched by sequence number, so that
// several threads may wait on the daemon at once (a job waiting for its turn does not hold up
// another job's pages). One reader thread receives every record; a request the daemon sends
// unasked (reclaim) goes to a handler on a thread of its own, which may itself call the daemon.
//
// When the daemon goes away (its socket closes), every waiting call and every later one throws
// DeviceError "salusd is gone": a bounded wait, never a hang.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>

#include "remote/channel.hpp"
#include "remote/protocol.hpp"

namespace salus::remote {

// What every call to a daemon that went away throws: DeviceError SALUSD_GONE.
DeviceError salusd_gone(const std::string& socket_path, const std::string& why);

class DaemonLink {
 public:
  // Connects and says hello; throws DeviceError when the daemon cannot be reached or refuses.
  explicit DaemonLink(const std::string& socket_path);
  ~DaemonLink();
  DaemonLink(const DaemonLink&) = delete;
  DaemonLink& operator=(const DaemonLink&) = delete;

  // Sends a request and waits for its reply. A Failure reply is thrown as the typed error it
  // names; the daemon's absence as DeviceError.
  Received call(MessageType type, std::span<const std::byte> body,
                std::span<const int> fds = {});
  template <class T>
    requires std::is_trivially_copyable_v<T>
  Received call(MessageType type, const T& body) {
    return call(type, std::as_bytes(std::span(&body, 1)));
  }
  // A request whose reply nobody waits for (give_pages from a destructor). `fds` ride along
  // (SCM_RIGHTS); they stay the caller's.
  void post(MessageType type, std::span<const std::byte> body, std::span<const int> fds = {});

  // Runs for each reclaim the daemon sends, on the link's own handler thread.
  void on_reclaim(std::function<void(const PageCount&)> handler);

  [[nodiscard]] const Welcome& welcome() const { return welcome_; }
  [[nodiscard]] const std::string& socket_path() const { return path_; }
  [[nodiscard]] bool alive() const;

 private:
  struct Pending {
    std::optional<Received> reply;
  };
  void stop() noexcept;  // ends the connection and joins the threads
  void read_loop();
  void fail_all(const std::string& why);
  void queue_reclaim(const PageCount& want);  // with mu_ held (reclaims_->mu is a leaf)
  [[noreturn]] void throw_gone() const;  // with mu_ held or not: reads gone_why_ under mu_

  const std::string path_;
  Channel channel_;
  Welcome welcome_{};

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::uint64_t next_seq_ = 1;
  std::map<std::uint64_t, Pending> pending_;
  bool gone_ = false;
  std::string gone_why_;
  bool stopping_ = false;

  // The reclaim handler's queue. Shared with its thread, which may outlive the link: the handler
  // may drop the last owner of the runtime, and so of this link, on that thread (which then
  // detaches itself instead of being joined, and touches nothing but this).
  struct Reclaims {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<PageCount> queue;
    std::function<void(const PageCount&)> handler;
    bool stopping = false;
  };
  static void handle_reclaims(const std::shared_ptr<Reclaims>& reclaims);
  const std::shared_ptr<Reclaims> reclaims_ = std::make_shared<Reclaims>();

  std::thread reader_;
  std::thread handler_;
};

}  // namespace salus::remote
