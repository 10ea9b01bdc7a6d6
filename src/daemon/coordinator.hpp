// What salusd decides, apart from its sockets: the sessions (one per connected process) and their
// jobs (jobs of the daemon's own runtime, so one policy and decision core orders every process's
// iterations). It composes the parts that own the rest and routes records to them: the pages,
// their limits and reclaims (PageLedger), the waits for a hung-up process's exit (ExitWatch), the
// jobs' turns and their GPU order between processes (JobTurns). The server feeds it records; the
// fuzz target does too.
//
// Lock story: the coordinator has no lock of its own. Each part owns its state and its lock: the
// sessions table (SessionTable: each session's hello, jobs, hang-ups), the pages (PageLedger:
// banks, limits, and what its waits read of each process: its jobs' limits, its jobs inside a
// turn, its hang-up), the turns (JobTurns: turn fences). Every part's public method takes its
// lock, none calls another part while holding it, and no part calls up: no two of these locks
// are ever held at once (under the ledger's only leaves run: the banks' driver calls, the
// trace). A step that touches two parts (a job added: its limit in the ledger, then its entry
// in the table; a hang-up: the table, then the ledger) is not atomic across them, and need not
// be: each part decides from its own state only (every page decision reads the ledger's), and
// the status table reads the parts one after the other. Nothing that blocks (a job's turn, a
// reclaim wait, a send) runs under any lock: handlers look up, then call the runtime or send. A
// request that may block runs on a worker thread of its session, or on the thread of the job's
// own turn connection (attach_turns), which has nothing else to read meanwhile.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "daemon/exit_watch.hpp"
#include "daemon/job_turns.hpp"
#include "daemon/options.hpp"
#include "daemon/page_bank.hpp"
#include "daemon/page_ledger.hpp"
#include "daemon/session_table.hpp"
#include "iteration_sched/trace.hpp"
#include "remote/channel.hpp"
#include "remote/protocol.hpp"
#include "salus/runtime.hpp"

namespace salus::daemon {

struct Session;

class Coordinator {
 public:
  // Delivers a record (and descriptors) to a session's process; may throw when it is gone.
  using Sender = std::function<void(std::span<const std::byte>, std::span<const int>)>;
  // Delivers a hint (a reclaim) if the process's queue has room, without waiting: false when it
  // has none (the process reads nothing: stopped or stuck; the hints it has not read stand).
  using Hinter = std::function<bool(std::span<const std::byte>)>;

  Coordinator(std::shared_ptr<DeviceBackend> backend, CoordinatorOptions options);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // `hint`: null sends hints with `send` (tests whose sender never blocks).
  SessionId open_session(const remote::PeerCredentials& peer, Sender send, Hinter hint = nullptr);
  // Handles one record of the session, replying through its sender (a blocking request replies
  // from a worker thread later). Throws ProtocolError for a record that breaks the protocol: the
  // caller then drops the client. Every other refusal is a Failure reply.
  void handle(SessionId session, remote::Received received);
  // The connection is gone: cancels its jobs, waits for its workers and (when it held pages) for
  // the process to exit, however long (or until stop()), then takes its pages back. Hangs up the
  // session's turn connections.
  void close_session(SessionId session);
  // The daemon is stopping: every wait for a process's exit ends (the pages go with the daemon).
  void stop();

  // A job's turn connection, joined to its process's session by AttachTurns (the connection's
  // first record). Its calls are answered by salusd's turn loop (daemon/turn_loop.hpp), which
  // never waits on a thread for a turn: a begin whose turn is not there yet comes back as a
  // WaitingTurn, asked again (retry_turn) when the job's wait changes (set_turn_listener).
  struct TurnLink {
    std::shared_ptr<Session> session;
    std::shared_ptr<Job> job;
    std::uint64_t job_id = 0;
  };
  // Checks the attach: the session exists and is open, the token is its, the peer is its process
  // and the job is its job. Throws Error naming what is wrong (the caller replies and hangs up);
  // `hang_up` ends the connection when the session closes.
  TurnLink attach_turns(const remote::PeerCredentials& peer, const remote::Record& attach,
                        std::function<void()> hang_up);
  // A reply as it travels; a begin whose turn was not there yet; what a turn call comes to
  // (JobTurns says more).
  using Reply = JobTurns::Reply;
  using WaitingTurn = JobTurns::WaitingTurn;
  using TurnResult = JobTurns::TurnResult;
  // Answers one record of a turn connection: begin_iteration, end_iteration (which may carry a
  // descriptor: a simulated fence's) or withdraw of its job. An end calls `between` once the
  // lane's next job is in and before the ended iteration's bookkeeping (RuntimeAccess::
  // end_iteration): where the loop sends the next job its turn. Throws ProtocolError for a
  // record a turn connection may not carry; every refusal is a Failure reply.
  TurnResult turn_call(const TurnLink& link, remote::Received& received,
                       const std::function<void()>& between = {});
  // A waiting begin asked again: the reply once the turn is granted, the job is refused (a
  // cancel), or the deadline has passed (not admitted; the job keeps its place); nullopt while it
  // still waits.
  std::optional<Reply> retry_turn(const TurnLink& link, const WaitingTurn& waiting);
  // Called with a job whenever its wait for a turn may have changed (RuntimeAccess::on_wake), on
  // the thread that decided and possibly under its scheduler's lock: it only takes note. Set
  // once, before any session opens.
  void set_turn_listener(std::function<void(const Job*)> listener) {
    turn_listener_ = std::move(listener);
  }

  // Releases to the driver the free pages idle for CoordinatorOptions::idle_release (the server
  // calls it about once a second). Returns how many went.
  std::size_t release_idle_pages();

  // `asking`: the session that asks, left out of the table when it is only a query (no jobs, no
  // pages: `salusd --status`, `salus status`).
  [[nodiscard]] std::string status_table(std::optional<SessionId> asking = std::nullopt) const;
  // "" when every bank is consistent, else what is wrong (tests, fuzz).
  [[nodiscard]] std::string inconsistency() const;
  [[nodiscard]] DeviceUse device_use(int device) const;
  // Pages zeroed so far because they went to another user (Scrubber).
  [[nodiscard]] std::uint64_t zeroed_pages() const { return pages_.zeroed_pages(); }
  [[nodiscard]] Runtime& runtime() { return *runtime_; }

 private:
  [[nodiscard]] std::size_t device_capacity(int device, std::size_t free_at_start) const;
  [[nodiscard]] std::vector<PageLedger::Device> devices() const;
  void reply(Session& s, remote::MessageType type, std::uint64_t seq,
             std::span<const std::byte> body, std::span<const int> fds = {});
  void fail(Session& s, std::uint64_t seq, const std::exception& e);
  void dispatch(const std::shared_ptr<Session>& s, const remote::Record& record);
  void on_hello(Session& s, const remote::Record& record);
  void on_add_job(Session& s, const remote::Record& record);
  void on_begin(const std::shared_ptr<Session>& s, const remote::Record& record);
  void on_job_call(Session& s, const remote::Record& record);
  void on_take_pages(const std::shared_ptr<Session>& s, const remote::Record& record);
  // A give-back may carry one descriptor: a simulated fence's.
  void on_give_pages(Session& s, remote::Received& received);
  const std::shared_ptr<DeviceBackend> backend_;
  const CoordinatorOptions options_;
  // Set before any session and read unlocked; declared before the runtime, whose jobs call it
  // until they are gone.
  std::function<void(const Job*)> turn_listener_;
  // Each process measures its own jobs' memory (it carves their blocks) and reports it at every
  // iteration's end: the policies plan with that (pack's lanes, memory_aware's offsets).
  const std::shared_ptr<Runtime> runtime_;
  const std::size_t page_bytes_;
  const std::shared_ptr<TraceRecorder> trace_;

  PageLedger pages_;  // has its own lock
  ExitWatch exits_;   // needs none
  JobTurns turns_;    // has its own lock; tells pages_ which jobs are inside a turn

  SessionTable sessions_;  // has its own lock
};

}  // namespace salus::daemon
