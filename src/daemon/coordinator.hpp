// What salusd decides, apart from its sockets: the sessions (one per connected process), their
// jobs (jobs of the daemon's own runtime, so one policy and decision core orders every process's
// iterations), the page banks, the limits. The server feeds it records; the fuzz target does too.
//
// Lock story: mu_ guards sessions and banks. Nothing that blocks (a job's turn, a reclaim wait, a
// send) runs under it: handlers look up under the lock, then call the runtime or send after
// releasing it. A request that may block runs on a worker thread of its session, or on the thread
// of the job's own turn connection (attach_turns), which has nothing else to read meanwhile.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "daemon/page_bank.hpp"
#include "daemon/scrubber.hpp"
#include "daemon/turn_fences.hpp"
#include "iteration_sched/trace.hpp"
#include "remote/channel.hpp"
#include "remote/protocol.hpp"
#include "salus/runtime.hpp"

namespace salus::daemon {

struct CoordinatorOptions {
  std::string policy = "fair";
  std::size_t process_limit_bytes = 0;  // pages one process may hold; 0: no limit
  // The most of each device the daemon hands out (a GPU it shares with programs that are not its
  // clients); 0: all of it.
  std::size_t device_limit_bytes = 0;
  // What each device keeps for everything that is not a page of the daemon: its clients' own CUDA
  // contexts (about 0.5 GiB each), lazily loaded kernels, libraries' buffers outside the
  // allocator, other programs. A device's capacity is its free memory when the daemon starts less
  // this, and at most device_limit_bytes.
  std::size_t reserve_bytes = 0;
  // A free page nobody took for this long goes back to the driver; zero: never.
  std::chrono::milliseconds idle_release{30000};
  // Whether a waiting process moves its jobs' pages to its host memory when another needs them.
  remote::Spill spill = remote::Spill::none;
  // How long a short request waits once no other process can give pages back (grant_or_wait):
  // none is inside a turn, none is leaving.
  std::chrono::milliseconds reclaim_wait{2000};
  // The most a short request waits, whatever the others do (a process stopped inside its turn).
  std::chrono::milliseconds short_wait_limit{60000};
  // Whether a short request asks the other processes for pages they cache. Off, a process keeps
  // what it was given until it gives it back itself or exits, as processes sharing a GPU without
  // Salus keep what their caching allocators reserved: the baseline the benchmarks compare with.
  bool reclaim = true;
  // A process that hung up holding pages may live on and still map them: its pages wait for its
  // exit, however long. For this long after it hung up, a short request counts them as coming
  // back (it waits); after it, the log says whose exit they wait for, and short requests go on
  // without them.
  std::chrono::milliseconds exit_wait{10000};
  // How long after a page came back behind a process's work (a fence) the daemon waits for that
  // work before it hands the page to another process; a page whose work has not completed by
  // then is withheld until it does, or its process exits. An iteration's end bounds the same
  // way the wait of the lane's next turns for its work (remote::Turn::fence_wait_ms).
  std::chrono::milliseconds fence_wait{10000};
};

struct DeviceUse {
  std::size_t granted_bytes = 0;
  std::size_t peak_granted_bytes = 0;
  std::size_t capacity_bytes = 0;
  std::size_t made_bytes = 0;  // of the driver's memory now: granted, free or fenced
  std::size_t released_idle_bytes = 0;  // given back to the driver as idle, since the start
  std::size_t withheld_bytes = 0;  // behind another process's work that did not complete in time
};

class Coordinator {
  struct Session;

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
  // A reply as it travels: the record and its descriptors (a simulated turn fence's).
  struct Reply {
    std::vector<std::byte> record;
    std::vector<remote::UniqueFd> fds;
  };
  // A begin whose turn was not there yet: its call, and when it stops waiting (its timeout).
  struct WaitingTurn {
    std::uint64_t seq = 0;
    remote::JobCall call;
    std::optional<std::chrono::steady_clock::time_point> deadline;
  };
  // What a turn call comes to: its reply, or the begin that waits for its turn.
  struct TurnResult {
    std::optional<Reply> reply;
    std::optional<WaitingTurn> waiting;
  };
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
  [[nodiscard]] std::uint64_t zeroed_pages() const { return scrubber_.scrubbed(); }
  [[nodiscard]] Runtime& runtime() { return *runtime_; }

 private:
  [[nodiscard]] std::size_t device_capacity(int device, std::size_t free_at_start) const;
  std::shared_ptr<Session> session(SessionId id) const;
  void reply(Session& s, remote::MessageType type, std::uint64_t seq,
             std::span<const std::byte> body, std::span<const int> fds = {});
  void fail(Session& s, std::uint64_t seq, const std::exception& e);
  void dispatch(const std::shared_ptr<Session>& s, const remote::Record& record);
  void on_hello(Session& s, const remote::Record& record);
  void on_add_job(Session& s, const remote::Record& record);
  void on_begin(const std::shared_ptr<Session>& s, const remote::Record& record);
  // The turn calls, wherever they come from: the session's connection (begin on a worker) or the
  // job's turn connection.
  // Returns the turn and, for the fence it names, the descriptor to send with it.
  std::pair<remote::Turn, remote::UniqueFd> take_turn(Session& s, Job& job,
                                                      const remote::JobCall& call);
  // The turn for `call` once its begin returned `lane` (nullopt: not admitted in time).
  std::pair<remote::Turn, remote::UniqueFd> granted(Session& s, Job& job,
                                                    const remote::JobCall& call,
                                                    std::optional<StreamHandle> lane);
  // What an end_iteration says its job's process measured, as the policies should plan with it:
  // nothing under --spill host, where a waiting process's memory leaves the device (its jobs
  // then run alone, one at a time, whatever the policy). Throws ProtocolError when malformed.
  [[nodiscard]] std::optional<MeasuredMemory> planned_memory(const remote::Record& end) const;
  // An end_iteration (with what the job's process measured of its memory) or a withdraw.
  // `fence`: what the end's process recorded after the iteration (null: none), for the lane's
  // next turn.
  // What an end_iteration reports of its iteration: memory (planned_memory) and GPU time.
  struct EndReport {
    std::optional<MeasuredMemory> memory;
    std::optional<GpuTime> gpu;
  };
  [[nodiscard]] EndReport end_report(const remote::Record& end) const;
  // `between`: see turn_call.
  void give_turn(Session& s, Job& job, remote::MessageType type, const EndReport& report,
                 std::shared_ptr<const PageBank::Fence> fence, bool settled,
                 const std::function<void()>& between = {});
  // The fence an end_iteration carries (its descriptor taken from `received`), or null.
  static std::shared_ptr<PageBank::Fence> end_fence(const Session& s, remote::Received& received);
  void on_job_call(Session& s, const remote::Record& record);
  void on_take_pages(const std::shared_ptr<Session>& s, const remote::Record& record);
  // A give-back may carry one descriptor: a simulated fence's.
  void on_give_pages(Session& s, remote::Received& received);
  std::shared_ptr<Job> job_of(Session& s, std::uint64_t id) const;
  std::vector<std::uint64_t> grant_or_wait(Session& s, int device, std::size_t count);
  // Zeroes the pages of `ids` (just granted to `s`) whose last holder was another user, each
  // behind its last fence; their fence is then the zeroing's. On failure the grant goes back.
  void scrub_for(Session& s, int device, const std::vector<std::uint64_t>& ids);
  // Of `ids` (just granted to `s`), the pages given back behind another process's work wait for
  // it, each at most until its give-back's time plus fence_wait: those whose work completed go
  // on settled, the others are withheld (out of the grant). Returns the pages that go on.
  std::vector<std::uint64_t> settle_fences(Session& s, int device, std::vector<std::uint64_t> ids);
  // Withheld pages whose work has completed become free (the server's tick).
  void release_completed_withheld();
  // With mu_ held, for a short request of `s` on `device`: whether another process holding pages
  // there may still give some back (it is inside a turn and not short itself, it is leaving, or
  // it gave way lately and its exit is awaited); and whether `s` is the one to give way when none
  // may (of the processes short there, the one holding the most pages; the newest of equals).
  [[nodiscard]] bool others_may_give_back(const Session& s, int device,
                                          std::chrono::steady_clock::time_point now) const;
  [[nodiscard]] bool gives_way(const Session& s, int device) const;
  // Why a short request of `s` on `device` failed (takes mu_).
  [[nodiscard]] std::string short_reason(const Session& s, int device) const;
  // What `s` may hold (with mu_ held): the process limit, or the sum of its jobs' limits when
  // every job has one and that is less; 0: no limit. room_of: pages it may still take.
  [[nodiscard]] std::size_t held_bytes(const Session& s) const;
  [[nodiscard]] std::size_t limit_bytes(const Session& s) const;
  [[nodiscard]] std::size_t room_of(const Session& s) const;
  [[nodiscard]] std::string limit_reason(const Session& s) const;
  void ask_others_to_give_back(SessionId asking, int device, std::size_t pages);
  // Returns once the session's process has exited (or stop() was called); see exit_wait.
  void wait_for_exit(const Session& s) const;
  // Returns once no other process maps a page the session holds (a forked child of its process
  // may: see daemon/mappings.hpp), or stop() was called.
  void wait_until_unmapped(const Session& s) const;
  // Throws InvalidArgument unless `fence` opens as an event of this backend on `device` (a
  // sealed event file, a handle of an event): it goes on to another process, which waits for it.
  // Returns the event as opened here.
  std::shared_ptr<const Event> check_fence(int device, const PageBank::Fence& fence,
                                           std::string_view what) const;
  // check_fence for an end_iteration's fence, once per distinct fence of the process; sets its
  // opened event and its time.
  void check_turn_fence(Session& s, Job& job, PageBank::Fence& fence);
  // How long `job`, granted a turn behind `fence`, may wait for it: null when its work has
  // completed (nothing to wait for) or fence_wait has passed since it came (its lane's next
  // holders go on beside it: a fence that never completes stalls nobody for longer).
  [[nodiscard]] std::optional<std::chrono::milliseconds> fence_wait_left(
      const Job& job, const PageBank::Fence& fence) const;
  // The timeline of every process's pages (salusd --trace): a move per grant and per give-back,
  // and each device's pages per process as a counter. With mu_ held.
  void trace_pages(const std::string& what, int device, double begin_us, std::size_t pages);

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

  // Each device's free memory when the daemon started (what its capacity was made from).
  std::vector<std::size_t> free_at_start_;

  mutable std::mutex mu_;
  std::condition_variable pages_back_;
  std::vector<std::unique_ptr<PageBank>> banks_;
  Scrubber scrubber_;  // has its own lock; goes before the banks (it maps their pages)
  std::map<SessionId, std::shared_ptr<Session>> sessions_;
  SessionId next_session_ = 1;
  TurnFences turn_fences_;  // has its own lock
  remote::UniqueFd stop_;   // an eventfd: stop() writes it, wait_for_exit polls it
};

}  // namespace salus::daemon
