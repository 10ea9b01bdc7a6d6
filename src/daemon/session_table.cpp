#include "daemon/session_table.hpp"

#include <fmt/format.h>

#include "daemon/session.hpp"

namespace salus::daemon {

namespace {
// How another user's process and jobs show in the status table.
constexpr std::string_view kAnotherUser = "(another user)";
}  // namespace

SessionId SessionTable::add(const std::shared_ptr<Session>& s) {
  std::lock_guard lock(mu_);
  s->id = next_++;
  sessions_.emplace(s->id, s);
  return s->id;
}

std::shared_ptr<Session> SessionTable::find(SessionId id) const {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) throw InvalidArgument(fmt::format("no session {}", id));
  return it->second;
}

std::vector<SessionId> SessionTable::ids() const {
  std::lock_guard lock(mu_);
  std::vector<SessionId> ids;
  for (const auto& [id, s] : sessions_) ids.push_back(id);
  return ids;
}

void SessionTable::check_greeted(const Session& s, remote::MessageType type) const {
  std::lock_guard lock(mu_);
  if (!s.greeted && type != remote::MessageType::hello) {
    throw remote::ProtocolError(fmt::format("{} before hello", to_string(type)));
  }
}

std::string SessionTable::greet(Session& s, const remote::Hello& hello) {
  std::lock_guard lock(mu_);
  if (s.greeted) throw remote::ProtocolError("a second hello");
  s.greeted = true;
  s.name = remote::name_of(hello.name, "hello name");
  return s.name;
}

void SessionTable::check_job_room(const Session& s) const {
  std::lock_guard lock(mu_);
  if (s.jobs.size() >= kMaxJobsPerProcess) {
    throw InvalidArgument(
        fmt::format("add_job: a process may have {} jobs at once", kMaxJobsPerProcess));
  }
}

void SessionTable::add_job(Session& s, std::uint64_t id, std::shared_ptr<Job> job) {
  std::lock_guard lock(mu_);
  s.jobs.emplace(id, std::move(job));
}

std::shared_ptr<Job> SessionTable::job_of(const Session& s, std::uint64_t id) const {
  std::lock_guard lock(mu_);
  auto it = s.jobs.find(id);
  if (it == s.jobs.end()) throw UnknownJob(JobId{static_cast<std::uint32_t>(id)});
  return it->second;
}

void SessionTable::remove_job(Session& s, std::uint64_t id) {
  std::lock_guard lock(mu_);
  s.jobs.erase(id);
}

std::pair<std::shared_ptr<Session>, std::shared_ptr<Job>> SessionTable::attach(
    const remote::PeerCredentials& peer, const remote::AttachTurns& a,
    std::function<void()> hang_up) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(a.session);
  // One answer for every wrong session: which sessions exist is none of the asker's business.
  if (it == sessions_.end() || it->second->token != a.token || it->second->closing) {
    throw InvalidArgument(
        fmt::format("attach_turns: no open session {} with that token", a.session));
  }
  const std::shared_ptr<Session>& s = it->second;
  if (peer.pid != s->peer.pid || peer.uid != s->peer.uid) {
    throw InvalidArgument(fmt::format("attach_turns: session {} is pid {}'s, not pid {}'s", s->id,
                                      s->peer.pid, peer.pid));
  }
  auto job = s->jobs.find(a.job);
  if (job == s->jobs.end()) throw UnknownJob(JobId{static_cast<std::uint32_t>(a.job)});
  // Under the lock, as close reads them: a hang-up added is run at the close, or refused here.
  s->hang_ups.push_back(std::move(hang_up));
  return {s, job->second};
}

std::optional<SessionTable::Closing> SessionTable::close(SessionId id) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return std::nullopt;
  Closing out{it->second, {}, {}};
  out.session->closing = true;
  out.jobs.swap(out.session->jobs);
  out.hang_ups.swap(out.session->hang_ups);
  return out;
}

void SessionTable::erase(SessionId id) {
  std::lock_guard lock(mu_);
  sessions_.erase(id);
}

std::string SessionTable::status(std::optional<SessionId> asking,
                                 const std::map<SessionId, PageLedger::Holding>& held,
                                 std::size_t page_bytes) const {
  const auto holding = [&](SessionId id) {
    const auto it = held.find(id);
    return it == held.end() ? PageLedger::Holding{} : it->second;
  };
  std::string out = fmt::format("\n{:<8} {:>8} {:<20} {:>5} {:>12} {:>12}\n", "session", "pid",
                                "process", "jobs", "held MiB", "limit MiB");
  std::vector<ListedJob> jobs;  // their state from the runtime, after the lock
  {
    std::lock_guard lock(mu_);
    std::optional<uid_t> viewer;  // root sees all
    if (asking) {
      if (const auto it = sessions_.find(*asking); it != sessions_.end())
        viewer = it->second->peer.uid;
    }
    const auto hidden = [&](const Session& s) {
      return viewer && *viewer != 0 && s.peer.uid != *viewer;
    };
    for (const auto& [id, s] : sessions_) {
      const PageLedger::Holding h = holding(id);
      if (id == asking && s->jobs.empty() && h.pages == 0) continue;
      const bool other = hidden(*s);
      out += fmt::format(
          "{:<8} {:>8} {:<20} {:>5} {:>12.1f} {:>12}\n", id,
          other ? std::string("-") : std::to_string(s->peer.pid),
          other ? std::string(kAnotherUser) : s->name.substr(0, 20), s->jobs.size(),
          h.pages * page_bytes / 1048576.0,
          h.limit_bytes == 0 ? std::string("-") : fmt::format("{:.1f}", h.limit_bytes / 1048576.0));
      for (const auto& [job_id, job] : s->jobs) {
        jobs.push_back({other ? std::string(kAnotherUser) : s->name, job, other});
      }
    }
    for (const auto& [id, s] : sessions_) {
      const PageLedger::Holding h = holding(id);
      if (!h.closed_at || h.pages == 0) continue;
      out += fmt::format(
          "session {} (pid {}) hung up {:.1f} s ago: its {} pages wait until no "
          "process can reach them\n",
          id, hidden(*s) ? std::string("-") : std::to_string(s->peer.pid),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - *h.closed_at).count(),
          h.pages);
    }
  }
  return out + job_rows(jobs);
}

std::string SessionTable::job_rows(const std::vector<ListedJob>& jobs) {
  std::string out = fmt::format("\n{:<20} {:<20} {:<9} {:>6} {:>10} {:>10}\n", "job", "process",
                                "state", "turns", "held s", "waited s");
  for (const auto& [process, job, other] : jobs) {
    try {
      const JobStats st = job->stats();
      out += fmt::format("{:<20} {:<20} {:<9} {:>6} {:>10.2f} {:>10.2f}\n",
                         other ? std::string(kAnotherUser) : st.name.substr(0, 20),
                         process.substr(0, 20), to_string(st.state), st.iterations,
                         st.attained_seconds, st.waiting_seconds);
    } catch (const Error&) {
      // Gone since the list was made.
    }
  }
  return out;
}

}  // namespace salus::daemon
