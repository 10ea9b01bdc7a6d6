// salusd's pages and who holds them: the page banks (one a device), each process's claim on them
// (PageHolders), the waits of a short ask for pages others give back (reclaims), pages given
// back behind work (settled, withheld), zeroing for another user, idle pages and the page trace.
// The coordinator routes page records here and tells it what its waits read of a process (its
// jobs, its turns, its hang-up); nothing here knows a socket or a job.
//
// Lock rule: mu_ guards the banks and the holders; every public method takes it and none calls
// another. Nothing that blocks runs under it (the waits for work, the zeroing, the reclaim
// hints, releasing idle pages), and nothing here calls up. device_count and capacity_bytes read
// what is fixed at construction, unlocked.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "daemon/options.hpp"
#include "daemon/page_bank.hpp"
#include "daemon/page_holders.hpp"
#include "daemon/scrubber.hpp"
#include "iteration_sched/trace.hpp"

namespace salus::daemon {

class PageLedger {
 public:
  // Each device as the daemon found it: its free memory at the start, and what it hands out.
  struct Device {
    std::size_t free_at_start = 0;
    std::size_t capacity_bytes = 0;
  };
  using Hinter = PageHolders::Hinter;  // Coordinator::Hinter

  PageLedger(std::shared_ptr<DeviceBackend> backend, std::shared_ptr<TraceRecorder> trace,
             std::size_t page_bytes, const std::vector<Device>& devices,
             const CoordinatorOptions& options);
  PageLedger(const PageLedger&) = delete;
  PageLedger& operator=(const PageLedger&) = delete;

  [[nodiscard]] int device_count() const { return static_cast<int>(banks_.size()); }
  [[nodiscard]] std::size_t capacity_bytes(int device) const {
    return banks_[static_cast<std::size_t>(device)]->capacity_pages() * page_bytes_;
  }

  // A process connected (`pid`, `uid`); `hint` asks it to give pages back.
  void open(SessionId id, pid_t pid, uid_t uid, Hinter hint);
  // Its name (its hello), as the trace and the logs show it.
  void name(SessionId id, std::string name);
  // Its job `job` came with a byte limit (0: none), or left. `key`: the job as its turns name it.
  void job_added(SessionId id, std::uint64_t job, std::size_t limit);
  void job_left(SessionId id, std::uint64_t job, const void* key);
  // A job of the process began (it may give pages back at the end) or ended a turn. A process
  // already gone (its pages taken back) is no matter: nothing changes.
  void turn_began(SessionId id, const void* key);
  void turn_ended(SessionId id, const void* key);
  // The process hung up: its asks end, and for exit_wait the others count its pages as coming.
  void hung_up(SessionId id);
  [[nodiscard]] std::size_t held_pages(SessionId id) const;
  [[nodiscard]] std::vector<ChunkHandle> chunks_held_by(SessionId id) const;
  // The process has exited (or can reach its pages no more): every page it holds comes back,
  // its fences are forgotten and its record goes. Returns how many pages came back.
  std::size_t take_back_all(SessionId id);

  // A grant of up to `count` pages of `device` to process `id`, or an out_of_memory Error saying
  // why not (its limit; no page came back in time). It may wait for others to give pages back,
  // for their work behind pages (fence_wait), and zeroes pages another user held. `asked_us`:
  // when it was asked (the trace's span). Returns the batch as it travels.
  PageBank::Batch take(SessionId id, int device, std::size_t count, double asked_us);
  // Pages `ids` of `device` come back from `id` (behind `fence` when fenced). Throws
  // InvalidArgument (nothing changes) for a device that does not exist or a page not its own.
  void give_back(SessionId id, int device, const std::vector<std::uint64_t>& ids,
                 remote::GiveFence mode, std::shared_ptr<const PageBank::Fence> fence);

  // The server's tick: zeroings and withheld pages whose work completed are recycled; free
  // pages idle for idle_release go back to the driver. Returns how many went.
  std::size_t release_idle_pages();

  // "" when every bank is consistent, else what is wrong (tests, fuzz).
  [[nodiscard]] std::string inconsistency() const;
  [[nodiscard]] DeviceUse device_use(int device) const;
  [[nodiscard]] std::uint64_t zeroed_pages() const { return scrubber_.scrubbed(); }
  // The status table's device sections; `free_now`: each device's free MiB, asked of the driver.
  [[nodiscard]] std::string device_table(const std::vector<std::string>& free_now) const;
  // What each process holds, its limit (0: none) and when it hung up.
  struct Holding {
    std::size_t pages = 0;
    std::size_t limit_bytes = 0;
    std::optional<std::chrono::steady_clock::time_point> closed_at;
  };
  [[nodiscard]] std::map<SessionId, Holding> holdings() const;

 private:
  using Holder = PageHolders::Holder;
  using Clock = std::chrono::steady_clock;

  // Takes mu_ and applies `change` to `id`'s record, if it has one (a process gone: no matter).
  template <class F>
  void change(SessionId id, F&& change);
  // With mu_ held: a device's bank, and the pages a process holds on every device.
  PageBank& bank(int device) { return *banks_[static_cast<std::size_t>(device)]; }
  [[nodiscard]] std::size_t held_by(SessionId id) const;
  // The steps of take, each taking mu_ (grant_or_wait finds `record` when null). wait_for_pages:
  // waits while another process may still give pages back; the grant, or none (gave way).
  std::vector<std::uint64_t> grant_or_wait(SessionId id, Holder*& record, int device,
                                           std::size_t count);
  std::vector<std::uint64_t> wait_for_pages(std::unique_lock<std::mutex>& lock, SessionId id,
                                            Holder& h, int device, std::size_t count);
  // Of `ids` (just granted), pages given back behind another process's work wait for it, each at
  // most until its give-back's time plus fence_wait: those whose work completed go on settled,
  // the others are withheld (out of the grant). Returns the pages that go on.
  std::vector<std::uint64_t> settle_fences(SessionId id, const Holder& h, int device,
                                           std::vector<std::uint64_t> ids);
  // Zeroes the pages of `ids` (just granted) whose last holder was another user, each behind
  // its last fence; their fence is then the zeroing's. On failure the grant goes back.
  void scrub_for(SessionId id, uid_t uid, int device, const std::vector<std::uint64_t>& ids);
  void release_completed_withheld();  // withheld pages whose work completed become free
  [[nodiscard]] std::string short_reason(SessionId id, int device) const;  // takes mu_
  void ask_others_to_give_back(SessionId asking, int device, std::size_t pages);
  // The timeline of every process's pages (salusd --trace): a move per grant and per give-back,
  // and each device's pages per process as a counter. With mu_ held.
  void trace_pages(const std::string& what, int device, double begin_us, std::size_t pages);

  const std::shared_ptr<DeviceBackend> backend_;
  const std::shared_ptr<TraceRecorder> trace_;
  const std::size_t page_bytes_;
  const CoordinatorOptions options_;  // a copy: what the coordinator was made with
  const std::vector<Device> devices_;

  mutable std::mutex mu_;
  std::condition_variable pages_back_;
  std::vector<std::unique_ptr<PageBank>> banks_;  // sized once, at construction
  Scrubber scrubber_;    // has its own lock; goes before the banks (it maps their pages)
  PageHolders holders_;  // a record stays put until take_back_all erases it
};

}  // namespace salus::daemon
