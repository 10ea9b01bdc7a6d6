// The GPU side of turns between processes. A process that ends an iteration sends an interprocess
// event recorded on its stream after the iteration's work; the next job granted a turn in the same
// lane of salusd's scheduler gets that event with its turn, and its process makes its stream wait
// for it before its own work. So the next process's kernels never share the GPU with the previous
// one's queued tail, as in-process jobs of one lane never do (they share the lane's stream).
// Lanes that run side by side by design (pack) stay unordered against each other.
//
// Thread-safety: every public method takes mu_, and none calls another.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "daemon/page_bank.hpp"
#include "remote/protocol.hpp"

namespace salus::daemon {

class TurnFences {
 public:
  using Fence = PageBank::Fence;

  // `job` (any key that stays unique while the job lives) took a turn in lane `lane` (the stream
  // salusd's runtime gave it); returns the end of the lane's last iteration to wait for, unless
  // that was `asking`'s own (its stream order has it already) or there is none.
  std::shared_ptr<const Fence> began(const void* job, std::uint64_t lane, SessionId asking);
  // `job`'s iteration ended behind `fence`: the next turn in its lane waits for it. Null keeps
  // the lane's last one (the process said nothing), unless `settled` (its stream had nothing
  // queued: the lane has nothing to wait for).
  void ended(const void* job, std::shared_ptr<const Fence> fence, bool settled);
  // `session`'s process has exited: its work is gone with it, and its jobs' lanes forgotten.
  void forget(SessionId session);

 private:
  std::mutex mu_;
  std::map<std::uint64_t, std::shared_ptr<const Fence>> by_lane_;
  std::map<const void*, std::uint64_t> lane_of_;  // jobs between their turn and its end
};

}  // namespace salus::daemon
