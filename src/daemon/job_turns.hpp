// The turns of salusd's jobs, wherever their calls come from (a session's connection, where a
// begin waits on a worker; or the job's own turn connection, served by the turn loop, where a
// begin never waits): the grant, with the end of the lane's last iteration when another process
// ran it (TurnFences) and how long to wait for it; the end, with what its process measured
// (memory, GPU time) for the runtime's decisions; and each process's turn fences, checked once.
// It tells the PageLedger which jobs are inside a turn (their processes may give pages back).
//
// Lock rule: mu_ guards the checked fences only; every public method that reads them takes it,
// none calls another, and nothing is called while it is held. TurnFences and the PageLedger
// have their own locks; the runtime's calls (a begin may block) run with no lock held here.
#pragma once

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
#include "daemon/turn_fences.hpp"
#include "remote/channel.hpp"
#include "remote/protocol.hpp"
#include "salus/runtime.hpp"

namespace salus::daemon {

class JobTurns {
 public:
  // `fence_wait` and `spill`: CoordinatorOptions says what they mean.
  JobTurns(std::shared_ptr<DeviceBackend> backend, PageLedger& pages,
           std::chrono::milliseconds fence_wait, remote::Spill spill);
  JobTurns(const JobTurns&) = delete;
  JobTurns& operator=(const JobTurns&) = delete;

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
  // A turn as it travels: the record and, for the fence it names, its descriptor.
  using Granted = std::pair<remote::Turn, remote::UniqueFd>;

  // Process `session` connected, or has exited (its work gone: its fences are forgotten).
  void open(SessionId session);
  void forget(SessionId session);

  // A begin on the session's connection: waits for the turn (its timeout, when it has one).
  Granted begin(SessionId session, Job& job, const remote::JobCall& call);
  // An end_iteration or withdraw on the session's connection: no fence travels there.
  void end(SessionId session, Job& job, const remote::Record& record);
  // A record of job `job_id`'s turn connection (Coordinator::turn_call says what it answers).
  TurnResult call(SessionId session, Job& job, std::uint64_t job_id, remote::Received& received,
                  const std::function<void()>& between);
  // A waiting begin asked again (Coordinator::retry_turn).
  std::optional<Reply> retry(SessionId session, Job& job, const WaitingTurn& waiting);

 private:
  // What an end_iteration reports of its iteration: what its process measured of its memory, as
  // the policies should plan with it (nothing under --spill host, where a waiting process's
  // memory leaves the device: its jobs then run alone, whatever the policy), and GPU time.
  // Throws ProtocolError when malformed.
  struct EndReport {
    std::optional<MeasuredMemory> memory;
    std::optional<GpuTime> gpu;
  };
  [[nodiscard]] EndReport end_report(const remote::Record& end) const;
  // A begin asked without waiting (call's first ask, retry's later ones).
  std::optional<Reply> try_turn(SessionId session, Job& job, const WaitingTurn& waiting);
  // The turn for `call` once its begin returned `lane` (nullopt: not admitted in time).
  Granted granted(SessionId session, Job& job, const remote::JobCall& call,
                  std::optional<StreamHandle> lane);
  // How long `job`, granted a turn behind `fence`, may wait for it: null when its work has
  // completed (nothing to wait for) or fence_wait has passed since it came (its lane's next
  // holders go on beside it: a fence that never completes stalls nobody for longer).
  [[nodiscard]] std::optional<std::chrono::milliseconds> fence_wait_left(
      const Job& job, const PageBank::Fence& fence) const;
  // The fence an end_iteration carries (its descriptor taken from `received`), or null.
  static std::shared_ptr<PageBank::Fence> end_fence(SessionId session, remote::Received& received);
  // Opens an end_iteration's fence here (check_fence), once per distinct fence of the process;
  // sets its opened event and its time.
  void check_turn_fence(SessionId session, Job& job, PageBank::Fence& fence);
  // An end_iteration (with its report) or a withdraw. `fence`: what the end's process recorded
  // after the iteration (null: none), for the lane's next turn. `between`: see turn_call.
  void give_turn(SessionId session, Job& job, remote::MessageType type, const EndReport& report,
                 std::shared_ptr<const PageBank::Fence> fence, bool settled,
                 const std::function<void()>& between = {});

  const std::shared_ptr<DeviceBackend> backend_;
  PageLedger& pages_;
  const std::chrono::milliseconds fence_wait_;
  const remote::Spill spill_;
  TurnFences fences_;  // has its own lock

  std::mutex mu_;
  // Each open process's turn fences as they opened here, by file identity or handle bytes: its
  // fence pool sends the same few again and again. The daemon asks them whether their work has
  // completed before it hands one on. A process gone (forget) caches none.
  std::map<SessionId, std::map<std::string, std::shared_ptr<const Event>>> checked_;
};

// Throws InvalidArgument unless `fence` opens as an event of `backend` on `device` (a sealed
// event file, a handle of an event): it goes on to another process, which waits for it. `what`:
// the record that carried it. Returns the event as opened here.
std::shared_ptr<const Event> check_fence(const std::shared_ptr<DeviceBackend>& backend, int device,
                                         const PageBank::Fence& fence, std::string_view what);

}  // namespace salus::daemon
