// salusd's turn loop: one thread that serves every job's turn connection (their records in shared
// memory, remote/turn_rings.hpp). A begin never waits on a thread: a job whose turn is not there
// yet stays queued in the daemon's scheduler, which tells the loop when that changes (its
// on_wake); the loop then asks again and sends the turn.
//
// Why one thread: a switch between processes is a giver's end and the next job's turn. The loop
// makes the decision for the end and sends the turn itself, before the ended iteration's
// bookkeeping, so no thread of the daemon is woken on the switch's path; and while a turn's end
// is due (as the job's turns have lately lasted, give or take `spin`) it watches the rings
// instead of sleeping, so the end finds it awake. Otherwise it sleeps in epoll on the
// connections' sockets, where a process that writes to a sleeping loop's ring wakes it.
//
// Lock rule: the loop's state (its connections) is its thread's alone; the inbox, which other
// threads post to (a job woken by a decision made elsewhere, a new connection, stop), has one
// mutex, and nothing is called while it is held.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "daemon/coordinator.hpp"
#include "remote/turn_channel.hpp"

namespace salus::daemon {

class TurnLoop {
 public:
  // Serves `coordinator`'s turn connections (it becomes its turn listener) until stop(). `spin`:
  // how long before and after a turn's end is due the loop watches for it (0: never; it then
  // sleeps whenever nothing waits).
  TurnLoop(Coordinator& coordinator, std::chrono::microseconds spin);
  ~TurnLoop();
  TurnLoop(const TurnLoop&) = delete;
  TurnLoop& operator=(const TurnLoop&) = delete;

  // A turn connection attached (its answer, with the rings' descriptor, already sent): served from
  // now on, until its socket closes (the session's close shuts it down) or it breaks the
  // protocol. Safe from any thread.
  void serve(std::shared_ptr<remote::Channel> socket, Coordinator::TurnLink link,
             remote::TurnRings rings);
  // Ends the loop and every connection it serves. Safe from any thread; idempotent.
  void stop();

  struct Inbox;

 private:
  class Loop;
  std::shared_ptr<Inbox> inbox_;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
};

}  // namespace salus::daemon
