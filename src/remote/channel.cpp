#include "remote/channel.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <fmt/format.h>
#include <poll.h>

#include <algorithm>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace salus::remote {
namespace {

constexpr std::size_t kMaxFds = 253;  // SCM_MAX_FD

sockaddr_un address_of(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    throw InvalidArgument(fmt::format("socket path '{}' is empty or longer than {} bytes", path,
                                      sizeof(addr.sun_path) - 1));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

UniqueFd seqpacket_socket() {
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) sim::throw_errno("socket", errno, "salusd socket");
  return fd;
}

// Takes ownership of every descriptor in the control messages of `msg`.
std::vector<UniqueFd> take_fds(msghdr& msg) {
  std::vector<UniqueFd> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < n; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd);
    }
  }
  return fds;
}

}  // namespace

void Channel::send(std::span<const std::byte> record, std::span<const int> fds) const {
  if (fds.size() > kMaxFds) {
    throw InvalidArgument(fmt::format("a record may carry {} descriptors, not {}", kMaxFds,
                                      fds.size()));
  }
  iovec iov{const_cast<std::byte*>(record.data()), record.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.resize(CMSG_SPACE(fds.size_bytes()));
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size_bytes());
    std::memcpy(CMSG_DATA(c), fds.data(), fds.size_bytes());
  }
  for (;;) {
    if (::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL) >= 0) return;
    if (errno != EINTR) sim::throw_errno("sendmsg", errno, "salusd connection");
  }
}

bool Channel::try_send(std::span<const std::byte> record) const {
  for (;;) {
    if (::send(fd_.get(), record.data(), record.size(), MSG_NOSIGNAL | MSG_DONTWAIT) >= 0) {
      return true;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    if (errno != EINTR) sim::throw_errno("send", errno, "salusd connection");
  }
}

std::optional<Received> Channel::receive() const { return receive_with(0, nullptr); }

std::optional<Received> Channel::receive_now(bool& closed) const {
  bool would_block = false;
  std::optional<Received> got = receive_with(MSG_DONTWAIT, &would_block);
  closed = !got && !would_block;
  return got;
}

std::optional<Received> Channel::receive_with(int flags, bool* would_block) const {
  // Each reading thread's own buffer: a turn's round trip allocates (and clears) no 32 KiB.
  thread_local std::vector<std::byte> buffer;
  buffer.resize(kMaxRecordBytes);
  std::array<char, CMSG_SPACE(kMaxFds * sizeof(int))> control{};
  iovec iov{buffer.data(), buffer.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t n = -1;
  do {
    n = ::recvmsg(fd_.get(), &msg, MSG_CMSG_CLOEXEC | flags);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && would_block != nullptr && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    *would_block = true;
    return std::nullopt;
  }
  if (n < 0) {
    if (errno == ECONNRESET || errno == EBADF || errno == ENOTCONN) return std::nullopt;
    sim::throw_errno("recvmsg", errno, "salusd connection");
  }
  std::vector<UniqueFd> fds = take_fds(msg);  // owned now: closed on any throw below
  if (n == 0) return std::nullopt;  // records are never empty: the peer is gone
  if ((msg.msg_flags & MSG_TRUNC) != 0) {
    throw ProtocolError(fmt::format("a record longer than {} bytes was cut", kMaxRecordBytes));
  }
  const std::span<const std::byte> record(buffer.data(), static_cast<std::size_t>(n));
  Received out;
  out.record.header = decode_header(record);
  out.record.body.assign(record.begin() + sizeof(Header), record.end());
  out.fds = std::move(fds);
  // The control buffer holds kMaxFds: descriptors lost are ones this process had no room for.
  out.fds_cut = (msg.msg_flags & MSG_CTRUNC) != 0;
  return out;
}

bool Channel::readable(std::chrono::nanoseconds timeout) const {
  pollfd p{fd_.get(), POLLIN, 0};
  const auto ns = std::max<std::int64_t>(timeout.count(), 0);
  const timespec t{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  return ::ppoll(&p, 1, &t, nullptr) > 0;
}

void Channel::shutdown() const noexcept {
  (void)::shutdown(fd_.get(), SHUT_RDWR);
}

PeerCredentials Channel::peer() const {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd_.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    sim::throw_errno("getsockopt(SO_PEERCRED)", errno, "salusd connection");
  }
  return {cred.pid, cred.uid, cred.gid};
}

UniqueFd connect_to(const std::string& path) {
  const sockaddr_un addr = address_of(path);
  UniqueFd fd = seqpacket_socket();
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    const char* hint = err == ENOENT || err == ECONNREFUSED ? "is salusd running?"
                       : err == EACCES                      ? "the socket is not yours"
                                                            : "";
    throw DeviceError("connect", fmt::format("errno {}", err), err,
                      fmt::format("cannot reach salusd at '{}': {} ({})", path,
                                  std::strerror(err), hint));
  }
  // Whoever listens there gets this process's memory and runs its turns: only a daemon of this
  // user, or root's (which serves a group), is trusted. Another user could have put a socket at
  // a path this user's clients use.
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    sim::throw_errno("getsockopt(SO_PEERCRED)", errno, path);
  }
  if (cred.uid != ::getuid() && cred.uid != 0) {
    throw DeviceError("connect", "EPERM", EPERM,
                      fmt::format("the salusd at '{}' runs as uid {} (pid {}), not as this user "
                                  "(uid {}) or root: not trusted",
                                  path, cred.uid, cred.pid, ::getuid()));
  }
  return fd;
}

UniqueFd listen_at(const std::string& path, unsigned mode, std::optional<gid_t> group) {
  // Bound and listening under a name of its own, then renamed into place: whoever sees the path
  // can connect (a socket file that exists before listen() refuses connections, and waiting for
  // the file is how scripts and tests wait for a daemon).
  const std::string staging = fmt::format("{}.{}.tmp", path, ::getpid());
  const sockaddr_un addr = address_of(staging);
  (void)address_of(path);  // the final name must fit too
  UniqueFd fd = seqpacket_socket();
  ::unlink(staging.c_str());  // left by a daemon of this pid that died here
  // Created owner-only (umask), then widened if asked: never briefly open to others.
  const mode_t old = ::umask(0077);
  const int bound = ::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  ::umask(old);
  if (bound != 0) sim::throw_errno("bind", err, staging);
  if (::chmod(staging.c_str(), mode) != 0 ||
      (group && ::chown(staging.c_str(), static_cast<uid_t>(-1), *group) != 0) ||
      ::listen(fd.get(), 64) != 0 || ::rename(staging.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(staging.c_str());
    sim::throw_errno("listen", e, path);
  }
  return fd;
}

std::string default_socket_path() {
  if (const char* env = std::getenv("SALUS_SOCKET"); env != nullptr && *env != '\0') return env;
  if (const char* run = std::getenv("XDG_RUNTIME_DIR"); run != nullptr && *run != '\0') {
    return fmt::format("{}/salusd.sock", run);
  }
  return fmt::format("{}/salusd.sock", private_socket_folder());
}

std::string private_socket_folder() { return fmt::format("/tmp/salus-{}", ::getuid()); }

void make_private_folder(const std::string& folder) {
  if (::mkdir(folder.c_str(), 0700) != 0 && errno != EEXIST) {
    sim::throw_errno("mkdir", errno, folder);
  }
  // Made by another user before this one (it is in /tmp), or a link to elsewhere: refused, for
  // whoever can write there can replace the socket or plant its lock file.
  struct stat st {};
  if (::lstat(folder.c_str(), &st) != 0) sim::throw_errno("lstat", errno, folder);
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::getuid() || (st.st_mode & 0077) != 0) {
    throw InvalidArgument(fmt::format(
        "'{}' must be a folder of uid {} that only it may use (mode 0700): it is {} of uid {} with "
        "mode {:o}; remove it, or choose another --socket",
        folder, ::getuid(), S_ISDIR(st.st_mode) ? "a folder" : "not a folder", st.st_uid,
        st.st_mode & 07777));
  }
}

}  // namespace salus::remote
