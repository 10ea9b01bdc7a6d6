// Unix sockets for salusd and its clients: SOCK_SEQPACKET, so a record arrives whole or not at
// all and its descriptors (SCM_RIGHTS) arrive with it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cuda/os_handles.hpp"
#include "remote/protocol.hpp"

namespace salus::remote {

using sim::UniqueFd;

struct Received {
  Record record;
  std::vector<UniqueFd> fds;
  // The record came whole but not all its descriptors did: this process had no room for them
  // (RLIMIT_NOFILE). What the record says of descriptors it does not have, it cannot use.
  bool fds_cut = false;
};

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// One connected socket. send() may be called from several threads at once (a record is sent in
// one sendmsg, which the kernel keeps whole); receive() from one thread at a time.
class Channel {
 public:
  explicit Channel(UniqueFd fd) : fd_(std::move(fd)) {}

  // Sends one record with `fds` attached (the kernel duplicates them; the caller still owns them).
  // Throws DeviceError naming the errno when the peer is gone or the socket fails.
  void send(std::span<const std::byte> record, std::span<const int> fds = {}) const;
  // send() without waiting: false, and nothing sent, when the peer's queue is full (a peer that
  // reads nothing: stopped, or stuck). For records that are hints, never worth a wait.
  [[nodiscard]] bool try_send(std::span<const std::byte> record) const;
  // The next record, or nullopt when the peer closed the connection. A malformed record (too
  // long, cut, bad header) throws ProtocolError; its descriptors are closed. A whole record
  // whose descriptors did not all fit in this process comes with fds_cut.
  std::optional<Received> receive() const;
  // receive() without waiting: nullopt when no record waits, and then `closed` says whether the
  // peer closed the connection.
  std::optional<Received> receive_now(bool& closed) const;
  // True when a record (or the peer's close) is waiting to be received: receive() would not
  // block. Waits at most `timeout` for one.
  [[nodiscard]] bool readable(std::chrono::nanoseconds timeout = {}) const;
  // Ends both directions: a receive() blocked on another thread returns nullopt.
  void shutdown() const noexcept;
  [[nodiscard]] PeerCredentials peer() const;
  [[nodiscard]] int fd() const noexcept { return fd_.get(); }

 private:
  // recvmsg with `flags`; nullopt when the peer is gone, or (MSG_DONTWAIT) when nothing waits:
  // `would_block` then says which.
  std::optional<Received> receive_with(int flags, bool* would_block) const;

  UniqueFd fd_;
};

// A client's socket connected to `path`. Throws DeviceError naming the path and the reason.
UniqueFd connect_to(const std::string& path);
// A listening socket at `path` with permissions `mode` (and `group`'s, when given), which appears
// there only once it accepts connections; a socket already at `path` is replaced.
UniqueFd listen_at(const std::string& path, unsigned mode, std::optional<gid_t> group = std::nullopt);

// The per-user default socket: $SALUS_SOCKET, else $XDG_RUNTIME_DIR/salusd.sock, else
// salusd.sock in private_socket_folder().
std::string default_socket_path();
// /tmp/salus-<uid>: the default socket's folder where there is no $XDG_RUNTIME_DIR.
std::string private_socket_folder();
// Makes `folder` (mode 0700) unless it exists, and checks that it is a folder of this user that
// nobody else may use (not a link); throws InvalidArgument naming what it is instead.
void make_private_folder(const std::string& folder);

}  // namespace salus::remote
