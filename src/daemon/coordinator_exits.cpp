// A session's end: its jobs cancelled, and its pages taken back once no process can reach them
// (its process has exited, and no other process maps them).
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>

#include "daemon/coordinator.hpp"
#include "daemon/mappings.hpp"
#include "daemon/session.hpp"

namespace salus::daemon {

void Coordinator::wait_for_exit(const Session& s) const {
  // A page goes to another process only once no process can reach it. One that hung up may live
  // on with its mappings (and, on CUDA, work queued on them), so its pages wait for its exit,
  // however long: never for a fixed time. (A forked child that kept its mappings of a simulated
  // device: wait_until_unmapped.) The daemon's own process is a
  // coordinator in a test, whose clients' mappings are its own: nothing to wait for.
  if (s.peer.pid == ::getpid()) return;
  if (s.pidfd.get() < 0) {
    // No pidfd (the kernel has none, or the process was gone at its first record): ask by pid.
    while (::kill(s.peer.pid, 0) == 0 || errno == EPERM) {
      pollfd stop{stop_.get(), POLLIN, 0};
      if (::poll(&stop, 1, 10) != 0) return;
    }
    return;
  }
  pollfd p[2] = {{s.pidfd.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
  int timeout = static_cast<int>(options_.exit_wait.count());
  for (;;) {
    const int ready = ::poll(p, 2, timeout);
    if (ready > 0) return;  // exited, or the daemon stops
    if (ready < 0 && errno != EINTR) {
      spdlog::error("session {}: waiting for pid {} to exit failed ({}); its pages are reused",
                    s.id, s.peer.pid, std::strerror(errno));
      return;
    }
    if (ready == 0 && timeout >= 0) {
      spdlog::warn("session {}: pid {} hung up holding pages and has not exited after {} ms; "
                   "it may still map them, so they wait for its exit",
                   s.id, s.peer.pid, options_.exit_wait.count());
      timeout = -1;
    }
  }
}

void Coordinator::wait_until_unmapped(const Session& s) const {
  std::vector<ChunkHandle> chunks;
  {
    std::lock_guard lock(mu_);
    for (const auto& bank : banks_) {
      const std::vector<ChunkHandle> held = bank->chunks_held_by(s.id);
      chunks.insert(chunks.end(), held.begin(), held.end());
    }
  }
  std::vector<FileRange> ranges;
  for (const ChunkHandle chunk : chunks) {
    try {
      const SharedChunk shared = backend_->export_chunk(chunk);
      const remote::UniqueFd fd(shared.fd);
      struct stat st {};
      // Only a memory file's pages show in maps (a simulated device's); a CUDA page does not.
      if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      ranges.push_back({static_cast<std::uint64_t>(st.st_dev),
                        static_cast<std::uint64_t>(st.st_ino), shared.offset, shared.bytes});
    } catch (const std::exception& e) {
      spdlog::error("session {}: a page's file is unknown ({}); it is not checked", s.id, e.what());
    }
  }
  bool told = false;
  for (;;) {
    const std::vector<pid_t> mapping = processes_mapping(ranges);
    if (mapping.empty()) return;
    if (!told) {
      spdlog::warn("session {}: pid {} has exited, but pid {}{} still maps pages it held; they "
                   "wait until none does", s.id, s.peer.pid, mapping.front(),
                   mapping.size() > 1 ? fmt::format(" and {} more", mapping.size() - 1) : "");
      told = true;
    }
    // Until one of them exits (or a second has passed: it may unmap and live on).
    std::vector<remote::UniqueFd> pidfds;
    std::vector<pollfd> polled{{stop_.get(), POLLIN, 0}};
    for (const pid_t pid : mapping) {
      pidfds.emplace_back(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
      if (pidfds.back().get() >= 0) polled.push_back({pidfds.back().get(), POLLIN, 0});
    }
    if (::poll(polled.data(), polled.size(), 1000) > 0 && polled.front().revents != 0) return;
  }
}

void Coordinator::close_session(SessionId id) {
  std::shared_ptr<Session> s;
  std::map<std::uint64_t, std::shared_ptr<Job>> jobs;
  std::vector<std::function<void()>> hang_ups;
  {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    s = it->second;
    s->closing = true;
    s->closed_at = std::chrono::steady_clock::now();
    jobs.swap(s->jobs);
    hang_ups.swap(s->hang_ups);
  }
  pages_back_.notify_all();
  for (const auto& hang_up : hang_ups) hang_up();
  // Its waiting turns end with the cancel; its running iteration ends with it.
  for (auto& [job_id, job] : jobs) {
    try {
      job->cancel();
    } catch (const std::exception&) {
    }
  }
  s->join_workers();
  jobs.clear();
  std::size_t held = 0;
  {
    std::lock_guard lock(mu_);
    for (const auto& bank : banks_) held += bank->held_by(id);
  }
  if (held > 0) {
    wait_for_exit(*s);
    wait_until_unmapped(*s);
  }
  {
    std::lock_guard lock(mu_);
    for (std::size_t d = 0; d < banks_.size(); ++d) {
      const std::size_t taken = banks_[d]->take_back_all(id);
      // Its exit (waited for above when it held pages) ended the work its fences stand for.
      banks_[d]->forget_fences_of(id);
      if (taken > 0) {
        trace_pages(fmt::format("taken back <- {} {} (gone)", s->name, s->peer.pid),
                    static_cast<int>(d),
                    trace_->micros(std::chrono::steady_clock::now()), taken);
      }
    }
    sessions_.erase(id);
  }
  turn_fences_.forget(id);  // its turns' fences too (after mu_: a leaf lock of its own)
  pages_back_.notify_all();
  spdlog::info("session {}: '{}' pid {} gone; {} pages taken back", id, s->name, s->peer.pid,
               held);
}

}  // namespace salus::daemon
