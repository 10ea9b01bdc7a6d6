// salusd's sessions: one per connected process, by id, each with what its records may change
// (its hello, its jobs, its turn connections' hang-ups, its hang-up). What the page waits read
// of a process is the PageLedger's; its turn fences are JobTurns'.
//
// Lock rule: mu_ guards the table and each session's fields that change (session.hpp says which);
// every public method takes it, none calls another, and nothing is called while it is held but a
// job's or a session's own accessors (no lock of theirs).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "daemon/page_ledger.hpp"
#include "remote/protocol.hpp"
#include "salus/runtime.hpp"

namespace salus::daemon {

struct Session;

class SessionTable {
 public:
  // A process may have this many jobs at once: each costs the daemon a record for good.
  static constexpr std::size_t kMaxJobsPerProcess = 256;

  // `s` joins the table under a new id (set in it); returns the id.
  SessionId add(const std::shared_ptr<Session>& s);
  // The session; InvalidArgument when there is none.
  [[nodiscard]] std::shared_ptr<Session> find(SessionId id) const;
  [[nodiscard]] std::vector<SessionId> ids() const;

  // Throws ProtocolError for a record of `type` other than a hello before its hello.
  void check_greeted(const Session& s, remote::MessageType type) const;
  // Its hello, naming it; returns the name. ProtocolError for a second one (or a bad name).
  std::string greet(Session& s, const remote::Hello& hello);

  // Throws InvalidArgument when `s` has kMaxJobsPerProcess jobs already.
  void check_job_room(const Session& s) const;
  void add_job(Session& s, std::uint64_t id, std::shared_ptr<Job> job);
  // Its job `id`; UnknownJob when it has none (another process's job is as unknown to it).
  [[nodiscard]] std::shared_ptr<Job> job_of(const Session& s, std::uint64_t id) const;
  void remove_job(Session& s, std::uint64_t id);

  // A turn connection of `peer` attaching to job `a.job` of session `a.session`: the session
  // and the job, once the session is open, its token is `a.token` and `peer` is its process.
  // Throws InvalidArgument (or UnknownJob) naming what is wrong; `hang_up` runs at its close.
  std::pair<std::shared_ptr<Session>, std::shared_ptr<Job>> attach(
      const remote::PeerCredentials& peer, const remote::AttachTurns& a,
      std::function<void()> hang_up);

  // The session hung up: it is closing (no turn connection attaches now), and its jobs and its
  // turn connections' hang-ups are handed over. Nullopt when there is no such session.
  struct Closing {
    std::shared_ptr<Session> session;
    std::map<std::uint64_t, std::shared_ptr<Job>> jobs;
    std::vector<std::function<void()>> hang_ups;
  };
  std::optional<Closing> close(SessionId id);
  void erase(SessionId id);

  // The status table's sessions (what each holds from `held`, the ledger's) and then its jobs.
  // `asking`: the session that asks, left out when it has no jobs and no pages; with --group
  // its user sees what others hold, not who they are or what they run.
  [[nodiscard]] std::string status(std::optional<SessionId> asking,
                                   const std::map<SessionId, PageLedger::Holding>& held,
                                   std::size_t page_bytes) const;

 private:
  // A job as the status lists it: its process as shown, and whether it is another user's.
  struct ListedJob {
    std::string process;
    std::shared_ptr<Job> job;
    bool other = false;
  };
  [[nodiscard]] static std::string job_rows(const std::vector<ListedJob>& jobs);

  mutable std::mutex mu_;
  std::map<SessionId, std::shared_ptr<Session>> sessions_;
  SessionId next_ = 1;
};

}  // namespace salus::daemon
