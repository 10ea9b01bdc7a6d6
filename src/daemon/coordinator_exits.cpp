// A session's end: its jobs cancelled, and its pages taken back once no process can reach them
// (its process has exited, and no other process maps them: ExitWatch).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "daemon/coordinator.hpp"
#include "daemon/session.hpp"

namespace salus::daemon {

void Coordinator::close_session(SessionId id) {
  std::optional<SessionTable::Closing> closing = sessions_.close(id);
  if (!closing) return;
  const std::shared_ptr<Session> s = closing->session;
  pages_.hung_up(id);  // its page asks end; the others count its pages as coming back
  for (const auto& hang_up : closing->hang_ups) hang_up();
  // Its waiting turns end with the cancel; its running iteration ends with it.
  for (auto& [job_id, job] : closing->jobs) {
    try {
      job->cancel();
    } catch (const std::exception&) {
    }
  }
  s->join_workers();
  closing->jobs.clear();
  const std::size_t held = pages_.held_pages(id);
  if (held > 0) {
    exits_.wait_for_exit(id, s->peer.pid, s->pidfd);
    exits_.wait_until_unmapped(id, s->peer.pid, pages_.chunks_held_by(id));
  }
  // Its exit (waited for above when it held pages) ended the work its fences stand for.
  pages_.take_back_all(id);
  sessions_.erase(id);
  turns_.forget(id);  // its turns' fences too
  spdlog::info("session {}: '{}' pid {} gone; {} pages taken back", id, s->name, s->peer.pid,
               held);
}

}  // namespace salus::daemon
