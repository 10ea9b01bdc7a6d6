// Turns: a job's begin_iteration, end_iteration and withdraw, from the session's connection (a
// begin waits on a worker thread) or from the job's own turn connection, which salusd's turn loop
// serves (daemon/turn_loop.hpp): a begin there never waits on a thread; the loop asks again when
// the job's wait changes (RuntimeAccess::on_wake). JobTurns answers them; here they find their
// session and job.
#include <fmt/format.h>

#include "daemon/coordinator.hpp"
#include "daemon/session.hpp"

namespace salus::daemon {

using remote::MessageType;

void Coordinator::on_begin(const std::shared_ptr<Session>& s, const remote::Record& record) {
  const auto call = remote::body_as<remote::JobCall>(record);
  std::shared_ptr<Job> job = sessions_.job_of(*s, call.job);
  const std::uint64_t seq = record.header.seq;
  s->spawn([this, s, job, call, seq] {
    try {
      const auto [turn, fd] = turns_.begin(s->id, *job, call);
      const int fds[1] = {fd.get()};
      reply(*s, MessageType::turn, seq, std::as_bytes(std::span(&turn, 1)),
            std::span(fds, fd.get() >= 0 ? 1 : 0));
    } catch (const std::exception& e) {
      fail(*s, seq, e);
    }
  });
}

Coordinator::TurnLink Coordinator::attach_turns(const remote::PeerCredentials& peer,
                                                const remote::Record& attach,
                                                std::function<void()> hang_up) {
  const auto a = remote::body_as<remote::AttachTurns>(attach);
  auto [s, job] = sessions_.attach(peer, a, std::move(hang_up));
  return TurnLink{std::move(s), std::move(job), a.job};
}

Coordinator::TurnResult Coordinator::turn_call(const TurnLink& link, remote::Received& received,
                                               const std::function<void()>& between) {
  return turns_.call(link.session->id, *link.job, link.job_id, received, between);
}

std::optional<Coordinator::Reply> Coordinator::retry_turn(const TurnLink& link,
                                                          const WaitingTurn& waiting) {
  return turns_.retry(link.session->id, *link.job, waiting);
}

}  // namespace salus::daemon
