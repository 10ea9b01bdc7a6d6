#include "daemon/exit_watch.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "daemon/mappings.hpp"

namespace salus::daemon {

namespace {

// The pages of `chunks` that show in a process's maps: a memory file's (a simulated device's);
// a CUDA page does not.
std::vector<FileRange> ranges_of(DeviceBackend& backend, SessionId id,
                                 const std::vector<ChunkHandle>& chunks) {
  std::vector<FileRange> ranges;
  for (const ChunkHandle chunk : chunks) {
    try {
      const SharedChunk shared = backend.export_chunk(chunk);
      const remote::UniqueFd fd(shared.fd);
      struct stat st {};
      if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      ranges.push_back({static_cast<std::uint64_t>(st.st_dev),
                        static_cast<std::uint64_t>(st.st_ino), shared.offset, shared.bytes});
    } catch (const std::exception& e) {
      spdlog::error("session {}: a page's file is unknown ({}); it is not checked", id, e.what());
    }
  }
  return ranges;
}

}  // namespace

ExitWatch::ExitWatch(std::shared_ptr<DeviceBackend> backend, std::chrono::milliseconds exit_wait)
    : backend_(std::move(backend)), exit_wait_(exit_wait) {
  stop_ = remote::UniqueFd(::eventfd(0, EFD_CLOEXEC));
  if (stop_.get() < 0) sim::throw_errno("eventfd", errno, "salusd");
}

void ExitWatch::stop() {
  const std::uint64_t one = 1;
  (void)!::write(stop_.get(), &one, sizeof(one));
}

void ExitWatch::wait_for_exit(SessionId id, pid_t pid, const remote::UniqueFd& pidfd) const {
  // A page goes to another process only once no process can reach it: never after a fixed time.
  if (pid == ::getpid()) return;
  if (pidfd.get() < 0) {
    // No pidfd (the kernel has none, or the process was gone at its first record): ask by pid.
    while (::kill(pid, 0) == 0 || errno == EPERM) {
      pollfd stop{stop_.get(), POLLIN, 0};
      if (::poll(&stop, 1, 10) != 0) return;
    }
    return;
  }
  pollfd p[2] = {{pidfd.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
  int timeout = static_cast<int>(exit_wait_.count());
  for (;;) {
    const int ready = ::poll(p, 2, timeout);
    if (ready > 0) return;  // exited, or the daemon stops
    if (ready < 0 && errno != EINTR) {
      spdlog::error("session {}: waiting for pid {} to exit failed ({}); its pages are reused", id,
                    pid, std::strerror(errno));
      return;
    }
    if (ready == 0 && timeout >= 0) {
      spdlog::warn(
          "session {}: pid {} hung up holding pages and has not exited after {} ms; "
          "it may still map them, so they wait for its exit",
          id, pid, exit_wait_.count());
      timeout = -1;
    }
  }
}

void ExitWatch::wait_until_unmapped(SessionId id, pid_t pid,
                                    const std::vector<ChunkHandle>& chunks) const {
  const std::vector<FileRange> ranges = ranges_of(*backend_, id, chunks);
  bool told = false;
  for (;;) {
    const std::vector<pid_t> mapping = processes_mapping(ranges);
    if (mapping.empty()) return;
    if (!told) {
      spdlog::warn(
          "session {}: pid {} has exited, but pid {}{} still maps pages it held; they "
          "wait until none does",
          id, pid, mapping.front(),
          mapping.size() > 1 ? fmt::format(" and {} more", mapping.size() - 1) : "");
      told = true;
    }
    // Until one of them exits (or a second has passed: it may unmap and live on).
    std::vector<remote::UniqueFd> pidfds;
    std::vector<pollfd> polled{{stop_.get(), POLLIN, 0}};
    for (const pid_t other : mapping) {
      pidfds.emplace_back(static_cast<int>(::syscall(SYS_pidfd_open, other, 0)));
      if (pidfds.back().get() >= 0) polled.push_back({pidfds.back().get(), POLLIN, 0});
    }
    if (::poll(polled.data(), polled.size(), 1000) > 0 && polled.front().revents != 0) return;
  }
}

}  // namespace salus::daemon
