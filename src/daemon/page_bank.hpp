// The daemon's physical pages: one bank per device. A page is a chunk of the device granularity,
// made on demand up to the bank's capacity; each is free or held by one session (a connected
// process). A free page unused for a while goes back to the driver (take_idle), so that memory
// no client needs is left to the other programs on the GPU. Lock story: the bank has no lock of its own; the PageLedger
// calls it under its lock (and it calls only down, into the backend).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "remote/channel.hpp"
#include "remote/protocol.hpp"
#include "salus/device.hpp"

namespace salus::daemon {

using SessionId = std::uint64_t;

struct DeviceUse {
  std::size_t granted_bytes = 0;
  std::size_t peak_granted_bytes = 0;
  std::size_t capacity_bytes = 0;
  std::size_t made_bytes = 0;  // of the driver's memory now: granted, free or fenced
  std::size_t released_idle_bytes = 0;  // given back to the driver as idle, since the start
  std::size_t withheld_bytes = 0;  // behind another process's work that did not complete in time
};

class PageBank {
 public:
  PageBank(DeviceBackend& backend, int device, std::size_t page_bytes, std::size_t capacity_bytes);
  ~PageBank();
  PageBank(const PageBank&) = delete;
  PageBank& operator=(const PageBank&) = delete;

  // Hands up to `count` pages to `owner` (free ones first, then new ones while the device has
  // room); returns their ids.
  std::vector<std::uint64_t> grant(SessionId owner, std::size_t count);
  // True when every id is a page `owner` holds (nothing changes either way).
  [[nodiscard]] bool all_held_by(SessionId owner, const std::vector<std::uint64_t>& ids) const;
  // GPU work a page may still be under: the interprocess fence it came back with, as received (a
  // simulated event's descriptor is kept open here), and the session whose work it is.
  struct Fence {
    remote::FenceEntry entry;
    remote::UniqueFd fd;  // the simulated event's memory; empty on CUDA
    SessionId from = 0;
    // The event as the daemon opened it (check_fence, job_turns.hpp), which it asks whether the
    // work has completed, and when it came (a give-back, or an iteration's end).
    std::shared_ptr<const Event> opened;
    std::chrono::steady_clock::time_point given_at{};
  };
  using FencePtr = std::shared_ptr<const Fence>;

  // The pages go back to the free list; ids must have passed all_held_by. Their fence: none
  // (settled), `fence` (fenced), or the one they were granted with (untouched).
  void take_back(const std::vector<std::uint64_t>& ids,
                 remote::GiveFence mode = remote::GiveFence::settled, FencePtr fence = nullptr);
  // Of `ids` (pages just granted), the pages whose last holder was not `user` (a uid): their
  // bytes are another user's. A page never held has no last holder.
  [[nodiscard]] std::vector<std::uint64_t> of_another_user(const std::vector<std::uint64_t>& ids,
                                                           std::uint32_t user) const;
  // Those of `ids` that `owner` still holds are `user`'s pages now (zeroed first where
  // of_another_user named them).
  void set_user(const std::vector<std::uint64_t>& ids, SessionId owner, std::uint32_t user);
  void set_fence(std::uint64_t id, FencePtr fence);
  [[nodiscard]] ChunkHandle chunk_of(std::uint64_t id) const { return pages_.at(id).chunk; }
  [[nodiscard]] FencePtr fence_of(std::uint64_t id) const { return pages_.at(id).fence; }
  // A page of `owner`'s (just granted) whose fence did not complete within the bound: it is out
  // of the grant and withheld, neither free nor held, until release_withheld.
  void withhold(std::uint64_t id, SessionId owner);
  // The withheld pages and their fences.
  [[nodiscard]] std::vector<std::pair<std::uint64_t, FencePtr>> withheld() const;
  // A withheld page's fence has completed (or its giver exited): it is free, settled.
  void release_withheld(std::uint64_t id);
  [[nodiscard]] std::size_t withheld_pages() const { return withheld_; }
  // Every page `owner` holds goes back, its fence kept; returns how many.
  std::size_t take_back_all(SessionId owner);
  // `session` has exited: the work its fences stand for is gone with it.
  void forget_fences_of(SessionId session);
  // Takes out of the bank the free pages that have been free since before `now - idle` and have
  // no fence, and returns their chunks for the caller to release to the driver. A fenced page
  // stays: its giver may still map it until its work is done (a simulated device would carve the
  // memory again at once), and the daemon does not watch that work; its next holder takes the
  // fence on, or its giver's exit drops it.
  using Clock = std::chrono::steady_clock;
  std::vector<ChunkHandle> take_idle(Clock::time_point now, Clock::duration idle);

  // A batch as it travels: entries naming descriptors (one a page), and the fences of the pages
  // granted behind work (a simulated fence's descriptor among the fds, after the pages').
  struct Batch {
    std::vector<remote::PageEntry> entries;
    std::vector<remote::FenceEntry> fences;
    std::vector<remote::UniqueFd> fds;
  };
  Batch export_pages(const std::vector<std::uint64_t>& ids);

  [[nodiscard]] std::size_t page_bytes() const { return page_bytes_; }
  [[nodiscard]] std::size_t granted_pages() const { return granted_; }
  [[nodiscard]] std::size_t peak_granted_pages() const { return peak_granted_; }
  [[nodiscard]] std::size_t capacity_pages() const { return capacity_pages_; }
  // Those counts in bytes.
  [[nodiscard]] DeviceUse use() const;
  // Pages made of the driver's memory now (held, free, fenced), and those released as idle since
  // the daemon started.
  [[nodiscard]] std::size_t made_pages() const { return pages_.size(); }
  [[nodiscard]] std::uint64_t released_idle_pages() const { return released_idle_; }
  [[nodiscard]] std::size_t held_by(SessionId owner) const;
  [[nodiscard]] std::vector<ChunkHandle> chunks_held_by(SessionId owner) const;
  // Pages with a fence (work of their last holder that may not have finished).
  [[nodiscard]] std::size_t fenced_pages() const;
  // Pages given back behind work, since the daemon started.
  [[nodiscard]] std::uint64_t fenced_returns() const { return fenced_returns_; }
  // "" when the bank is consistent (each page free or held by one session, the free list without
  // repeats, the count of granted pages right); else what is wrong. For tests and the fuzz target.
  [[nodiscard]] std::string inconsistency() const;

 private:
  struct Slot {
    ChunkHandle chunk{};
    SessionId owner = 0;  // 0: free
    FencePtr fence;       // null: nothing pending
    Clock::time_point freed_at{};  // when it was last taken back (free pages only)
    std::optional<std::uint32_t> user;  // the uid of its last holder's process (none: never held)
    bool withheld = false;
  };
  DeviceBackend& backend_;
  const int device_;
  const std::size_t page_bytes_;
  const std::size_t capacity_pages_;
  std::unordered_map<std::uint64_t, Slot> pages_;
  // Oldest-freed first: grants take from the back (the page most recently used, its memory
  // likeliest cached), take_back appends, take_idle releases from the front.
  std::vector<std::uint64_t> free_;
  std::uint64_t next_serial_ = 1;
  std::size_t granted_ = 0;
  std::size_t peak_granted_ = 0;
  std::uint64_t fenced_returns_ = 0;
  std::uint64_t released_idle_ = 0;
  std::size_t withheld_ = 0;
};

}  // namespace salus::daemon
