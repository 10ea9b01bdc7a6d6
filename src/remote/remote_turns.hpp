// A connected runtime's turn gate: each job is also a job of salusd, whose policy decides when
// its iterations run relative to the jobs of other processes.
#pragma once

#include <memory>
#include <mutex>
#include <unordered_map>

#include "iteration_sched/turn_gate.hpp"
#include "remote/daemon_link.hpp"

namespace salus::remote {

class RemoteTurns final : public TurnGate {
 public:
  explicit RemoteTurns(std::shared_ptr<DaemonLink> link) : link_(std::move(link)) {}

  void add(JobId job, const JobSpec& spec) override;
  bool acquire(JobId job, std::optional<std::chrono::steady_clock::time_point> deadline) override;
  void release(JobId job) override;
  void withdraw(JobId job) override;
  void finish(JobId job, bool cancelled) noexcept override;

 private:
  struct Entry {
    std::uint64_t daemon_job = 0;
    bool holding = false;  // the daemon granted a turn that has not gone back
  };
  // The daemon's id of `job`, and whether it holds a turn; UnknownJob when it has none.
  Entry entry(JobId job) const;
  void set_holding(JobId job, bool holding);

  const std::shared_ptr<DaemonLink> link_;
  mutable std::mutex mu_;  // guards jobs_; never held across a call to the daemon
  std::unordered_map<JobId, Entry> jobs_;
};

}  // namespace salus::remote
