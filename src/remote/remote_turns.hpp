// A connected runtime's turn gate: each job is also a job of salusd, whose policy decides when
// its iterations run relative to the jobs of other processes.
//
// Each job's turns go on a connection of their own (attach_turns), on which the job's thread
// sends its call and reads the answer itself: a switch wakes the waiting thread straight from the
// socket, with no reader thread between (the session's link has one, for its many callers). The
// session's link keeps the rest: adding the job, cancelling it (which reaches a thread waiting on
// the turn connection through the daemon), finishing it.
#pragma once

#include <memory>
#include <mutex>
#include <unordered_map>

#include "iteration_sched/turn_gate.hpp"
#include "remote/daemon_link.hpp"

namespace salus::remote {

// One job's turn connection: a call at a time (its lock is held from send to answer).
class TurnConnection {
 public:
  // Connects and attaches to `link`'s session as `daemon_job`; throws what the daemon refused.
  TurnConnection(const DaemonLink& link, std::uint64_t daemon_job);
  // Sends `type` for the job and waits for the answer: a Failure is thrown as its typed error,
  // the daemon's absence as DeviceError SALUSD_GONE.
  Received call(MessageType type, const JobCall& body);
  Received call(MessageType type, const EndIteration& body);

 private:
  Received exchange(std::span<const std::byte> record, std::string_view what, std::uint64_t seq);

  const std::string path_;
  std::mutex mu_;  // one call at a time
  Channel channel_;
  std::uint64_t next_seq_ = 1;
};

class RemoteTurns final : public TurnGate {
 public:
  explicit RemoteTurns(std::shared_ptr<DaemonLink> link) : link_(std::move(link)) {}

  void add(JobId job, const JobSpec& spec) override;
  bool acquire(JobId job, std::optional<std::chrono::steady_clock::time_point> deadline) override;
  void release(JobId job, const MeasuredMemory* measured) override;
  void withdraw(JobId job) override;
  void finish(JobId job, bool cancelled) noexcept override;

 private:
  struct Entry {
    std::uint64_t daemon_job = 0;
    std::shared_ptr<TurnConnection> turns;
    bool holding = false;  // the daemon granted a turn that has not gone back
  };
  // The job's entry (a copy: the connection stays while a call uses it); UnknownJob when it has
  // none.
  Entry entry(JobId job) const;
  void set_holding(JobId job, bool holding);

  const std::shared_ptr<DaemonLink> link_;
  mutable std::mutex mu_;  // guards jobs_; never held across a call to the daemon
  std::unordered_map<JobId, Entry> jobs_;
};

}  // namespace salus::remote
