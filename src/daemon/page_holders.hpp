// The processes that may hold salusd's pages, as its page waits read them: each one's limit (the
// process limit, or its jobs' limits), its jobs inside a turn, its asks waiting, whether it gave
// way lately or hung up; and the rules a short ask reads of them: who may still give pages back,
// and who gives way when none may.
//
// Lock rule: none of its own. PageLedger calls it under the ledger's lock, as it calls the page
// banks; it calls nothing but a bank's counts (and the log).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "daemon/options.hpp"
#include "daemon/page_bank.hpp"
#include "iteration_sched/trace.hpp"

namespace salus::daemon {

class PageHolders {
 public:
  using Clock = std::chrono::steady_clock;
  // Delivers a reclaim to a process if its queue has room, without waiting (Coordinator::Hinter).
  using Hinter = std::function<bool(std::span<const std::byte>)>;

  struct Holder {
    pid_t pid = 0;
    uid_t uid = 0;
    std::string name;
    Hinter hint;  // reclaims: a process that reads nothing must not hold up the one that asks
    std::uint64_t hints_dropped = 0;  // reclaims its full queue refused
    // Each job's byte limit (0: none). While every job has one, the process may hold no more
    // pages than their sum: the daemon's bound on what its jobs take, whatever it counts itself.
    std::map<std::uint64_t, std::size_t> job_limits;
    // Its jobs holding a turn now (their keys), its asks waiting now, and when an ask of its was
    // refused as the one that gives way (cleared at a grant).
    std::set<const void*> in_turn;
    int asking = 0;
    std::optional<Clock::time_point> gave_way;
    bool closing = false;
    std::optional<Clock::time_point> closed_at;  // when it hung up
  };

  // `process_limit_bytes`: what one process may hold (0: no limit); `exit_wait`: how long a
  // process that hung up or gave way counts as giving its pages back soon.
  PageHolders(std::size_t page_bytes, std::size_t process_limit_bytes,
              std::chrono::milliseconds exit_wait);

  Holder& add(SessionId id);
  // The process's record; null (find) or InvalidArgument (at) when there is none. A record stays
  // put (its address too) until erase.
  Holder* find(SessionId id);
  Holder& at(SessionId id);
  void erase(SessionId id);
  [[nodiscard]] const std::map<SessionId, Holder>& all() const { return holders_; }

  // What `h` may hold: the process limit, or the sum of its jobs' limits when every job has one
  // and that is less; 0: no limit. room: pages it may still take, holding `held_pages`.
  [[nodiscard]] std::size_t limit_bytes(const Holder& h) const;
  [[nodiscard]] std::size_t room(const Holder& h, std::size_t held_pages) const;
  [[nodiscard]] std::string limit_reason(const Holder& h, std::size_t held_pages) const;
  // For a short ask of `id` on `bank`'s device: whether another process holding pages there may
  // still give some back (it is inside a turn and not short itself, it is leaving, or it gave way
  // lately and its exit is awaited); and whether `id` is the one to give way when none may (of
  // the processes short there, the one holding the most pages; the newest of equals).
  [[nodiscard]] bool others_may_give_back(SessionId id, const PageBank& bank,
                                          Clock::time_point now) const;
  [[nodiscard]] bool gives_way(SessionId id, const PageBank& bank) const;
  // Why a short ask of `id` on `device` (its bank: `bank`) failed; `options`: whether the daemon
  // asks others to give pages back, and how long it waited.
  [[nodiscard]] std::string short_reason(SessionId id, int device, const PageBank& bank,
                                         const CoordinatorOptions& options) const;
  // The others holding pages of `bank`'s device, and how to ask each to give some back.
  [[nodiscard]] std::vector<std::pair<SessionId, Hinter>> others_holding(
      SessionId id, const PageBank& bank) const;
  // Each process's pages of `bank` (device `device`) at `at_us`, as the trace counts them.
  [[nodiscard]] TraceRecorder::Counter counter(int device, const PageBank& bank,
                                               double at_us) const;
  // `id`'s queue refused a reclaim: said once.
  void hint_dropped(SessionId id);

 private:
  const std::size_t page_bytes_;
  const std::size_t process_limit_bytes_;
  const std::chrono::milliseconds exit_wait_;
  std::map<SessionId, Holder> holders_;
};

}  // namespace salus::daemon
