#include "daemon/server.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace salus::daemon {
namespace {

// Holds PATH.lock for the daemon's life: the kernel drops the lock when the process dies, so a
// crashed daemon's socket does not block the next one.
remote::UniqueFd take_lock(const std::string& socket_path) {
  const std::string path = socket_path + ".lock";
  // Never through a link: one planted there would have the daemon truncate and write its target.
  remote::UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (fd.get() < 0) {
    const int err = errno;
    if (err == ELOOP) {
      throw DeviceError("open", "ELOOP", err,
                        fmt::format("'{}' is a symbolic link: salusd will not write through it "
                                    "(remove it, or choose another --socket)", path));
    }
    sim::throw_errno("open", err, path);
  }
  // Another user's file (made in a folder others may write): not this daemon's to write.
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) sim::throw_errno("fstat", errno, path);
  if (st.st_uid != ::getuid() || !S_ISREG(st.st_mode)) {
    throw DeviceError("open", "EPERM", EPERM,
                      fmt::format("'{}' is not a file of uid {} (it is uid {}'s): salusd will not "
                                  "write it (remove it, or choose another --socket)",
                                  path, ::getuid(), st.st_uid));
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    char buf[32] = {};
    const ssize_t n = ::pread(fd.get(), buf, sizeof(buf) - 1, 0);
    throw DeviceError("flock", "EWOULDBLOCK", EWOULDBLOCK,
                      fmt::format("another salusd (pid {}) already serves '{}'",
                                  n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "?",
                                  socket_path));
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd.get(), 0) != 0 ||
      ::pwrite(fd.get(), pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    sim::throw_errno("write", errno, path);
  }
  return fd;
}

}  // namespace

Server::Server(Coordinator& coordinator, ServerOptions options)
    : coordinator_(coordinator), options_(std::move(options)),
      turns_(coordinator_, options_.turn_spin) {
  lock_file_ = take_lock(options_.socket_path);
  listener_ = remote::listen_at(options_.socket_path, options_.group ? 0660 : 0600, options_.group);
  wake_ = remote::UniqueFd(::eventfd(0, EFD_CLOEXEC));
  if (wake_.get() < 0) sim::throw_errno("eventfd", errno, "salusd");
}

Server::~Server() {
  stop();
  std::vector<Connection> connections;
  {
    std::lock_guard lock(mu_);
    connections.swap(connections_);
  }
  for (Connection& c : connections) c.thread.join();
  ::unlink(options_.socket_path.c_str());
  // Still holding its lock: a daemon starting now makes a lock file of its own.
  ::unlink((options_.socket_path + ".lock").c_str());
}

void Server::stop() {
  coordinator_.stop();  // a connection waiting for its process's exit ends too
  std::vector<std::shared_ptr<remote::Channel>> channels;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (const Connection& c : connections_) channels.push_back(c.channel);
  }
  const std::uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  for (const auto& c : channels) c->shutdown();
  turns_.stop();
}

void Server::run() {
  // Between connections the loop also wakes once a second for the coordinator's idle pages.
  constexpr std::chrono::milliseconds kTick{1000};
  auto next_tick = std::chrono::steady_clock::now() + kTick;
  for (;;) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    const int ready = ::poll(fds, 2, static_cast<int>(kTick.count()));
    if (ready < 0) {
      if (errno == EINTR) continue;
      sim::throw_errno("poll", errno, "salusd");
    }
    if (fds[1].revents != 0) return;
    if (const auto now = std::chrono::steady_clock::now(); now >= next_tick) {
      next_tick = now + kTick;
      coordinator_.release_idle_pages();
    }
    if (fds[0].revents == 0) continue;
    remote::UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (fd.get() < 0) continue;  // the peer gave up meanwhile
    auto channel = std::make_shared<remote::Channel>(std::move(fd));
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::lock_guard lock(mu_);
    if (stopping_) return;
    reap_finished();
    connections_.push_back({channel, std::thread([this, channel, done] {
                              serve(channel);
                              done->store(true);
                            }),
                            done});
  }
}

void Server::reap_finished() {
  // A long-lived daemon sees many connections come and go (a trial a process): their threads
  // are joined here, not kept until shutdown.
  std::erase_if(connections_, [](Connection& c) {
    if (!c.done->load()) return false;
    c.thread.join();
    return true;
  });
}

std::optional<std::string> Server::refusal(const remote::PeerCredentials& peer) const {
  if (peer.uid == ::getuid()) return std::nullopt;
  if (options_.group && peer.gid == *options_.group) return std::nullopt;
  return fmt::format("uid {} (pid {}) may not use this salusd: it serves uid {}{}", peer.uid,
                     peer.pid, ::getuid(),
                     options_.group ? fmt::format(" and gid {}", *options_.group) : "");
}

void Server::refuse(remote::Channel& channel, const std::string& why) {
  spdlog::warn("refused a connection: {}", why);
  try {
    // The answer goes to its hello, so that the client reports the reason.
    if (auto first = channel.receive()) {
      const remote::Failure f = remote::failure_of(Errc::invalid_argument, why);
      channel.send(remote::encode(remote::MessageType::failure, first->record.header.seq, f));
    }
  } catch (const std::exception&) {
  }
}

void Server::drop_at_first(remote::Channel& channel, const std::exception& e) {
  // Said and hung up at once (another protocol version, most often): a client that waited for
  // an answer would otherwise wait until the connection is reaped.
  spdlog::warn("a connection was dropped at its first record: {}", e.what());
  try {
    channel.send(remote::encode(
        remote::MessageType::failure, 0,
        remote::failure_of(Errc::invalid_argument,
                           fmt::format("salusd refused the connection: {}", e.what()))));
  } catch (const std::exception&) {
  }
  channel.shutdown();
}

void Server::serve(std::shared_ptr<remote::Channel> channel) {
  remote::PeerCredentials peer;
  try {
    peer = channel->peer();
  } catch (const std::exception& e) {
    spdlog::warn("a connection without credentials was dropped: {}", e.what());
    return;
  }
  if (auto why = refusal(peer)) return refuse(*channel, *why);
  std::optional<remote::Received> first;
  try {
    first = channel->receive();
    if (first && first->record.type() == remote::MessageType::attach_turns) {
      return serve_turns(channel, peer, first->record);
    }
  } catch (const std::exception& e) {
    return drop_at_first(*channel, e);
  }
  if (!first) return;
  const SessionId id = coordinator_.open_session(
      peer,
      [channel](std::span<const std::byte> record, std::span<const int> fds) {
        channel->send(record, fds);
      },
      [channel](std::span<const std::byte> record) { return channel->try_send(record); });
  try {
    for (auto received = std::move(first); received; received = channel->receive()) {
      coordinator_.handle(id, std::move(*received));
    }
  } catch (const std::exception& e) {
    spdlog::warn("session {}: dropped: {}", id, e.what());
  }
  channel->shutdown();
  coordinator_.close_session(id);
}

void Server::serve_turns(const std::shared_ptr<remote::Channel>& channel,
                         const remote::PeerCredentials& peer, const remote::Record& attach) {
  Coordinator::TurnLink link;
  try {
    link = coordinator_.attach_turns(peer, attach, [weak = std::weak_ptr(channel)] {
      if (auto c = weak.lock()) c->shutdown();
    });
  } catch (const std::exception& e) {
    spdlog::warn("refused a turn connection of pid {}: {}", peer.pid, e.what());
    const auto* error = dynamic_cast<const Error*>(&e);
    try {
      channel->send(remote::encode(
          remote::MessageType::failure, attach.header.seq,
          remote::failure_of(error != nullptr ? error->code() : Errc::invalid_argument, e.what())));
    } catch (const std::exception&) {
    }
    return;
  }
  try {
    remote::TurnRings rings = remote::TurnRings::make();
    const int fds[1] = {rings.fd()};
    channel->send(remote::encode_body(remote::MessageType::done, attach.header.seq, {}), fds);
    turns_.serve(channel, std::move(link), std::move(rings));
  } catch (const std::exception& e) {
    spdlog::warn("turn connection of job {} could not begin: {}", link.job_id, e.what());
    channel->shutdown();
  }
}

}  // namespace salus::daemon
